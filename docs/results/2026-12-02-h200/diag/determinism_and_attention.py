# Diagnostic (not committed): where do the logits of a strata run and a never-left run differ, and
from forward_setup import *  # noqa: F401,F403 (the shared setup, as it ran)
# --- part 1: determinism, 8K context -------------------------------------------------------------
n = 1024 if CPU else 8192
gen = torch.Generator().manual_seed(1)
doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
suf = torch.randint(0, ctx.vocab, (17,), generator=gen)
ids = torch.cat([doc, suf]).to(dev)
doc_list = doc.tolist()
set_impl("sdpa")
ref_kv = prefill_kv(doc)
pages = n // pt
device_pages = pages + 16
for impl in ("sdpa", "strata_flash", "eager"):
    try:
        set_impl(impl)
        r = {}
        hs = hook_layers(impl + "/A")
        A = rm.generate(model, ids, rm.cache_from(lambda l: ref_kv[l], L), 32, ctx.pad)
        for h in hs:
            h.remove()
        hs = hook_layers(impl + "/B")
        B = rm.generate(model, ids, rm.cache_from(lambda l: ref_kv[l], L), 32, ctx.pad)
        for h in hs:
            h.remove()
        r["ref_vs_ref"] = cmp(A, B)
        r["ref_vs_ref_first_forward"] = first_diff(impl + "/A", impl + "/B")
        pool = rm.make_pool(ctx, device_pages, device_pages + 8)
        rm.seed_pool(ctx, pool, doc_list, lambda l: ref_kv[l])
        cache = rm.start(ctx, pool, ids.tolist(), 32)
        r["hit_cached"] = list(cache.cached_pages)
        hs = hook_layers(impl + "/C")
        C = rm.generate(model, ids, cache, 32, ctx.pad)
        for h in hs:
            h.remove()
        pool.abort(cache)
        del cache
        r["ref_vs_devicehit"] = cmp(A, C)
        r["ref_vs_devicehit_first_forward"] = first_diff(impl + "/A", impl + "/C")
        rm.drop(ctx, pool, doc_list, strata.tier.host)
        cache = rm.start(ctx, pool, ids.tolist(), 32)
        r["load_cached"] = list(cache.cached_pages)
        D = rm.generate(model, ids, cache, 32, ctx.pad)
        pool.abort(cache)
        del cache, pool
        r["ref_vs_hostload"] = cmp(A, D)
        r["devicehit_vs_hostload"] = cmp(C, D)
        # A DynamicCache made from the strata-gathered tensors' clone, same as the hit
        if impl != "sdpa":
            r["sdpa_vs_this_ref_logits_maxdiff"] = float((res["sdpa"]["_A"][1][0].float() - A[1][0].float()).abs().max())
        r["_A"] = A
        res[impl] = r
        log(impl, {k: v for k, v in r.items() if not k.startswith("_")})
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        res[impl] = {"error": repr(e)}
    captured.clear()
    rm.free_memory()
# cudnn sdp off
try:
    set_impl("sdpa")
    torch.backends.cuda.enable_cudnn_sdp(False)
    A = rm.generate(model, ids, rm.cache_from(lambda l: ref_kv[l], L), 32, ctx.pad)
    B = rm.generate(model, ids, rm.cache_from(lambda l: ref_kv[l], L), 32, ctx.pad)
    res["sdpa_nocudnn"] = {"ref_vs_ref": cmp(A, B), "vs_sdpa_ref": cmp(res["sdpa"]["_A"], A)}
    log("sdpa_nocudnn", res["sdpa_nocudnn"])
    torch.backends.cuda.enable_cudnn_sdp(True)
except Exception as e:  # noqa: BLE001
    res["sdpa_nocudnn"] = {"error": repr(e)}
for k in list(res):
    if isinstance(res[k], dict):
        res[k].pop("_A", None)
del ref_kv
rm.free_memory()

# --- part 2: question compute and (d) phases -----------------------------------------------------
timing = {}
hostbuf = {}
for n in ((1024, 2048) if CPU else (32768, 131072)):
    try:
        gen = torch.Generator().manual_seed(1000 + n)
        doc = torch.randint(0, ctx.vocab, (n,), generator=gen)
        qs = [torch.randint(0, ctx.vocab, (100,), generator=gen) for _ in range(4)]
        set_impl("sdpa")
        rm.sync(dev)
        t = time.perf_counter()
        kv = prefill_kv(doc)
        rm.sync(dev)
        timing[f"{n}/prefill_s"] = time.perf_counter() - t
        pages = n // pt
        pool = rm.make_pool(ctx, pages + 8, pages + 8)
        rm.seed_pool(ctx, pool, doc.tolist(), lambda l: kv[l])
        for impl in ("sdpa", "strata_flash"):
            set_impl(impl)
            comp, dd, st, iss = [], [], [], []
            toks = []
            for r in range(4):
                cache = rm.cache_from(lambda l: kv[l], L)
                s, tok = rm.timed(ctx, lambda: rm.first_token(model, qs[r].to(dev)[None], cache))
                del cache
                toks.append(int(tok))
                if r:
                    comp.append(s)
            for r in range(4):
                rm.drop(ctx, pool, doc.tolist(), strata.tier.host)
                full = torch.cat([doc, qs[r]])
                fl = full.tolist()
                fd = full.to(dev)[None]
                rm.sync(dev)
                t0 = time.perf_counter()
                cache = rm.start(ctx, pool, fl, 1)
                t1 = time.perf_counter()
                tok = rm.first_token(model, fd[:, cache.prefix_tokens:], cache)
                t2 = time.perf_counter()
                rm.sync(dev)
                t3 = time.perf_counter()
                toks.append(int(tok))
                pool.abort(cache)
                del cache
                if r:
                    st.append(t1 - t0)
                    iss.append(t2 - t1)
                    dd.append(t3 - t0)
            timing[f"{n}/{impl}"] = dict(compute_ms=[round(x * 1e3, 2) for x in comp],
                                         d_ms=[round(x * 1e3, 2) for x in dd],
                                         start_ms=[round(x * 1e3, 2) for x in st],
                                         forward_issue_ms=[round(x * 1e3, 2) for x in iss], tokens=toks)
            log(n, impl, timing[f"{n}/{impl}"])
        del pool, kv
        rm.free_memory()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        timing[f"{n}/error"] = repr(e)
        rm.free_memory()
res["timing"] = timing
with open(os.path.join(OUT, "diag.json"), "w") as f:
    json.dump(res, f, indent=1, default=str)
log(json.dumps(res, indent=1, default=str))
