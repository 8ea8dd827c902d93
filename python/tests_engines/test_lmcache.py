# SPDX-License-Identifier: Apache-2.0
"""strata as an LMCache L2 store through LMCache's own native_plugin factory and its
NativeConnectorL2Adapter (lmcache 0.5.6, installed with --no-deps by scripts/test_engines.sh): the
adapter loads strata.lmcache.StrataConnector from the config, watches its eventfd on its own
thread, and the test calls the adapter as LMCache's storage manager does (store tasks of
TensorMemoryObj chunks, lookup-and-lock, load tasks into fresh objects).

An object's reference bytes come from a generator seeded by its chunk hash alone.
"""
import hashlib
import time

import numpy as np
import pytest
import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import NativeConnectorL2Adapter
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (
    NativePluginL2AdapterConfig,
    _create_native_plugin_l2_adapter,
)
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

from strata.lmcache import StrataConnector

OBJECT = 64 * 1024  # bytes of a full chunk


def adapter(params):
    """As LMCache builds an L2 adapter from its config: the native_plugin factory."""
    cfg = NativePluginL2AdapterConfig.from_dict(
        {"type": "native_plugin", "module_path": "strata.lmcache", "class_name": "StrataConnector",
         "adapter_params": {"object_bytes": OBJECT, **params}})
    a = _create_native_plugin_l2_adapter(cfg)
    assert isinstance(a, NativeConnectorL2Adapter) and isinstance(a._client, StrataConnector)
    return a


def keys(n, seed, rank=0, model="meta-llama/Llama-3.1-8B"):
    h, out = hashlib.sha256(f"doc-{seed}".encode()).digest(), []
    for i in range(n):
        h = hashlib.sha256(h + bytes([i])).digest()
        out.append(ObjectKey(chunk_hash=h, model_name=model, kv_rank=rank))
    return out


def reference(key, nbytes):
    return np.random.default_rng(int.from_bytes(key.chunk_hash[:8], "little")).integers(0, 256, nbytes,
                                                                                         dtype=np.uint8)


def memory_obj(nbytes):
    """LMCache's own memory object over a CPU tensor of `nbytes` bytes."""
    raw = torch.zeros(nbytes, dtype=torch.uint8)
    meta = MemoryObjMetadata(shape=torch.Size([nbytes]), dtype=torch.uint8, address=0, phy_size=nbytes, ref_count=1)
    return TensorMemoryObj(raw, meta, None)


def until(f, timeout=10.0):
    end = time.monotonic() + timeout
    while True:
        r = f()
        if r is not None and r != {}:
            return r
        assert time.monotonic() < end, "timed out waiting for the adapter"
        time.sleep(0.002)


def store(a, ks, sizes):
    objs = []
    for k, n in zip(ks, sizes):
        o = memory_obj(n)
        o.raw_data.numpy()[:] = reference(k, n)
        objs.append(o)
    task = a.submit_store_task(ks, objs)
    done = until(lambda: a.pop_completed_store_tasks())
    return done[task]


def lookup(a, ks):
    task = a.submit_lookup_and_lock_task(ks, {})
    bitmap = until(lambda: a.query_lookup_and_lock_result(task))
    a.submit_unlock(ks)
    return [bitmap.test(i) for i in range(len(ks))]


def load(a, ks, sizes):
    objs = [memory_obj(n) for n in sizes]
    task = a.submit_load_task(ks, objs)
    bitmap = until(lambda: a.query_load_result(task))
    got = [bitmap.test(i) for i in range(len(ks))]
    for k, o, ok in zip(ks, objs, got):
        if ok:
            assert np.array_equal(o.raw_data.numpy(), reference(k, o.raw_data.numel())), "wrong bytes"
    return got


def test_chunks_round_trip_through_lmcaches_adapter(tmp_path):
    params = {"file_paths": [str(tmp_path / "d0"), str(tmp_path / "d1")], "file_capacity_gb": 0.01}
    a = adapter(params)
    ks = keys(9, 1)
    sizes = [OBJECT] * 8 + [OBJECT // 3 + 5]  # the last chunk partial
    assert lookup(a, ks) == [False] * 9
    # Some chunks held: the lookup reports each (a miss among hits does not fail the batch).
    held = [0, 1, 2, 5]
    assert int(store(a, [ks[i] for i in held], [sizes[i] for i in held])) == sum(sizes[i] for i in held)
    assert lookup(a, ks) == [i in held for i in range(9)]
    assert load(a, ks, sizes) == [i in held for i in range(9)]
    # LMCache's L2StoreResult: bytes newly stored (its adapter counts a key once), -1 on failure.
    assert int(store(a, ks, sizes)) == sum(sizes) - sum(sizes[i] for i in held)
    assert lookup(a, ks) == [True] * 9
    assert load(a, ks, sizes) == [True] * 9
    # Another rank's key for the same chunk, and a chunk larger than object_bytes: misses / refusals.
    assert lookup(a, keys(2, 1, rank=1)) == [False, False]
    big = keys(1, 77)
    assert int(store(a, big, [OBJECT * 2])) == -1
    assert lookup(a, big) == [False]
    a.close()
    # A restart keeps every chunk.
    b = adapter(params)
    assert load(b, ks, sizes) == [True] * 9
    b.close()


def test_bad_params_are_refused(tmp_path):
    with pytest.raises(ValueError, match="file_paths"):
        adapter({})
    with pytest.raises(ValueError, match="object_bytes"):
        StrataConnector(object_bytes=0, file_paths=str(tmp_path))
    with pytest.raises(ValueError, match="unknown options"):
        adapter({"file_paths": str(tmp_path), "path": "x"})


def test_shared_cluster_between_instances(redis_cluster):
    nodes = redis_cluster.addresses()[:2]
    a, b = adapter({"redis_nodes": nodes}), adapter({"redis_nodes": ",".join(nodes)})
    ks = keys(5, 2)
    store(a, ks, [OBJECT] * 5)
    assert lookup(b, ks) == [True] * 5
    assert load(b, ks, [OBJECT] * 5) == [True] * 5
    a.close()
    b.close()
