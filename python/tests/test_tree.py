# SPDX-License-Identifier: Apache-2.0
"""hiradix_tree from Python: match / insert / evict / load / complete / take_copies, result objects."""
import numpy as np
import pytest

import strata


def tree(device=16, host=32, policy=strata.write_policy.write_back):
    c = strata.hiradix_config()
    c.page_tokens = 4
    c.capacity = [device, host, 0, 0]
    c.backup_policy = policy
    return strata.hiradix_tree(c)


def test_insert_match_probe():
    t = tree()
    tokens = np.arange(10, dtype=np.int32)  # two whole pages and a partial one
    r = t.insert(tokens, [3, 5])
    assert r.new_pages == 2 and r.unused_device_pages == []
    m = t.probe(list(range(10)) + [99])
    assert m.tokens == 8 and m.device_prefix_tokens == 8
    assert t.path_pages(m.node, strata.tier.device) == [3, 5]
    assert t.peek([0, 1, 2, 3]) == 4
    assert t.match(range(8)).tokens == 8  # any sequence of ints
    assert t.stats().matched_tokens == 8
    t.check_invariants()
    again = t.insert(range(8), [7, 9])
    assert again.unused_device_pages == [7, 9]  # duplicates: the caller frees them


def test_write_back_eviction_then_load():
    t = tree()
    r = t.insert(range(8), [0, 1])
    ev = t.evict(strata.tier.device, 2)
    assert ev.pages == 2 and len(ev.demotions) == 1
    d = ev.demotions[0]
    assert (d.from_tier, d.to_tier, d.demotion) == (strata.tier.device, strata.tier.host, True)
    assert sorted(d.from_pages) == [0, 1] and len(d.to_pages) == 2
    freed = t.complete(d.id)
    assert sorted(freed) == [0, 1]
    m = t.match(range(8))
    assert m.tokens == 8 and m.device_prefix_tokens == 0 and m.fastest_tokens[1] == 8
    assert t.pages_to_load(m.node) == 2
    orders = t.load(m.node, [4, 6])
    assert [(o.from_tier, o.to_tier) for o in orders] == [(strata.tier.host, strata.tier.device)]
    assert t.complete(orders[0].id) == []
    assert t.probe(range(8)).device_prefix_tokens == 8
    t.check_invariants()
    assert r.node == r.node and isinstance(hash(r.node), int)


def test_write_through_backups_and_locks():
    t = tree(policy=strata.write_policy.write_through)
    r = t.insert(range(4), [2])
    copies = t.take_copies()
    assert len(copies) == 1 and copies[0].to_tier == strata.tier.host
    assert t.pending_transfers() == 1
    t.lock(r.node, strata.tier.device)
    assert t.locks(r.node, strata.tier.device) == 1
    assert t.complete(copies[0].id) == []
    assert t.evict(strata.tier.device, 1).pages == 0  # locked
    t.unlock(r.node, strata.tier.device)
    ev = t.evict(strata.tier.device, 1)
    assert ev.pages == 1 and ev.freed == [2] and ev.demotions == []  # the host holds a copy
    t.check_invariants()


def test_transient_marks_and_delay_hits():
    t = tree()
    assert t.mark_in_queue(7, range(16)) == 16
    m = t.probe(range(16))
    assert m.transient_tokens == 16 and m.transient_owner == 7
    assert m.transient == strata.transient_state.in_queue
    t.mark_in_flight(7)
    node = t.commit(7, [0, 1, 2, 3])
    assert t.path_length(node) == 4
    assert t.probe(range(16)).device_prefix_tokens == 16


def test_tree_rejections():
    t = tree()
    with pytest.raises(ValueError):
        t.insert(range(8), [0])  # one page id for two pages
    with pytest.raises(ValueError):
        t.insert(range(4), [99])  # outside the device pool
    with pytest.raises(TypeError):
        t.match("abcd")
    with pytest.raises(TypeError):
        t.match([2**40])  # not an int32 token id
    with pytest.raises(ValueError):
        strata.hiradix_tree(strata.hiradix_config())  # no device capacity
