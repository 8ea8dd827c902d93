# SPDX-License-Identifier: Apache-2.0
"""strata as a secondary tier of vLLM's tiered KV offloading, driven through vLLM's own classes
(vllm 0.34.0, installed with --no-deps by scripts/test_engines.sh): vLLM's TieringOffloadingSpec
builds its CPU primary tier and, from the "secondary_tiers" config, strata's tier; the test plays
vLLM's scheduler and GPU worker against vLLM's TieringOffloadingManager (prepare_store, writing the
chunks, complete_store — which cascades to strata —, lookups that promote from strata, prepare_load).

A chunk's reference bytes come from a generator seeded by its key alone; every chunk the manager
serves must hold them.
"""
import glob
import hashlib
import itertools
import os
import time

import numpy as np
import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from strata.vllm import StrataSecondaryTier

BLOCK_BYTES = 16 * 2 * 2 * 64 * 2 * 2  # 16 tokens, 2 layers, K and V, 2 heads of 64 bf16
# vLLM names its CPU tier's shared memory (/dev/shm) by engine id: one per manager, so that a run that
# dies without shutting down leaves nothing a later one trips on.
_engines = itertools.count()


@pytest.fixture(autouse=True, scope="module")
def _no_shared_memory_left():
    """Removes what a manager that failed to start leaves in /dev/shm."""
    yield
    for f in glob.glob(f"/dev/shm/vllm_offload_strata-test-{os.getpid()}-*"):
        os.remove(f)


def spec(tier, cpu_chunks=64, model="meta-llama/Llama-3.1-8B", dtype="bfloat16", block_bytes=BLOCK_BYTES,
         blocks_per_chunk=1, dp=(0, 1)):
    """vLLM's tiering spec: a CPU primary tier of `cpu_chunks` chunks above one secondary tier
    (strata's unless `tier` names another "type")."""
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers.0", "layers.1"), group_id=0),),
        worker_kv_bytes_per_block=block_bytes, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": cpu_chunks * block_bytes * blocks_per_chunk,
                      "secondary_tiers": [{"type": "strata", "module_path": "strata.vllm", **tier}]},
        engine_id=f"strata-test-{os.getpid()}-{next(_engines)}", model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=dp[0], data_parallel_size=dp[1],
                                          data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True))
    return TieringOffloadingSpec(cfg)


def chunk_keys(n, seed):
    """Chained block hashes of a prompt, as vLLM's offloading keys (hash + KV group index)."""
    h, keys = hashlib.sha256(f"prompt-{seed}".encode()).digest(), []
    for i in range(n):
        h = hashlib.sha256(h + i.to_bytes(4, "little")).digest()
        keys.append(make_offload_key(h, 0))
    return keys


def reference(key, nbytes):
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little")).integers(
        0, 256, nbytes, dtype=np.uint8)


def primary(m):
    view = np.asarray(m.primary_tier.get_kv_memoryview())
    return view.reshape(view.shape[0], -1).view(np.uint8)


def step(m, until, timeout=10.0):
    """Scheduler steps until `until()` holds."""
    end = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < end, "timed out waiting for the offloading manager"
        m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        time.sleep(0.002)


def tier_of(m, kind=StrataSecondaryTier):
    (t,) = m.secondary_tiers
    assert isinstance(t, kind)
    return t


def offload(m, keys, req="writer"):
    """The GPU worker's store into the CPU tier, then complete_store (which cascades to strata)."""
    ctx = ReqContext(req_id=req)
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    assert out is not None and list(out.keys_to_store) == list(keys)
    mem = primary(m)
    for k, cid in zip(out.keys_to_store, out.store_spec.block_ids):
        mem[int(cid)][:] = reference(k, mem.shape[1])
    m.complete_store(out.keys_to_store, ctx)
    (t,) = m.secondary_tiers
    step(m, lambda: not t.has_pending_work() and not m.has_pending_work())
    m.on_request_finished(ctx)


def fetch(m, keys, req="reader"):
    """The scheduler's lookups (promoting from strata) until every key is a HIT, then prepare_load:
    every chunk served is checked against its reference bytes. Returns how many were HITs."""
    ctx = ReqContext(req_id=req)
    m.on_new_request(ctx)
    results = {}

    def all_settled():
        for k in keys:
            r = m.lookup(k, ctx)
            results[k] = r
        return all(r in (LookupResult.HIT, LookupResult.MISS) for r in results.values())

    step(m, all_settled)
    hits = [k for k in keys if results[k] is LookupResult.HIT]
    if hits:
        spec_ = m.prepare_load(hits, ctx)
        mem = primary(m)
        for k, cid in zip(hits, spec_.block_ids):
            assert np.array_equal(mem[int(cid)], reference(k, mem.shape[1])), "chunk served with wrong bytes"
        m.complete_load(hits, ctx)
    m.on_request_finished(ctx)
    return len(hits)


def test_chunks_cascade_to_the_drives_and_come_back_after_a_restart(tmp_path):
    tier = {"file_paths": [str(tmp_path / "d0"), str(tmp_path / "d1")], "file_capacity_gb": 0.01}
    keys = chunk_keys(12, 1)
    m = spec(tier).get_manager()
    offload(m, keys)
    st = tier_of(m).stats()["file"]
    assert st.pages_written == 12
    assert fetch(m, keys) == 12  # from the CPU tier
    m.shutdown()
    # A restart: an empty CPU tier; every chunk is promoted from strata's drives.
    m2 = spec(tier).get_manager()
    assert fetch(m2, keys) == 12
    assert tier_of(m2).stats()["file"].pages_read == 12
    assert fetch(m2, chunk_keys(3, 99)) == 0  # never stored: a MISS
    m2.shutdown()


def test_namespaces_and_the_cpu_tier_evicting_to_strata(tmp_path):
    tier = {"file_paths": str(tmp_path / "kv"), "file_capacity_gb": 0.01}
    m = spec(tier, cpu_chunks=16).get_manager()
    first, second = chunk_keys(12, 2), chunk_keys(12, 3)
    offload(m, first, "a")
    offload(m, second, "b")  # the CPU tier (16 chunks) evicts most of `first`
    assert fetch(m, first, "c") == 12  # promoted back from strata as needed
    assert tier_of(m).stats()["file"].pages_read >= 12 - 16 + 12  # at least what the CPU tier evicted
    m.shutdown()
    other = spec(tier, dtype="float16").get_manager()  # same sizes, another dtype
    assert fetch(other, first) == 0
    other.shutdown()


def test_data_parallel_replicas_each_own_their_drives(tmp_path):
    """vLLM runs an engine process per data-parallel replica, each with the same run config: each
    gets a file store of its own on the same drives (one process owns a store's files)."""
    tier = {"file_paths": str(tmp_path / "kv"), "file_capacity_gb": 0.01}
    replicas = [spec(tier, dp=(r, 2)).get_manager() for r in range(2)]
    keys = chunk_keys(6, 5)
    offload(replicas[1], keys)
    assert tier_of(replicas[1]).stats()["file"].pages_written == 6
    assert tier_of(replicas[0]).stats()["file"].pages_written == 0
    dirs = {d for m in replicas for d in tier_of(m).file.directories}
    assert len(dirs) == 2
    for m in replicas:
        m.shutdown()
    again = spec(tier, dp=(1, 2)).get_manager()  # replica 1 restarted: its own chunks
    assert fetch(again, keys) == 6
    again.shutdown()


def test_bad_tier_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="file_paths"):
        spec({}).get_manager()
    with pytest.raises(ValueError, match="unknown options"):
        spec({"file_paths": str(tmp_path), "root_dir": str(tmp_path)}).get_manager()


def test_shared_cluster_through_vllms_async_lookups(redis_cluster, tmp_path):
    nodes = redis_cluster.addresses()[:2]
    keys = chunk_keys(8, 4)
    a = spec({"redis_nodes": nodes}, model="vllm-redis-share").get_manager()
    offload(a, keys)
    assert tier_of(a).stats()["redis"].pages_written == 8
    # Another instance (drives empty, the same cluster): RETRY while vLLM's lookup thread asks the
    # cluster, then promotions from it.
    b = spec({"redis_nodes": nodes, "file_paths": str(tmp_path / "b"), "file_capacity_gb": 0.01},
             model="vllm-redis-share").get_manager()
    assert fetch(b, keys) == 8
    assert tier_of(b).stats()["redis"].pages_read == 8
    a.shutdown()
    b.shutdown()
