# SPDX-License-Identifier: Apache-2.0
"""strata's LMCache connector beside LMCache's own native file-system connector (``fs_native``), in
one run: both built by LMCache's own factories and wrapped by its NativeConnectorL2Adapter, given the
same chunks (8 MiB by default: a 256-token chunk of Llama-3.1-8B is 32 MiB, of a TP8 shard 4 MiB) in
LMCache's TensorMemoryObj, same parent directory, same machine. Store tasks of ``--batch`` chunks,
then (after closing the adapter and dropping the page cache: ``posix_fadvise(DONTNEED)``) load tasks
into fresh objects in a new adapter; every chunk loaded is checked. ``fs_native`` runs with
``use_odirect`` as given (LMCache's default: off) and its default 4 workers.

    python3 benchmarks/python/bench_lmcache_l2.py --dir /path/on/the/drive [--chunks 96 --reps 3]
"""
import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests_engines"))
import test_lmcache as t  # noqa: E402  LMCache's own factories and memory objects, as the tests use them
from lmcache.v1.distributed.l2_adapters.fs_native_l2_adapter import (  # noqa: E402
    FSNativeL2AdapterConfig,
    _create_fs_native_l2_adapter,
)

from bench_common import drop_cache, report  # noqa: E402


def make(kind, d, chunk, odirect, cap_gb):
    if kind == "strata":
        t.OBJECT = chunk  # the adapter's object_bytes
        return t.adapter({"file_paths": [d], "file_capacity_gb": cap_gb})
    return _create_fs_native_l2_adapter(FSNativeL2AdapterConfig.from_dict(
        {"type": "fs_native", "base_path": d, "use_odirect": odirect}))


def run(kind, d, chunks, chunk, batch, odirect, cap_gb):
    ks = t.keys(chunks, 7)
    sizes = [chunk] * chunks
    a = make(kind, d, chunk, odirect, cap_gb)
    objs = []
    for k in ks:
        o = t.memory_obj(chunk)
        o.raw_data.numpy()[:] = t.reference(k, chunk)
        objs.append(o)
    t0 = time.perf_counter()
    tasks = [a.submit_store_task(ks[i:i + batch], objs[i:i + batch]) for i in range(0, chunks, batch)]
    done = {}
    while len(done) < len(tasks):
        done.update(a.pop_completed_store_tasks())
        time.sleep(0.0005)
    store_s = time.perf_counter() - t0
    assert all(int(done[x]) >= 0 for x in tasks), "a store task failed"
    a.close()
    drop_cache(d)
    b = make(kind, d, chunk, odirect, cap_gb)
    fresh = [t.memory_obj(chunk) for _ in ks]
    t0 = time.perf_counter()
    tasks = [b.submit_load_task(ks[i:i + batch], fresh[i:i + batch]) for i in range(0, chunks, batch)]
    got = {}
    while len(got) < len(tasks):
        for x in tasks:
            if x not in got:
                r = b.query_load_result(x)
                if r is not None:
                    got[x] = r
        time.sleep(0.0005)
    load_s = time.perf_counter() - t0
    for x in tasks:
        assert got[x].popcount() == got[x].size(), "a chunk did not load"
    for k, o in zip(ks, fresh):
        assert (o.raw_data.numpy() == t.reference(k, chunk)).all(), "a chunk loaded wrong"
    b.close()
    n = chunks * chunk
    return {"store_gbps": n / store_s / 1e9, "load_gbps": n / load_s / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/strata-bench-lmcache")
    ap.add_argument("--chunks", type=int, default=96)
    ap.add_argument("--chunk-bytes", type=int, default=8 << 20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--odirect", action="store_true", help="fs_native with use_odirect")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    runs = {"strata": [], "fs_native": []}
    cap = (a.chunks + 8) * (a.chunk_bytes + 8192) / (1 << 30)
    for rep in range(a.reps):
        for kind in runs:
            shutil.rmtree(a.dir, ignore_errors=True)
            d = os.path.join(a.dir, kind)
            os.makedirs(d)
            runs[kind].append(run(kind, d, a.chunks, a.chunk_bytes, a.batch, a.odirect, cap))
            print(f"rep {rep} {kind}: {runs[kind][-1]}", flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    report(runs, "fs_native", {"chunk_bytes": a.chunk_bytes, "chunks": a.chunks, "odirect": a.odirect, "reps": a.reps}, a.json)

if __name__ == "__main__":
    main()
