# Diagnostic (not committed): where do the logits of a strata run and a never-left run differ, and
# what does the 100-token question cost under transformers' sdpa vs a lower-right causal flash path.
import os
import sys
import time
import json

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "python"))
import real_model as rm  # noqa: E402  (sets CUBLAS_WORKSPACE_CONFIG)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402
import transformers  # noqa: E402
from transformers import AttentionInterface, DynamicCache  # noqa: E402
import strata  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/diag_out")
os.makedirs(OUT, exist_ok=True)
res = {}


def log(*a):
    print(*a, flush=True)


def flash_lr(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    ql, kl = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if ql == 1:
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=gqa)
    elif ql == kl:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=causal_lower_right(ql, kl), scale=scaling,
                                             enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("strata_flash", flash_lr)

torch.use_deterministic_algorithms(True, warn_only=True)
CPU = os.environ.get("DIAG_CPU") == "1"
dev = torch.device("cpu" if CPU else "cuda")
dtype = torch.float32 if CPU else torch.bfloat16
args = rm.parse_args(["--out", OUT] + (["--cpu-smoke"] if CPU else []))
cfg = rm.model_config(CPU)
t0 = time.perf_counter()
model = rm.build_model(cfg, dev, dtype, 0)
log(f"model built in {time.perf_counter() - t0:.1f} s")
ctx = rm.Ctx(args, model, dev, dtype)
L, pt = ctx.layers, ctx.pt


def set_impl(name):
    model.config._attn_implementation = name
    for m in model.modules():
        if hasattr(m, "config") and m.config is not model.config and hasattr(m.config, "_attn_implementation"):
            m.config._attn_implementation = name


def prefill_kv(doc):
    c = DynamicCache()
    with torch.no_grad():
        model(input_ids=doc.to(dev)[None], past_key_values=c, use_cache=True, logits_to_keep=1)
    kv = [(lay.keys.clone(), lay.values.clone()) for lay in c.layers]
    del c
    return kv


def cmp(a, b):
    """first step whose logits differ, max abs diff at that step"""
    la, lb = a[1], b[1]
    for s in range(min(la.shape[0], lb.shape[0])):
        if not torch.equal(la[s], lb[s]):
            return dict(equal=False, first_step=s, maxdiff=float((la[s].float() - lb[s].float()).abs().max()),
                        tokens_equal=bool(torch.equal(a[0], b[0])))
    return dict(equal=True, tokens_equal=bool(torch.equal(a[0], b[0])))


captured = {}


def hook_layers(tag):
    hs = []
    captured[tag] = {}
    first = {"done": False}

    def mk(i, part):
        def h(mod, inp, out):
            if first["done"]:
                return
            o = out[0] if isinstance(out, tuple) else out
            captured[tag][(i, part)] = o.detach().clone()
        return h

    for i, layer in enumerate(model.model.layers):
        hs.append(layer.self_attn.register_forward_hook(mk(i, "attn")))
        hs.append(layer.mlp.register_forward_hook(mk(i, "mlp")))

    def fin(mod, inp, out):
        first["done"] = True
    hs.append(model.register_forward_hook(fin))
    return hs


def first_diff(ta, tb):
    for i in range(L):
        for part in ("attn", "mlp"):
            a, b = captured[ta].get((i, part)), captured[tb].get((i, part))
            if a is None or b is None:
                return f"missing {(i, part)}"
            if a.shape != b.shape:
                return f"shape differs at {(i, part)}: {tuple(a.shape)} vs {tuple(b.shape)}"
            if not torch.equal(a, b):
                return f"first differ at layer {i} {part} (max {float((a.float() - b.float()).abs().max()):.3g})"
    return "first forward identical in every layer"



set_impl("sdpa")
timing = {}
for n in ((2048,) if CPU else (32768, 131072)):
    try:
        gen = torch.Generator().manual_seed(1000 + n)
        doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
        qs = [torch.randint(0, ctx.vocab, (100,), generator=gen) for _ in range(4)]
        kv = prefill_kv(doc)
        pages = n // pt
        for cudnn in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            comp = []
            for r in range(4):
                cache = rm.cache_from(lambda l: kv[l], L)
                s, tok = rm.timed(ctx, lambda: rm.first_token(model, qs[r].to(dev)[None], cache))
                del cache
                if r:
                    comp.append(round(s * 1e3, 2))
            timing[f"{n}/cudnn={cudnn}/compute_ms"] = comp
            log(n, cudnn, comp)
        for force in (None, 0, 1):
            pool = rm.make_pool(ctx, pages + 8, pages + 8, force=force)
            rm.seed_pool(ctx, pool, doc.tolist(), lambda l: kv[l])
            for cudnn in (True, False):
                torch.backends.cuda.enable_cudnn_sdp(cudnn)
                dd, st, iss, lo = [], [], [], []
                before = rm.backend_counts(pool)
                for r in range(4):
                    full = torch.cat([doc, qs[r]])
                    fl = full.tolist()
                    fd = full.to(dev)[None]
                    # load alone
                    rm.drop(ctx, pool, doc.tolist(), strata.tier.host)
                    rm.sync(dev)
                    t0 = time.perf_counter()
                    cache = rm.start(ctx, pool, fl, 1)
                    pool.controller.synchronize()
                    t1 = time.perf_counter()
                    pool.abort(cache)
                    del cache
                    if r:
                        lo.append(round((t1 - t0) * 1e3, 2))
                    rm.drop(ctx, pool, doc.tolist(), strata.tier.host)
                    rm.sync(dev)
                    t0 = time.perf_counter()
                    cache = rm.start(ctx, pool, fl, 1)
                    t1 = time.perf_counter()
                    tok = rm.first_token(model, fd[:, cache.prefix_tokens:], cache)
                    t2 = time.perf_counter()
                    rm.sync(dev)
                    t3 = time.perf_counter()
                    pool.abort(cache)
                    del cache
                    if r:
                        st.append(round((t1 - t0) * 1e3, 2))
                        iss.append(round((t2 - t1) * 1e3, 2))
                        dd.append(round((t3 - t0) * 1e3, 2))
                key = f"{n}/force={force}/cudnn={cudnn}"
                timing[key] = dict(load_only_ms=lo, d_ms=dd, start_ms=st, forward_issue_ms=iss,
                                   backends=rm.backends_used(before, rm.backend_counts(pool)))
                log(key, timing[key])
            del pool
            rm.free_memory()
        del kv
        rm.free_memory()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        timing[f"{n}/error"] = repr(e)
        rm.free_memory()
with open(os.path.join(OUT, "diag2.json"), "w") as f:
    json.dump(timing, f, indent=1, default=str)
