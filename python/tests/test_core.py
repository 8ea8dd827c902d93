# SPDX-License-Identifier: Apache-2.0
"""Geometry, errors, layouts over NumPy arrays, copy plans and host_copy."""
import gc
import importlib.metadata
import pathlib

import numpy as np
import pytest

import strata
from conftest import sglang_pool


def test_version_matches_the_headers():
    assert strata.__version__ == importlib.metadata.version("strata")


def test_stubs_are_installed_and_name_the_api():
    stub = pathlib.Path(strata._strata.__file__).with_name("_strata.pyi")
    assert stub.exists(), "the build generates _strata.pyi with nanobind's stubgen"
    text = stub.read_text()
    for name in ("class kv_geometry", "class hiradix_tree", "class cache_controller", "def cpu_controller",
                 "def host_copy", "class layer_first_table", "def submit"):
        assert name in text, name
    assert (stub.parent / "py.typed").exists()


def test_geometry_and_models(geo):
    assert geo.page_bytes() == 2 * 2 * 16 * 2 * 16 * 2
    assert geo.block_bytes() == 16 * 2 * 16 * 2
    assert geo == strata.kv_geometry(2, 16, 2, 16)
    g = strata.models.llama31_8b.geometry(page_tokens=32)
    assert (g.layers, g.kv_heads, g.head_dim, g.planes) == (32, 8, 128, 2)
    assert g.token_bytes() == 128 * 1024
    assert strata.models.deepseek_v3.geometry(32).planes == 1
    assert strata.models.llama31_70b.geometry(32, tensor_parallel=8).kv_heads == 1


def test_errors_map_to_python_exceptions():
    with pytest.raises(strata.InvalidArgument, match="layers must be positive"):
        strata.kv_geometry(0, 16, 2, 16)
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError ...
        strata.kv_geometry(2, 16, 2, 16, planes=3)
    with pytest.raises(ValueError, match="elem_bytes must be 1 \\(fp8\\), 2 \\(bf16, fp16\\), 4 \\(fp32\\) or 8, got 3"):
        strata.kv_geometry(2, 16, 2, 16, elem_bytes=3)
    assert issubclass(strata.InvalidArgument, strata.Error)  # ... and a strata.Error
    assert issubclass(strata.Error, RuntimeError)
    assert issubclass(strata.OutOfMemory, MemoryError)
    with pytest.raises(ValueError, match="does not divide"):
        strata.models.llama31_8b.geometry(32, tensor_parallel=3)


def test_layout_checks(geo):
    pages = 4
    rows = pages * geo.page_tokens
    ok = [np.zeros((rows, 2, 16), np.float16) for _ in range(4)]
    assert strata.layer_first_table(ok, geo).num_pages == pages
    with pytest.raises(TypeError, match="elements of 32 bits"):
        strata.layer_first_table([np.zeros((rows, 2, 16), np.float32)] * 4, geo)
    with pytest.raises(ValueError, match="last dimension must be head_dim"):
        strata.layer_first_table([np.zeros((rows, 16, 2), np.float16)] * 4, geo)
    with pytest.raises(TypeError, match="C-contiguous"):
        strata.layer_first_table([np.zeros((rows, 2, 32), np.float16)[:, :, :16]] * 4, geo)
    with pytest.raises(ValueError, match="expected layers \\* planes = 4 arrays"):
        strata.layer_first_table(ok[:3], geo)
    with pytest.raises(ValueError, match="bytes"):
        strata.layer_first_table([ok[0], ok[1], ok[2], np.zeros((rows - 16, 2, 16), np.float16)], geo)
    ro = np.zeros((rows, 2, 16), np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        strata.layer_first_table([ro] * 4, geo)
    with pytest.raises(TypeError, match="expected an array"):
        strata.layer_first_table(["not an array"] * 4, geo)
    with pytest.raises(ValueError, match="whole number of pages"):
        strata.layer_first(np.zeros(100, np.float16).reshape(-1, 4)[:, :4].copy(), strata.kv_geometry(2, 16, 2, 4))
    with pytest.raises(ValueError, match="expected 2 K and 2 V arrays"):
        strata.sglang_layout(ok[:2], ok[:1], geo)
    # K passed as V, or views of one array, would overwrite each other's pages.
    with pytest.raises(ValueError, match="arrays 0 and 1 share memory"):
        strata.sglang_layout(ok[:2], [ok[0], np.zeros_like(ok[1])], geo)  # layer 0's K is its V
    big = np.zeros((rows + 16, 2, 16), np.float16)
    with pytest.raises(ValueError, match="arrays 1 and 2 share memory"):
        strata.layer_first_table([ok[0], big[:rows], big[16:], ok[3]], geo)
    assert strata.layer_first_table([ok[0], ok[1], np.zeros_like(ok[2]), ok[3]], geo).num_pages == pages
    with pytest.raises(ValueError, match="expected shape"):
        strata.hf_layout([np.zeros((1, 3, 32, 16), np.float16)] * 2, [np.zeros((1, 3, 32, 16), np.float16)] * 2, geo)
    with pytest.raises(ValueError, match="num_pages must be positive"):
        strata.layer_first(np.zeros((2, 2, 16, 2, 16), np.float16), geo, num_pages=0)


def test_layout_keeps_its_arrays_alive(geo):
    k, v, pool = sglang_pool(geo, 2)
    k[0][:] = 7
    del k, v
    gc.collect()
    assert all(a.shape == (32, 2, 16) for a in pool.arrays)
    assert float(pool.arrays[0][3, 1, 2]) == 7.0  # layer 0's K: the array the layout holds


def random_pool(rng, shape, dtype=np.float16):
    return rng.integers(0, 30000, size=shape, dtype=np.uint16).view(dtype)


def test_host_copy_transposes_between_engine_layouts(geo):
    """sglang (token-major) -> page_first records -> hf (head-major) -> layer_first: every byte lands."""
    rng = np.random.default_rng(1)
    pages = 6
    k = [random_pool(rng, (pages * 16, 2, 16)) for _ in range(2)]
    v = [random_pool(rng, (pages * 16, 2, 16)) for _ in range(2)]
    src = strata.sglang_layout(k, v, geo)
    records = np.zeros((4 * geo.page_bytes() // 32, 16), np.float16)
    pf = strata.page_first(records, geo)
    pairs = [(5, 0), (2, 1), (0, 3)]
    plan = strata.copy_plan(src, pf, pairs)
    plan.validate()
    assert plan.bytes() == 3 * geo.page_bytes()
    assert len(plan.runs()) >= 1
    strata.host_copy(plan)
    rec = records.reshape(4, 2, 2, 16, 2, 16)  # [page][layer][plane][tokens][heads][dim]
    for s, d in pairs:
        for layer in range(2):
            np.testing.assert_array_equal(rec[d, layer, 0], k[layer][s * 16:(s + 1) * 16])
            np.testing.assert_array_equal(rec[d, layer, 1], v[layer][s * 16:(s + 1) * 16])

    hk = [np.zeros((2, 2, 64, 16), np.float16) for _ in range(2)]  # batch 2, capacity 64: 4 pages each
    hv = [np.zeros((2, 2, 64, 16), np.float16) for _ in range(2)]
    hf = strata.hf_layout(hk, hv, geo)
    assert hf.num_pages == 8 and hf.pages_per_sequence == 4
    strata.host_copy(pf, hf, np.array([[0, 5], [1, 6], [3, 7]], dtype=np.int64))  # batch entry 1, tokens 16..63
    for (s, _), d in zip(pairs, (5, 6, 7)):
        t0 = (d % 4) * 16
        for layer in range(2):
            np.testing.assert_array_equal(hk[layer][1, :, t0:t0 + 16, :], k[layer][s * 16:(s + 1) * 16].transpose(1, 0, 2))
            np.testing.assert_array_equal(hv[layer][1, :, t0:t0 + 16, :], v[layer][s * 16:(s + 1) * 16].transpose(1, 0, 2))
    assert not hk[0][0].any()  # nothing else was written

    lf_mem = np.zeros((2, 2, 8, 16, 2, 16), np.float16)
    lf = strata.layer_first(lf_mem, geo)
    strata.host_copy(hf, lf, [(7, 2)], layers=(1, 2))  # one layer only
    np.testing.assert_array_equal(lf_mem[1, 0, 2], k[1][0:16])
    assert not lf_mem[0].any()


def test_copy_plan_rejections(geo):
    _, _, a = sglang_pool(geo, 4)
    _, _, b = sglang_pool(geo, 4)
    with pytest.raises(ValueError, match="out of range"):
        strata.host_copy(a, b, [(0, 4)])
    with pytest.raises(ValueError, match="more than once"):
        strata.host_copy(a, b, [(0, 1), (2, 1)])
    with pytest.raises(ValueError, match="no pages"):
        strata.host_copy(a, b, [])
    with pytest.raises(ValueError, match="layer range"):
        strata.host_copy(a, b, [(0, 0)], layers=(1, 1))
    other = strata.kv_geometry(2, 16, 2, 16, planes=2, elem_bytes=2)
    k = [np.zeros((64, 1, 16), np.float16) for _ in range(2)]
    v = [np.zeros((64, 1, 16), np.float16) for _ in range(2)]
    c = strata.sglang_layout(k, v, strata.kv_geometry(2, 16, 1, 16))
    with pytest.raises(ValueError, match="geometry"):
        strata.host_copy(a, c, [(0, 0)])
    with pytest.raises(TypeError, match="expected a strata layout"):
        strata.copy_plan(a, "b", [(0, 0)])
    assert other == geo


def test_block_addresses(geo):
    mem = np.zeros((2, 2, 4, 16, 2, 16), np.float16)
    lf = strata.layer_first(mem, geo)
    addr, token_stride, head_stride = lf.block(3, 1, 0)
    assert addr == mem.ctypes.data + ((1 * 2 + 0) * 4 + 3) * geo.block_bytes()
    assert (token_stride, head_stride) == (geo.row_bytes(), geo.head_bytes())
    with pytest.raises(IndexError):
        lf.block(4, 0, 0)
