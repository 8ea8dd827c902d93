# SPDX-License-Identifier: Apache-2.0
"""strata's SGLang HiCache backend beside SGLang's own HiCacheFile, in one run: same pages
(Llama-3.1-8B-shaped by default: 32 layers, 8 KV heads of 128 bf16, 64-token pages = 8 MiB), same
parent directory, same machine, each driven the way SGLang's cache controller drives it:

- strata: the zero-copy v1 path (``interface_v1``): ``batch_set_v1`` / ``batch_get_v1`` with the
  host pool's page regions, ``batch_exists``.
- HiCacheFile: the controller's generic path (HiCacheFile is not on its zero-copy list):
  ``batch_set`` of ``get_data_page`` tensors; ``batch_get`` into ``get_dummy_flat_data_page``
  tensors, then ``set_from_flat_data_page``; ``batch_exists``.

Reads are measured cold (each backend's files dropped from the page cache first:
``posix_fadvise(DONTNEED)``; strata's files are ``O_DIRECT`` anyway) and warm (HiCacheFile read again
at once, from the page cache). Every page read is checked against what was written. Reports the
median of ``--reps`` runs of each figure and the ratios.

    python3 benchmarks/python/bench_sglang_storage.py --dir /path/on/the/drive [--pages 64 --reps 3]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests_engines"))
import test_sglang as t  # noqa: E402  SGLang's own pool classes, built as the tests build them
from sglang.srt.mem_cache.hicache_storage import HiCacheFile  # noqa: E402

from bench_common import drop_cache  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/strata-bench-sglang")
    ap.add_argument("--pages", type=int, default=64, help="pages per batch (SGLang's STORAGE_BATCH_SIZE is 128)")
    ap.add_argument("--batches", type=int, default=2, help="batches per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t.PAGE = a.page_tokens
    tokens = a.pages * a.page_tokens
    pool = t.mha_pool("page_first", layers=a.layers, heads=a.heads, dim=a.head_dim, tokens=tokens)
    page_bytes = t.page_bytes_of(pool)
    n = a.pages * a.batches
    results = {k: [] for k in ("strata_set", "file_set", "strata_get_cold", "file_get_cold", "file_get_warm",
                               "strata_exists_us", "file_exists_us")}
    for rep in range(a.reps):
        shutil.rmtree(a.dir, ignore_errors=True)
        ours_dir, theirs_dir = os.path.join(a.dir, "strata"), os.path.join(a.dir, "hicache_file")
        cap_gb = (n + 8) * (page_bytes + 8192) / (1 << 30)
        ours = t.backend({"file_paths": [ours_dir], "file_capacity_gb": cap_gb}, pool)
        os.makedirs(theirs_dir)
        theirs = HiCacheFile(t.config({"file_storage_path": theirs_dir}), file_path=theirs_dir)
        prompts = [t.Prompt(a.pages, 1000 * rep + b) for b in range(a.batches)]
        idx = pool.alloc(tokens)
        host_pages = [int(idx[i * a.page_tokens]) for i in range(a.pages)]

        def timed(f):
            t0 = time.perf_counter()
            f()
            return time.perf_counter() - t0

        def gbps(seconds):
            return n * page_bytes / seconds / 1e9

        # Writes: the same host pages (filled per prompt) to each backend.
        s_ours = s_theirs = 0.0
        for p in prompts:
            t.fill(pool, idx, p.tokens)
            s_ours += timed(lambda: assert_all(ours.batch_set_v1(p.keys, idx)))
            s_theirs += timed(lambda: assert_true(theirs.batch_set(p.keys, [pool.get_data_page(h) for h in host_pages])))
        results["strata_set"].append(gbps(s_ours))
        results["file_set"].append(gbps(s_theirs))

        # exists of one batch's keys (leading hits), median of 20.
        for name, b in (("strata", ours), ("file", theirs)):
            lat = []
            for _ in range(20):
                t0 = time.perf_counter()
                assert b.batch_exists(prompts[0].keys) == a.pages
                lat.append((time.perf_counter() - t0) * 1e6)
            results[f"{name}_exists_us"].append(statistics.median(lat))

        # Reads, cold then (HiCacheFile) warm; every page checked.
        drop_cache(a.dir)

        def read_ours():
            for p in prompts:
                assert_all(ours.batch_get_v1(p.keys, idx))
                check(pool, host_pages, p)

        def read_theirs():
            for p in prompts:
                dummies = [pool.get_dummy_flat_data_page() for _ in p.keys]
                got = theirs.batch_get(p.keys, dummies)
                for h, d in zip(host_pages, got):
                    assert d is not None
                    pool.set_from_flat_data_page(h, d)
                check(pool, host_pages, p)

        results["strata_get_cold"].append(gbps(timed_minus_check(read_ours)))
        results["file_get_cold"].append(gbps(timed_minus_check(read_theirs)))
        results["file_get_warm"].append(gbps(timed_minus_check(read_theirs)))
        pool.free(idx)
        ours.close()
        print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in results.items()), flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    out = {
        "machine": platform.node(), "page_bytes": page_bytes, "pages": n, "reps": a.reps, "median": med,
        "ratios": {
            "set": med["strata_set"] / med["file_set"],
            "get_cold": med["strata_get_cold"] / med["file_get_cold"],
            "get_vs_file_warm": med["strata_get_cold"] / med["file_get_warm"],
            "exists_speedup": med["file_exists_us"] / med["strata_exists_us"],
        },
        "runs": results,
    }
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


check_seconds = [0.0]


def check(pool, host_pages, p):
    """Every page read holds its reference bytes (timed apart and subtracted from the read)."""
    t0 = time.perf_counter()
    for i, h in enumerate(host_pages):
        assert t.holds(pool, h, p.tokens, i), f"page {i} read wrong"
    check_seconds[0] += time.perf_counter() - t0


def timed_minus_check(f):
    check_seconds[0] = 0.0
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0 - check_seconds[0]


def assert_all(flags):
    assert all(flags), flags


def assert_true(x):
    assert x


if __name__ == "__main__":
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    main()
