# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Llama on strata (CPU): a prefix computed once, moved to the host tier, dropped
from the pool, loaded back through the controller, and decoded: logits bitwise identical to a run
whose cache never left the model. Nothing is downloaded."""
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import strata  # noqa: E402
from strata.transformers import StrataCache, StrataKVPool  # noqa: E402

NEW = 8


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def generate(model, ids, cache):
    with torch.no_grad():
        out = model.generate(ids[None], past_key_values=cache, max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0], torch.stack(out.logits)


def reference(model, context, suffix):
    """The run that never leaves the model: the context prefilled into a DynamicCache, then generate."""
    cache = transformers.DynamicCache()
    with torch.no_grad():
        model(context[None], past_key_values=cache, use_cache=True)
    return generate(model, torch.cat([context, suffix]), cache)


def test_prefix_through_the_host_tier_is_bit_exact(model):
    g = torch.Generator().manual_seed(1)
    context = torch.randint(0, 256, (64,), generator=g)  # 4 pages of 16 tokens
    suffixes = [torch.randint(0, 256, (n,), generator=g) for n in (7, 11)]
    pool = StrataKVPool(model.config, device_pages=32, host_pages=64, page_tokens=16, dtype=torch.float32)
    assert pool.geometry == strata.kv_geometry(2, 16, 2, 16, 4, 2)

    # The context, prefilled through strata: nothing cached yet.
    cache = pool.cache_for(context, max_new_tokens=1)
    assert isinstance(cache, StrataCache) and cache.prefix_tokens == 0
    with torch.no_grad():
        model(context[None], past_key_values=cache, use_cache=True)
    pool.commit(cache)

    # Backed up to the host (write-through), then dropped from the pool.
    c = pool.controller
    c.poll()
    assert c.stats().bytes_moved[0][1] == 4 * pool.geometry.page_bytes()
    assert c.evict(strata.tier.device, 32) == 4
    for t in pool.k + pool.v:
        t.zero_()

    for i, suffix in enumerate(suffixes):
        ids = torch.cat([context, suffix])
        cache = pool.cache_for(ids, max_new_tokens=NEW)
        assert cache.prefix_tokens == 64
        if i == 0:
            assert cache.cached_pages == [0, 4, 0, 0]  # loaded back from the host tier
        pool.waits.clear()
        seq, logits = generate(model, ids, cache)
        assert pool.waits == [0, 1], "each layer waited for its own load, once"
        ref_seq, ref_logits = reference(model, context, suffix)
        assert torch.equal(seq, ref_seq)
        assert torch.equal(logits, ref_logits), f"suffix {i}: logits differ"
        pool.commit(cache, seq, keep_output=True)

    s = c.stats()
    assert s.hit_tokens[1] == 64 and s.hit_tokens[0] == 64
    c.check_invariants()


def test_each_layer_waits_only_for_its_own_load(model):
    """The wait for layer l comes right before layer l's attention, after layer l - 1 ran."""
    events = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, i=i: events.append(("layer", i)))
             for i, layer in enumerate(model.model.layers)]
    try:
        pool = StrataKVPool(model.config, device_pages=16, host_pages=16, page_tokens=16, dtype=torch.float32)
        ctx = torch.arange(32) % 256
        cache = pool.cache_for(ctx)
        with torch.no_grad():
            model(ctx[None], past_key_values=cache, use_cache=True)
        pool.commit(cache)
        pool.controller.poll()
        pool.controller.evict(strata.tier.device, 16)
        real = pool._gather

        def recording(cache, layer, n):
            events.append(("wait", layer))
            return real(cache, layer, n)

        pool._gather = recording
        cache = pool.cache_for(torch.cat([ctx, torch.tensor([5, 6, 7])]))
        events.clear()
        with torch.no_grad():
            model(torch.tensor([[5, 6, 7]]), past_key_values=cache, use_cache=True)
        assert events == [("layer", 0), ("wait", 0), ("layer", 1), ("wait", 1)]
        pool.commit(cache)
    finally:
        for h in hooks:
            h.remove()


def test_rejections(model):
    pool = StrataKVPool(model.config, device_pages=8, host_pages=8, page_tokens=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="one sequence"):
        pool.cache_for(torch.zeros(2, 20, dtype=torch.long))
    with pytest.raises(TypeError):
        StrataKVPool(model.config, device_pages=8, host_pages=8, force=1)
    cache = pool.cache_for(torch.arange(20))
    with pytest.raises(strata.Error, match="run the model"):
        pool.commit(cache)
    pool.abort(cache)
    assert pool.controller.live_requests() == 0


class _LoadFailsOnGpu:
    """The pool's controller, except that the loads are reported as a GPU reports a load that failed
    after the model ran (its ``wait_layer`` only ordered the stream): settled, and the request sent
    back to wait (no longer prefilled)."""

    def __init__(self, real):
        self._real = real

    def prefilled(self, rid):
        return False

    def __getattr__(self, name):
        return getattr(self._real, name)


class _LoadStillCopying:
    """The pool's controller, except that the loads are still copying until ``synchronize``."""

    def __init__(self, real):
        self._real = real
        self.synchronized = False

    def complete(self, loads):
        return self._real.complete(loads) and self.synchronized

    def synchronize(self):
        self.synchronized = True
        self._real.synchronize()

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_commit_after_a_failed_load_caches_nothing_and_ends_the_request(model):
    pool = StrataKVPool(model.config, device_pages=16, host_pages=16, page_tokens=16, dtype=torch.float32)
    real = pool.controller
    ids = torch.arange(40)
    cache = pool.cache_for(ids)
    with torch.no_grad():
        model(ids[None], past_key_values=cache, use_cache=True)
    pool.controller = _LoadFailsOnGpu(real)
    try:
        with pytest.raises(strata.Error, match="failed: what the model computed from it was not cached"):
            pool.commit(cache)
    finally:
        pool.controller = real
    assert real.live_requests() == 0
    assert real.probe(ids.tolist()).tokens == 0  # nothing of it entered the index
    with pytest.raises(strata.Error, match="committed already"):
        pool.commit(cache)
    real.check_invariants()


def test_commit_waits_for_loads_still_copying_and_refuses_bad_output_first(model):
    pool = StrataKVPool(model.config, device_pages=16, host_pages=16, page_tokens=16, dtype=torch.float32)
    real = pool.controller
    ids = torch.arange(40)
    cache = pool.cache_for(ids, max_new_tokens=4)
    with torch.no_grad():
        model(ids[None], past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="batch of 2"):  # nothing changed: commit can run again
        pool.commit(cache, torch.zeros(2, 41, dtype=torch.long), keep_output=True)
    slow = _LoadStillCopying(real)
    pool.controller = slow
    try:
        pool.commit(cache)
    finally:
        pool.controller = real
    assert slow.synchronized and real.live_requests() == 0
    assert real.probe(ids.tolist()).tokens == 32  # its two whole pages are cached
    real.check_invariants()


def test_commit_refuses_a_whole_page_the_model_did_not_finish(model):
    pool = StrataKVPool(model.config, device_pages=16, host_pages=16, page_tokens=16, dtype=torch.float32)
    c = pool.controller
    # 32 tokens, two whole pages; the model ran on all but the last: page 1 lacks its last row.
    ids = torch.arange(32)
    cache = pool.cache_for(ids, max_new_tokens=4)
    with torch.no_grad():
        model(ids[None, :-1], past_key_values=cache, use_cache=True)
    with pytest.raises(strata.Error, match="holds 31 tokens.*2 whole pages of 16"):
        pool.commit(cache)  # nothing changed: the request is live, nothing cached
    assert c.live_requests() == 1 and c.probe(ids.tolist()).tokens == 0
    with torch.no_grad():
        model(ids[None, -1:], past_key_values=cache, use_cache=True)
    pool.commit(cache)
    assert c.probe(ids.tolist()).tokens == 32
    # 40 tokens: the last one lies in the partial page, which is not cached: commit takes 39.
    ids = torch.arange(100, 140)
    cache = pool.cache_for(ids, max_new_tokens=4)
    with torch.no_grad():
        model(ids[None, :-1], past_key_values=cache, use_cache=True)
    pool.commit(cache)
    assert c.probe(ids.tolist()).tokens == 32 and c.live_requests() == 0
    c.check_invariants()


@pytest.fixture(scope="module")
def mla_model():
    """A tiny random DeepSeek-V3-shaped model: transformers caches its MLA latent (compressed KV, rotary key)."""
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                        num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4,
                                        num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8,
                                        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                                        n_group=1, topk_group=1, max_position_embeddings=512)
    return transformers.DeepseekV3ForCausalLM(cfg).eval()


def test_mla_latent_through_the_host_tier_is_bit_exact(mla_model):
    """The MLA latent rides in strata's MLA layout (one 40-element row per token and layer) and comes back
    bit-exact: the decode's logits equal the never-left run's."""
    g = torch.Generator().manual_seed(2)
    context = torch.randint(0, 256, (64,), generator=g)
    suffix = torch.randint(0, 256, (9,), generator=g)
    pool = StrataKVPool(mla_model.config, device_pages=32, host_pages=64, page_tokens=16, dtype=torch.float32)
    assert pool.geometry == strata.kv_geometry(2, 16, 1, 32 + 8, 4, 1)
    assert pool.v == [] and tuple(pool.k[0].shape) == (32 * 16, 1, 40)
    cache = pool.cache_for(context, max_new_tokens=1)
    with torch.no_grad():
        mla_model(context[None], past_key_values=cache, use_cache=True)
    pool.commit(cache)
    c = pool.controller
    c.poll()
    assert c.evict(strata.tier.device, 32) == 4
    for t in pool.k:
        t.zero_()
    ids = torch.cat([context, suffix])
    cache = pool.cache_for(ids, max_new_tokens=NEW)
    assert cache.prefix_tokens == 64 and cache.cached_pages == [0, 4, 0, 0]
    seq, logits = generate(mla_model, ids, cache)
    ref_seq, ref_logits = reference(mla_model, context, suffix)
    assert torch.equal(seq, ref_seq)
    assert torch.equal(logits, ref_logits)
    pool.commit(cache)
    c.check_invariants()


def test_a_cache_of_another_shape_is_refused(model, mla_model):
    """A pool made for one model refuses another's cache tensors, with nothing written."""
    pool = StrataKVPool(model.config, device_pages=8, host_pages=8, page_tokens=16, dtype=torch.float32)
    cache = pool.cache_for(torch.arange(20))
    with pytest.raises(ValueError, match="this pool holds"):
        with torch.no_grad():
            mla_model(torch.arange(20)[None], past_key_values=cache, use_cache=True)
    pool.abort(cache)
    assert pool.controller.live_requests() == 0


@pytest.mark.skipif(not strata.redis_built, reason="the module was built without hiredis")
def test_a_prefix_another_pool_computed_comes_from_the_remote_tier_bit_exact(redis_cluster):
    # Two pools (two engine instances) sharing one Redis Cluster: the second finds the context the
    # first computed and decodes logits bitwise equal to a run whose cache never left the model.
    # Llama-3.1-8B-shaped KV heads (8 of 128, 32 layers) so that reading a page beats recomputing it
    # in the cost model; tiny otherwise (hidden 64), random weights.
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=32,
                                   num_attention_heads=8, num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(cfg).eval()
    geo = strata.kv_geometry(32, 16, 8, 128, 4, 2)
    store = strata.redis_store(redis_cluster.addresses()[:1], geo, model="tiny-llama-remote", dtype="float32")
    o = strata.controller_options()
    o.set_remote_tier(geo, 1e15, 1e15, 0.0)  # loopback: a read at once

    g = torch.Generator().manual_seed(2)
    context = torch.randint(0, 256, (64,), generator=g)  # 4 pages
    first = StrataKVPool(cfg, device_pages=16, host_pages=16, page_tokens=16, dtype=torch.float32, options=o,
                         remote_store=store)
    assert first.geometry == geo
    cache = first.cache_for(context, max_new_tokens=1)
    with torch.no_grad():
        model(context[None], past_key_values=cache, use_cache=True)
    first.commit(cache)
    for _ in range(2000):  # device -> host, then host -> the cluster on the store's threads
        first.controller.poll()
        if store.stats().pages_written >= 4:
            break
        time.sleep(0.002)
    assert store.stats().pages_written >= 4

    second = StrataKVPool(cfg, device_pages=16, host_pages=16, page_tokens=16, dtype=torch.float32, options=o,
                          remote_store=store)
    suffix = torch.randint(0, 256, (9,), generator=g)
    ids = torch.cat([context, suffix])
    cache = second.cache_for(ids, max_new_tokens=NEW)
    assert cache.prefix_tokens == 64
    assert cache.cached_pages[0] == 0 and cache.cached_pages[1] + cache.cached_pages[3] == 4
    seq, logits = generate(model, ids, cache)
    ref_seq, ref_logits = reference(model, context, suffix)
    assert torch.equal(seq, ref_seq) and torch.equal(logits, ref_logits)
    assert second.controller.stats().remote_found_pages == 4
    second.commit(cache, seq, keep_output=True)
    second.controller.check_invariants()
