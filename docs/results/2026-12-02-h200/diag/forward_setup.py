# The setup backend_overlap.py and determinism_and_attention.py share (each began with these
# lines when it ran): the Llama-3.1-8B-shaped model, its context, hooks and comparisons.
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
