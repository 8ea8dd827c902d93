# Diagnostic (not committed): where do the logits of a strata run and a never-left run differ, and
from forward_setup import *  # noqa: F401,F403 (the shared setup, as it ran)

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
