# SPDX-License-Identifier: Apache-2.0
"""strata: hierarchical KV caching for LLM serving.

The names are the C++ library's (``strata::kv_geometry`` is ``strata.kv_geometry``); docs/python.md
maps the API. Arrays cross through DLPack (NumPy, PyTorch, CuPy); streams are integers
(``torch.cuda.current_stream().cuda_stream``). Errors: ``strata.InvalidArgument`` (also a
``ValueError``) for rejected input, ``strata.Error`` (a ``RuntimeError``) for the rest.
"""

from . import _strata
from ._arguments import name_arguments as _name_arguments

_name_arguments(_strata)  # before the names below are bound: type errors name the argument

from . import models  # noqa: E402
from ._strata import (  # noqa: E402
    CudaError,
    Error,
    InvalidArgument,
    OutOfMemory,
    __version__,
    adopt_result,
    batch_plan,
    cache_controller,
    cache_stats,
    content_keys,
    controller_options,
    copy_order,
    copy_plan,
    cuda_built,
    cuda_device_count,
    deferral,
    deferral_reason,
    discard_result,
    eviction_result,
    executor_stats,
    file_store,
    file_store_options,
    hf_layout,
    hiradix_config,
    hiradix_stats,
    hiradix_tree,
    cpu_controller,
    host_copy,
    insert_result,
    keyed_file_store,
    keyed_file_store_stats,
    keyed_store_rates,
    kv_geometry,
    layer_first,
    layer_first_table,
    layout_order,
    load_handle,
    match_result,
    measure_keyed_store,
    mla_layout,
    model_shape,
    node_ref,
    page_first,
    prefetch_mode,
    prefill_item,
    prefill_result,
    recovered_record,
    redis_built,
    schedule_budget,
    sglang_layout,
    started_request,
    tier,
    transient_state,
    vllm_layout,
    write_policy,
)

if redis_built:
    from ._strata import (
        redis_store,
        redis_store_options,
        redis_store_stats,
    )

if cuda_built:
    from ._strata import gpu_controller, gpu_copier, gpu_transfer, pinned_host_pool
else:

    def _without_cuda(name):
        def f(*args, **kwargs):
            raise Error(f"strata was built without CUDA: {name} is not available")

        f.__name__ = name
        f.__doc__ = "Not available: this build of strata has no CUDA parts (STRATA_PYTHON_CUDA=OFF)."
        return f

    gpu_controller = _without_cuda("gpu_controller")
    gpu_copier = _without_cuda("gpu_copier")
    pinned_host_pool = _without_cuda("pinned_host_pool")


def _file_store_open(geometry, pages, options):
    """Reopens a store's files and recovers their intact records (``file_store::open``)."""
    options.reopen = True
    return file_store(geometry, pages, options)


file_store.open = staticmethod(_file_store_open)


def gpu_available() -> bool:
    """True when this build has the CUDA parts and a CUDA device is visible."""
    return bool(cuda_built) and cuda_device_count() > 0


__all__ = [name for name in dir() if not name.startswith("_")]
