# SPDX-License-Identifier: Apache-2.0
"""strata as an LMCache L2 store through LMCache's ``native_plugin`` adapter::

    l2_adapters:
      - type: native_plugin
        module_path: strata.lmcache
        class_name: StrataConnector
        adapter_params: {object_bytes: 4194304, file_paths: [/nvme0/strata, /nvme1/strata],
                         file_capacity_gb: 512}

LMCache hands the connector key strings (``<model>@<kv_rank>@<group>@<chunk hash>[@salt]``: the model
and rank are in every key) and a memoryview per object; ``object_bytes`` is the size of a full chunk
(``chunk_size`` tokens of the model's KV for one rank). A smaller object (a prompt's last, partial
chunk) is stored padded to it; a larger one is refused (``False``). Every ``submit_*`` returns a
future id at once; the batch runs on the connector's threads (reads apart from writes, so a write
never queues a read) and its completion is announced on ``event_fd()`` and returned by
``drain_completions()``. Options of the stores: docs/engines.md.

This module imports nothing of LMCache: LMCache loads it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ._engine_stores import (
    content_keys_of,
    held_each,
    open_stores,
    page_geometry,
    read_pages,
    store_options,
    stores_stats,
    write_pages,
)

logger = logging.getLogger(__name__)

Completion = Tuple[int, bool, str, Optional[List[bool]]]


class StrataConnector:
    """LMCache's native connector interface (``event_fd``, ``submit_batch_get`` / ``_set`` /
    ``_exists``, ``drain_completions``, ``close``) over strata's keyed stores."""

    def __init__(self, object_bytes: int, namespace: str = "", load_threads: int = 2, store_threads: int = 2,
                 **options: Any):
        who = "strata LMCache connector (adapter_params)"
        self.options = store_options(options, who)
        if int(object_bytes) <= 0:
            raise ValueError(f"{who}: object_bytes must be positive, got {object_bytes}")
        if int(load_threads) < 1 or int(store_threads) < 1:
            raise ValueError(f"{who}: load_threads and store_threads must be at least 1")
        self.object_bytes = int(object_bytes)
        self.page_bytes = -(-self.object_bytes // 16) * 16
        g = page_geometry(self.page_bytes)
        ns = {"model": f"lmcache:{namespace}", "dtype": "bytes", "layout": "lmcache:object", "tp_rank": 0,
              "tp_size": 1}
        self.staging_bytes = int(float(self.options["staging_mb"]) * (1 << 20))
        self.file, self.redis = open_stores(self.options, g, ns)
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ids = itertools.count(1)
        self._done: List[Completion] = []
        self._lock = threading.Lock()
        self._reads = ThreadPoolExecutor(int(load_threads), thread_name_prefix="strata_lmcache_get")
        self._writes = ThreadPoolExecutor(int(store_threads), thread_name_prefix="strata_lmcache_set")
        self._closed = False

    # --- LMCache's interface -------------------------------------------------------------------

    def event_fd(self) -> int:
        """Readable when completions are waiting (an eventfd)."""
        return self._efd

    def submit_batch_get(self, keys: Sequence[str], memviews: Sequence[memoryview]) -> int:
        """Reads each key's object into its memoryview; per-key results."""
        return self._submit(self._reads, self._get, list(keys), list(memviews))

    def submit_batch_set(self, keys: Sequence[str], memviews: Sequence[memoryview]) -> int:
        """Writes each memoryview under its key; per-key results (true too for a key held)."""
        return self._submit(self._writes, self._set, list(keys), list(memviews))

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        """Which keys a store holds; per-key results, the batch ``ok`` when it ran (LMCache reads an
        exists batch's per-key results only when ``ok``: a miss among hits is not a failure)."""
        return self._submit(self._reads, self._exists, list(keys), ok_when="ran")

    def drain_completions(self) -> List[Completion]:
        """``(future_id, ok, error, per-key results)`` of every batch finished since the last call."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Finishes the batches submitted, then closes the stores."""
        if self._closed:
            return
        self._closed = True
        self._reads.shutdown(wait=True)
        self._writes.shutdown(wait=True)
        self.file = None
        self.redis = None
        os.close(self._efd)

    # --- the batches (on the connector's threads) ------------------------------------------------

    def _submit(self, pool: ThreadPoolExecutor, task, *args, ok_when: str = "all") -> int:
        """Runs ``task(*args)`` on ``pool``; its completion's ``ok`` is true when every key succeeded
        (``ok_when="all"``: gets and sets) or when the batch ran (``"ran"``: exists)."""
        if self._closed:
            raise RuntimeError("strata LMCache connector: closed")
        fid = next(self._ids)
        pool.submit(self._run, fid, ok_when, task, *args)
        return fid

    def _run(self, fid: int, ok_when: str, task, *args) -> None:
        try:
            flags = [bool(f) for f in task(*args)]
            done: Completion = (fid, ok_when == "ran" or all(flags), "", flags)
        except Exception as e:  # a batch that fails as a whole: every key false
            logger.exception("strata LMCache connector: batch %d failed", fid)
            done = (fid, False, f"{type(e).__name__}: {e}", [False] * len(args[0]))
        with self._lock:
            self._done.append(done)
        os.eventfd_write(self._efd, 1)

    def _split(self, memviews):
        """Arrays over the memoryviews; the objects that fit a page (a larger one is refused) and a
        zeroed page-sized row for each smaller one; one page-sized region per object that fits."""
        arrays = [np.frombuffer(mv, dtype=np.uint8) for mv in memviews]
        fits = []
        for i, a in enumerate(arrays):
            if a.size <= self.page_bytes:
                fits.append(i)
            else:
                logger.error("strata LMCache connector: an object of %d bytes exceeds object_bytes=%d", a.size,
                             self.object_bytes)
        padded = {i: np.zeros(self.page_bytes, dtype=np.uint8) for i in fits if arrays[i].size < self.page_bytes}
        ptrs = [padded[i].ctypes.data if i in padded else arrays[i].ctypes.data for i in fits]
        return arrays, fits, padded, ptrs

    def _get(self, keys: List[str], memviews: List[memoryview]) -> np.ndarray:
        arrays, fits, padded, ptrs = self._split(memviews)
        ok = np.zeros(len(keys), dtype=bool)
        if fits:
            ok[fits] = read_pages(self.file, self.redis, content_keys_of([keys[i] for i in fits]), ptrs,
                                  [self.page_bytes] * len(fits), self.staging_bytes)
        for i, row in padded.items():
            if ok[i]:
                arrays[i][:] = row[: arrays[i].size]
        return ok

    def _set(self, keys: List[str], memviews: List[memoryview]) -> np.ndarray:
        arrays, fits, padded, ptrs = self._split(memviews)
        for i, row in padded.items():
            row[: arrays[i].size] = arrays[i]
        ok = np.zeros(len(keys), dtype=bool)
        if fits:
            ok[fits] = write_pages(self.file, self.redis, content_keys_of([keys[i] for i in fits]), ptrs,
                                   [self.page_bytes] * len(fits), self.staging_bytes)
        return ok

    def _exists(self, keys: List[str]) -> List[bool]:
        return held_each(self.file, self.redis, content_keys_of(keys))

    def stats(self) -> dict:
        """strata's own counters of each store."""
        return stores_stats(self.file, self.redis)

