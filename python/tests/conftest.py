# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

import strata


@pytest.fixture
def geo():
    """2 layers, 16-token pages, 2 KV heads of 16 fp16 elements, K and V: 4 KiB pages."""
    return strata.kv_geometry(layers=2, page_tokens=16, kv_heads=2, head_dim=16, elem_bytes=2, planes=2)


def sglang_pool(g, pages, dtype=np.float16):
    """Per-layer K and V arrays [pages * page_tokens, kv_heads, head_dim] and their layout."""
    k = [np.zeros((pages * g.page_tokens, g.kv_heads, g.head_dim), dtype) for _ in range(g.layers)]
    v = [np.zeros((pages * g.page_tokens, g.kv_heads, g.head_dim), dtype) for _ in range(g.layers)]
    return k, v, strata.sglang_layout(k, v, g)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A 6-node Redis Cluster (3 masters, 3 replicas) on loopback ports, for the whole session."""
    from redis_servers import redis_servers
    servers = redis_servers(tmp_path_factory.mktemp("redis"))
    yield servers
    servers.stop()
