# SPDX-License-Identifier: Apache-2.0
import os
import sys

# The Redis servers' fixture is the Python suite's (python/tests/redis_servers.py).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A 6-node Redis Cluster (3 masters, 3 replicas) on loopback ports, for the whole session."""
    from redis_servers import redis_servers
    servers = redis_servers(tmp_path_factory.mktemp("redis"))
    yield servers
    servers.stop()
