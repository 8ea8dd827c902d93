# SPDX-License-Identifier: Apache-2.0
"""strata as SGLang's HiCache storage backend (its L3), through SGLang's ``dynamic`` backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "strata",
            "module_path": "strata.sglang", "class_name": "StrataHiCacheStorage",
            "interface_v1": 1, "file_paths": ["/nvme0/kv", "/nvme1/kv"], "file_capacity_gb": 512}'

Pages go to strata's keyed stores: ``keyed_file_store`` over one directory per drive
(``file_paths``) and/or ``redis_store`` over a Redis Cluster (``redis_nodes``). Both given: a page
is read from the drives first and from the cluster where the drives miss it, and written to both.
Options, namespacing and failure behaviour: docs/engines.md.

Importing this module imports SGLang (``sglang.srt.mem_cache.hicache_storage``); nothing else in
``strata`` does.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from . import _strata
from ._engine_stores import (
    content_keys_of,
    leading_pages,
    open_file_store,
    open_redis_store,
    page_geometry,
    read_pages,
    store_options,
    stores_stats,
    write_pages,
)

logger = logging.getLogger(__name__)

class _SharedExclusive:
    """Many batches at once, or one ``clear`` alone."""

    def __init__(self):
        self._cv = threading.Condition()
        self._shared = 0
        self._exclusive = False

    def __enter__(self):
        with self._cv:
            self._cv.wait_for(lambda: not self._exclusive)
            self._shared += 1

    def __exit__(self, *exc):
        with self._cv:
            self._shared -= 1
            self._cv.notify_all()

    def exclusive(self):
        lock = self

        class _Exclusive:
            def __enter__(self):
                with lock._cv:
                    lock._cv.wait_for(lambda: not lock._exclusive)
                    lock._exclusive = True
                    lock._cv.wait_for(lambda: lock._shared == 0)

            def __exit__(self, *exc):
                with lock._cv:
                    lock._exclusive = False
                    lock._cv.notify_all()

        return _Exclusive()


def _flat_host_page(t, contiguous: bool = True) -> bool:
    """Whether ``t`` is a page the stores can read or write in place: a CPU tensor (a device
    tensor's address is not the host's), contiguous where the stores write into it."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or (contiguous and not t.is_contiguous()):
        logger.error("strata HiCache: a page must be a contiguous CPU tensor, got %s",
                     f"{t.device} tensor" if isinstance(t, torch.Tensor) else type(t).__name__)
        return False
    return True


class StrataHiCacheStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` over strata's keyed stores (the zero-copy v1 interface, and the
    legacy one). Every batch reports each page: a page the stores cannot serve is ``False`` (never
    ``None``, never an exception into SGLang's prefetch or backup thread)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        """As SGLang's dynamic backend factory calls it: the storage config (its ``extra_config`` holds
        the options, docs/engines.md) and the factory's keyword arguments (unused)."""
        extra = {k: v for k, v in (storage_config.extra_config or {}).items()
                 if k not in ("backend_name", "module_path", "class_name", "interface_v1")}
        self.options = store_options(extra, "strata HiCache backend (--hicache-storage-backend-extra-config)")
        self.file_paths = self.options["file_paths"]
        self.redis_nodes = self.options["redis_nodes"]
        self.config = storage_config
        self.file: Optional[Any] = None
        self.redis: Optional[Any] = None
        self.mem_pool_host = None
        self.page_bytes = 0
        self.staging_bytes = int(float(self.options["staging_mb"]) * (1 << 20))
        self._lock = _SharedExclusive()
        self._metrics_lock = threading.Lock()
        # Kept only where SGLang collects them (get_stats runs only with storage metrics on).
        self._keep_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}

    # --- namespace and stores ----------------------------------------------------------------

    def namespace(self, pool) -> dict:
        """What a page's bytes depend on besides its tokens (strata's ``store_namespace``): the
        model and every shard SGLang splits it into, the dtype, the pool's layout and kind, the page
        shape; the TP rank and size, except for MLA, whose pages every rank shares."""
        c = self.config
        model = c.model_name or "unknown-model"
        if c.pp_size > 1:
            model += f"#pp{c.pp_rank}/{c.pp_size}"
        if c.attn_cp_size > 1:
            model += f"#cp{c.attn_cp_rank}/{c.attn_cp_size}"
        if c.dcp_size > 1:
            model += f"#dcp{c.dcp_rank}/{c.dcp_size}#page{c.logical_page_size}#tp{c.tp_size}"
        mla = bool(c.is_mla_model)
        tp_rank, tp_size = (0, 1) if mla else (c.tp_rank, c.tp_size)
        layout = f"sglang:{getattr(pool, 'layout', 'unknown')}:{'mla' if mla else 'mha'}"
        if layout == "sglang:layer_first:mha" and not (c.extra_config or {}).get("interface_v1"):
            # The legacy interface's flat page of a layer-first MHA pool is every layer's K, then
            # every layer's V; the zero-copy regions go K, V layer by layer: other bytes, other name.
            layout += ":flat"
        return {"model": model, "dtype": str(pool.dtype).replace("torch.", ""), "layout": layout,
                "tp_rank": tp_rank, "tp_size": tp_size}

    @staticmethod
    def _geometry(pool, page_bytes: int, mla: bool):
        itemsize = pool.dtype.itemsize
        try:
            if mla:
                natural = _strata.kv_geometry(pool.layer_num, pool.page_size, 1, pool.kv_cache_dim, itemsize, 1)
            else:
                natural = _strata.kv_geometry(pool.layer_num, pool.page_size, pool.head_num, pool.head_dim, itemsize,
                                              2)
        except (AttributeError, ValueError):
            natural = None
        # Other page formats (split K/V, indexer sidecars, other V widths): a flat page of the same bytes.
        return page_geometry(page_bytes, natural)

    def register_mem_pool_host(self, mem_pool_host):
        """Opens the stores once the host pool says what a page is (its regions, from
        ``get_page_buffer_meta``)."""
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        ptrs, sizes = pool.get_page_buffer_meta(torch.arange(pool.page_size, dtype=torch.int64))
        self.page_bytes = int(sum(sizes))
        self._namespace = self.namespace(pool)
        self._page_geometry = self._geometry(pool, self.page_bytes, bool(self.config.is_mla_model))
        if self.file_paths:
            c = self.config
            if c.is_mla_model and c.tp_size > 1:
                raise ValueError(
                    "strata HiCache backend: an MLA model under tensor parallelism keeps one copy of each page for "
                    "every rank (SGLang writes it from one rank only), which a file tier -- owned by one process -- "
                    "cannot serve to the other ranks' processes: give redis_nodes only (docs/engines.md)"
                )
            self._open_file()
        if self.redis_nodes:
            self.redis = open_redis_store(self.options, self._page_geometry, self._namespace)

    def _open_file(self):
        # Data-parallel attention runs a scheduler process per DP rank with the same TP coordinates.
        replica = int(getattr(self.config, "dp_rank", 0) or 0)
        self.file = open_file_store(self.options, self._page_geometry, self._namespace, replica)
        logger.info("strata HiCache: %d pages of %d bytes on %s (%d held)", self.file.capacity, self.page_bytes,
                    self.file_paths, self.file.size)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if str(host_pool_name) != "kv":
            raise NotImplementedError(
                f"strata HiCache backend stores KV pages only; pool {host_pool_name!r} (hybrid models: Mamba, "
                "SWA, indexer sidecars) is not supported"
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    # --- the v1 zero-copy interface (interface_v1: 1) ------------------------------------------

    def _regions(self, keys: List[str], host_indices: torch.Tensor):
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("no host pool registered")
        if host_indices.numel() != len(keys) * pool.page_size:
            raise ValueError(f"{host_indices.numel()} host indices for {len(keys)} pages of {pool.page_size} tokens")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        return list(ptrs), list(sizes)

    def _move(self, keys, ptrs, sizes, write: bool) -> List[bool]:
        if len(keys) == 0:
            return []
        move = write_pages if write else read_pages
        return move(self.file, self.redis, content_keys_of(keys), ptrs, sizes, self.staging_bytes).tolist()

    def _batch(self, keys, host_indices, write: bool) -> List[bool]:
        what = "batch_set_v1" if write else "batch_get_v1"
        t0 = time.perf_counter()
        try:
            with self._lock:
                ptrs, sizes = self._regions(keys, host_indices)
                result = self._move(keys, ptrs, sizes, write)
        except Exception:  # never into SGLang's thread: every page of the batch fails
            logger.exception("strata HiCache %s of %d pages failed", what, len(keys))
            return [False] * len(keys)
        seconds = time.perf_counter() - t0
        ok = sum(result)
        if not self._keep_metrics:
            return result
        with self._metrics_lock:
            side = "backup" if write else "prefetch"
            self._metrics[f"{side}_pgs"].append(ok)
            if seconds > 0:
                self._metrics[f"{side}_bandwidth"].append(ok * self.page_bytes / seconds / 1e9)
        return result

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Reads pages into the host pool's pages at ``host_indices``; one flag per page."""
        return self._batch(keys, host_indices, False)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Writes the host pool's pages at ``host_indices``; one flag per page (true when a store
        holds it, already or now)."""
        return self._batch(keys, host_indices, True)

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading pages of ``keys`` a store holds (the drives' index, then the cluster
        for the rest)."""
        try:
            with self._lock:
                return leading_pages(self.file, self.redis, content_keys_of(keys))
        except Exception:
            logger.exception("strata HiCache batch_exists of %d keys failed", len(keys))
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- the legacy interface (flat page tensors) -------------------------------------------

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """Reads one page into ``target_location`` (a flat page tensor); returns it, or ``None``
        when no store has the page intact."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """Reads pages into flat page tensors in one batch; each is returned, or ``None`` when no
        store has the page intact (or its tensor is not a contiguous CPU tensor)."""
        if target_locations is None or len(target_locations) != len(keys):
            logger.error("strata HiCache batch_get: give one target tensor per key")
            return [None] * len(keys)
        ok = [False] * len(keys)
        try:
            usable = [i for i, t in enumerate(target_locations) if _flat_host_page(t)]
            with self._lock:
                got = self._move([keys[i] for i in usable], [target_locations[i].data_ptr() for i in usable],
                                 [target_locations[i].numel() * target_locations[i].element_size() for i in usable],
                                 False)
            for i, g in zip(usable, got):
                ok[i] = g
        except Exception:
            logger.exception("strata HiCache batch_get of %d pages failed", len(keys))
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Writes flat page tensors in one batch; true when every page is stored."""
        if values is None or len(values) != len(keys):
            logger.error("strata HiCache batch_set: give one value tensor per key")
            return False
        try:
            if not all(_flat_host_page(v, contiguous=False) for v in values):
                return False
            pages = [v.contiguous() for v in values]  # kept alive while the stores read them
            with self._lock:
                return all(self._move(keys, [p.data_ptr() for p in pages],
                                      [p.numel() * p.element_size() for p in pages], True))
        except Exception:
            logger.exception("strata HiCache batch_set of %d pages failed", len(keys))
            return False

    # --- housekeeping -------------------------------------------------------------------------

    def get_stats(self):
        """SGLang's ``StorageMetrics`` since the last call: pages and GB/s of each get and set batch."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:  # metrics not importable here: SGLang then logs none
            return None
        m = StorageMetrics()
        with self._metrics_lock:
            for name, values in self._metrics.items():
                getattr(m, name).extend(values)
                values.clear()
        return m

    def stats(self) -> dict:
        """strata's own counters of each store."""
        return stores_stats(self.file, self.redis)

    def clear(self) -> bool:
        """Forgets every page of the file tier (its namespace's files are removed and made anew).
        The Redis Cluster is shared with other instances and is left as it is."""
        if self.file is None:
            return True
        try:
            with self._lock.exclusive():
                dirs = list(self.file.directories)
                self.file = None  # closes the files
                for d in dirs:
                    shutil.rmtree(d, ignore_errors=True)
                self._open_file()
            return True
        except Exception:
            logger.exception("strata HiCache clear failed")
            return False

    def close(self):
        """Waits for the stores' transfers in flight and closes them."""
        with self._lock.exclusive():
            self.file = None
            self.redis = None
