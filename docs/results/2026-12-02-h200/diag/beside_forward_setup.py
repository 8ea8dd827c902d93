# The setup and measurement dma_beside_forward.py and sm_copy_ctas_beside_forward.py share (each
# began with these lines, and ran this loop inline, when it ran): a 32K-token document's KV, the
# 100-token question's forward, and a load beside it on a side stream.
import os, sys, time, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "python"))
import real_model as rm
import torch
import strata
from transformers import DynamicCache
OUT = os.environ.get("OUT", "/tmp/d3"); os.makedirs(OUT, exist_ok=True)
torch.use_deterministic_algorithms(True, warn_only=True)
dev = torch.device("cuda"); dtype = torch.bfloat16
args = rm.parse_args(["--out", OUT]); model = rm.build_model(rm.model_config(False), dev, dtype, 0)
ctx = rm.Ctx(args, model, dev, dtype); L, pt, H, D = ctx.layers, ctx.pt, ctx.kv_heads, ctx.head_dim
n = 32768; pages = n // pt
gen = torch.Generator().manual_seed(5)
doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
q = torch.randint(0, ctx.vocab, (1, 100), generator=gen).to(dev)
c = DynamicCache(); model(input_ids=doc.to(dev)[None], past_key_values=c, use_cache=True, logits_to_keep=1)
kv = [(l.keys.clone(), l.values.clone()) for l in c.layers]; del c
g = ctx.geometry
host = torch.from_dlpack(strata.pinned_host_pool(g, pages)).view(torch.int16); host.fill_(1)
k = [torch.zeros(pages * pt, H, D, dtype=torch.int16, device=dev) for _ in range(L)]
v = [torch.zeros_like(x) for x in k]
plan = strata.copy_plan(strata.page_first(host, g), strata.sglang_layout(k, v, g), [(p, p) for p in range(pages)])
side = torch.cuda.Stream()
res = {}


def beside_forward(name, cop):
    """Three repetitions of the question's forward with copier `cop`'s load beside it (none: alone)."""
    for rep in range(3):
        cache = rm.cache_from(lambda l: kv[l], L)
        rm.sync(dev)
        t0 = time.perf_counter()
        t = cop.copy(plan, side.cuda_stream) if cop else None
        t1 = time.perf_counter()
        small = torch.arange(64, dtype=torch.long).pin_memory().to(dev, non_blocking=True)
        ev = torch.cuda.Event(); ev.record(); ev.synchronize()
        t2 = time.perf_counter()   # a tiny H2D copy on the compute stream, waited for
        tok = rm.first_token(model, q, cache)
        t3 = time.perf_counter()   # forward issued
        torch.cuda.current_stream().synchronize()
        t4 = time.perf_counter()
        if t: t.synchronize()
        t5 = time.perf_counter()
        del cache
        res.setdefault(name, []).append(dict(enqueue_ms=round((t1-t0)*1e3,2), small_h2d_ms=round((t2-t1)*1e3,2),
            forward_issue_ms=round((t3-t2)*1e3,2), forward_done_ms=round((t4-t2)*1e3,2), copy_done_ms=round((t5-t0)*1e3,2)))
