# SPDX-License-Identifier: Apache-2.0
"""strata's vLLM secondary tier beside vLLM's own file-system tier (``"type": "fs"``), in one run:
same chunks (Llama-3.1-8B-shaped by default: 16-token blocks of 2 MiB, 4 blocks a chunk = 8 MiB),
same parent directory, same machine, each built by vLLM's TieringOffloadingSpec from a
``secondary_tiers`` config (with vLLM's CPU tier above it) and given vLLM's own TransferJobs:

- store: the tier's ``submit_store`` jobs (``--batch`` chunks each, as the manager's cascade issues
  them) from the CPU tier's memory, timed until the tier has finished them (``drain_jobs``);
- load: after a restart (an empty CPU tier), its ``submit_load`` jobs (promotions) into the CPU
  tier's memory, timed likewise; files dropped from the page cache first
  (``posix_fadvise(DONTNEED)``; strata's are ``O_DIRECT`` anyway). Every chunk loaded is checked.

The tier is timed alone: through the manager's step loop both tiers promote at the same rate, that
of the loop.

Medians of ``--reps`` runs, GB/s of chunk bytes, and the ratios.

    python3 benchmarks/python/bench_vllm_tier.py --dir /path/on/the/drive [--chunks 96 --reps 3]
"""
import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests_engines"))
import test_vllm as t  # noqa: E402  vLLM's own spec and manager, built as the tests build them
import numpy as np  # noqa: E402
from vllm.v1.kv_offload.base import ReqContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402

from bench_common import drop_cache, report  # noqa: E402


def jobs(keys, batch, is_promotion, first_id):
    """The tier's jobs as vLLM's manager issues them: `batch` chunks each, chunk i in CPU slot i."""
    ctx = ReqContext(req_id="bench")
    return [TransferJob(job_id=first_id + j, keys=keys[i:i + batch], chunk_ids=np.arange(i, i + len(keys[i:i + batch])),
                        is_promotion=is_promotion, req_context=ctx)
            for j, i in enumerate(range(0, len(keys), batch))]


def run_tier(tier, directory, chunks, block_bytes, blocks_per_chunk, batch):
    """Stores `chunks` chunks from the CPU tier into the secondary tier, then (a restart) loads them
    back into an empty CPU tier; the tier's own jobs, timed until drained, every chunk checked."""
    keys = t.chunk_keys(chunks, 1)
    kw = dict(cpu_chunks=chunks, block_bytes=block_bytes, blocks_per_chunk=blocks_per_chunk)
    m = t.spec(tier, **kw).get_manager()
    (sec,) = m.secondary_tiers
    mem = t.primary(m)
    for i, k in enumerate(keys):
        mem[i][:] = t.reference(k, mem.shape[1])
    t0 = time.perf_counter()
    for job in jobs(keys, batch, False, 1):
        sec.submit_store(job)
    sec.drain_jobs()
    store_s = time.perf_counter() - t0
    assert all(r.success for r in sec.get_finished_jobs())
    m.shutdown()
    drop_cache(directory)
    m2 = t.spec(tier, **kw).get_manager()
    (sec2,) = m2.secondary_tiers
    mem2 = t.primary(m2)
    mem2[:] = 0xA5
    t0 = time.perf_counter()
    for job in jobs(keys, batch, True, 1000):
        sec2.submit_load(job)
    sec2.drain_jobs()
    load_s = time.perf_counter() - t0
    assert all(r.success for r in sec2.get_finished_jobs())
    for i, k in enumerate(keys):
        assert np.array_equal(mem2[i], t.reference(k, mem2.shape[1])), f"chunk {i} loaded wrong"
    m2.shutdown()
    bytes_ = chunks * mem.shape[1]
    return {"store_gbps": bytes_ / store_s / 1e9, "load_gbps": bytes_ / load_s / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/strata-bench-vllm")
    ap.add_argument("--chunks", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16, help="chunks per complete_store")
    ap.add_argument("--block-bytes", type=int, default=2 << 20, help="Llama-3.1-8B: 16 tokens = 2 MiB")
    ap.add_argument("--blocks-per-chunk", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    runs = {"strata": [], "fs": []}
    for rep in range(a.reps):
        for name in ("strata", "fs"):  # alternate nothing else between them
            shutil.rmtree(a.dir, ignore_errors=True)
            d = os.path.join(a.dir, name)
            os.makedirs(d)
            chunk = a.block_bytes * a.blocks_per_chunk
            tier = ({"file_paths": [d], "file_capacity_gb": (a.chunks + 8) * (chunk + 8192) / (1 << 30)}
                    if name == "strata" else {"type": "fs", "root_dir": d})
            runs[name].append(run_tier(tier, d, a.chunks, a.block_bytes, a.blocks_per_chunk, a.batch))
            print(f"rep {rep} {name}: {runs[name][-1]}", flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    report(runs, "fs", {"chunk_bytes": a.block_bytes * a.blocks_per_chunk, "chunks": a.chunks, "reps": a.reps}, a.json)

if __name__ == "__main__":
    main()
