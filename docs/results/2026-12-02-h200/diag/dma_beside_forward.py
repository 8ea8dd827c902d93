# Does a batched-DMA load delay transformers' forward, and is it the copy engine? (not committed)
from beside_forward_setup import *  # noqa: F401,F403 (the shared setup, as it ran)
for name in ("none", "dma_batch", "gpu_assisted", "dma_copy", "none"):
    cop = None if name == "none" else strata.gpu_copier(name)
    beside_forward(name, cop)
    print(name, res[name], flush=True)
json.dump(res, open(os.path.join(OUT, "diag3.json"), "w"), indent=1)
