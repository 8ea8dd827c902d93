# SPDX-License-Identifier: Apache-2.0
"""What the engines' plug-ins share (strata.sglang, strata.vllm): their options, the content keys of
an engine's page keys, and opening the keyed stores (docs/engines.md)."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, List, Optional, Tuple

import numpy as np

from . import _strata

#: Defaults of the options every plug-in takes (docs/engines.md).
STORE_DEFAULTS = {
    "file_paths": None,  # one directory per drive (a list, or a comma-separated string)
    "file_capacity_gb": 16.0,  # disk the file tier takes over all drives (preallocated)
    "file_io_threads": 8,  # I/O threads per drive
    "file_direct_io": True,  # O_DIRECT where the file system allows it
    "redis_nodes": None,  # "host:port" of cluster nodes (a list, or a comma-separated string)
    "redis_key_prefix": "strata",
    "redis_timeout_ms": 2000,  # one pipelined round's replies
    "staging_mb": 64,  # host memory per thread that gathers (scatters) a page's regions, at once
}


def content_keys_of(keys: Iterable[Any]) -> np.ndarray:
    """strata's 128-bit content keys of an engine's page keys (hash strings or bytes): the first 16
    bytes of BLAKE2b over each key, as an ``[n, 2]`` uint64 array (hi, lo)."""
    keys = list(keys)
    out = np.empty((len(keys), 2), dtype=np.uint64)
    for i, k in enumerate(keys):
        d = hashlib.blake2b(k.encode() if isinstance(k, str) else bytes(k), digest_size=16).digest()
        out[i, 0] = int.from_bytes(d[:8], "big")
        out[i, 1] = int.from_bytes(d[8:], "big")
    return out


def listed(value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def store_options(given: dict, who: str, passthrough: Iterable[str] = ()) -> dict:
    """The options with their defaults; refuses unknown ones and configurations without a store."""
    allowed = set(STORE_DEFAULTS) | set(passthrough)
    unknown = sorted(k for k in given if k not in allowed)
    if unknown:
        raise ValueError(f"{who}: unknown options {unknown}; known: {sorted(STORE_DEFAULTS)}")
    o = {**STORE_DEFAULTS, **given}
    o["file_paths"], o["redis_nodes"] = listed(o["file_paths"]), listed(o["redis_nodes"])
    if not o["file_paths"] and not o["redis_nodes"]:
        raise ValueError(f"{who}: give file_paths (one directory per drive) and/or redis_nodes "
                         "(host:port of Redis Cluster nodes)")
    if float(o["file_capacity_gb"]) <= 0:
        raise ValueError(f"{who}: file_capacity_gb must be positive, got {o['file_capacity_gb']}")
    if float(o["staging_mb"]) <= 0:
        raise ValueError(f"{who}: staging_mb must be positive, got {o['staging_mb']}")
    return o


def page_geometry(page_bytes: int, natural=None):
    """`natural` when it has `page_bytes` bytes, else a flat page of them (layers, tokens, heads 1)."""
    if natural is not None and natural.page_bytes() == page_bytes:
        return natural
    return _strata.kv_geometry(1, 1, 1, page_bytes, 1, 1)


def open_file_store(o: dict, geometry, namespace: dict, replica: int = 0):
    """A ``keyed_file_store`` over ``o["file_paths"]``, ``file_capacity_gb`` of records. A file
    store belongs to one process: data-parallel replicas (``replica`` > 0) of one namespace each
    get their own (the cluster, shared by every process, keeps the namespace as it is)."""
    if replica > 0:
        namespace = {**namespace, "model": f"{namespace['model']}#replica{replica}"}
    files = _strata.file_store_options()
    files.io_threads = int(o["file_io_threads"])
    files.use_direct_io = bool(o["file_direct_io"])
    page_bytes = geometry.page_bytes()
    record = page_bytes + 4096 + (-page_bytes) % 4096
    pages = max(1, int(float(o["file_capacity_gb"]) * (1 << 30)) // record)
    for p in o["file_paths"]:
        os.makedirs(p, exist_ok=True)
    return _strata.keyed_file_store(o["file_paths"], geometry, pages, files=files, **namespace)


def open_redis_store(o: dict, geometry, namespace: dict):
    """A ``redis_store`` over ``o["redis_nodes"]``."""
    if not _strata.redis_built:
        raise RuntimeError("redis_nodes given, but this strata was built without hiredis")
    ro = _strata.redis_store_options()
    ro.key_prefix = str(o["redis_key_prefix"])
    ro.command_timeout_ms = int(o["redis_timeout_ms"])
    return _strata.redis_store(o["redis_nodes"], geometry, options=ro, **namespace)


def read_pages(file, redis, keys: np.ndarray, ptrs: List[int], sizes: List[int], staging: int) -> np.ndarray:
    """Reads pages from the drives, then the ones they miss from the cluster; one flag per page."""
    n = len(keys)
    per = len(ptrs) // n if n else 0
    got = file.get_into(keys, ptrs, sizes, staging) if file is not None else np.zeros(n, bool)
    if redis is not None and not got.all():
        miss = np.flatnonzero(~got)
        mp = [ptrs[i * per + j] for i in miss for j in range(per)]
        ms = [sizes[i * per + j] for i in miss for j in range(per)]
        got[miss] = redis.get_into(np.ascontiguousarray(keys[miss]), mp, ms, staging)
    return got


def write_pages(file, redis, keys: np.ndarray, ptrs: List[int], sizes: List[int], staging: int) -> np.ndarray:
    """Writes pages to every store; a page is stored when one holds it."""
    done = np.zeros(len(keys), dtype=bool)
    for s in (file, redis):
        if s is not None:
            done |= s.set_from(keys, ptrs, sizes, staging)
    return done


def leading_pages(file, redis, keys: np.ndarray) -> int:
    """Leading pages held: the drives' index, then the cluster for the rest."""
    n = file.exists(keys) if file is not None else 0
    if redis is not None and n < len(keys):
        n += redis.exists(np.ascontiguousarray(keys[n:]))
    return int(n)


def held_each(file, redis, keys: np.ndarray) -> List[bool]:
    """Whether a store holds each key (keys of any prompts, in any order): the drives' index, then
    the cluster (one pipelined round) for what it lacks."""
    have = file.contains(keys) if file is not None else np.zeros(len(keys), dtype=bool)
    if redis is not None and not have.all():
        miss = np.flatnonzero(~have)
        have[miss] = redis.contains(np.ascontiguousarray(keys[miss]))
    return [bool(h) for h in have]


def open_stores(o: dict, geometry, namespace: dict, replica: int = 0):
    """``(keyed_file_store or None, redis_store or None)`` as the options ask (``replica``: as
    ``open_file_store``)."""
    file = open_file_store(o, geometry, namespace, replica) if o["file_paths"] else None
    redis = open_redis_store(o, geometry, namespace) if o["redis_nodes"] else None
    return file, redis


def stores_stats(file, redis) -> dict:
    """strata's own counters of each store (``keyed_file_store_stats``, ``redis_store_stats``)."""
    out = {}
    if file is not None:
        out["file"] = file.stats()
    if redis is not None:
        out["redis"] = redis.stats()
    return out
