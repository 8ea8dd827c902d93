# SPDX-License-Identifier: Apache-2.0
"""keyed_file_store from Python, and the region path every keyed store has (get_into / set_from:
pages as several regions of host memory, as SGLang's get_page_buffer_meta gives them)."""
import numpy as np
import pytest

import strata


def regions(rows, parts):
    """Each row of `rows` split into `parts` regions, listed page by page (pointers, sizes)."""
    ptrs, sizes = [], []
    step = rows.shape[1] // parts
    for r in range(rows.shape[0]):
        for j in range(parts):
            ptrs.append(rows[r, j * step:].ctypes.data)
            sizes.append(step)
    return ptrs, sizes


def test_pages_by_content_on_drives_and_through_regions(tmp_path, geo):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    s = strata.keyed_file_store(dirs, geo, 32, model="python-keyed-test", dtype="float16")
    assert s.capacity == 32 and s.size == 0 and s.page_bytes == geo.page_bytes()
    assert all("strata-" in d for d in s.directories)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50000, size=16 * 12).astype(np.int32)
    keys = strata.content_keys(ids, 16)
    pages = rng.integers(0, 256, size=(12, geo.page_bytes()), dtype=np.uint8)
    # Written as 4 regions a page (staging of one page: every chunk boundary crossed), read back as 2.
    assert s.set_from(keys[1:], *regions(pages[1:], 4), staging_bytes=geo.page_bytes()).all()
    assert s.exists(keys) == 0 and s.contains(keys).tolist() == [False] + [True] * 11
    assert s.set_from(keys[:1], *regions(pages[:1], 4)).all()
    assert s.exists(keys) == 12
    out = np.zeros_like(pages)
    assert s.get_into(keys, *regions(out, 2)).all()
    assert (out == pages).all()
    rows = np.zeros_like(pages)
    assert s.get(keys, rows).all() and (rows == pages).all()
    st = s.stats()
    assert st.pages_written == 12 and st.pages_read == 24
    rates = strata.measure_keyed_store(s, 4)
    assert rates.read_bytes_per_s > 0
    del s
    again = strata.keyed_file_store(dirs, geo, 32, model="python-keyed-test", dtype="float16")
    assert again.exists(keys) == 12  # kept across a restart
    assert strata.keyed_file_store(dirs, geo, 32, model="python-keyed-test", dtype="bfloat16").exists(keys) == 0


def test_regions_are_checked_before_anything_moves(tmp_path, geo):
    s = strata.keyed_file_store([str(tmp_path)], geo, 8, model="m", dtype="float16")
    keys = strata.content_keys(list(range(64)), 16)
    pages = np.zeros((4, geo.page_bytes()), np.uint8)
    ptrs, sizes = regions(pages, 2)
    with pytest.raises(ValueError, match="split evenly"):
        s.set_from(keys, ptrs[:-1], sizes[:-1])
    with pytest.raises(ValueError, match="bytes in its regions"):
        s.set_from(keys, ptrs, [sz - 16 for sz in sizes])
    with pytest.raises(ValueError, match="null"):
        s.set_from(keys, [0] + ptrs[1:], sizes)
    with pytest.raises(ValueError, match="pointers and"):
        s.get_into(keys, ptrs, sizes[:1])
    assert s.size == 0 and s.exists(keys) == 0
    with pytest.raises(ValueError, match="pages must be at least 1"):
        strata.keyed_file_store([str(tmp_path / "x")], geo, 0, model="m", dtype="float16")


@pytest.mark.skipif(not strata.redis_built, reason="the module was built without hiredis")
def test_redis_store_moves_regions_too(redis_cluster, geo):
    s = strata.redis_store(redis_cluster.addresses()[:1], geo, model="python-keyed-regions", dtype="float16")
    rng = np.random.default_rng(4)
    keys = strata.content_keys(rng.integers(0, 50000, size=16 * 5).astype(np.int32), 16)
    pages = rng.integers(0, 256, size=(5, geo.page_bytes()), dtype=np.uint8)
    assert s.set_from(keys[:4], *regions(pages[:4], 2)).all()
    assert s.contains(keys).tolist() == [True] * 4 + [False]
    assert s.set_from(keys, *regions(pages, 2)).all()
    out = np.zeros_like(pages)
    assert s.get_into(keys, *regions(out, 8)).all() and (out == pages).all()
