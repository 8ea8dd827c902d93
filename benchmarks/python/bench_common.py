# SPDX-License-Identifier: Apache-2.0
"""What the Python benchmarks share: dropping a directory's files from the OS page cache, and the
report of medians and ratios."""
import os


def drop_cache(directory):
    """Every file under `directory` written back and dropped from the page cache (no root needed)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def report(runs, baseline, settings, json_path=None):
    """Medians of each backend's figures, strata's ratios to `baseline`'s (store and load GB/s), the
    runs; printed as JSON and written to `json_path` when given."""
    import json
    import statistics

    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    out = {**settings, "median": med,
           "ratios": {"store": med["strata"]["store_gbps"] / med[baseline]["store_gbps"],
                      "load": med["strata"]["load_gbps"] / med[baseline]["load_gbps"]},
           "runs": runs}
    print(json.dumps(out, indent=1))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
