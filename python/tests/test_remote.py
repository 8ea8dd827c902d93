# SPDX-License-Identifier: Apache-2.0
"""The remote tier from Python against a real Redis Cluster (started by the redis_cluster fixture):
redis_store's exists / get / set by content key, namespaces, and cpu_controllers sharing prefixes
through it, every cached page checked against what the "model" computed."""
import time

import numpy as np
import pytest

import strata
from test_controller import engine

pytestmark = pytest.mark.skipif(not strata.redis_built, reason="the module was built without hiredis")


def store(cluster, g, dtype="float16", **kw):
    return strata.redis_store(cluster.addresses()[:1], g, model="python-remote-test", dtype=dtype, **kw)


def test_pages_round_trip_by_content(redis_cluster, geo):
    s = store(redis_cluster, geo)
    assert s.clustered and s.page_bytes == geo.page_bytes()
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50000, size=16 * 20).astype(np.int32)
    keys = strata.content_keys(ids, 16)
    assert keys.shape == (20, 2) and keys.dtype == np.uint64
    assert s.exists(keys) == 0
    pages = rng.integers(0, 256, size=(20, geo.page_bytes()), dtype=np.uint8)
    assert s.set(keys, pages, ids=ids).all()
    assert s.exists(keys) == 20
    out = np.zeros_like(pages)
    assert s.get(keys, out, ids=ids).all()
    assert (out == pages).all()
    # Other ids under a key are refused; the prefix chain: a longer prompt finds its first 20 pages.
    wrong = ids.copy()
    wrong[3] += 1
    assert not s.get(keys, out, ids=wrong)[0]
    longer = np.concatenate([ids, rng.integers(0, 50000, size=16 * 4).astype(np.int32)])
    assert s.exists(strata.content_keys(longer, 16)) == 20
    # Another dtype of the same shape is another namespace.
    assert store(redis_cluster, geo, dtype="bfloat16").exists(keys) == 0
    st = s.stats()
    assert st.pages_written == 20 and st.pages_read == 20 + 19 and st.pages_rejected == 1
    rates = strata.measure_keyed_store(s, 8)
    assert rates.read_bytes_per_s > 0 and rates.write_bytes_per_s > 0 and rates.round_trip_s > 0


def test_bad_input(redis_cluster, geo):
    s = store(redis_cluster, geo)
    keys = strata.content_keys(list(range(64)), 16)
    with pytest.raises(ValueError, match=r"\[4, 4096\]"):
        s.get(keys, np.zeros((3, geo.page_bytes()), np.uint8))
    with pytest.raises(ValueError, match="split evenly"):
        s.set(keys, np.zeros((4, geo.page_bytes()), np.uint8), ids=list(range(10)))
    with pytest.raises(ValueError, match="host:port"):
        strata.redis_store(["nowhere"], geo, model="m", dtype="float16")
    with pytest.raises(ValueError, match="dtype"):
        strata.redis_store(redis_cluster.addresses(), geo, model="m", dtype="")


def fast_records(geo):
    """Options whose cost model reads the remote tier at once (loopback here)."""
    o = strata.controller_options()
    o.set_remote_tier(geo, 1e15, 1e15, 0.0)
    return o


class remote_engine(engine):
    attempts = 2000


def test_controllers_share_prefixes_through_the_cluster(redis_cluster):
    # Llama-3.1-8B-shaped pages: reading them back beats recomputing (a toy model's would not).
    geo = strata.kv_geometry(layers=32, page_tokens=16, kv_heads=8, head_dim=128, elem_bytes=2, planes=2)
    s = store(redis_cluster, geo)
    rng = np.random.default_rng(7)
    doc = [int(x) for x in rng.integers(0, 30000, size=16 * 6)]
    a = remote_engine(geo, device_pages=32, host_pages=32, options=fast_records(geo), remote_store=s)
    assert a.cache.tiers == [strata.tier.device, strata.tier.host, strata.tier.remote]
    assert sum(a.run(1, doc + [40001, 40002])) == 0  # computed, written to the cluster
    a.settle()
    assert s.stats().pages_written == 6
    b = remote_engine(geo, device_pages=32, host_pages=32, options=fast_records(geo), remote_store=s)
    cached = b.run(2, doc + [40003])
    assert sum(cached) == 6 and cached[0] == 0  # every page from the other instance's work
    assert b.checked == 6
    st = b.cache.stats()
    assert st.remote_lookups == 1 and st.remote_found_pages == 6
    b.cache.check_invariants()


@pytest.mark.skipif(not strata.gpu_available(), reason="needs a CUDA GPU and strata built with CUDA")
def test_gpu_controllers_share_prefixes_through_the_cluster(redis_cluster):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    geo = strata.kv_geometry(layers=32, page_tokens=16, kv_heads=8, head_dim=128, elem_bytes=2, planes=2)
    s = store(redis_cluster, geo, dtype="bfloat16")
    pages = 24
    stream = torch.cuda.current_stream().cuda_stream
    doc = list(range(7000, 7000 + 8 * 16))  # 8 pages

    def engine():
        k = [torch.zeros(pages * 16, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
        v = [torch.zeros(pages * 16, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
        c = strata.gpu_controller(strata.sglang_layout(k, v, geo), 16, options=fast_records(geo), remote_store=s)
        assert c.tiers == [strata.tier.device, strata.tier.host, strata.tier.remote]
        return k, v, c

    def start(c, rid, tokens):
        c.submit(rid, tokens, max_new_tokens=2, stream=stream)
        for _ in range(2000):  # held back while its lookup is out
            loads = c.begin_loads(c.schedule(), stream)
            if loads.started:
                return loads
            c.poll(stream)
            time.sleep(0.002)
        raise AssertionError(f"request {rid} never started")

    k, v, a = engine()
    loads = start(a, 1, doc + [1, 2])
    table = a.page_table(1)
    data = torch.randn(32, 2, 8 * 16, 8, 128, device="cuda").to(torch.bfloat16)
    idx = torch.tensor(table[:8], device="cuda")
    for layer in range(32):
        assert a.wait_layer(loads, layer, stream)
        k[layer].view(pages, 16, 8, 128).index_copy_(0, idx, data[layer, 0].view(8, 16, 8, 128))
        v[layer].view(pages, 16, 8, 128).index_copy_(0, idx, data[layer, 1].view(8, 16, 8, 128))
    a.complete(loads)
    assert a.wait_after(a.finish_prefill(1, stream), stream)
    a.release(1, None, stream)
    for _ in range(2000):  # device -> host, then host -> the cluster, on the store's threads
        a.synchronize()
        a.poll(stream)
        if s.stats().pages_written >= 8:
            break
        time.sleep(0.002)
    assert s.stats().pages_written >= 8

    k2, v2, b = engine()  # another instance: an empty index, a zeroed pool
    loads = start(b, 2, doc + [3])
    assert sum(loads.started[0].cached_pages) == 8 and loads.started[0].cached_pages[0] == 0
    table = b.page_table(2)
    idx = torch.tensor(table[:8], device="cuda")
    for layer in range(32):
        assert b.wait_layer(loads, layer, stream)
        assert torch.equal(k2[layer].view(pages, 16, 8, 128).index_select(0, idx).view(-1, 8, 128), data[layer, 0])
        assert torch.equal(v2[layer].view(pages, 16, 8, 128).index_select(0, idx).view(-1, 8, 128), data[layer, 1])
    b.complete(loads)
    b.release(2, None, stream)
    b.synchronize()
    b.poll(stream)
    b.check_invariants()
    assert b.stats().remote_found_pages == 8
