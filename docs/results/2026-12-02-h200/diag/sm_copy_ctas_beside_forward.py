# SM copies with 2-16 CTAs beside transformers' forward: does a larger quota buy anything? (not committed)
from beside_forward_setup import *  # noqa: F401,F403 (the shared setup, as it ran)
for name in ("none", "ga2", "ga4", "ga8", "ga16"):
    cop = None if name == "none" else strata.gpu_copier("gpu_assisted", ctas=int(name[2:]))
    beside_forward(name, cop)
    if cop:
        for rep in range(3):
            rm.sync(dev); t0 = time.perf_counter(); t = cop.copy(plan, side.cuda_stream); t.synchronize()
            res.setdefault(name + "/alone_ms", []).append(round((time.perf_counter() - t0) * 1e3, 2))
    print(name, res[name], res.get(name + "/alone_ms"), flush=True)
json.dump(res, open(os.path.join(OUT, "diag4.json"), "w"), indent=1)
