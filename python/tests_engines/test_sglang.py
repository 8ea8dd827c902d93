# SPDX-License-Identifier: Apache-2.0
"""strata as SGLang's HiCache storage backend, driven the way SGLang's cache controller drives it,
with SGLang's own classes (sglang 0.5.23, installed with --no-deps by scripts/test_engines.sh): the
backend is made by SGLang's StorageBackendFactory from the "dynamic" extra config; host pools are
SGLang's MHATokenToKVPoolHost / MLATokenToKVPoolHost on the CPU; keys are SGLang's chained page hashes
(get_hash_str); random failures come from SGLang's HiCacheStorageFailureInjector.

A page's reference bytes come from a generator seeded by its token ids alone (they share nothing
with the code under test); every page a call reports as read must hold them.
"""
import hashlib
import os
import random
import threading

import numpy as np
import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo, MLABufferInfo
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheFile,
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    HiCacheStorageFailureInjector,
)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str

import strata
from strata.sglang import StrataHiCacheStorage

PAGE = 4  # tokens per page


def mha_pool(layout="page_first", layers=3, heads=2, dim=16, tokens=256, dtype=torch.bfloat16):
    """SGLang's MHA host pool (its own class) over CPU "device" buffers."""
    k = tuple(torch.zeros(tokens + PAGE, heads, dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens + PAGE, heads, dim, dtype=dtype) for _ in range(layers))
    bufs = KVBuffers(k=k, v=v, k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
                     v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
                     layout=KVBufferLayout.NHD)
    info = MHABufferInfo(buffers=bufs, page_size=PAGE, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=dtype,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers)


def mla_pool(layers=3, lora=32, rope=16, tokens=256, dtype=torch.bfloat16):
    """SGLang's MLA host pool (its own class) over CPU "device" buffers."""
    bufs = tuple(torch.zeros(tokens + PAGE, 1, lora + rope, dtype=dtype) for _ in range(layers))
    info = MLABufferInfo(buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
                         layer_indices=tuple(range(layers)), device_layer_num=layers, page_size=PAGE,
                         kv_lora_rank=lora, qk_rope_head_dim=rope, kv_cache_dim=lora + rope, dtype=dtype,
                         device=torch.device("cpu"))
    return MLATokenToKVPoolHost(info, 2.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers,
                                target_layer_num=layers)


def config(extra, tp_rank=0, tp_size=1, mla=False, model="meta-llama/Llama-3.1-8B", metrics=True, dp_rank=0):
    """The HiCacheStorageConfig SGLang builds, with strata named as the dynamic backend."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=metrics, is_page_first_layout=True, model_name=model, dp_rank=dp_rank,
        extra_config={"backend_name": "strata", "module_path": "strata.sglang", "class_name": "StrataHiCacheStorage",
                      "interface_v1": 1, **extra})


def backend(extra, pool, **kw):
    """As SGLang's cache controller attaches a backend: the factory, then register_mem_pool_host."""
    b = StorageBackendFactory.create_backend("dynamic", config(extra, **kw), pool)
    assert isinstance(b, StrataHiCacheStorage) and isinstance(b, HiCacheStorage)
    b.register_mem_pool_host(pool)
    return b


def page_bytes_of(pool):
    _, sizes = pool.get_page_buffer_meta(torch.arange(PAGE))
    return sum(sizes)


def reference(tokens, page, nbytes):
    """The bytes of page `page` of a prompt: seeded by every token up to the page's end."""
    seed = hashlib.sha256(np.asarray(tokens[: (page + 1) * PAGE], np.int64).tobytes()).digest()
    return np.random.default_rng(int.from_bytes(seed[:8], "little")).integers(0, 256, nbytes, dtype=np.uint8)


def page_view(pool, index):
    """The bytes of the host page at `index`, in the regions' order (as a store keeps them)."""
    ptrs, sizes = pool.get_page_buffer_meta(torch.arange(index, index + PAGE))
    base = pool.kv_buffer.data_ptr()
    flat = pool.kv_buffer.view(-1).view(torch.uint8).numpy()
    return [flat[p - base: p - base + s] for p, s in zip(ptrs, sizes)]


def fill(pool, indices, tokens, first_page=0):
    nbytes = page_bytes_of(pool)
    for i in range(len(indices) // PAGE):
        ref = reference(tokens, first_page + i, nbytes)
        at = 0
        for region in page_view(pool, int(indices[i * PAGE])):
            region[:] = ref[at: at + len(region)]
            at += len(region)


def holds(pool, index, tokens, page):
    got = np.concatenate(page_view(pool, index))
    return np.array_equal(got, reference(tokens, page, len(got)))


class Prompt:
    def __init__(self, pages, seed):
        self.tokens = random.Random(seed).choices(range(128000), k=pages * PAGE)
        self.keys = get_hash_str(self.tokens, None, page_size=PAGE)  # SGLang's chained page hashes
        assert len(self.keys) == pages


def flat_pages(pool, p):
    """Host pages holding `p`'s KV and their legacy flat views (as SGLang's _generic_page_set
    passes them); returns the pages' indices and the views."""
    idx = pool.alloc(len(p.keys) * PAGE)
    fill(pool, idx, p.tokens)
    return idx, [pool.get_data_page(int(idx[i * PAGE]), flat=True) for i in range(len(p.keys))]


def backup(b, pool, p):
    """The controller's backup: pages land in the host pool, then batch_set_v1 in batches."""
    idx = pool.alloc(len(p.keys) * PAGE)
    fill(pool, idx, p.tokens)
    flags = b.batch_set_v1(p.keys, idx, HiCacheStorageExtraInfo(prefix_keys=[]))
    pool.free(idx)
    return flags


def prefetch(b, pool, p):
    """The controller's prefetch: batch_exists, then batch_get_v1 of the hits into fresh host pages;
    returns the leading pages read, each checked."""
    hit = b.batch_exists(p.keys)
    if hit == 0:
        return 0
    idx = pool.alloc(hit * PAGE)
    pool.kv_buffer.view(torch.uint8).view(-1)[:] = 0xA5  # poison
    flags = b.batch_get_v1(p.keys[:hit], idx)
    assert isinstance(flags, list) and len(flags) == hit and all(isinstance(f, bool) for f in flags)
    n = 0
    for i, ok in enumerate(flags):
        if not ok:
            break
        assert holds(pool, int(idx[i * PAGE]), p.tokens, i), f"page {i} read with wrong bytes"
        n += 1
    pool.free(idx)
    return n


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_mha_pages_round_trip_through_the_drives(tmp_path, layout):
    pool = mha_pool(layout)
    b = backend({"file_paths": [str(tmp_path / "d0"), str(tmp_path / "d1")], "file_capacity_gb": 0.01}, pool)
    p = Prompt(10, 1)
    assert b.batch_exists(p.keys) == 0
    assert b.batch_set_v1(p.keys, pool.alloc(0)) == [False] * 10  # wrong index count: every page fails
    assert backup(b, pool, p) == [True] * 10
    assert b.batch_exists(p.keys) == 10 and b.exists(p.keys[0])
    assert prefetch(b, pool, p) == 10
    # A longer prompt sharing the prefix finds the 10 pages.
    longer = Prompt(14, 1)
    assert longer.keys[:10] == p.keys
    assert b.batch_exists(longer.keys) == 10
    st = b.stats()["file"]
    assert st.pages_written == 10 and st.pages_read == 10
    m = b.get_stats()
    assert m.backup_pgs == [10] and m.prefetch_pgs == [10] and len(m.prefetch_bandwidth) == 1
    b.close()
    # Another instance (a restart) finds every page on the drives.
    again = backend({"file_paths": [str(tmp_path / "d0"), str(tmp_path / "d1")], "file_capacity_gb": 0.01},
                    mha_pool(layout))
    assert prefetch(again, again.mem_pool_host, p) == 10


def test_namespaces_ranks_and_mla(tmp_path):
    d = {"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": 0.01}
    p = Prompt(6, 2)
    r0 = backend(d, mha_pool(), tp_rank=0, tp_size=2)
    assert backup(r0, r0.mem_pool_host, p) == [True] * 6
    r1 = backend(d, mha_pool(), tp_rank=1, tp_size=2)
    assert r1.batch_exists(p.keys) == 0  # another rank's heads
    other_dtype = backend(d, mha_pool(dtype=torch.float16), tp_rank=0, tp_size=2)
    assert other_dtype.batch_exists(p.keys) == 0  # same page size, another dtype
    other_model = backend(d, mha_pool(), tp_rank=0, tp_size=2, model="Qwen/Qwen3-8B")
    assert other_model.batch_exists(p.keys) == 0
    # MLA under TP: one copy for every rank, which a file tier owned by one process cannot serve.
    with pytest.raises(ValueError, match="redis_nodes"):
        backend(d, mla_pool(), tp_rank=0, tp_size=4, mla=True)
    m = backend(d, mla_pool(), mla=True)
    assert backup(m, m.mem_pool_host, p) == [True] * 6
    assert prefetch(m, m.mem_pool_host, p) == 6
    assert m.namespace(m.mem_pool_host)["layout"] == "sglang:page_first:mla"


def test_instances_share_pages_through_redis_cluster(redis_cluster, tmp_path):
    """Two engine instances over one Redis Cluster; MLA pages written by rank 0 are read by rank 3;
    with drives and cluster both, a page the drives miss comes from the cluster."""
    nodes = redis_cluster.addresses()[:2]
    p = Prompt(7, 7)
    a = backend({"redis_nodes": nodes}, mha_pool(), model="redis-share-test")
    b = backend({"redis_nodes": ",".join(nodes)}, mha_pool(), model="redis-share-test")
    assert b.batch_exists(p.keys) == 0
    assert backup(a, a.mem_pool_host, p) == [True] * 7
    assert prefetch(b, b.mem_pool_host, p) == 7
    m0 = backend({"redis_nodes": nodes}, mla_pool(), tp_rank=0, tp_size=4, mla=True, model="redis-share-test")
    m3 = backend({"redis_nodes": nodes}, mla_pool(), tp_rank=3, tp_size=4, mla=True, model="redis-share-test")
    assert backup(m0, m0.mem_pool_host, p) == [True] * 7
    assert prefetch(m3, m3.mem_pool_host, p) == 7
    # Drives in front of the cluster: empty drives, so every page comes from the cluster; then both.
    both = backend({"redis_nodes": nodes, "file_paths": str(tmp_path / "kv"), "file_capacity_gb": 0.01}, mha_pool(),
                   model="redis-share-test")
    assert both.batch_exists(p.keys) == 7
    assert prefetch(both, both.mem_pool_host, p) == 7
    assert both.stats()["file"].pages_read == 0 and both.stats()["redis"].pages_read == 7
    q = Prompt(3, 8)
    assert backup(both, both.mem_pool_host, q) == [True] * 3
    assert both.stats()["file"].pages_written == 3 and b.batch_exists(q.keys) == 3
    assert prefetch(both, both.mem_pool_host, q) == 3
    assert both.stats()["file"].pages_read == 3


def test_legacy_interface_through_flat_pages(tmp_path):
    pool = mha_pool()
    b = backend({"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": 0.01}, pool)
    p = Prompt(3, 3)
    _, pages = flat_pages(pool, p)
    assert b.batch_set(p.keys, pages) is True
    assert b.set(p.keys[0], pages[0]) is True  # already held
    dummies = [pool.get_dummy_flat_data_page() for _ in range(4)]
    got = b.batch_get(p.keys + ["not-a-page"], dummies)
    assert got[3] is None and all(g is dummies[i] for i, g in enumerate(got[:3]))
    for i in range(3):
        assert torch.equal(got[i].view(torch.uint8), pages[i].contiguous().view(torch.uint8))
    assert b.get("not-a-page", pool.get_dummy_flat_data_page()) is None


def test_layer_first_pages_of_one_interface_are_never_read_by_the_other(tmp_path):
    """A layer-first MHA page is K, V layer by layer through the zero-copy interface and every K,
    then every V as the legacy interface's flat page: a restart that switches interfaces misses."""
    drives = {"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": 0.01}
    pool = mha_pool("layer_first")
    p = Prompt(3, 11)
    legacy = backend({**drives, "interface_v1": 0}, pool)
    idx, pages = flat_pages(pool, p)
    assert legacy.batch_set(p.keys, pages)
    pool.free(idx)
    legacy.close()
    v1 = backend(drives, pool)
    assert v1.batch_exists(p.keys) == 0 and prefetch(v1, pool, p) == 0
    assert backup(v1, pool, p) == [True] * 3 and prefetch(v1, pool, p) == 3
    v1.close()
    legacy = backend({**drives, "interface_v1": 0}, pool)
    assert legacy.batch_exists(p.keys) == 3  # its own pages, kept across the restart
    legacy.close()


def test_legacy_targets_that_are_not_host_pages_fail_their_pages(tmp_path):
    pool = mha_pool()
    b = backend({"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": 0.01}, pool)
    p = Prompt(2, 12)
    _, pages = flat_pages(pool, p)
    assert b.batch_set(p.keys, [pages[0], None]) is False  # nothing raised into SGLang's thread
    assert b.batch_exists(p.keys) == 0
    assert b.batch_set(p.keys, pages) is True
    got = b.batch_get(p.keys, [pool.get_dummy_flat_data_page(), "not a tensor"])
    assert got[1] is None and torch.equal(got[0].view(torch.uint8), pages[0].contiguous().view(torch.uint8))


def test_data_parallel_ranks_each_own_their_drives(tmp_path):
    """With data-parallel attention every DP rank's scheduler has the same TP coordinates: each
    gets a file store of its own on the same drives (one process owns a store's files)."""
    drives = {"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": 0.01}
    pools = [mha_pool(), mha_pool()]
    ranks = [backend(drives, pools[r], dp_rank=r) for r in range(2)]
    p = Prompt(2, 14)
    assert backup(ranks[1], pools[1], p) == [True, True]
    assert ranks[0].batch_exists(p.keys) == 0 and ranks[1].batch_exists(p.keys) == 2
    assert set(ranks[0].file.directories).isdisjoint(ranks[1].file.directories)
    for b in ranks:
        b.close()


def test_metrics_are_kept_only_when_sglang_collects_them(tmp_path):
    pool = mha_pool()
    drives = {"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": 0.01}
    b = StorageBackendFactory.create_backend("dynamic", config(drives, metrics=False), pool)
    b.register_mem_pool_host(pool)
    p = Prompt(2, 13)
    assert backup(b, pool, p) == [True, True] and prefetch(b, pool, p) == 2
    assert all(len(v) == 0 for v in b._metrics.values())  # SGLang never calls get_stats: nothing grows
    b.close()
    b = backend(drives, pool)
    assert prefetch(b, pool, p) == 2
    m = b.get_stats()
    assert list(m.prefetch_pgs) == [2]


def test_clear_empties_the_drives_and_the_backend_goes_on(tmp_path):
    pool = mha_pool()
    b = backend({"file_paths": [str(tmp_path / "a"), str(tmp_path / "b")], "file_capacity_gb": 0.01}, pool)
    p = Prompt(5, 9)
    assert backup(b, pool, p) == [True] * 5
    assert b.clear() is True
    assert b.batch_exists(p.keys) == 0 and b.file.size == 0
    assert backup(b, pool, p) == [True] * 5
    assert prefetch(b, pool, p) == 5
    b.close()
    assert b.batch_exists(p.keys) == 0  # closed: no store, every page a miss
    assert b.batch_get_v1(p.keys, pool.alloc(5 * PAGE)) == [False] * 5


def test_bad_configuration_is_refused(tmp_path):
    with pytest.raises(ValueError, match="file_paths"):
        backend({}, mha_pool())
    with pytest.raises(ValueError, match="unknown options"):
        backend({"file_paths": str(tmp_path), "file_path": str(tmp_path)}, mha_pool())
    with pytest.raises(ValueError, match="file_capacity_gb"):
        backend({"file_paths": str(tmp_path), "file_capacity_gb": 0}, mha_pool())
    b = backend({"file_paths": str(tmp_path), "file_capacity_gb": 0.01}, mha_pool())
    with pytest.raises(NotImplementedError, match="mamba"):
        b.register_mem_host_pool_v2(mha_pool(), "mamba")


def test_damaged_and_evicted_pages_are_misses(tmp_path):
    pool = mha_pool()
    nbytes = page_bytes_of(pool)
    cap = 12 * (nbytes + 4096 + (-nbytes) % 4096) / (1 << 30)  # 12 pages
    b = backend({"file_paths": [str(tmp_path / "kv")], "file_capacity_gb": cap, "file_direct_io": False}, pool)
    p, q = Prompt(8, 4), Prompt(8, 5)
    assert backup(b, pool, p) == [True] * 8
    assert backup(b, pool, q) == [True] * 8  # replaces p's 4 least recently used pages
    assert b.stats()["file"].pages_evicted == 4
    assert b.batch_exists(p.keys) == 0 and prefetch(b, pool, q) == 8
    # One flipped byte in each record file: those pages read False, never wrong bytes.
    for path in b.file.directories:
        for name in os.listdir(path):
            if name.endswith(".meta") or not os.path.isfile(os.path.join(path, name)):
                continue
            with open(os.path.join(path, name), "r+b") as f:
                for rec in range(12):
                    f.seek(rec * (nbytes + 4096 + (-nbytes) % 4096) + 4096 + 7)
                    c = f.read(1)
                    if c:
                        f.seek(-1, 1)
                        f.write(bytes([c[0] ^ 0x40]))
    idx = pool.alloc(8 * PAGE)
    flags = b.batch_get_v1(q.keys, idx)
    assert flags == [False] * 8
    assert b.batch_exists(q.keys) == 0  # forgotten
    assert b.stats()["file"].pages_rejected == 8


def test_random_failures_and_concurrent_prefetch_and_backup(tmp_path):
    """SGLang's failure injector around the backend (delays and failures on every call), a prefetch
    thread and a backup thread as SGLang runs them, plus a second pair: no None, no exception, and
    every page reported read holds its reference bytes."""
    pool = mha_pool(tokens=2048)
    nbytes = page_bytes_of(pool)
    cap = 48 * (nbytes + 4096 + (-nbytes) % 4096) / (1 << 30)  # 48 pages: fewer than the prompts', so replaced
    inner = backend({"file_paths": [str(tmp_path / "a"), str(tmp_path / "b")], "file_capacity_gb": cap}, pool)
    b = HiCacheStorageFailureInjector(inner, 0.002, 0.2)
    prompts = [Prompt(5 + i % 4, 100 + i) for i in range(16)]
    lock = threading.Lock()  # SGLang's host pool allocator is driven by one thread at a time
    read, errors = [0], []

    def backups(seed):
        rng = random.Random(seed)
        for _ in range(40):
            p = rng.choice(prompts)
            with lock:
                idx = pool.alloc(len(p.keys) * PAGE)
                fill(pool, idx, p.tokens)
            flags = b.batch_set_v1(p.keys, idx)
            assert isinstance(flags, list) and len(flags) == len(p.keys)
            with lock:
                pool.free(idx)

    def prefetches(seed):
        rng = random.Random(seed)
        for _ in range(60):
            p = rng.choice(prompts)
            hit = b.batch_exists(p.keys)
            assert isinstance(hit, int) and 0 <= hit <= len(p.keys)
            if hit == 0:
                continue
            with lock:
                idx = pool.alloc(hit * PAGE)
            flags = b.batch_get_v1(p.keys[:hit], idx)
            assert isinstance(flags, list) and len(flags) == hit
            for i, ok in enumerate(flags):
                if ok:
                    if not holds(pool, int(idx[i * PAGE]), p.tokens, i):
                        errors.append((p.keys[i], i))
                    with lock:
                        read[0] += 1
            with lock:
                pool.free(idx)

    failures = []

    def run(f, seed):
        try:
            f(seed)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=run, args=(f, s)) for f, s in
               [(backups, 1), (prefetches, 2), (backups, 3), (prefetches, 4)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert not errors, f"{len(errors)} pages read with wrong bytes"
    assert read[0] > 0
    assert inner.stats()["file"].pages_evicted > 0  # pages were replaced while others were read


def test_side_by_side_with_sglangs_file_backend(tmp_path):
    """Same pages, same directory: strata's and SGLang's HiCacheFile keep to their own files."""
    pool = mha_pool()
    d = str(tmp_path / "shared")
    ours = backend({"file_paths": [d], "file_capacity_gb": 0.01}, pool)
    theirs = HiCacheFile(config({"file_storage_path": d}), file_path=d)
    p = Prompt(4, 6)
    assert backup(ours, pool, p) == [True] * 4
    idx = pool.alloc(4 * PAGE)
    fill(pool, idx, p.tokens)
    assert theirs.batch_set(p.keys, [pool.get_data_page(int(idx[i * PAGE])) for i in range(4)])
    pool.free(idx)
    assert ours.batch_exists(p.keys) == 4 and theirs.batch_exists(p.keys) == 4
    assert prefetch(ours, pool, p) == 4
