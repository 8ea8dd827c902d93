# SPDX-License-Identifier: Apache-2.0
"""A transformers model reusing a prefix through strata, with no change to the model.

A document is prefilled once through a `StrataKVPool`; two questions on it then find its pages
cached (`cache.prefix_tokens`), and greedy decoding gives exactly the tokens of a run whose own
cache holds the document (prefilled the same way, never through strata). A tiny random Llama on the CPU stands in for a real model (nothing is
downloaded); on a GPU pass `--device cuda` and a real checkpoint's config. The measured version,
Llama-3.1-8B-shaped on the H200, is benchmarks/python/real_model.py.

    python examples/python/transformers_cache.py [--device cpu|cuda]
"""
import argparse

import torch
import transformers

from strata.transformers import StrataKVPool


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = transformers.LlamaForCausalLM(cfg).to(args.device, dtype).eval()
    pool = StrataKVPool(cfg, device_pages=64, host_pages=256, page_tokens=16, device=args.device, dtype=dtype)

    def generate(ids, cache):
        with torch.no_grad():
            out = model.generate(ids[None], past_key_values=cache, max_new_tokens=16, min_new_tokens=16,
                                 do_sample=False, pad_token_id=0)
        return out[0, ids.numel():]

    g = torch.Generator().manual_seed(1)
    document = torch.randint(0, cfg.vocab_size, (256,), generator=g).to(args.device)
    cache = pool.cache_for(document, max_new_tokens=1)  # nothing cached yet: the model computes it
    with torch.no_grad():
        model(document[None], past_key_values=cache, use_cache=True)
    pool.commit(cache)  # its pages enter strata's index (and are backed up to the host tier)

    same = True
    for q in range(2):
        question = torch.randint(0, cfg.vocab_size, (12,), generator=g).to(args.device)
        ids = torch.cat([document, question])
        cache = pool.cache_for(ids, max_new_tokens=16)  # the document's pages, locked or loading
        reused = cache.prefix_tokens
        answer = generate(ids, cache)
        pool.commit(cache)
        own = transformers.DynamicCache()  # the model alone: the document prefilled into its own cache
        with torch.no_grad():
            model(document[None], past_key_values=own, use_cache=True)
        reference = generate(ids, own)
        same = same and torch.equal(answer, reference)
        print(f"question {q}: {reused} of {ids.numel()} prompt tokens reused from strata, "
              f"answer {'identical to' if torch.equal(answer, reference) else 'DIFFERENT from'} the model's own")
    if not same:
        raise SystemExit("transformers_cache: FAILED")
    print("transformers_cache: every answer identical with the prefix reused")


if __name__ == "__main__":
    main()
