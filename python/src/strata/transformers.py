# SPDX-License-Identifier: Apache-2.0
"""Hugging Face transformers on strata: a cached prefix reused by ``model.generate`` unchanged.

``StrataKVPool`` is a paged KV pool in strata's SGLang-like layout (per layer one K and one V tensor
``[pages * page_tokens, kv_heads, head_dim]``; for DeepSeek's multi-head latent attention, whose
latent transformers caches, one tensor ``[pages * page_tokens, 1, kv_lora_rank + qk_rope_head_dim]``
in strata's MLA layout) with a cache controller over it: the CPU controller
for CPU tensors, the GPU one (``gpu_policies``) for CUDA tensors. ``cache_for(tokens)`` submits a
request, runs the controller's plan (the cached prefix's pages are locked, or loaded from the host
or file tier) and returns a ``StrataCache``: a ``DynamicCache`` whose layers start with the cached
prefix. Each layer fetches its prefix the first time the model updates that layer, after waiting
for that layer's load only (``wait_layer`` on the current stream), so layer 0 computes while later
layers still load. ``commit(cache)`` writes the pages the model computed into the pool and hands
them to the index (``finish_prefill``, backups per write policy, ``release``).

    pool = StrataKVPool(model.config, device_pages=4096, host_pages=65536, page_tokens=32)
    cache = pool.cache_for(input_ids, max_new_tokens=32)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=32, do_sample=False)
    pool.commit(cache)

One sequence at a time (batch 1): the pool is the engine, ``generate`` the model.
"""

from __future__ import annotations

import itertools
import time

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from . import _strata as _s

# How long ``cache_for`` waits for a request held back by its remote lookup or prefetch (the store's
# own timeouts end those sooner: redis_store's retry budget is 1 s).
_HOLD_S = 5.0

__all__ = ["StrataKVPool", "StrataCache", "CacheShape", "cache_shape", "GPU_ASSISTED"]

#: ``gpu_controller(force=...)`` value of the SM copy kernels (``force=GPU_ASSISTED`` forces them).
GPU_ASSISTED = 0


class CacheShape:
    """What one token of one layer holds in the model's cache: ``planes`` 2 (K and V of ``kv_heads``
    heads of ``head_dim``) or 1 (an MLA latent: the cache's keys are the ``split[0]``-wide compressed
    KV, its values the ``split[1]``-wide rotary key, one row of ``head_dim = split[0] + split[1]``)."""

    def __init__(self, layers, kv_heads, head_dim, planes=2, split=None):
        self.layers, self.kv_heads, self.head_dim, self.planes, self.split = layers, kv_heads, head_dim, planes, split


def cache_shape(config) -> CacheShape:
    """What a model with this config keeps per token and layer in its cache (what a pool for it holds)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    lora, rope = getattr(text, "kv_lora_rank", None), getattr(text, "qk_rope_head_dim", None)
    if lora and rope:  # DeepSeek's multi-head latent attention: transformers caches the latent
        return CacheShape(text.num_hidden_layers, 1, lora + rope, planes=1, split=(lora, rope))
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return CacheShape(text.num_hidden_layers, kv_heads, head_dim)


def _tokens(input_ids):
    if isinstance(input_ids, torch.Tensor):
        t = input_ids.detach()
        if t.dim() == 2:
            if t.shape[0] != 1:
                raise ValueError(f"StrataKVPool serves one sequence at a time, got a batch of {t.shape[0]}")
            t = t[0]
        if t.dim() != 1:
            raise ValueError(f"expected token ids of shape [n] or [1, n], got {tuple(input_ids.shape)}")
        return [int(x) for x in t.cpu().tolist()]
    return [int(x) for x in input_ids]


class _DeviceIndex:
    """A page index copied to the device on one stream (``made_on``), readable on any: ``on(stream)``
    makes ``stream`` wait for the copy and keeps the memory from reuse until ``stream`` is done with it."""

    def __init__(self, tensor, made_on, copied):
        self.tensor, self._made_on, self._copied = tensor, made_on, copied

    def on(self, stream):
        if stream is not None and stream != self._made_on:
            stream.wait_event(self._copied)
            self.tensor.record_stream(stream)
        return self.tensor


class _StrataLayer(DynamicLayer):
    """A DynamicLayer that starts with the cached prefix: it reports the prefix's length before it
    is materialised and fetches it (waiting for its own layer's load) at its first update."""

    def __init__(self, owner: "StrataCache", layer: int):
        super().__init__()
        self._owner = owner
        self._layer = layer
        self._fetched = False

    def get_seq_length(self) -> int:
        if not self._fetched:
            return self._owner.prefix_tokens
        return super().get_seq_length()

    def update(self, key_states, value_states, *args, **kwargs):
        self._owner._pool._check_states(key_states, value_states)
        if not self._fetched:
            self._fetch(key_states, value_states)
        return super().update(key_states, value_states, *args, **kwargs)

    def _fetch(self, key_states, value_states):
        self._fetched = True
        self.lazy_initialization(key_states, value_states)
        n = self._owner.prefix_tokens
        if n == 0:
            return
        k, v = self._owner._pool._gather(self._owner, self._layer, n)
        self.keys, self.values = k.to(key_states.dtype), v.to(value_states.dtype)


class StrataCache(DynamicCache):
    """The cache of one request, made by ``StrataKVPool.cache_for``; pass it as ``past_key_values``.

    Attributes: ``id`` (the controller's request id), ``tokens`` (the prompt), ``prefix_tokens``
    (tokens served from strata), ``cached_pages`` (pages found cached, per tier: device, host, file,
    remote), ``page_table`` (the request's pool pages)."""

    def __init__(self, pool: "StrataKVPool", rid: int, tokens, item, loads, table, cached_pages):
        Cache.__init__(self, layers=[_StrataLayer(self, i) for i in range(pool.geometry.layers)])
        self._pool = pool
        self.id = rid
        self.tokens = list(tokens)
        self.prefix_tokens = int(item.context_tokens)
        self.cached_pages = list(cached_pages)
        self.page_table = list(table)
        self.loads = loads
        self.committed = False
        # The prefix's pool pages as a device index, made once (before any layer waits): a blocking
        # host-to-device copy per layer would stall the CPU on each layer's load in turn.
        pt = pool.geometry.page_tokens
        self._prefix_pages = pool._page_index(self.page_table[: -(-self.prefix_tokens // pt)]) if self.prefix_tokens else None

    def __repr__(self):
        return f"StrataCache(id={self.id}, prefix_tokens={self.prefix_tokens}, cached_pages={self.cached_pages})"


class StrataKVPool:
    """A paged KV pool for a Hugging Face model, with strata's tiers behind it.

    Args:
        config: the model's config (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``).
        device_pages: pages of the pool (on ``device``).
        host_pages: pages of the host tier (pinned when the pool is on a GPU).
        page_tokens: tokens per page.
        dtype: element type of the pool (default: ``config.torch_dtype`` or float32).
        device: where the pool lives (``"cpu"`` or a CUDA device).
        options: ``strata.controller_options``.
        file_store: a ``strata.file_store`` below the host tier (kept alive by the pool).
        remote_store: a ``strata.redis_store`` below them, shared with other engines (kept alive by
            the pool; only when ``strata.redis_built``).
        **gpu: keyword arguments of ``strata.gpu_controller`` (``force``, ``staged_loads``, ...).
            Without ``force`` the controller chooses each transfer's backend by measured cost.

    On a GPU the pool's controller is warmed up at construction (``controller.warm_up()``: its copy
    kernels loaded, its cost tables scaled to this machine's link, ``calibration``), and told that
    its loads run beside the model's forward (``set_activity(1)``: SM copies then cost the forward
    SMs, the copy engine does not), so that the automatic choice is the right one beside this model
    (docs/real_model.md).
    """

    def __init__(self, config, device_pages: int, host_pages: int, page_tokens: int = 16, dtype=None,
                 device="cpu", options=None, file_store=None, remote_store=None, **gpu):
        shape = cache_shape(config)
        self.shape = shape
        layers, kv_heads, head_dim = shape.layers, shape.kv_heads, shape.head_dim
        if dtype is None:
            dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
            if isinstance(dtype, str):
                dtype = getattr(torch, dtype)
        self.device = torch.device(device)
        self.dtype = dtype
        elem = torch.empty((), dtype=dtype).element_size()
        self.geometry = _s.kv_geometry(layers, page_tokens, kv_heads, head_dim, elem, shape.planes)
        rows = device_pages * page_tokens
        self.k = [torch.zeros(rows, kv_heads, head_dim, dtype=dtype, device=self.device) for _ in range(layers)]
        if shape.planes == 1:  # MLA: one latent row per token (SGLang's MLA pool)
            self.v = []
            layout = _s.mla_layout(self.k, self.geometry)
        else:
            self.v = [torch.zeros(rows, kv_heads, head_dim, dtype=dtype, device=self.device) for _ in range(layers)]
            layout = _s.sglang_layout(self.k, self.v, self.geometry)
        if self.device.type == "cuda":
            self.controller = _s.gpu_controller(layout, host_pages, options=options, file_store=file_store,
                                                remote_store=remote_store, **gpu)
            # The copy kernels loaded now, not at the first load, and the backend choice's costs
            # measured on this machine's link.
            self.calibration = self.controller.warm_up()
            self.controller.set_activity(1)  # each load runs beside the model's forward
        else:
            if gpu:
                raise TypeError(f"GPU options {sorted(gpu)} need a CUDA pool")
            self.calibration = None
            self.controller = _s.cpu_controller(layout, host_pages, options=options, file_store=file_store,
                                                remote_store=remote_store)
        self._next_id = 1
        self.waits: list[int] = []  # layers the latest request waited for, in order (the per-layer overlap)

    # --- the stream strata orders its copies after ------------------------------------------------
    def _stream(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.current_stream(self.device).cuda_stream)
        return 0

    def cache_for(self, input_ids, max_new_tokens: int = 1, rid: int | None = None) -> StrataCache:
        """Submits the prompt, starts it (locks its cached prefix, submits its loads) and returns its
        cache. ``input_ids``: ``[n]`` or ``[1, n]`` token ids (a tensor or a list)."""
        tokens = _tokens(input_ids)
        if rid is None:
            rid = self._next_id
            self._next_id += 1
        c = self.controller
        stream = self._stream()
        c.submit(rid, tokens, max_new_tokens=max_new_tokens, stream=stream)
        self.waits.clear()
        deadline = None
        for attempt in itertools.count():
            if attempt >= 8:  # held back: a remote lookup or a prefetch on a store's threads
                deadline = deadline or time.monotonic() + _HOLD_S
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            plan = c.schedule(tokens=max(len(tokens), 1))
            loads = c.begin_loads(plan, stream)
            mine = [it for it in loads.ran if it.id == rid]
            others = [it.id for it in loads.ran if it.id != rid]
            if others:
                raise _s.Error(f"StrataKVPool: requests {others} of another user ran in this pool's batch")
            if mine:
                item = mine[0]
                if not (item.first_chunk and item.last_chunk):
                    raise _s.Error("StrataKVPool: the prompt was split into chunks")
                started = next(s for s in loads.started if s.id == rid)
                return StrataCache(self, rid, tokens, item, loads, c.page_table(rid), started.cached_pages)
            c.complete(loads)
            c.poll(stream)
        c.release(rid)
        raise _s.Error(f"StrataKVPool: request {rid} could not start (no device pages for it?)")

    def _page_index(self, pages):
        """Pool page numbers as a long tensor on the pool's device, copied without a host sync on the
        current stream; ``_DeviceIndex.on`` makes another stream wait for the copy before it reads it."""
        t = torch.tensor(list(pages), dtype=torch.long)
        if self.device.type == "cuda":
            made_on = torch.cuda.current_stream(self.device)
            index = t.pin_memory().to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(made_on)
            return _DeviceIndex(index, made_on, copied)
        return _DeviceIndex(t, None, None)

    def _check_states(self, key_states, value_states):
        """The model's cache tensors must have the shape this pool was made for (a model whose cache
        holds something else, e.g. an older transformers' DeepSeek caching per-head K/V, is refused)."""
        sh = self.shape
        want = ((1, sh.split[0]), (1, sh.split[1])) if sh.planes == 1 else ((sh.kv_heads, sh.head_dim),) * 2
        got = tuple((t.shape[1], t.shape[-1]) if t.dim() == 4 else tuple(t.shape) for t in (key_states, value_states))
        if got != want or key_states.dim() != 4 or key_states.shape[0] != 1:
            raise ValueError(f"StrataKVPool: the model caches keys/values of (heads, dim) {got}, this pool holds {want} "
                             f"({'an MLA latent' if sh.planes == 1 else 'K and V'}) for batch 1; shapes "
                             f"{tuple(key_states.shape)}, {tuple(value_states.shape)}")

    def _gather(self, cache: StrataCache, layer: int, n: int):
        """Layer ``layer``'s first ``n`` tokens of the request, as ``[1, kv_heads, n, head_dim]``,
        once that layer's load has landed."""
        if not self.controller.wait_layer(cache.loads, layer, self._stream()):
            raise _s.Error(f"StrataKVPool: the load of request {cache.id} failed (layer {layer})")
        self.waits.append(layer)
        pt = self.geometry.page_tokens
        index = cache._prefix_pages
        if index is None or index.tensor.numel() != (n + pt - 1) // pt:
            index = self._page_index(cache.page_table[: (n + pt - 1) // pt])
        pages = index.on(torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None)
        out = []
        for pool in [self.k[layer]] + self.v[layer:layer + 1]:
            paged = pool.view(-1, pt, pool.shape[1], pool.shape[2])
            rows = paged.index_select(0, pages).reshape(-1, pool.shape[1], pool.shape[2])[:n]
            out.append(rows.permute(1, 0, 2).unsqueeze(0))
        if self.shape.planes == 1:  # the latent row: compressed KV, then the rotary key
            lora = self.shape.split[0]
            return out[0][..., :lora].contiguous(), out[0][..., lora:].contiguous()
        return out[0].contiguous(), out[1].contiguous()

    def _scatter(self, cache: StrataCache, table, first_page: int, end_page: int):
        """Writes pages [first_page, end_page) of the sequence from the cache's tensors into the pool."""
        if end_page <= first_page:
            return
        pt = self.geometry.page_tokens
        pages = torch.tensor(table[first_page:end_page], dtype=torch.long, device=self.device)
        for layer, state in enumerate(cache.layers):
            if self.shape.planes == 1:
                pairs = ((self.k[layer], torch.cat((state.keys, state.values), dim=-1)),)
            else:
                pairs = ((self.k[layer], state.keys), (self.v[layer], state.values))
            for pool, t in pairs:
                rows = t[0, :, first_page * pt:end_page * pt, :].permute(1, 0, 2)  # [tokens, heads, dim]
                paged = pool.view(-1, pt, pool.shape[1], pool.shape[2])
                paged.index_copy_(0, pages, rows.reshape(-1, pt, pool.shape[1], pool.shape[2]).to(pool.dtype))

    def commit(self, cache: StrataCache, output_ids=None, keep_output: bool = False) -> None:
        """The request is done: the prompt pages the model computed enter the pool and the index
        (backed up per the write policy), and the request's pages are released. With ``keep_output``
        (and ``output_ids``: the full sequence ``generate`` returned, or the tokens after the prompt),
        the answer's whole pages are cached too, for a later turn."""
        if cache.committed:
            raise _s.Error(f"StrataKVPool: request {cache.id} was committed already")
        c = self.controller
        stream = self._stream()
        pt = self.geometry.page_tokens
        have = cache.get_seq_length()  # tokens whose KV the model holds
        prompt_pages = len(cache.tokens) // pt
        # Every whole prompt page is published: the model must hold all of them (the prompt's last
        # token may be missing only where it lies in a partial page, which is not cached).
        if have < max(len(cache.tokens) - 1, prompt_pages * pt):
            raise _s.Error(f"StrataKVPool: the cache holds {have} tokens, the prompt has {len(cache.tokens)} "
                           f"({prompt_pages} whole pages of {pt}): run the model on it before commit")
        seq = None  # the output to keep, checked before anything changes
        if keep_output and output_ids is not None:
            seq = _tokens(output_ids)
            if seq[: len(cache.tokens)] != cache.tokens:
                seq = cache.tokens + seq
            seq = seq[:have]
        cached_pages = sum(cache.cached_pages)
        # On a GPU a load fails asynchronously: wait_layer only ordered the stream, the model may
        # have read what a failed load left. The loads settle first (landed or failed); a failed one
        # marks the request failed, or sends it back to wait (no longer prefilled, its pages not
        # its own). Then nothing of the request is cached, and it ends.
        if not c.complete(cache.loads):
            c.synchronize()
            c.complete(cache.loads)
        if c.failed(cache.id) or not c.prefilled(cache.id):
            c.release(cache.id)
            c.poll(stream)
            cache.committed = True
            raise _s.Error(f"StrataKVPool: a load of request {cache.id} failed: what the model computed from it was "
                           "not cached and the request was released; run it again")
        self._scatter(cache, cache.page_table, cached_pages, min(prompt_pages, have // pt))
        c.finish_prefill(cache.id, stream)
        keep = None
        if seq is not None:
            table = c.page_table(cache.id)  # finish_prefill may have swapped duplicates
            pages = min(len(seq) // pt, len(table))  # generate may have run past max_new_tokens
            if pages > prompt_pages:
                self._scatter(cache, table, prompt_pages, pages)
                keep = seq[: pages * pt]
        c.release(cache.id, keep, stream)
        c.poll(stream)
        cache.committed = True

    def abort(self, cache: StrataCache) -> None:
        """Gives a request's pages back without caching anything."""
        if not cache.committed:
            self.controller.complete(cache.loads)
            self.controller.release(cache.id)
            cache.committed = True
