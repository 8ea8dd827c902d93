# SPDX-License-Identifier: Apache-2.0
"""strata's vLLM secondary tier beside vLLM's own file-system tier (``"type": "fs"``), in one run:
same chunks (Llama-3.1-8B-shaped by default: 16-token blocks of 2 MiB, 4 blocks a chunk = 8 MiB),
same parent directory, same machine, each built by vLLM's TieringOffloadingSpec from a
``secondary_tiers`` config and driven through vLLM's TieringOffloadingManager:

- cascade: chunks land in the CPU tier (``prepare_store``, written, ``complete_store``), which
  submits them to the secondary tier; timed until the tier has finished them (``drain_jobs``);
- promotion: a restarted manager (empty CPU tier) looks every chunk up until it is a HIT in the CPU
  tier, i.e. promoted from the secondary tier; files dropped from the page cache first
  (``posix_fadvise(DONTNEED)``; strata's are ``O_DIRECT`` anyway). Every chunk served is checked.

Medians of ``--reps`` runs, GB/s of chunk bytes, and the ratios.

    python3 benchmarks/python/bench_vllm_tier.py --dir /path/on/the/drive [--chunks 96 --reps 3]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests_engines"))
import test_vllm as t  # noqa: E402  vLLM's own spec and manager, built as the tests build them
from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext  # noqa: E402

from bench_sglang_storage import drop_cache  # noqa: E402


def run_tier(tier, directory, chunks, block_bytes, blocks_per_chunk, batch):
    keys = t.chunk_keys(chunks, 1)
    kw = dict(cpu_chunks=chunks, block_bytes=block_bytes, blocks_per_chunk=blocks_per_chunk)
    m = t.spec(tier, **kw).get_manager()
    (sec,) = m.secondary_tiers
    ctx = ReqContext(req_id="writer")
    m.on_new_request(ctx)
    mem = t.primary(m)
    t0 = time.perf_counter()
    for i in range(0, chunks, batch):
        out = m.prepare_store(keys[i:i + batch], ctx)
        for k, cid in zip(out.keys_to_store, out.store_spec.block_ids):
            mem[int(cid)][:] = t.reference(k, mem.shape[1])
        m.complete_store(out.keys_to_store, ctx)
    t_written = time.perf_counter()
    sec.drain_jobs()
    t_stored = time.perf_counter()
    m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
    m.on_request_finished(ctx)
    m.shutdown()
    fill_s = t_written - t0  # writing the reference bytes into the CPU tier, not the tier's work
    store_s = t_stored - t_written
    drop_cache(directory)
    m2 = t.spec(tier, **kw).get_manager()
    t0 = time.perf_counter()
    hits = t.fetch(m2, keys)
    fetch_s = time.perf_counter() - t0
    m2.shutdown()
    assert hits == chunks, f"{hits} of {chunks} chunks promoted"
    bytes_ = chunks * mem.shape[1]
    return {"store_gbps": bytes_ / max(store_s, 1e-9) / 1e9, "fill_s": fill_s,
            "promote_gbps": bytes_ / fetch_s / 1e9}


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
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    out = {"chunk_bytes": a.block_bytes * a.blocks_per_chunk, "chunks": a.chunks, "reps": a.reps, "median": med,
           "ratios": {"store": med["strata"]["store_gbps"] / med["fs"]["store_gbps"],
                      "promote": med["strata"]["promote_gbps"] / med["fs"]["promote_gbps"]},
           "runs": runs}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
