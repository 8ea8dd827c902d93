# SPDX-License-Identifier: Apache-2.0
"""KV shapes of common models (``strata::models``): ``strata.models.llama31_8b.geometry(page_tokens=32)``."""

from ._strata import _model_shapes, model_shape

_shapes = dict(_model_shapes())

llama31_8b: model_shape = _shapes["llama31_8b"]  #: Llama-3.1-8B: 32 layers, 8 KV heads of 128
qwen25_14b: model_shape = _shapes["qwen25_14b"]  #: Qwen-2.5-14B: 48 layers, 8 KV heads of 128
llama31_70b: model_shape = _shapes["llama31_70b"]  #: Llama-3.1-70B: 80 layers, 8 KV heads of 128
deepseek_v3: model_shape = _shapes["deepseek_v3"]  #: DeepSeek-V3 MLA: 61 layers, one 576-element latent

__all__ = ["llama31_8b", "qwen25_14b", "llama31_70b", "deepseek_v3"]
