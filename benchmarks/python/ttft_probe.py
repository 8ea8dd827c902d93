#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where the first token's time goes beside transformers' forward, per backend: for a 100-token
question on a cached document (the Llama-3.1-8B-shaped model of real_model.py, random weights and
random KV: timing only), the host time of `cache_for`, when each layer's wait is passed on the
compute stream (GPU and host clocks), the forward's end, the load alone, the pool's calibration
(`warm_up`) and the descriptor cost the executor observed. Prints one line per backend; writes
probe.json under $OUT.

    python benchmarks/python/ttft_probe.py [LENGTHS] [CONFIGS]   # e.g. 8192,32768 "ga2;dma;auto"

CONFIGS (";"-separated): ga2, ga4, ga8, ga16 (gpu_assisted forced, that many CTAs), dma (dma_batch
forced), dma_caller (dma_batch on the engine's thread), auto (StrataKVPool's default). Lengths above
32K skip the compute and contiguous-copy rows (no reference copy of the KV fits an 80 GB card).
"""
import json
import os
import sys
import time

sys.path.insert(0, "benchmarks/python")
import torch  # noqa: E402

import real_model as rm  # noqa: E402
import strata  # noqa: E402

OUT = os.environ.get("OUT") or "."
lengths = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "8192,32768").split(",")]
configs = sys.argv[2].split(";") if len(sys.argv) > 2 else None
reps = 3
torch.set_grad_enabled(False)
args = rm.parse_args(["--out", OUT])
dev, dtype = torch.device("cuda", 0), torch.bfloat16
t0 = time.perf_counter()
model = rm.build_model(rm.model_config(False), dev, dtype, 0)
ctx = rm.Ctx(args, model, dev, dtype)
print(f"model built in {time.perf_counter() - t0:.1f} s; {torch.cuda.get_device_name(0)}", flush=True)
results = []

ALL = {
    "ga2": dict(force=0, load_ctas=2),
    "ga4": dict(force=0, load_ctas=4),
    "ga8": dict(force=0, load_ctas=8),
    "ga16": dict(force=0, load_ctas=16),
    "dma": dict(force=1),
    "dma_caller": dict(force=1, dma_submit_thread=False),
    "auto": dict(force=None),
}


def ms(x):
    return round(x * 1e3, 2)


for n in lengths:
    L, pt = ctx.layers, ctx.pt
    pages = n // pt
    gen = torch.Generator().manual_seed(1000 + n)
    doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
    qs = [torch.randint(0, ctx.vocab, (100,), generator=gen) for _ in range(reps + 1)]
    full = [torch.cat([doc, q]).tolist() for q in qs]
    full_dev = [torch.cat([doc, q]).to(dev)[None] for q in qs]
    big = n > 32768  # no reference copy of the KV on an 80 GB card: random KV per layer, no compute / contiguous rows
    flat = None if big else torch.empty((L, 2, pages, pt, ctx.kv_heads, ctx.head_dim), dtype=dtype, device=dev).normal_()
    perm_dev = torch.randperm(pages, generator=gen).to(dev)
    row = {"n": n}

    def kv_of(l):
        if big:
            return tuple(torch.randn(1, ctx.kv_heads, n, ctx.head_dim, dtype=dtype, device=dev) for _ in range(2))
        return rm.gather_prefix(flat, l, perm_dev, n)

    # compute with the KV in place
    times = []
    if big:
        reps_c = 0
    else:
        reps_c = reps + 1
    for r in range(reps_c):
        cache = rm.cache_from(kv_of, L)
        s, _ = rm.timed(ctx, lambda: rm.first_token(model, full_dev[r][:, n:], cache))
        del cache
        if r:
            times.append(s)
    row["compute_ms"] = [ms(t) for t in times]
    # contiguous copy
    if not big:
        hbuf = torch.empty(flat.shape, dtype=dtype, pin_memory=True)
        hbuf.copy_(flat)
        times = []
        for r in range(reps + 1):
            s, _ = rm.timed(ctx, lambda: flat.copy_(hbuf, non_blocking=True))
            if r:
                times.append(s)
        row["contiguous_ms"] = [ms(t) for t in times]
        del hbuf
    if n <= 32768:
        torch.cuda.empty_cache()
        s, _ = rm.timed(ctx, lambda: rm.first_token(model, full_dev[0], rm.DynamicCache()))
        row["recompute_ms"] = ms(s)
    print(n, row, flush=True)
    names = configs or list(ALL)
    for name in names:
        kw = dict(ALL[name])
        force = kw.pop("force")
        rm.free_memory()
        pool = strata.transformers.StrataKVPool(model.config, device_pages=pages + 8, host_pages=pages + 8,
                                                page_tokens=pt, dtype=dtype, device=dev, force=force, **kw)
        rm.seed_pool(ctx, pool, doc.tolist(), kv_of)
        orig = pool._gather
        marks = []

        def gather(cache, layer, k, orig=orig, marks=marks):
            out = orig(cache, layer, k)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append((layer, ev, time.perf_counter()))
            return out

        pool._gather = gather
        rec = {"config": name, "ttft_ms": [], "cache_for_ms": [], "alone_ms": [], "layers": None}
        cal = pool.calibration
        rec["calibration"] = [list(cal.load_gbps), list(cal.copy_gbps), cal.dma_descriptor_us]
        print(f"  calibration: load {[round(x, 1) for x in cal.load_gbps]} copy {[round(x, 1) for x in cal.copy_gbps]} "
              f"GB/s, {cal.dma_descriptor_us:.2f} us/descriptor", flush=True)
        before = pool.controller.executor_stats().transfers[0]
        for r in range(reps + 1):
            rm.drop(ctx, pool, doc.tolist(), strata.tier.host)
            marks.clear()
            torch.cuda.synchronize()
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            e0.record()
            cache = rm.start(ctx, pool, full[r], 1)
            h1 = time.perf_counter()
            tok = rm.first_token(model, full_dev[r][:, cache.prefix_tokens:], cache)
            e1.record()
            h2 = time.perf_counter()
            torch.cuda.synchronize()
            h3 = time.perf_counter()
            if r:
                rec["ttft_ms"].append(ms(h3 - h0))
                rec["cache_for_ms"].append(ms(h1 - h0))
                rec.setdefault("forward_host_ms", []).append(ms(h2 - h1))
                rec.setdefault("gpu_ms", []).append(round(e0.elapsed_time(e1), 2))
                if r == reps:
                    rec["layers"] = [(l, round(e0.elapsed_time(ev), 2), ms(h - h0)) for l, ev, h in marks]
            pool.abort(cache)
            del cache
            # the load alone
            rm.drop(ctx, pool, doc.tolist(), strata.tier.host)
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            cache = rm.start(ctx, pool, full[r], 1)
            for layer in range(L):
                pool.controller.wait_layer(cache.loads, layer, ctx.stream)
            torch.cuda.synchronize()
            if r:
                rec["alone_ms"].append(ms(time.perf_counter() - h0))
            pool.abort(cache)
            del cache
        st = pool.controller.executor_stats()
        after = st.transfers[0]
        rec["backends"] = [a - b for a, b in zip(after, before)]
        rec["descriptor_us_observed"] = getattr(st, "dma_descriptor_us", None)
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        print(f"  {n} {name}: ttft {med(rec['ttft_ms'])} ms (cache_for {med(rec['cache_for_ms'])}, forward host "
              f"{med(rec['forward_host_ms'])}, gpu {med(rec['gpu_ms'])}), load alone {med(rec['alone_ms'])} ms, "
              f"backends {rec['backends']}, descriptor us observed {rec['descriptor_us_observed']}", flush=True)
        lay = rec["layers"] or []
        if lay:
            print("    layer marks (gpu ms, host ms):", [x for x in lay if x[0] in (0, 1, 2, 8, 16, 24, 30, 31)],
                  flush=True)
        row[name] = rec
        pool._gather = orig
        del pool
        rm.free_memory()
    results.append(row)
    del flat
    rm.free_memory()
    with open(os.path.join(OUT, "probe.json"), "w") as f:
        json.dump(results, f, indent=1)
print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)
