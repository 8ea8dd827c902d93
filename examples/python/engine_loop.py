# SPDX-License-Identifier: Apache-2.0
"""An engine's loop around strata's cache controller, on the CPU, from Python (runs anywhere).

NumPy arrays stand in for the GPU's KV pool (SGLang-like: one K and one V array per layer) and the
"model" writes bytes that depend on every token up to a page's end, as a real model's KV would. A
few documents get several questions each; the pool holds about two documents, so prefixes go to the
host tier and come back. Every page a request reads from the cache is checked.

    python examples/python/engine_loop.py [--quick]
"""
import sys
import time

import numpy as np

import strata


def page_value(tokens, p, page_tokens):
    return np.float16((hash(tuple(tokens[: (p + 1) * page_tokens])) % 4000) / 16.0)


def main(quick: bool) -> int:
    g = strata.kv_geometry(layers=4, page_tokens=16, kv_heads=2, head_dim=32, elem_bytes=2, planes=2)
    doc_tokens = 256 if quick else 1024
    device_pages = 2 * doc_tokens // g.page_tokens + 16
    rows = device_pages * g.page_tokens
    k = [np.zeros((rows, g.kv_heads, g.head_dim), np.float16) for _ in range(g.layers)]
    v = [np.zeros((rows, g.kv_heads, g.head_dim), np.float16) for _ in range(g.layers)]
    pool = strata.sglang_layout(k, v, g)
    cache = strata.cpu_controller(pool, host_pages=8 * doc_tokens // g.page_tokens)

    rng = np.random.default_rng(42)
    docs = [[int(t) for t in rng.integers(0, 30000, size=doc_tokens)] for _ in range(3)]
    pt = g.page_tokens
    bad = checked = 0
    rid = 0
    for turn in range(2 if quick else 4):
        for d, doc in enumerate(docs):
            rid += 1
            prompt = doc + [int(t) for t in rng.integers(30000, 31000, size=int(rng.integers(20, 100)))]
            start = time.perf_counter()
            cache.submit(rid, prompt, max_new_tokens=32)
            plan = cache.schedule(tokens=8192)
            loads = cache.begin_loads(plan)
            (it,) = [x for x in loads.ran if x.id == rid]
            (st,) = [s for s in loads.started if s.id == rid]
            table = cache.page_table(rid)
            for layer in range(g.layers):
                cache.wait_layer(loads, layer)  # a GPU engine passes its stream here
                for p in range(it.context_tokens // pt, len(prompt) // pt):
                    val = page_value(prompt, p, pt)
                    k[layer][table[p] * pt:(table[p] + 1) * pt] = val
                    v[layer][table[p] * pt:(table[p] + 1) * pt] = -val
            cache.complete(loads)
            cached = sum(st.cached_pages)
            for p in range(cached):
                val = page_value(prompt, p, pt)
                ok = all((k[l][table[p] * pt:(table[p] + 1) * pt] == val).all() for l in range(g.layers))
                bad += 0 if ok else 1
                checked += 1
            if not cache.wait_after(cache.finish_prefill(rid)):  # a load filling its table failed
                cache.release(rid)  # its pages hold garbage: a real engine submits it again
                continue
            ms = (time.perf_counter() - start) * 1e3
            print(f"request {rid:2d} doc {d} turn {turn + 1}: {len(prompt):5d} tokens, cached pages "
                  f"device {st.cached_pages[0]:3d} host {st.cached_pages[1]:3d}, computed "
                  f"{len(prompt) - it.context_tokens:4d} tokens, TTFT {ms:7.3f} ms")
            cache.release(rid)
            cache.poll()

    s = cache.stats()
    print(f"hit tokens: device {s.hit_tokens[0]}, host {s.hit_tokens[1]}; computed {s.computed_tokens}")
    print(f"bytes moved: host->device {s.bytes_moved[1][0]}, device->host {s.bytes_moved[0][1]}")
    cache.check_invariants()
    if bad or not checked or not s.hit_tokens[1]:
        print(f"engine_loop.py: FAILED ({bad} of {checked} cached pages wrong, {s.hit_tokens[1]} host hit tokens)")
        return 1
    print(f"engine_loop.py: {rid} requests served, {checked} cached pages checked, every KV byte right")
    return 0


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv[1:]))
