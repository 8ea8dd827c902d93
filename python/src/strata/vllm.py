# SPDX-License-Identifier: Apache-2.0
"""strata as a secondary tier of vLLM's tiered KV offloading (below its CPU tier)::

    vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-transfer-config '{
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 68719476736,
        "secondary_tiers": [{"type": "strata", "module_path": "strata.vllm",
                             "file_paths": ["/nvme0/strata", "/nvme1/strata"], "file_capacity_gb": 512}]}}'

Chunks go to strata's keyed stores: ``keyed_file_store`` over one directory per drive
(``file_paths``) and/or ``redis_store`` (``redis_nodes``), with the options of docs/engines.md.
Every method returns at once: copies run on the tier's own threads (loads apart from stores, so a
store never queues a load), lookups answer from the drives' index in memory, or, with a cluster,
through vLLM's own asynchronous lookup machinery.

Importing this module imports vLLM (``vllm.v1.kv_offload.tiering``); nothing else in ``strata`` does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, List

import numpy as np
from vllm.v1.kv_offload.base import Locality, LookupResult, Medium, OffloadKey, ReqContext
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
)

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

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

logger = logging.getLogger(__name__)


class _ClusterLookups(AsyncLookupManager):
    """vLLM's asynchronous lookups, answered by the drives' index and then the cluster."""

    def __init__(self, tier: "StrataSecondaryTier", tier_type: str):
        self._tier = tier
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: List[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier._held(keys)


class StrataSecondaryTier(SecondaryTierManager):
    """vLLM's ``SecondaryTierManager`` over strata's keyed stores. A chunk is one primary-tier slot
    (``primary_kv_view.strides[0]`` bytes), stored as one page."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: "OffloadingSpec", primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None, locality: str | None = None, load_threads: int = 2,
                 store_threads: int = 2, **options: Any):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        self.options = store_options(options, f"strata vLLM tier {tier_type!r} (secondary_tiers entry)")
        if int(load_threads) < 1 or int(store_threads) < 1:
            raise ValueError(f"strata vLLM tier: load_threads and store_threads must be at least 1, "
                             f"got {load_threads} and {store_threads}")
        self._base = np.asarray(primary_kv_view).ctypes.data
        self._view = primary_kv_view  # keeps the memory the pointers name
        bs = self.block_size_bytes
        self.namespace = self._namespace(offloading_spec)
        g = page_geometry(bs)
        self.staging_bytes = int(float(self.options["staging_mb"]) * (1 << 20))
        # One engine process per data-parallel replica, each with this namespace.
        replica = int(getattr(getattr(getattr(offloading_spec, "config", None), "parallel", None),
                              "data_parallel_index", 0) or 0)
        self.file, self.redis = open_stores(self.options, g, self.namespace, replica)
        if os.environ.get("PYTHONHASHSEED") is None:
            logger.warning("strata vLLM tier: PYTHONHASHSEED is not set, so vLLM seeds its block hashes at random "
                           "in each process: chunks stored now are never found after a restart or by another "
                           "instance (set it to the same value everywhere; docs/engines.md)")
        self._loads = ThreadPoolExecutor(int(load_threads), thread_name_prefix="strata_vllm_load")
        self._stores = ThreadPoolExecutor(int(store_threads), thread_name_prefix="strata_vllm_store")
        self._finished: queue.SimpleQueue[JobResult] = queue.SimpleQueue()
        self._in_flight: set[Future] = set()
        self._in_flight_lock = threading.Lock()
        self._job_keys: dict[int, tuple[list, bool]] = {}  # scheduler thread only: keys, is a store
        self._lookups = _ClusterLookups(self, tier_type) if self.redis is not None else None

    @staticmethod
    def _namespace(spec) -> dict:
        """vLLM's own account of what a chunk's bytes depend on (the file tier's run config: model,
        dtype, block and chunk sizes, KV groups and their layers, parallelism unless the layout is
        parallelism-agnostic, canonical format), hashed into the store's namespace."""
        mapper = FileMapper.from_offloading_spec(root_dir="", offloading_spec=spec,
                                                 blocks_per_file=spec.blocks_per_chunk, parallel_agnostic=True)
        run = mapper.get_run_config()
        digest = hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()[:32]
        return {"model": f"vllm:{run.get('model_name', '')}#{digest}", "dtype": str(run.get("dtype", "unknown")),
                "layout": "vllm:chunk", "tp_rank": 0, "tp_size": 1}

    # --- lookups -------------------------------------------------------------------------------

    def _held(self, keys: List[OffloadKey]) -> List[bool]:
        return held_each(self.file, self.redis, content_keys_of(keys))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT or MISS from the drives' index (memory only); with a cluster, RETRY until vLLM's
        lookup thread has asked it."""
        try:
            if self._lookups is None:
                return LookupResult.HIT if self.file.exists(content_keys_of([key])) == 1 else LookupResult.MISS
            found = self._lookups.lookup(key, req_context)
            if found is None:
                return LookupResult.RETRY
            return LookupResult.HIT if found else LookupResult.MISS
        except Exception:
            logger.exception("strata vLLM tier: lookup failed")
            return LookupResult.MISS

    # --- jobs ----------------------------------------------------------------------------------

    def _submit(self, pool: ThreadPoolExecutor, task, *args) -> None:
        f = pool.submit(task, *args)
        with self._in_flight_lock:
            self._in_flight.add(f)
        f.add_done_callback(self._done)

    def _done(self, f: Future) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(f)

    def _regions(self, chunk_ids) -> tuple[list[int], list[int]]:
        bs = self.block_size_bytes
        return [self._base + int(c) * bs for c in chunk_ids], [bs] * len(chunk_ids)

    def _store(self, job_id: int, keys: list, chunk_ids) -> None:
        t0 = time.perf_counter()
        try:
            ptrs, sizes = self._regions(chunk_ids)
            ok = bool(write_pages(self.file, self.redis, content_keys_of(keys), ptrs, sizes, self.staging_bytes).all())
        except Exception:
            logger.exception("strata vLLM tier: store job %s failed", job_id)
            ok = False
        self._finished.put(JobResult(job_id=job_id, success=ok, transfer_time=time.perf_counter() - t0,
                                     transfer_bytes=len(keys) * self.block_size_bytes))

    def _load(self, job_id: int, keys: list, chunk_ids) -> None:
        t0 = time.perf_counter()
        try:
            ptrs, sizes = self._regions(chunk_ids)
            flags = read_pages(self.file, self.redis, content_keys_of(keys), ptrs, sizes, self.staging_bytes)
        except Exception:
            logger.exception("strata vLLM tier: load job %s failed", job_id)
            flags = np.zeros(len(keys), dtype=bool)
        ok = bool(flags.all())
        good = tuple(k for k, f in zip(keys, flags) if f)
        self._finished.put(JobResult(job_id=job_id, success=ok, successful_keys=None if ok else good,
                                     transfer_time=time.perf_counter() - t0,
                                     transfer_bytes=int(flags.sum()) * self.block_size_bytes))

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Writes the job's primary-tier slots on the store threads (pages held already are kept)."""
        keys = list(job_metadata.keys)
        self._job_keys[job_metadata.job_id] = (keys, True)
        self._submit(self._stores, self._store, job_metadata.job_id, keys, np.array(job_metadata.chunk_ids))

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Reads the job's chunks into its primary-tier slots on the load threads."""
        keys = list(job_metadata.keys)
        self._job_keys[job_metadata.job_id] = (keys, False)
        self._submit(self._loads, self._load, job_metadata.job_id, keys, np.array(job_metadata.chunk_ids))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while True:
            try:
                r = self._finished.get_nowait()
            except queue.Empty:
                break
            keys, is_store = self._job_keys.pop(r.job_id, ([], False))
            if self._lookups is not None:
                if is_store and r.success:
                    self._lookups.mark_present(keys)
                elif not is_store and not r.success:
                    good = set(r.successful_keys or ())
                    self._lookups.mark_miss([k for k in keys if k not in good])
            out.append(r)
        return out

    def has_pending_work(self) -> bool:
        with self._in_flight_lock:
            return bool(self._in_flight) or not self._finished.empty()

    def drain_jobs(self) -> None:
        """Waits for every job submitted; their results stay for ``get_finished_jobs``."""
        with self._in_flight_lock:
            pending = list(self._in_flight)
        wait(pending)

    # --- requests and lifetime -----------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._lookups is not None:
            self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._lookups is not None:
            self._lookups.flush()

    def stats(self) -> dict:
        """strata's own counters of each store."""
        return stores_stats(self.file, self.redis)

    def shutdown(self) -> None:
        self.drain_jobs()
        self._loads.shutdown(wait=True)
        self._stores.shutdown(wait=True)
        if self._lookups is not None:
            self._lookups.shutdown()
        self.file = None
        self.redis = None


#: The name vLLM looks up for ``{"type": "strata", "module_path": "strata.vllm"}``.
strata = StrataSecondaryTier
