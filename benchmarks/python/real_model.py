#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real transformer on strata (issue 13's proof): a Hugging Face LlamaForCausalLM with the
Llama-3.1-8B configuration (32 layers, hidden 4096, 32 heads, 8 KV heads of 128, intermediate 14336,
vocab 128256, Llama-3.1 rope) and random weights from a fixed seed, bf16, built on the GPU (nothing
is downloaded).

1. Correctness, bit-exact. A long random context (8K tokens) is prefilled through strata
   (`StrataKVPool.cache_for` + the model: a `StrataCache`), committed (device -> pinned host by the
   GPU controller, write-through), evicted from the pool whose tensors are then zeroed, and loaded
   back into the model's cache by the controller with the integration's default (the automatic
   choice, after `warm_up`), and gpu_assisted, dma_batch and staged forced; 32 tokens are
   decoded greedily by `model.generate(..., past_key_values=cache)`: logits bitwise equal to a run
   whose DynamicCache never left the GPU. Twice per backend: under two different suffixes of the
   shared prefix (each reloaded from the host), plus a device hit; and through the file tier (host ->
   file write-through, host copies dropped, loaded back through file -> host -> device). A control
   repeats the never-left run (cuDNN's attention, not reproducible run to run, is off in this part).
   The same checks on a small DeepSeek-V3-shaped model: its MLA latent in strata's MLA layout.
2. TTFT of a 100-token question on a cached document of 8K / 32K / 64K / 128K tokens:
   (a) recompute (prefill of document + question), (b) per-block DMA (one cudaMemcpyAsync per
   (page, layer, K/V) block from pinned memory, then the forward), (c) strata forced to batched DMA,
   (d) strata's default (the controller's automatic backend choice, each layer waits only for its
   own layer's load), (d') the same with gpu_assisted forced,
   (e) (d) with the document on the file tier only; against the ideal = the document's bytes over
   the bandwidth of one contiguous pinned -> device copy measured in the same run plus the compute of
   the question with the KV already in place (measured). Medians of --reps.
3. Writes real_model.md, real_model.csv, real_model.json and ttft.png under --out (default $OUT,
   else ./real_model_out); exits 1 when a bit-exactness check fails, 2 when a check could not run.

    python benchmarks/python/real_model.py [--quick] [--lengths 8192,32768] [--commit SHA]
    python benchmarks/python/real_model.py --cpu-smoke      # tiny random Llama on the CPU, float32

The integration used: `strata.transformers.StrataKVPool` / `StrataCache` for everything strata does
(seeding a pool goes through the same Cache.update the model calls); the baselines (b) and the ideal
use plain torch copies into a paged pool of the same shape.
"""
from __future__ import annotations

import argparse
import os as _os

# Bit-exact logits need run-to-run deterministic kernels: cuBLAS with a fixed workspace, and
# PyTorch's deterministic algorithms (set before CUDA initialises; the KV itself is compared
# byte for byte in any case).
_os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import csv
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import transformers
from transformers import DynamicCache, LlamaConfig

import strata
from strata.transformers import StrataKVPool, cache_shape

GIB = float(1 << 30)
TIER_NAMES = ("device", "host", "file", "remote")
BACKENDS = ("gpu_assisted", "dma_batch", "staged")
ROPE_LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
TARGET_A_OVER_D = {32768: 15.0, 65536: 20.0, 131072: 30.0}


# --- small helpers ------------------------------------------------------------------------------

def log(*a):
    print(*a, flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def stream_of(dev) -> int:
    return int(torch.cuda.current_stream(dev).cuda_stream) if dev.type == "cuda" else 0


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def host_available_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def kv_equal(pool, cache, ref_kv, n) -> bool:
    """The prefix KV strata loaded into the pool, layer by layer, byte for byte against the KV the
    model computed (each layer waits for its own load first)."""
    ok = True
    for layer, (rk, rv) in enumerate(ref_kv):
        k, v = pool._gather(cache, layer, n)
        ok = ok and bitwise_equal(k, rk[:, :, :n].to(k.dtype).contiguous()) and bitwise_equal(v, rv[:, :, :n].to(v.dtype).contiguous())
    pool.waits.clear()
    return ok


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-for-byte equality (what `torch.equal` says for finite values; NaNs compare by their bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def fmt(x, scale=1.0, digits=1):
    if x is None:
        return "—"
    return f"{x * scale:.{digits}f}"


# --- the model ----------------------------------------------------------------------------------

def model_config(smoke: bool) -> LlamaConfig:
    if smoke:  # tiny, same architecture and rope type
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                           max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=dict(ROPE_LLAMA31),
                           bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                       max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=dict(ROPE_LLAMA31),
                       bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False, attention_bias=False,
                       mlp_bias=False)


def mla_config(smoke: bool):
    """A small DeepSeek-V3-shaped model: its multi-head latent attention as in DeepSeek-V3 (kv_lora_rank
    512, rotary 64, nope 128, v 128, q_lora_rank, interleaved rope), fewer and narrower layers, dense MLPs
    (the experts do not touch the KV cache). transformers caches the MLA latent (compressed KV and
    rotary key): strata's MLA layout, one 576-element row per token and layer."""
    from transformers import DeepseekV3Config

    if smoke:
        return DeepseekV3Config(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4,
                                num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8,
                                qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                                n_group=1, topk_group=1, max_position_embeddings=16384, bos_token_id=1,
                                eos_token_id=2, tie_word_embeddings=False)
    return DeepseekV3Config(vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=512,
                            num_hidden_layers=8, first_k_dense_replace=8, num_attention_heads=16,
                            num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                            qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=8, num_experts_per_tok=2,
                            n_group=1, topk_group=1, max_position_embeddings=65536, bos_token_id=0, eos_token_id=1,
                            tie_word_embeddings=False)


def build_model(cfg, dev, dtype, seed):
    torch.manual_seed(seed)
    if dev.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    model.requires_grad_(False)
    return model


def first_token(model, ids, cache):
    """One forward of `ids` ([1, n]) over `cache`; the greedy first token (a 0-d tensor)."""
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].argmax()


def generate(model, ids, cache, new_tokens, pad):
    ids = ids[None]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=pad)
    return out.sequences[0], torch.stack(out.logits)


def cache_from(kv, layers):
    """A DynamicCache holding kv[l] = (K, V) [1, kv_heads, n, head_dim] per layer."""
    c = DynamicCache()
    for layer in range(layers):
        k, v = kv(layer)
        c.update(k, v, layer)
    return c


def gather_prefix(flat, layer, pages, n):
    """Layer `layer`'s first n tokens from a paged pool flat[L, 2, pages, page_tokens, H, D] whose
    sequence occupies `pages` (a long tensor), as the model's [1, H, n, D] K and V (the same two device
    copies StrataCache's fetch makes)."""
    out = []
    for plane in (0, 1):
        x = flat[layer, plane].index_select(0, pages)
        out.append(x.reshape(-1, x.shape[-2], x.shape[-1])[:n].permute(1, 0, 2).unsqueeze(0).contiguous())
    return out[0], out[1]


# --- strata helpers ------------------------------------------------------------------------------

class Ctx:
    """What every part needs."""

    def __init__(self, args, model, dev, dtype):
        self.args, self.model, self.dev, self.dtype = args, model, dev, dtype
        text = model.config
        shape = cache_shape(text)  # what StrataKVPool makes of the config (K and V, or an MLA latent)
        self.layers = shape.layers
        self.kv_heads = shape.kv_heads
        self.head_dim = shape.head_dim
        self.vocab = text.vocab_size
        self.pad = text.eos_token_id if isinstance(text.eos_token_id, int) else 0
        self.pt = args.page_tokens
        self.elem = torch.empty((), dtype=dtype).element_size()
        self.geometry = strata.kv_geometry(self.layers, self.pt, self.kv_heads, self.head_dim, self.elem, shape.planes)
        self.page_bytes = self.geometry.page_bytes()
        self.gpu = dev.type == "cuda"
        self.stream = stream_of(dev)


def make_pool(ctx, device_pages, host_pages, force="default", file_store=None, options=None):
    """A StrataKVPool; `force`: "default" (the integration's default, gpu_assisted on a GPU), None
    (the controller's automatic choice) or a backend index."""
    kw = {}
    if ctx.gpu and force != "default":
        kw["force"] = force
    free_memory()  # torch's cached blocks back to the driver: the controller allocates with CUDA directly
    return StrataKVPool(ctx.model.config, device_pages=device_pages, host_pages=host_pages, page_tokens=ctx.pt,
                        dtype=ctx.dtype, device=ctx.dev, options=options, file_store=file_store, **kw)


def settle(ctx, pool, timeout_s=900.0):
    """Every copy the controller issued has landed and is completed in its index (file writes too)."""
    c = pool.controller
    t0 = time.perf_counter()
    while True:
        c.synchronize()
        if c.poll(ctx.stream) == 0:
            return
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"settle: copies still pending after {timeout_s:.0f} s")
        time.sleep(0.002)


def drop(ctx, pool, tokens, expect_tier):
    """Evicts the pool's device copies (and host copies when the prefix must come from the file
    tier), zeroes the pool's tensors, and checks the prefix now lies in `expect_tier` only."""
    c = pool.controller
    settle(ctx, pool)
    c.evict(strata.tier.device, c.capacity(strata.tier.device), ctx.stream)
    settle(ctx, pool)
    if expect_tier == strata.tier.file:
        c.evict(strata.tier.host, c.capacity(strata.tier.host), ctx.stream)
        settle(ctx, pool)
    for t in pool.k + pool.v:
        t.zero_()
    sync(ctx.dev)
    m = c.probe(tokens)
    want = ((len(tokens) - 1) // ctx.pt) * ctx.pt
    got = m.fastest_tokens[1 if expect_tier == strata.tier.host else 2]
    if got < want:
        raise RuntimeError(f"the prefix is not on the {expect_tier} tier alone: fastest tokens per tier "
                           f"{list(m.fastest_tokens)}, wanted {want} on {expect_tier}")


def start(ctx, pool, tokens, max_new_tokens, notes=None):
    """`pool.cache_for`, once more after the copies in flight land if the request could not start
    (a scheduler that holds it back for them)."""
    for attempt in range(3):
        try:
            return pool.cache_for(tokens, max_new_tokens=max_new_tokens)
        except strata.Error as e:
            if "could not start" not in str(e) or attempt == 2:
                raise
            if notes is not None:
                notes.append(f"retried cache_for after: {e}")
            settle(ctx, pool)


def seed_pool(ctx, pool, tokens, kv):
    """Puts a prefix's KV (kv(layer) -> (K, V) [1, H, n, D]) into a pool the way the model would:
    `cache_for` (nothing cached yet), `Cache.update` per layer, `commit` (write-through backups)."""
    cache = start(ctx, pool, tokens, 1)
    if cache.prefix_tokens != 0:
        pool.abort(cache)
        raise RuntimeError(f"seed: {cache.prefix_tokens} tokens were cached already")
    for layer in range(ctx.layers):
        k, v = kv(layer)
        cache.update(k, v, layer)
        del k, v
    pool.commit(cache)
    del cache
    settle(ctx, pool)


def file_options(ctx, gbps):
    o = strata.controller_options()
    o.file_backup_policy = strata.write_policy.write_through  # host copies go to the file tier at once
    note = "controller default (1.92 GB/s measured disk)"
    if gbps and gbps > 0:
        if hasattr(o, "set_file_tier"):
            o.set_file_tier(ctx.geometry, gbps * 1e9, gbps * 1e9)
            note = f"cost model told {gbps:g} GB/s (so that reading beats recompute)"
        else:
            note = "controller default (this binding has no controller_options.set_file_tier)"
    return o, note


def make_file_store(ctx, pages):
    d = tempfile.mkdtemp(prefix="strata_real_model_", dir=ctx.args.file_dir)
    fo = strata.file_store_options(d)
    fo.tag = "real_model.py"
    if ctx.args.file_buffered:
        fo.use_direct_io = False
        fo.use_io_uring = False
    return strata.file_store(ctx.geometry, pages, fo), d


def backend_counts(pool):
    s = pool.controller.executor_stats()
    return [int(x) for x in s.transfers[0]], [int(x) for x in s.bytes[0]]


def backends_used(before, after):
    (t0, b0), (t1, b1) = before, after
    used = [f"{BACKENDS[i]} x{t1[i] - t0[i]}" for i in range(3) if t1[i] > t0[i]]
    return ", ".join(used) if used else ("host memcpy" if not any(t1) else "none")


# --- 1. correctness -----------------------------------------------------------------------------

def correctness(ctx):
    args, model, dev = ctx.args, ctx.model, ctx.dev
    L, pt = ctx.layers, ctx.pt
    n = (args.check_tokens // pt) * pt
    pages = n // pt
    gen = torch.Generator().manual_seed(args.seed + 1)
    doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
    suffixes = [torch.randint(0, ctx.vocab, (k,), generator=gen) for k in args.suffix_tokens]
    doc_list = doc.tolist()
    rows, failures, errors = [], [], []
    device_pages = pages + 8 + 2 * (-(-(max(args.suffix_tokens) + args.decode) // pt))
    host_pages = device_pages + 8

    def record(check, backend, suffix, cached, waits_ok, seq_ok, logits, ref_logits, note=""):
        logits_ok = bitwise_equal(logits, ref_logits)
        torch_eq = bool(torch.equal(logits, ref_logits))
        if logits_ok and not torch_eq:
            note = (note + "; " if note else "") + "torch.equal is False only because the logits hold NaNs"
        ok = bool(waits_ok and seq_ok and logits_ok)
        rows.append(dict(check=check, backend=backend, suffix=suffix, cached_pages=list(cached),
                         waits_in_order=bool(waits_ok), tokens_equal=bool(seq_ok), logits_bitwise_equal=bool(logits_ok),
                         logits_torch_equal=torch_eq, ok=ok, note=note))
        log(f"  {check:28s} {backend:14s} suffix {suffix}: cached pages {list(cached)}, layer waits in order "
            f"{bool(waits_ok)}, tokens equal {bool(seq_ok)}, logits bitwise equal {bool(logits_ok)}"
            + (f"  [{note}]" if note else ""))
        if not ok:
            failures.append(f"{check} / {backend} / suffix {suffix}")

    log(f"correctness: a {n}-token random context, {args.decode} greedy tokens under suffixes of "
        f"{args.suffix_tokens} tokens, {pages} pages of {pt} tokens ({pages * ctx.page_bytes / GIB:.2f} GiB of KV)")
    t_start = time.perf_counter()
    # The context prefilled through strata (nothing cached yet: a StrataCache is a DynamicCache).
    pool = make_pool(ctx, device_pages, host_pages)
    cache = pool.cache_for(doc_list, max_new_tokens=1)
    if cache.prefix_tokens != 0:
        raise RuntimeError("correctness: a fresh pool found the context cached")
    model(input_ids=doc.to(dev)[None], past_key_values=cache, use_cache=True, logits_to_keep=1)
    ref_kv = [(lay.keys.clone(), lay.values.clone()) for lay in cache.layers]
    pool.commit(cache)
    del cache
    settle(ctx, pool)

    # The runs that never leave the GPU: the same KV in a DynamicCache, the same generate.
    refs = []
    for s in suffixes:
        ids = torch.cat([doc, s]).to(dev)
        seq, logits = generate(model, ids, cache_from(lambda l: ref_kv[l], L), args.decode, ctx.pad)
        refs.append((ids, seq, logits))
    if not all(torch.isfinite(r[2]).all() for r in refs):
        log("  note: the reference logits hold non-finite values (the bitwise check still applies)")
    # The control: the never-left run once more. If the model's own kernels are not reproducible,
    # no comparison below can be bitwise (cuDNN's attention was not, on the H200: hence it is off).
    ids, ref_seq, ref_logits = refs[0]
    seq, logits = generate(model, ids, cache_from(lambda l: ref_kv[l], L), args.decode, ctx.pad)
    record("never-left run, repeated (control)", "—", 0, [0, 0, 0, 0], True, torch.equal(seq, ref_seq), logits,
           ref_logits, "the model's kernels are run-to-run reproducible" if bitwise_equal(logits, ref_logits)
           else "the model's kernels are NOT reproducible: the bitwise checks cannot pass")
    del seq, logits

    def run_suffix(pool, check, backend, i, expect):
        ids, ref_seq, ref_logits = refs[i]
        before = backend_counts(pool)
        cache = start(ctx, pool, ids.tolist(), args.decode)
        cached = list(cache.cached_pages)
        kv_ok = cache.prefix_tokens == 0 or kv_equal(pool, cache, ref_kv, cache.prefix_tokens)
        pool.waits.clear()
        seq, logits = generate(model, ids, cache, args.decode, ctx.pad)
        waits_ok = pool.waits == list(range(L))
        note = backends_used(before, backend_counts(pool)) if ctx.gpu else ""
        loaded_ok = expect(cached)
        if not loaded_ok:
            note = (note + "; " if note else "") + f"unexpected cached pages {cached}"
        note = (note + "; " if note else "") + f"prefix KV byte-equal: {kv_ok}"
        record(check, backend, i, cached, waits_ok and loaded_ok and kv_ok, torch.equal(seq, ref_seq), logits, ref_logits,
               note)
        pool.commit(cache, seq, keep_output=True)  # the answer's whole pages are cached too
        del cache
        settle(ctx, pool)

    from_host = lambda c: c[0] == 0 and c[1] == pages  # noqa: E731
    on_device = lambda c: c[0] == pages  # noqa: E731
    # The pool above: the integration's default (the automatic choice on a GPU); then each backend forced.
    variants = [("default: automatic" if ctx.gpu else "default", "default")]
    if ctx.gpu:
        variants += [(name, i) for i, name in enumerate(BACKENDS)]
    for name, force in variants:
        try:
            if force != "default":
                pool = None
                free_memory()
                pool = make_pool(ctx, device_pages, host_pages, force=force)
                seed_pool(ctx, pool, doc_list, lambda l: ref_kv[l])
            for i in range(len(suffixes)):
                drop(ctx, pool, doc_list, strata.tier.host)
                run_suffix(pool, "host tier -> device", name, i, from_host)
            if force == "default":  # the shared prefix still on the device: a hit with no load
                run_suffix(pool, "device hit (no load)", name, 0, on_device)
            pool.controller.check_invariants()
            if pool.controller.executor_stats().failed_submissions:
                failures.append(f"{name}: failed submissions")
        except Exception as e:  # noqa: BLE001 - reported, the run fails
            traceback.print_exc()
            errors.append(f"host tier / {name}: {type(e).__name__}: {e}")
            rows.append(dict(check="host tier -> device", backend=name, suffix="-", cached_pages=[], ok=False,
                             note=f"ERROR {type(e).__name__}: {e}"))
    pool = None
    free_memory()

    # The file tier: host -> file write-through, host and device copies dropped, loaded back.
    fs_dir = fs = None
    try:
        opts, cost_note = file_options(ctx, args.file_cost_gbps)
        fs, fs_dir = make_file_store(ctx, host_pages + 8)
        pool = make_pool(ctx, device_pages, host_pages, file_store=fs, options=opts)
        seed_pool(ctx, pool, doc_list, lambda l: ref_kv[l])
        m = pool.controller.probe(doc_list)
        if m.tier_tokens[2] < n:
            raise RuntimeError(f"the context did not reach the file tier (tier tokens {list(m.tier_tokens)})")
        for i in range(len(suffixes)):
            drop(ctx, pool, doc_list, strata.tier.file)
            prefetched = pool.controller.stats().prefetched_pages
            ids, ref_seq, ref_logits = refs[i]
            cache = start(ctx, pool, ids.tolist(), args.decode)
            cached = list(cache.cached_pages)
            up = pool.controller.stats().prefetched_pages - prefetched
            if sum(cached) == 0:  # the controller's cost model chose to recompute the prefix
                note = f"not loaded: the controller recomputed the prefix ({cost_note})"
                pool.abort(cache)
                rows.append(dict(check="file tier -> host -> device", backend="default", suffix=i, cached_pages=cached,
                                 ok=True, skipped=True, note=note))
                log(f"  file tier: {note}")
                del cache
                continue
            kv_ok = kv_equal(pool, cache, ref_kv, cache.prefix_tokens)
            pool.waits.clear()
            seq, logits = generate(model, ids, cache, args.decode, ctx.pad)
            waits_ok = pool.waits == list(range(L))
            loaded_ok = cached[0] == 0 and cached[1] + cached[2] == pages and kv_ok
            note = f"{up} pages prefetched file -> host at submit; {cost_note}; prefix KV byte-equal: {kv_ok}"
            if not loaded_ok:
                note += f"; unexpected cached pages {cached}"
            record("file tier -> host -> device", "default", i, cached, waits_ok and loaded_ok, torch.equal(seq, ref_seq),
                   logits, ref_logits, note)
            pool.commit(cache, seq, keep_output=True)
            del cache
            settle(ctx, pool)
        pool.controller.check_invariants()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        errors.append(f"file tier: {type(e).__name__}: {e}")
        rows.append(dict(check="file tier -> host -> device", backend="default", suffix="-", cached_pages=[], ok=False,
                         note=f"ERROR {type(e).__name__}: {e}"))
    finally:
        pool = fs = None  # the controller goes first, then its file store
        free_memory()
        if fs_dir:
            shutil.rmtree(fs_dir, ignore_errors=True)
    del ref_kv, refs
    free_memory()
    return dict(tokens=n, decode=args.decode, suffix_tokens=list(args.suffix_tokens), rows=rows, failures=failures,
                errors=errors, seconds=time.perf_counter() - t_start)


# --- 2. TTFT ------------------------------------------------------------------------------------

class HostBuffer:
    """One pinned buffer for the largest document (torch's pinned cache keeps what it frees)."""

    def __init__(self, ctx, max_elems):
        self.ctx, self.max_elems, self.t = ctx, max_elems, None

    def get(self, elems):
        if self.t is None or self.t.numel() < elems:
            self.t = None
            gc.collect()
            size = max(elems, self.max_elems)
            try:
                self.t = torch.empty(size, dtype=self.ctx.dtype, pin_memory=self.ctx.gpu)
            except RuntimeError:
                self.t = torch.empty(elems, dtype=self.ctx.dtype, pin_memory=self.ctx.gpu)
        return self.t[:elems]


def timed(ctx, fn):
    sync(ctx.dev)
    t0 = time.perf_counter()
    out = fn()
    sync(ctx.dev)
    return time.perf_counter() - t0, out


def ttft_length(ctx, n, reps, warm, host, row, with_file):
    """Fills `row` (a dict) with the measurements for an n-token document; each part on its own."""
    args, model, dev = ctx.args, ctx.model, ctx.dev
    L, H, D, pt = ctx.layers, ctx.kv_heads, ctx.head_dim, ctx.pt
    pages = n // pt
    nbytes = pages * ctx.page_bytes
    gen = torch.Generator().manual_seed(args.seed + 1000 + n)
    doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
    questions = [torch.randint(0, ctx.vocab, (args.question_tokens,), generator=gen) for _ in range(warm + reps)]
    full = [torch.cat([doc, q]) for q in questions]
    full_lists = [f.tolist() for f in full]
    full_dev = [f.to(dev)[None] for f in full]
    q_dev = [q.to(dev)[None] for q in questions]
    doc_list = doc.tolist()
    row["errors"] = []
    first_tokens = {}

    def part(name, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failing part leaves the others
            traceback.print_exc()
            row["errors"].append(f"{name}: {type(e).__name__}: {e}")
            log(f"  {name}: FAILED ({type(e).__name__}: {e})")
        finally:
            free_memory()

    # (a) recompute: the document and the question prefilled together; the last run's KV (its
    # first n tokens) is the document's KV for everything below.
    source = {}

    def recompute():
        times = []
        cache = None
        for r in range(warm + reps):
            cache = None  # the previous run's cache goes before this run allocates its own
            source.pop("cache", None)
            free_memory()
            cache = DynamicCache()
            s, tok = timed(ctx, lambda: first_token(model, full_dev[r], cache))
            if r >= warm:
                times.append(s)
            source["cache"] = cache
            first_tokens.setdefault("recompute", []).append(int(tok))
        row["recompute_s"] = times
        log(f"  (a) recompute: {[round(t, 3) for t in times]} s")

    part("(a) recompute", recompute)

    flat = torch.empty((L, 2, pages, pt, H, D), dtype=ctx.dtype, device=dev)
    if "cache" in source:
        for layer in range(L):
            lay = source["cache"].layers[layer]
            for plane, t in enumerate((lay.keys, lay.values)):
                flat[layer, plane].view(n, H, D).copy_(t[0, :, :n].transpose(0, 1))
        row["kv_source"] = "the recompute's KV"
    else:
        flat.normal_()
        row["kv_source"] = "random (the recompute failed)"
    source.clear()
    free_memory()
    hbuf = host.get(flat.numel()).view(flat.shape)
    hbuf.copy_(flat)
    sync(dev)
    perm = torch.randperm(pages, generator=gen)  # the paged pool's page table: scattered pages
    perm_dev = perm.to(dev)
    row["bytes"] = nbytes

    # The contiguous copy: one pinned -> device copy of the same bytes.
    def contiguous():
        times = []
        for r in range(1 + reps):
            s, _ = timed(ctx, lambda: flat.copy_(hbuf, non_blocking=True))
            if r >= 1:
                times.append(s)
        row["contiguous_s"] = times
        log(f"  contiguous copy of {nbytes / GIB:.2f} GiB: {[round(t * 1e3, 2) for t in times]} ms "
            f"({nbytes / median(times) / 1e9:.1f} GB/s)")

    part("contiguous copy", contiguous)

    # (b) per-block DMA: one copy per (page, layer, K/V) block into scattered pages, then the forward.
    def per_block():
        order = perm.tolist()
        srcs, dsts = [], []
        for layer in range(L):
            for plane in (0, 1):
                srcs.extend(hbuf[layer, plane].unbind(0))
                d = flat[layer, plane].unbind(0)
                dsts.extend(d[j] for j in order)
        use_foreach = hasattr(torch, "_foreach_copy_")

        def load_and_run(q):
            if use_foreach:  # one cudaMemcpyAsync per block, issued from C++
                torch._foreach_copy_(dsts, srcs, non_blocking=True)
            else:
                for d, s in zip(dsts, srcs):
                    d.copy_(s, non_blocking=True)
            cache = cache_from(lambda l: gather_prefix(flat, l, perm_dev, n), L)
            return first_token(model, q, cache)

        times = []
        for r in range(warm + reps):
            s, tok = timed(ctx, lambda: load_and_run(q_dev[r]))
            if r >= warm:
                times.append(s)
            first_tokens.setdefault("per_block", []).append(int(tok))
        row["per_block_s"] = times
        row["blocks"] = len(srcs)
        row["per_block_issue"] = "torch._foreach_copy_" if use_foreach else "python loop of copy_"
        log(f"  (b) per-block DMA ({len(srcs)} blocks of {ctx.geometry.block_bytes() >> 10} KiB): "
            f"{[round(t * 1e3, 2) for t in times]} ms")

    part("(b) per-block DMA", per_block)

    # The compute of the question with the document's KV already in place.
    def compute():
        times = []
        for r in range(warm + reps):
            cache = cache_from(lambda l: gather_prefix(flat, l, perm_dev, n), L)
            s, tok = timed(ctx, lambda: first_token(model, q_dev[r], cache))
            del cache
            if r >= warm:
                times.append(s)
            first_tokens.setdefault("compute", []).append(int(tok))
        row["compute_s"] = times
        log(f"  compute of {args.question_tokens} tokens, KV in place: {[round(t * 1e3, 2) for t in times]} ms")

    part("compute", compute)

    # (c), (d), (e): strata, through StrataKVPool / StrataCache.
    def through_strata(key, label, force="default", file=False):
        fs = fs_dir = None
        pool = None
        try:
            options, note = (None, "")
            if file:
                options, note = file_options(ctx, args.file_cost_gbps)
                fs, fs_dir = make_file_store(ctx, pages + 16)
            pool = make_pool(ctx, pages + 8, pages + 8, force=force, file_store=fs, options=options)
            seed_pool(ctx, pool, doc_list, lambda l: gather_prefix(flat, l, perm_dev, n))
            tier = strata.tier.file if file else strata.tier.host
            times, cached_all, waits_ok = [], [], True
            before = None
            for r in range(warm + reps):
                drop(ctx, pool, doc_list, tier)
                if r == warm:
                    before = backend_counts(pool)

                def run():
                    cache = start(ctx, pool, full_lists[r], 1, row.setdefault("retries", []))
                    pool.waits.clear()
                    tok = first_token(model, full_dev[r][:, cache.prefix_tokens:], cache)
                    return cache, tok

                s, (cache, tok) = timed(ctx, run)
                cached = list(cache.cached_pages)
                if r >= warm:
                    times.append(s)
                    cached_all.append(cached)
                    waits_ok = waits_ok and (pool.waits == list(range(L)) or cache.prefix_tokens == 0)
                first_tokens.setdefault(key, []).append(int(tok))
                pool.abort(cache)
                del cache
            used = backends_used(before, backend_counts(pool)) if ctx.gpu else "host memcpy"
            row[key + "_s"] = times
            row[key + "_cached_pages"] = cached_all
            row[key + "_backends"] = used
            row[key + "_waits_in_order"] = waits_ok
            loaded = all(sum(c) == pages and c[0] == 0 for c in cached_all)
            row[key + "_loaded"] = loaded
            if note:
                row[key + "_note"] = note
            log(f"  {label}: {[round(t * 1e3, 2) for t in times]} ms, cached pages {cached_all[-1] if cached_all else '-'}"
                f", loads by {used}, layer waits in order {waits_ok}" + ("" if loaded else "  [NOT LOADED: recomputed]"))
        finally:
            del pool
            free_memory()
            if fs_dir:
                del fs
                gc.collect()
                shutil.rmtree(fs_dir, ignore_errors=True)

    part("(c) batched DMA", lambda: through_strata("dma_batch", "(c) strata forced to dma_batch",
                                                   force=1 if ctx.gpu else None))
    part("(d) strata default", lambda: through_strata("strata", "(d) strata default (automatic backend choice)"))
    if ctx.gpu:
        part("(d') gpu_assisted", lambda: through_strata("forced_ga", "(d') strata, gpu_assisted forced", force=0))
    if with_file:
        part("(e) file tier", lambda: through_strata("file", "(e) strata default, file tier", file=True))

    # Every path that reads the same KV computes the same first token (recompute may differ: other
    # GEMM shapes). Reported, not a failure: the bitwise checks are part 1's.
    row["first_tokens"] = first_tokens
    same = [v for k, v in first_tokens.items() if k != "recompute"]
    row["first_tokens_agree"] = all(v == same[0] for v in same) if same else None
    del flat, hbuf
    free_memory()


def summarize(row):
    m = {k: median(row.get(k + "_s", [])) for k in ("recompute", "contiguous", "per_block", "compute", "dma_batch",
                                                    "strata", "forced_ga", "file")}
    for k in ("dma_batch", "strata", "forced_ga", "file"):
        if row.get(k + "_loaded") is False:
            row[k + "_recomputed"] = True
    out = dict(m)
    nbytes = row.get("bytes")
    out["contiguous_gbps"] = nbytes / m["contiguous"] / 1e9 if m["contiguous"] and nbytes else None
    out["ideal"] = m["contiguous"] + m["compute"] if m["contiguous"] is not None and m["compute"] is not None else None
    out["d_over_ideal"] = m["strata"] / out["ideal"] if m["strata"] and out["ideal"] else None
    out["a_over_d"] = m["recompute"] / m["strata"] if m["recompute"] and m["strata"] else None
    fixed = [m[k] for k in ("dma_batch", "forced_ga") if m[k] and not row.get(k + "_recomputed")]
    out["d_over_best_fixed"] = m["strata"] / min(fixed) if m["strata"] and fixed else None
    out["per_block_gbps"] = (nbytes / (m["per_block"] - m["compute"]) / 1e9
                             if m["per_block"] and m["compute"] and m["per_block"] > m["compute"] else None)
    return out


# --- report -------------------------------------------------------------------------------------

def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                           timeout=10)
        if r.returncode == 0:
            sha = r.stdout.strip()
            d = subprocess.run(["git", "-C", here, "status", "--porcelain"], capture_output=True, text=True, timeout=10)
            return sha + ("+dirty" if d.stdout.strip() else "")
    except Exception:  # noqa: BLE001
        pass
    return "unknown"


def correctness_lines(corr, title):
    """The correctness section of the report for one model."""
    lines = []
    lines += [f"## Correctness{title}: bit-exact reuse ({corr['tokens']}-token context, {corr['decode']} greedy tokens, "
              f"suffixes of {corr['suffix_tokens']} tokens)", "",
              "Logits of `model.generate(..., past_key_values=StrataCache)` against a run whose DynamicCache never "
              "left the device: `torch.equal` and byte-for-byte. Cached pages: [device, host, file, remote] pages "
              "the prefix was found in (loaded from host/file). cuDNN's attention "
              + ("on" if corr.get("cudnn_attention") else "off (not run-to-run reproducible on the H200; "
                 "SDPA's flash / memory-efficient kernels)") + "; the control row repeats the never-left run.", "",
              "| check | backend | suffix | cached pages | layer waits in order | tokens equal | logits bitwise equal "
              "| result | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in corr["rows"]:
        res = "skipped" if r.get("skipped") else ("PASS" if r["ok"] else "FAIL")
        lines.append(f"| {r['check']} | {r['backend']} | {r['suffix']} | {r['cached_pages']} | "
                     f"{r.get('waits_in_order', '—')} | {r.get('tokens_equal', '—')} | "
                     f"{r.get('logits_bitwise_equal', '—')} | {res} | {r.get('note', '')} |")
    verdict = "PASS" if not corr["failures"] and not corr["errors"] else "FAIL"
    n_skip = sum(1 for r in corr["rows"] if r.get("skipped"))
    if n_skip:
        verdict += f" ({n_skip} check(s) skipped: the prefix was recomputed, not loaded)"
    lines += ["", f"Correctness: **{verdict}**" + (f" — failures: {corr['failures']}" if corr["failures"] else "")
              + (f" — errors: {corr['errors']}" if corr["errors"] else ""), ""]
    return lines


def write_report(out_dir, meta, corr, rows, notes, corr_mla=None):
    os.makedirs(out_dir, exist_ok=True)
    lines = [f"# strata on a real transformer: {meta['model']}", ""]
    lines += ["| | |", "|---|---|"]
    for k in ("date", "gpu", "host", "torch", "transformers", "strata", "commit", "model", "dtype", "page_tokens",
              "question_tokens", "reps", "mode", "file_dir", "wall_s"):
        lines.append(f"| {k} | {meta.get(k, '')} |")
    lines.append("")
    if corr is not None:
        lines += correctness_lines(corr, "")
    if corr_mla is not None:
        lines += correctness_lines(corr_mla, f", MLA ({corr_mla.get('model', 'DeepSeek-V3-shaped')})")
    lines += [f"## TTFT of a {meta['question_tokens']}-token question on a cached document (median of {meta['reps']})",
              "",
              "(a) recompute: prefill of document + question. (b) per-block DMA: one cudaMemcpyAsync per (page, layer, "
              "K/V) block from pinned memory into scattered pool pages, then the forward. (c) strata forced to "
              "dma_batch. (d) strata's default (StrataKVPool: the controller's automatic backend choice after warm_up), "
              "each layer waits for its own layer's load (StrataCache). (d') the same with gpu_assisted forced. (e) (d) "
              "with the document on the file tier only. Ideal: the document's bytes over "
              "the contiguous pinned -> device copy bandwidth measured here, plus the compute of the question with the "
              "KV in place. Times in ms.", "",
              "| context tokens | KV GiB | (a) recompute | (b) per-block DMA | (c) batched DMA | (d) strata | "
              "(d') gpu_assisted | (e) file tier | contiguous copy | compute | ideal | contiguous GB/s | (d)/ideal (<= 1.2) | "
              "(a)/(d) | target (a)/(d) | (d) / best of (c), (d') (<= 1.05) | (d) loads by |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row.get("skipped"):
            lines.append(f"| {row['tokens']} | {row['bytes_planned'] / GIB:.2f} | skipped: {row['skipped']} "
                         "| | | | | | | | | | | | | | |")
            continue
        s = summarize(row)
        e = fmt(s["file"], 1e3)
        if row.get("file_recomputed"):
            e += " (recomputed)"
        c = fmt(s["dma_batch"], 1e3) + (" (recomputed)" if row.get("dma_batch_recomputed") else "")
        d = fmt(s["strata"], 1e3) + (" (recomputed)" if row.get("strata_recomputed") else "")
        d2 = fmt(s["forced_ga"], 1e3) + (" (recomputed)" if row.get("forced_ga_recomputed") else "")
        tgt = TARGET_A_OVER_D.get(row["tokens"])
        lines.append(
            f"| {row['tokens']} | {row['bytes'] / GIB:.2f} | {fmt(s['recompute'], 1e3)} | {fmt(s['per_block'], 1e3)} | "
            f"{c} | {d} | {d2} | {e} | {fmt(s['contiguous'], 1e3, 2)} | {fmt(s['compute'], 1e3, 2)} | {fmt(s['ideal'], 1e3)} | "
            f"{fmt(s['contiguous_gbps'])} | {fmt(s['d_over_ideal'], 1, 3)} | {fmt(s['a_over_d'])} | "
            f"{'>= ' + format(tgt, 'g') if tgt else '—'} | {fmt(s['d_over_best_fixed'], 1, 3)} | "
            f"{row.get('strata_backends', '—')} |")
    lines.append("")
    lines += ["### Details per length", ""]
    for row in rows:
        if row.get("skipped"):
            continue
        s = summarize(row)
        lines.append(f"- {row['tokens']} tokens: per-block DMA issued by {row.get('per_block_issue', '—')} "
                     f"({row.get('blocks', '—')} blocks, {fmt(s['per_block_gbps'])} GB/s effective after the compute); "
                     f"(c) loads by {row.get('dma_batch_backends', '—')}; (d') loads by "
                     f"{row.get('forced_ga_backends', '—')}; (e) loads by {row.get('file_backends', '—')}, "
                     f"cached pages {row.get('file_cached_pages', '—')}, {row.get('file_note', '')}; KV: "
                     f"{row.get('kv_source')}; layer waits in order: (c) {row.get('dma_batch_waits_in_order', '—')}, "
                     f"(d) {row.get('strata_waits_in_order', '—')}, (e) {row.get('file_waits_in_order', '—')}; "
                     f"first tokens agree across (b)-(e): {row.get('first_tokens_agree')}"
                     + (f"; errors: {row['errors']}" if row.get("errors") else ""))
    lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {x}" for x in notes] + [""]
    md = "\n".join(lines)
    with open(os.path.join(out_dir, "real_model.md"), "w") as f:
        f.write(md)

    cols = ["tokens", "kv_bytes", "recompute_ms", "per_block_ms", "dma_batch_ms", "strata_ms", "forced_ga_ms", "file_ms",
            "contiguous_ms", "compute_ms", "ideal_ms", "contiguous_gbps", "d_over_ideal", "a_over_d", "strata_backends",
            "file_loaded", "skipped", "errors"]
    with open(os.path.join(out_dir, "real_model.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for row in rows:
            if row.get("skipped"):
                w.writerow([row["tokens"], row.get("bytes_planned")] + [""] * (len(cols) - 4) + [row["skipped"], ""])
                continue
            s = summarize(row)
            ms = lambda x: "" if x is None else f"{x * 1e3:.3f}"  # noqa: E731
            w.writerow([row["tokens"], row["bytes"], ms(s["recompute"]), ms(s["per_block"]), ms(s["dma_batch"]),
                        ms(s["strata"]), ms(s["forced_ga"]), ms(s["file"]), ms(s["contiguous"]), ms(s["compute"]), ms(s["ideal"]),
                        "" if s["contiguous_gbps"] is None else f"{s['contiguous_gbps']:.2f}",
                        "" if s["d_over_ideal"] is None else f"{s['d_over_ideal']:.4f}",
                        "" if s["a_over_d"] is None else f"{s['a_over_d']:.2f}", row.get("strata_backends", ""),
                        row.get("file_loaded", ""), "", "; ".join(row.get("errors", []))])
    with open(os.path.join(out_dir, "real_model.json"), "w") as f:
        json.dump(dict(meta=meta, correctness=corr, correctness_mla=corr_mla, ttft=rows, notes=notes), f, indent=1,
                  default=str)
    return md


def plot(out_dir, rows, meta):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no ttft.png"
    series = [("recompute", "(a) recompute", "o-"), ("per_block", "(b) per-block DMA", "s-"),
              ("dma_batch", "(c) batched DMA (strata, forced)", "^-"), ("strata", "(d) strata default", "D-"),
              ("forced_ga", "(d') strata, gpu_assisted forced", "d:"),
              ("file", "(e) strata, file tier", "v-"), ("ideal", "ideal: contiguous copy + compute", "k--")]
    done = [r for r in rows if not r.get("skipped")]
    if not done:
        return "no TTFT measured: no ttft.png"
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for key, label, style in series:
        xs, ys = [], []
        for r in done:
            v = summarize(r).get(key)
            if v:
                xs.append(r["tokens"])
                ys.append(v * 1e3)
        if xs:
            ax.plot(xs, ys, style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([r["tokens"] for r in done])
    ax.set_xticklabels([f"{r['tokens'] // 1024}K" for r in done])
    ax.set_xlabel("cached document (tokens)")
    ax.set_ylabel(f"TTFT of a {meta['question_tokens']}-token question (ms)")
    ax.set_title(f"{meta['model']} on {meta['gpu']}\n{meta['date']}, commit {meta['commit']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "ttft.png"), dpi=130)
    plt.close(fig)
    return None


# --- main ---------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "./real_model_out", help="output directory")
    p.add_argument("--commit", default=None, help="commit to report (default: git rev-parse, if available)")
    p.add_argument("--quick", action="store_true", help="8K and 32K only, 1 repetition, 8 decode tokens")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny random Llama on the CPU (host controller, float32)")
    p.add_argument("--lengths", default=None, help="document lengths, e.g. 8192,32768 (default 8K,32K,64K,128K)")
    p.add_argument("--file-lengths", default=None, help="lengths that also measure (e) (default 8192,32768)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per measurement (default 3; --quick 1)")
    p.add_argument("--decode", type=int, default=None, help="greedy tokens of the bit-exactness check (default 32)")
    p.add_argument("--check-tokens", type=int, default=None, help="context of the bit-exactness check (default 8192)")
    p.add_argument("--suffix-tokens", default="17,29", help="the two suffixes' lengths of the check")
    p.add_argument("--question-tokens", type=int, default=100)
    p.add_argument("--page-tokens", type=int, default=None, help="tokens per page (default 32; --cpu-smoke 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-correctness", action="store_true")
    p.add_argument("--cudnn-attention-in-check", action="store_true",
                   help="keep cuDNN's attention on in the bit-exactness check (off by default: not reproducible)")
    p.add_argument("--skip-ttft", action="store_true")
    p.add_argument("--skip-mla", action="store_true", help="no MLA check (the small DeepSeek-V3-shaped model)")
    p.add_argument("--mla-check-tokens", type=int, default=None, help="context of the MLA check (default 4096)")
    p.add_argument("--file-dir", default=None, help="where the file tier's files go (default: the temp directory)")
    p.add_argument("--file-buffered", action="store_true", help="file tier without O_DIRECT and io_uring")
    p.add_argument("--file-cost-gbps", type=float, default=None,
                   help="file-tier read rate the controller's cost model assumes (default 12, the PCIe 5 NVMe "
                        "assumption, so that it reads rather than recomputes; 0: the controller's default, the "
                        "measured 1.92 GB/s disk, which recomputes documents up to ~64K tokens)")
    p.add_argument("--time-limit-s", type=float, default=480.0,
                   help="start no new document length after this many seconds (the outputs are written after each)")
    a = p.parse_args(argv)
    if a.cpu_smoke:
        # 4K tokens: long enough that the cost model prefers reading the file tier to recomputing
        # (its 100 µs file latency dominates shorter tiny-model contexts)
        a.lengths = a.lengths or "2048,4096"
        a.file_lengths = a.file_lengths or "4096"
        a.reps = a.reps or 2
        a.decode = a.decode or 8
        a.check_tokens = a.check_tokens or 4096
        a.page_tokens = a.page_tokens or 16
        a.file_cost_gbps = 1000.0 if a.file_cost_gbps is None else a.file_cost_gbps
        a.suffix_tokens = a.suffix_tokens if a.suffix_tokens != "17,29" else "7,11"
    elif a.quick:
        a.lengths = a.lengths or "8192,32768"
        a.reps = a.reps or 1
        a.decode = a.decode or 8
    a.lengths = [int(x) for x in (a.lengths or "8192,32768,65536,131072").split(",") if x]
    a.file_lengths = [int(x) for x in (a.file_lengths or "8192,32768").split(",") if x]
    a.reps = a.reps or 3
    a.decode = a.decode or 32
    a.check_tokens = a.check_tokens or 8192
    a.page_tokens = a.page_tokens or 32
    a.file_cost_gbps = 12.0 if a.file_cost_gbps is None else a.file_cost_gbps
    a.suffix_tokens = [int(x) for x in a.suffix_tokens.split(",") if x]
    if len(a.suffix_tokens) < 2:
        p.error("--suffix-tokens needs two lengths")
    return a


def run_correctness(ctx):
    """`correctness(ctx)` with cuDNN's attention off (unless --cudnn-attention-in-check): it is not
    run-to-run reproducible on the H200 (two identical decodes differed from their third step), so the
    bitwise part runs on SDPA's other kernels. The TTFT part keeps torch's default, cuDNN included."""
    args = ctx.args
    cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(args.cudnn_attention_in_check)
    try:
        corr = correctness(ctx)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        corr = dict(tokens=args.check_tokens, decode=args.decode, suffix_tokens=args.suffix_tokens, rows=[],
                    failures=[], errors=[f"{type(e).__name__}: {e}"], seconds=None)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
    corr["cudnn_attention"] = bool(args.cudnn_attention_in_check)
    free_memory()
    log(f"correctness: {'PASS' if verdict_rc(corr) == 0 else 'FAIL'} ({corr['seconds'] or 0:.1f} s)"
        + (f"; failures {corr['failures']}" if corr["failures"] else "")
        + (f"; errors {corr['errors']}" if corr["errors"] else ""))
    return corr


def verdict_rc(corr):
    return 1 if corr["failures"] else (2 if corr["errors"] else 0)


def worse_rc(a, b):
    """Exit status of two parts: a failed check (1) outranks a check that could not run (2)."""
    return 1 if 1 in (a, b) else max(a, b)


def mla_correctness(args, dev, dtype):
    """The same checks on a small DeepSeek-V3-shaped model (mla_config): its MLA latent in strata's
    MLA layout, through every backend and the file tier."""
    smoke = dev.type != "cuda"
    margs = argparse.Namespace(**vars(args))
    margs.check_tokens = args.mla_check_tokens or (1024 if smoke else 4096)
    # A small model recomputes a few thousand tokens faster than a 12 GB/s file tier reads them, so
    # its controller keeps them out of that tier (what is cheaper to recompute than to read stays
    # out of a slow tier): told a rate at which reading wins, as --cpu-smoke does, so that the check
    # goes through the file tier at all.
    if margs.file_cost_gbps and margs.file_cost_gbps < 1000:
        margs.file_cost_gbps = 1000.0
    cfg = mla_config(smoke)
    name = ("tiny" if smoke else "small") + f" DeepSeek-V3-shaped (MLA: kv_lora_rank {cfg.kv_lora_rank}, rope " \
        f"{cfg.qk_rope_head_dim}; {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, dense MLPs), random weights"
    log(f"MLA: {name}")
    try:
        model = build_model(cfg, dev, dtype, args.seed)
        mctx = Ctx(margs, model, dev, dtype)
        w = torch.randint(0, mctx.vocab, (1, 512), device=dev)
        c = DynamicCache()
        first_token(model, w[:, :400], c)  # warm-up
        first_token(model, w[:, 400:], c)
        del c, w
        corr = run_correctness(mctx)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        corr = dict(tokens=margs.check_tokens, decode=args.decode, suffix_tokens=args.suffix_tokens, rows=[],
                    failures=[], errors=[f"MLA model: {type(e).__name__}: {e}"], seconds=None)
    corr["model"] = name
    model = mctx = None
    free_memory()
    return corr


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.cpu_smoke:
        dev, dtype = torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            log("real_model.py: no CUDA device (use --cpu-smoke for the CPU check)")
            return 77
        if not strata.gpu_available():
            log("real_model.py: strata was built without CUDA (pip install --no-build-isolation ./python on a "
                "machine with nvcc)")
            return 77
        dev, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
    cfg = model_config(args.cpu_smoke)
    name = "tiny random Llama (CPU smoke)" if args.cpu_smoke else "Llama-3.1-8B-shaped LlamaForCausalLM, random weights"
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none (CPU)",
                host=f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})",
                torch=torch.__version__, transformers=transformers.__version__, strata=strata.__version__,
                commit=args.commit or git_commit(), model=name, dtype=str(dtype).replace("torch.", ""),
                page_tokens=args.page_tokens, question_tokens=args.question_tokens, reps=args.reps,
                mode="cpu-smoke" if args.cpu_smoke else ("quick" if args.quick else "full"),
                file_dir=args.file_dir or tempfile.gettempdir(),
                layers=cfg.num_hidden_layers, kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
    notes = []
    log(f"real_model.py: {name}; {meta['gpu']}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"strata {strata.__version__}; out {args.out}")

    t = time.perf_counter()
    model = build_model(cfg, dev, dtype, args.seed)
    params = sum(p.numel() for p in model.parameters())
    meta["parameters"] = params
    log(f"model: {params / 1e9:.2f} B parameters, {cfg.num_hidden_layers} layers, built in {time.perf_counter() - t:.1f} s")
    ctx = Ctx(args, model, dev, dtype)
    if not args.cpu_smoke and cfg.num_hidden_layers != 32:
        notes.append(f"fewer layers than Llama-3.1-8B: {cfg.num_hidden_layers}")

    # Warm-up: cuBLAS, attention kernels, the allocator.
    w = torch.randint(0, ctx.vocab, (1, 1024 + args.question_tokens), device=dev)
    c = DynamicCache()
    first_token(model, w[:, :1024], c)
    first_token(model, w[:, 1024:], c)
    del c, w
    sync(dev)

    corr = None
    rows = []
    rc = 0
    corr_mla = None
    if not args.skip_correctness:
        corr = run_correctness(ctx)
        rc = worse_rc(rc, verdict_rc(corr))
        meta["wall_s"] = round(time.perf_counter() - t_start, 1)
        write_report(args.out, meta, corr, rows, notes)
        if not args.skip_mla:
            corr_mla = mla_correctness(args, dev, dtype)
            rc = worse_rc(rc, verdict_rc(corr_mla))
            meta["wall_s"] = round(time.perf_counter() - t_start, 1)
            write_report(args.out, meta, corr, rows, notes, corr_mla)

    if not args.skip_ttft:
        lengths = sorted(args.lengths)
        L = ctx.layers
        host = HostBuffer(ctx, max(lengths) * L * 2 * ctx.kv_heads * ctx.head_dim)
        last = None  # (tokens, seconds) of the last length measured
        for i, n in enumerate(lengths):
            n = (n // ctx.pt) * ctx.pt
            nbytes = (n // ctx.pt) * ctx.page_bytes
            row = dict(tokens=n, bytes_planned=nbytes)
            elapsed = time.perf_counter() - t_start
            predicted = last[1] * (n / last[0]) ** 1.7 if last else 0.0
            reason = None
            if elapsed > args.time_limit_s or elapsed + predicted > args.time_limit_s * 1.15:
                reason = (f"time: {elapsed:.0f} s elapsed, ~{predicted:.0f} s predicted for this length, limit "
                          f"{args.time_limit_s:.0f} s (--time-limit-s)")
            elif ctx.gpu:
                free_memory()
                free, _ = torch.cuda.mem_get_info(dev)
                act = (n + args.question_tokens) * (cfg.intermediate_size * 3 + cfg.hidden_size * 8) * ctx.elem
                need = max(nbytes + act, 3.2 * nbytes) + 4 * GIB
                if free < need:
                    reason = f"GPU memory: {free / GIB:.1f} GiB free, ~{need / GIB:.1f} GiB needed"
                host_need = nbytes * (1 if host.t is not None and host.t.numel() * ctx.elem >= nbytes else 2) + 4 * GIB
                if reason is None and host_available_bytes() < host_need:
                    reason = (f"host memory: {host_available_bytes() / GIB:.1f} GiB available, ~{host_need / GIB:.1f} "
                              "GiB of pinned memory needed")
            if reason:
                row["skipped"] = reason
                log(f"TTFT {n} tokens: SKIPPED ({reason})")
                rows.append(row)
                notes.append(f"{n} tokens skipped: {reason}")
                meta["wall_s"] = round(time.perf_counter() - t_start, 1)
                write_report(args.out, meta, corr, rows, notes, corr_mla)
                continue
            log(f"TTFT {n} tokens ({nbytes / GIB:.2f} GiB of KV):")
            t = time.perf_counter()
            warm = 1 if (i == 0 or n <= 32768) else 0
            try:
                ttft_length(ctx, n, args.reps, warm, host, row, with_file=n in args.file_lengths)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                row.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
            free_memory()
            seconds = time.perf_counter() - t
            row["seconds"] = round(seconds, 1)
            last = (n, seconds)
            rows.append(row)
            s = summarize(row)
            log(f"  -> ideal {fmt(s['ideal'], 1e3)} ms, (d) {fmt(s['strata'], 1e3)} ms, (d)/ideal "
                f"{fmt(s['d_over_ideal'], 1, 3)}, (a)/(d) {fmt(s['a_over_d'])} ({seconds:.1f} s)")
            meta["wall_s"] = round(time.perf_counter() - t_start, 1)
            write_report(args.out, meta, corr, rows, notes, corr_mla)
            plot(args.out, rows, meta)  # a run cut short still leaves its plot
        host.t = None
        if args.file_cost_gbps and any(r.get("file_s") for r in rows):
            notes.append(f"(e): the controller's cost model was told the file tier reads at {args.file_cost_gbps:g} "
                         "GB/s so that it loads the document rather than recomputing it; with its default (the "
                         "measured 1.92 GB/s disk) it recomputes documents up to ~64K tokens, where recomputing is "
                         "predicted faster than reading them")
        for r in rows:
            for k in ("dma_batch", "strata", "file"):
                if r.get(k + "_loaded") is False:
                    notes.append(f"{r['tokens']} tokens, {k}: the controller recomputed instead of loading")
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    md = write_report(args.out, meta, corr, rows, notes, corr_mla)
    why = plot(args.out, rows, meta)
    if why:
        log(f"plot: {why}")
    log("")
    log(md)
    log(f"real_model.py: wrote {os.path.abspath(args.out)}/real_model.md, real_model.csv, real_model.json"
        + ("" if why else ", ttft.png") + f" in {meta['wall_s']:.0f} s")
    verdict = {0: "PASS", 1: "FAILED (a bit-exactness check)", 2: "FAILED (a correctness check could not run)"}[rc]
    if corr is None:
        verdict = "correctness not run"
    else:
        skipped = [r for r in corr["rows"] if r.get("skipped")]
        if skipped:
            verdict += f" ({len(skipped)} check(s) skipped: {skipped[0]['note']})"
    log(f"real_model.py: {verdict}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
