# SPDX-License-Identifier: Apache-2.0
"""A call with an argument of the wrong type says which argument, and changes nothing."""

import numpy as np
import pytest
import strata


@pytest.fixture
def cache():
    g = strata.kv_geometry(layers=2, page_tokens=16, kv_heads=2, head_dim=8, elem_bytes=2)
    k = [np.zeros((64, 2, 8), np.float16) for _ in range(2)]
    v = [np.zeros((64, 2, 8), np.float16) for _ in range(2)]
    return g, k, v, strata.cpu_controller(strata.sglang_layout(k, v, g), host_pages=8)


@pytest.mark.parametrize(
    "args, kwargs, named",
    [
        (("x", [1, 2, 3]), {}, "argument 'id' must be int: got str"),
        ((1, [1, 2, "a"]), {}, "argument 'tokens' .* its element 2 does not fit int: got str"),
        ((1, 5), {}, "argument 'tokens' must be .*: got int"),
        ((1, [1, 2, 3]), {"max_new_tokens": 1.5}, "argument 'max_new_tokens' must be int: got float"),
        ((1, [1, 2, 3]), {"arrival_s": "soon"}, "argument 'arrival_s' must be float: got str"),
        ((1, [1, 2, 3]), {"max_new": 1}, "has no argument 'max_new' \\(its arguments: id, tokens, prompt_tokens"),
    ],
)
def test_submit_names_the_argument(cache, args, kwargs, named):
    c = cache[3]
    with pytest.raises(TypeError, match=named) as e:
        c.submit(*args, **kwargs)
    assert "cache_controller.submit()" in str(e.value)
    assert "incompatible function arguments" in str(e.value)  # nanobind's own message follows
    assert c.waiting() == 0 and c.live_requests() == 0


def test_functions_and_methods_name_the_argument(cache):
    g, k, v, c = cache
    with pytest.raises(TypeError, match="sglang_layout\\(\\): argument 'geometry' must be strata._strata.kv_geometry"):
        strata.sglang_layout(k, v, "g")
    with pytest.raises(TypeError, match="cache_controller.page_table\\(\\): argument 'id' must be int: got list"):
        c.page_table([1])
    with pytest.raises(TypeError, match="cpu_controller\\(\\): argument 'host_pages' must be int: got str"):
        strata.cpu_controller(strata.sglang_layout(k, v, g), host_pages="8")


def test_right_calls_are_unchanged(cache):
    c = cache[3]
    assert c.submit.__name__ == "submit" and c.submit.__doc__ == strata._strata.cache_controller.submit.__doc__
    c.submit(1, np.arange(40, dtype=np.int32), max_new_tokens=2)  # a NumPy array passes as before
    assert c.waiting() == 1
    with pytest.raises(ValueError, match="already live"):  # other errors pass through untouched
        c.submit(1, [1, 2, 3])
