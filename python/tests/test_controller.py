# SPDX-License-Identifier: Apache-2.0
"""The CPU cache controller from Python: the engine loop of examples/engine_loop.cpp with NumPy pools,
every cached page checked against what the "model" computed; the file tier; rejections; threads."""
import threading
import time

import numpy as np
import pytest

import strata
from conftest import sglang_pool


def page_value(tokens, p):
    """What page p holds: it depends on every token up to the page's end (as a model's KV does)."""
    return np.float16((hash(tuple(tokens[: (p + 1) * 16])) % 2000) / 8.0)


class engine:
    """A toy engine over an SGLang-like NumPy pool; the "model" fills pages with page_value."""

    attempts = 10  # schedule rounds before a request that never ran fails the test

    def __init__(self, g, device_pages, host_pages, options=None, file_store=None, remote_store=None):
        self.g = g
        self.k, self.v, self.pool = sglang_pool(g, device_pages)
        self.cache = strata.cpu_controller(self.pool, host_pages, options=options, file_store=file_store,
                                           remote_store=remote_store)
        self.checked = 0

    def compute(self, tokens, p, page):
        for layer in range(self.g.layers):
            self.k[layer][page * 16:(page + 1) * 16] = page_value(tokens, p)
            self.v[layer][page * 16:(page + 1) * 16] = -page_value(tokens, p)

    def check(self, tokens, p, page):
        for layer in range(self.g.layers):
            assert (self.k[layer][page * 16:(page + 1) * 16] == page_value(tokens, p)).all()
            assert (self.v[layer][page * 16:(page + 1) * 16] == -page_value(tokens, p)).all()
        self.checked += 1

    def settle(self):
        """Waits for every copy in flight (record I/O on the file store's threads included) and
        completes it in the index."""
        while self.cache.poll():
            self.cache.synchronize()

    def run(self, rid, tokens, max_new=8):
        """Submits, schedules until it runs, computes, checks cached pages; returns cached pages per tier."""
        c = self.cache
        c.submit(rid, tokens, max_new_tokens=max_new)
        for attempt in range(self.attempts):
            if attempt >= 10:  # held back: a lookup or prefetch on a store's threads
                time.sleep(0.002)
                self.settle()
            plan = c.schedule(tokens=4096)
            loads = c.begin_loads(plan)
            for layer in range(self.g.layers):
                assert c.wait_layer(loads, layer)
            mine = [it for it in loads.ran if it.id == rid]
            if not mine:
                assert c.complete(loads)
                continue
            it = mine[0]
            started = [s for s in loads.started if s.id == rid][0]
            table = c.page_table(rid)
            cached = sum(started.cached_pages)
            for p in range(it.context_tokens // 16, len(tokens) // 16):
                self.compute(tokens, p, table[p])
            assert c.complete(loads)
            for p in range(cached):
                self.check(tokens, p, table[p])
            c.finish_prefill(rid)
            c.release(rid)
            c.poll()
            return started.cached_pages
        raise AssertionError(f"request {rid} never ran")


def test_engine_loop_with_host_tier(geo):
    e = engine(geo, device_pages=12, host_pages=64)
    rng = np.random.default_rng(3)
    docs = [list(rng.integers(0, 30000, size=128)) for _ in range(3)]  # 8 pages each
    rid = 0
    for turn in range(3):
        for d in docs:
            rid += 1
            q = list(rng.integers(30000, 31000, size=int(rng.integers(5, 30))))
            cached = e.run(rid, d + q)
            if turn > 0:
                assert sum(cached) == 8, cached  # the document, from the device or the host
    s = e.cache.stats()
    assert s.hit_tokens[1] > 0, "some documents came back from the host tier"
    assert s.bytes_moved[1][0] > 0 and s.bytes_moved[0][1] > 0
    assert e.checked > 0
    e.cache.check_invariants()
    assert e.cache.live_requests() == 0


def test_evict_then_load_back_is_exact(geo):
    e = engine(geo, device_pages=16, host_pages=16)
    doc = list(range(1000, 1064))  # 4 pages
    assert e.run(1, doc + [1, 2, 3]) == [0, 0, 0, 0]
    assert e.cache.evict(strata.tier.device, 16) >= 4
    for a in e.k + e.v:
        a[:] = 0  # the device copy is gone
    assert e.run(2, doc + [4, 5]) == [0, 4, 0, 0]  # all four pages from the host
    assert e.checked == 4


def test_options_and_state(geo):
    o = strata.controller_options()
    o.backup_policy = strata.write_policy.write_back
    o.prefetch = strata.prefetch_mode.off
    o.delay_hit_tokens = 32
    e = engine(geo, 8, 8, options=o)
    c = e.cache
    assert c.options.backup_policy == strata.write_policy.write_back
    assert c.tiers == [strata.tier.device, strata.tier.host]
    assert c.capacity(strata.tier.host) == 8 and c.page_tokens == 16
    assert c.executor == "host" and c.geometry == geo
    assert c.device_pages_available() == 8
    c.submit(1, list(range(40)))
    assert c.waiting() == 1
    m = c.probe(list(range(40)))
    assert m.tokens == 0
    c.release(1)  # aborts a waiting request
    assert c.live_requests() == 0 and c.stats().released == 1


def test_device_pages_chunk_by_chunk(geo):
    o = strata.controller_options()
    assert not o.device_pages_by_chunk  # the default: the first chunk takes all
    o.device_pages_by_chunk = True
    e = engine(geo, 16, 16, options=o)
    c = e.cache
    c.submit(1, list(range(2000, 2064)), max_new_tokens=16)  # 4 prompt pages of 16 tokens, 1 output page
    sizes = []
    for _ in range(4):
        loads = c.begin_loads(c.schedule(tokens=16))
        assert [it.new_pages for it in loads.ran] == [1 if len(sizes) < 3 else 2]
        sizes.append(len(c.page_table(1)))
        c.complete(loads)
    assert sizes == [1, 2, 3, 5]  # the last chunk also takes the output's page
    assert c.device_pages_available() == 11
    c.release(1)
    c.check_invariants()


def test_rejections_change_nothing(geo):
    e = engine(geo, 8, 8)
    c = e.cache
    c.submit(1, list(range(20)))
    with pytest.raises(strata.InvalidArgument, match="already live"):
        c.submit(1, list(range(20)))
    with pytest.raises(ValueError, match="at least one token"):
        c.submit(2, list(range(20)), max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt_tokens must not be negative"):
        c.submit(2, list(range(20)), prompt_tokens=-5)
    with pytest.raises(ValueError, match="arrival_s must be finite and not negative, got nan"):
        c.submit(2, list(range(20)), arrival_s=float("nan"))
    assert c.live_requests() == 1 and c.waiting() == 1
    with pytest.raises(ValueError, match="unknown or released"):
        c.page_table(99)
    with pytest.raises(ValueError, match="has not started"):
        c.page_table(1)
    with pytest.raises(ValueError, match="takes no stream"):
        c.poll(stream=5)
    with pytest.raises(ValueError, match="token budget"):
        c.schedule(tokens=0)
    plan = c.schedule()
    c.schedule()  # a newer plan: the old one is stale
    with pytest.raises(ValueError, match="not the last one scheduled"):
        c.begin_loads(plan)
    with pytest.raises(ValueError, match="no file tier"):
        c.evict(strata.tier.file, 1)
    other = engine(geo, 8, 8).cache
    other.submit(5, list(range(20)))
    loads = other.begin_loads(other.schedule())
    with pytest.raises(ValueError, match="another controller"):
        c.complete(loads)
    with pytest.raises(TypeError, match="layer_first_table"):
        strata.cpu_controller(strata.page_first(np.zeros(geo.page_bytes() // 2, np.float16).reshape(-1, 16), geo), 4)
    with pytest.raises(ValueError, match="host_pages|num_pages|capacity"):
        strata.cpu_controller(e.pool, -1)
    c.check_invariants()
    assert c.live_requests() == 1 and c.waiting() == 1


def test_layer_first_pool(geo):
    mem = np.zeros((2, 2, 8, 16, 2, 16), np.float16)
    c = strata.cpu_controller(strata.layer_first(mem, geo), 8)
    c.submit(1, list(range(33)))
    loads = c.begin_loads(c.schedule())
    assert [it.id for it in loads.ran] == [1]
    assert c.wait_after(c.finish_prefill(1)) is True  # no load fills its table
    assert not c.failed(1)
    c.release(1, list(range(33)) + [7] * 20)  # keeps the answer's whole pages too
    c.poll()
    assert c.probe(list(range(33)) + [7] * 20).tokens == 48


def buffered_store_options(tmp_path):
    """file_store options in tmp_path with plain buffered I/O (tmpfs refuses O_DIRECT)."""
    opts = strata.file_store_options(str(tmp_path))
    opts.use_direct_io = False
    return opts


def test_file_tier(geo, tmp_path):
    opts = buffered_store_options(tmp_path)
    fs = strata.file_store(geo, 32, opts)
    o = strata.controller_options()
    o.file_backup_policy = strata.write_policy.write_through
    assert o.records_by_cost and o.record_write_backlog_s == 1.0
    o.records_by_cost = False  # these tiny pages are cheaper to recompute than to write and read
    e = engine(geo, device_pages=8, host_pages=8, options=o, file_store=fs)
    assert e.cache.tiers == [strata.tier.device, strata.tier.host, strata.tier.file]
    doc = list(range(500, 564))  # 4 pages
    e.run(1, doc + [1])
    e.settle()  # the writes to the file tier land on the store's own threads
    assert fs.slots_used() == 4, "write-through to the file tier"
    assert e.cache.evict(strata.tier.device, 8) == 4
    e.settle()
    assert e.cache.evict(strata.tier.host, 8) == 4
    e.settle()
    for a in e.k + e.v:
        a[:] = 0
    cached = e.run(2, doc + [2])
    # From the host (prefetched at submit) or the file; the cost model may also judge the file tier
    # slower than recomputing these tiny pages (then nothing is loaded). What is loaded is exact.
    assert cached[0] == 0 and sum(cached) in (0, 4), cached
    assert e.checked == sum(cached)


def test_file_tier_keeps_out_what_is_cheaper_to_recompute(geo, tmp_path):
    opts = buffered_store_options(tmp_path)
    fs = strata.file_store(geo, 32, opts)
    o = strata.controller_options()  # the defaults: write-through to the file tier, records by cost
    e = engine(geo, device_pages=8, host_pages=8, options=o, file_store=fs)
    e.run(1, list(range(500, 564)) + [1])
    e.cache.poll()
    s = e.cache.stats()
    # A tiny model's page costs less to prefill than to write and read back at the default disk
    # rates: the file tier stays empty, and stats say why.
    assert fs.slots_used() == 0
    assert s.writes_not_worth[2] >= 4  # [tier]: 2 is the file tier
    assert s.writes_dropped[2] == 0


def written_then_reopened(geo, opts, doc):
    """A controller over a new store of `opts` serves `doc` (its 4 pages written through to the
    file tier), goes away with the store; returns the store reopened and a controller over it."""
    import gc

    o = strata.controller_options()
    o.file_backup_policy = strata.write_policy.write_through
    o.records_by_cost = False  # keep every page, whatever it costs to read back
    fs = strata.file_store(geo, 16, opts)
    e = engine(geo, 8, 8, options=o, file_store=fs)
    e.run(1, doc + [9])
    e.cache.poll()
    del e, fs
    gc.collect()
    fs = strata.file_store.open(geo, 16, opts)
    assert len(fs.recovered) == 4
    return fs, engine(geo, 8, 8, options=o, file_store=fs)


def test_file_store_restart(geo, tmp_path):
    doc = list(range(700, 764))
    fs, e = written_then_reopened(geo, buffered_store_options(tmp_path), doc)
    assert e.cache.stats().restored_pages == 4
    assert e.cache.probe(doc).tokens == 64


def test_file_store_over_several_directories(geo, tmp_path):
    import gc

    opts = buffered_store_options(tmp_path / "unused")
    opts.directory = ""
    opts.directories = [str(tmp_path / "drive0"), str(tmp_path / "drive1")]
    fs = strata.file_store(geo, 16, opts)
    assert fs.directories == opts.directories
    assert [fs.drive(s) for s in range(4)] == [0, 1, 0, 1]
    with pytest.raises(strata.InvalidArgument, match="out of range"):
        fs.drive(16)
    del fs
    gc.collect()
    doc = list(range(300, 364))
    fs, e = written_then_reopened(geo, opts, doc)
    assert {fs.drive(r.slot) for r in fs.recovered} == {0, 1}  # striped over both
    assert e.cache.probe(doc).tokens == 64
    del e, fs
    gc.collect()
    swapped = buffered_store_options(tmp_path / "unused")
    swapped.directory = ""
    swapped.directories = list(reversed(opts.directories))
    with pytest.raises(strata.Error, match="another number or order"):
        strata.file_store.open(geo, 16, swapped)


def test_controller_keeps_layout_and_file_store_alive(geo, tmp_path):
    k, v, pool = sglang_pool(geo, 8)
    c = strata.cpu_controller(pool, 8)
    del k, v, pool
    import gc

    gc.collect()
    assert c.layout.num_pages == 8
    c.submit(1, list(range(40)))
    c.begin_loads(c.schedule())
    c.finish_prefill(1)
    c.release(1)
    assert c.poll() == 0


def test_poll_from_a_helper_thread(geo):
    """Blocking calls release the GIL: a polling thread runs beside the engine thread."""
    e = engine(geo, device_pages=12, host_pages=64)
    stop = threading.Event()
    polls = [0]

    def poller():
        while not stop.is_set():
            e.cache.poll()
            polls[0] += 1

    t = threading.Thread(target=poller)
    t.start()
    try:
        rng = np.random.default_rng(5)
        docs = [list(rng.integers(0, 30000, size=96)) for _ in range(3)]
        for i in range(12):
            e.run(i + 1, docs[i % 3] + [int(x) for x in rng.integers(30000, 31000, size=9)])
    finally:
        stop.set()
        t.join()
    assert polls[0] > 0
    e.cache.check_invariants()


def test_file_tier_costs(geo):
    o = strata.controller_options()
    assert o.file_read_bytes_per_s is None  # the H200 default, chosen by the controller
    o.set_file_tier(geo, 12e9, 6e9)
    assert o.file_read_bytes_per_s == 12e9
    with pytest.raises(strata.InvalidArgument, match="read bandwidth"):
        o.set_file_tier(geo, 0.0, 1e9)
    assert o.file_read_bytes_per_s == 12e9  # unchanged
    k, v, pool = sglang_pool(geo, 8)
    c = strata.cpu_controller(pool, 8, options=o)
    assert c.options.file_read_bytes_per_s == 12e9
    other = strata.controller_options()
    other.set_file_tier(strata.kv_geometry(geo.layers, 32, geo.kv_heads, geo.head_dim, geo.elem_bytes, 2), 1e9, 1e9)
    with pytest.raises(ValueError, match="tokens"):
        strata.cpu_controller(pool, 8, options=other)  # a cost model for another page size
