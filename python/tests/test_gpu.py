# SPDX-License-Identifier: Apache-2.0
"""The GPU controller with PyTorch CUDA tensors (skipped without a GPU). Streams are torch's."""
import pytest

import strata

torch = pytest.importorskip("torch")


def test_gpu_controller_rejects_cpu_pools():
    if not strata.cuda_built:
        with pytest.raises(strata.Error, match="without CUDA"):
            strata.gpu_controller(None, 1)
        with pytest.raises(strata.Error, match="gpu_copier is not available"):
            strata.gpu_copier("dma_batch")
        with pytest.raises(strata.Error, match="pinned_host_pool is not available"):
            strata.pinned_host_pool(strata.kv_geometry(2, 16, 2, 16, 2, 2), 4)
        return
    g = strata.kv_geometry(2, 16, 2, 16, 2, 2)
    k = [torch.zeros(64, 2, 16, dtype=torch.float16) for _ in range(2)]
    v = [torch.zeros(64, 2, 16, dtype=torch.float16) for _ in range(2)]
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        strata.gpu_controller(strata.sglang_layout(k, v, g), 8)
    with pytest.raises(TypeError, match="layer_first_table"):
        strata.gpu_controller(object(), 8)


def test_the_host_executor_has_nothing_to_warm_up():
    g = strata.kv_geometry(2, 16, 2, 16, 2, 2)
    k, v = ([torch.zeros(64, 2, 16, dtype=torch.float16) for _ in range(2)] for _ in range(2))
    cal = strata.cpu_controller(strata.sglang_layout(k, v, g), 8).warm_up()
    assert list(cal.load_gbps) == [0, 0, 0] and list(cal.copy_gbps) == [0, 0, 0] and cal.dma_descriptor_us == 0


gpu = pytest.mark.skipif(not (strata.gpu_available() and torch.cuda.is_available()),
                         reason="needs a CUDA GPU and strata built with CUDA")


two_gpus = pytest.mark.skipif(not (strata.gpu_available() and torch.cuda.is_available()
                                    and torch.cuda.device_count() >= 2), reason="needs two CUDA GPUs")


def engine_loop_exact(force, dev="cuda", current=None):
    """A document computed, backed up, evicted and loaded back exactly, the pool on ``dev``; with
    ``current``, that device is current on this thread throughout (and stays so after each call)."""
    g = strata.kv_geometry(4, 16, 2, 64, 2, 2)
    pages = 32
    dev = torch.device(dev)
    k = [torch.zeros(pages * 16, 2, 64, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    v = [torch.zeros(pages * 16, 2, 64, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    c = strata.gpu_controller(strata.sglang_layout(k, v, g), 64, force=force)
    assert c.executor == "gpu" and c.tiers == [strata.tier.device, strata.tier.host]
    stream = torch.cuda.current_stream(dev).cuda_stream
    doc = list(range(100, 100 + 128))  # 8 pages
    c.submit(1, doc + [1, 2, 3], max_new_tokens=4, stream=stream)
    loads = c.begin_loads(c.schedule(), stream)
    assert current is None or torch.cuda.current_device() == current
    table = c.page_table(1)
    data = torch.randn(4, 2, 8 * 16, 2, 64, device=dev).to(torch.bfloat16)
    idx = torch.tensor(table[:8], device=dev)
    for layer in range(4):
        assert c.wait_layer(loads, layer, stream)
        k[layer].view(pages, 16, 2, 64).index_copy_(0, idx, data[layer, 0].view(8, 16, 2, 64))
        v[layer].view(pages, 16, 2, 64).index_copy_(0, idx, data[layer, 1].view(8, 16, 2, 64))
    c.complete(loads)
    assert c.wait_after(c.finish_prefill(1, stream), stream) is True
    c.release(1, None, stream)
    c.synchronize()
    while c.poll(stream):
        c.synchronize()
    assert c.evict(strata.tier.device, pages, stream) >= 8
    c.synchronize()
    c.poll(stream)
    for t in k + v:
        t.zero_()
    c.submit(2, doc + [9], max_new_tokens=4, stream=stream)
    loads = c.begin_loads(c.schedule(), stream)
    assert current is None or torch.cuda.current_device() == current
    assert loads.started[0].cached_pages == [0, 8, 0, 0]
    table = c.page_table(2)
    idx = torch.tensor(table[:8], device=dev)
    for layer in range(4):
        assert c.wait_layer(loads, layer, stream)  # the stream waits for this layer only
        got_k = k[layer].view(pages, 16, 2, 64).index_select(0, idx).view(-1, 2, 64)
        got_v = v[layer].view(pages, 16, 2, 64).index_select(0, idx).view(-1, 2, 64)
        assert torch.equal(got_k, data[layer, 0]) and torch.equal(got_v, data[layer, 1])
    c.complete(loads)
    c.release(2, None, stream)
    c.synchronize()
    c.poll(stream)
    c.check_invariants()
    assert c.executor_stats().failed_submissions == 0
    return c, stream, doc


@gpu
@pytest.mark.parametrize("force", [None, 0, 1])
def test_gpu_engine_loop_exact(force):
    engine_loop_exact(force)


@gpu
def test_warm_up_measures_the_link_and_the_controller_still_serves():
    g = strata.kv_geometry(4, 16, 2, 64, 2, 2)
    k, v = ([torch.zeros(32 * 16, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(4)] for _ in range(2))
    c = strata.gpu_controller(strata.sglang_layout(k, v, g), 64)
    cal = c.warm_up()
    assert all(1 < x < 1000 for x in cal.load_gbps[:2]) and all(1 < x < 1000 for x in cal.copy_gbps[:2])
    assert cal.load_gbps[2] == 0 and cal.dma_descriptor_us > 0
    c.check_invariants()


@gpu
def test_gpu_controller_rejects_a_bad_load_quota():
    g = strata.kv_geometry(2, 16, 2, 16, 2, 2)
    k, v = ([torch.zeros(64, 2, 16, dtype=torch.float16, device="cuda") for _ in range(2)] for _ in range(2))
    with pytest.raises(ValueError, match="load_ctas"):
        strata.gpu_controller(strata.sglang_layout(k, v, g), 8, load_ctas=0)


@two_gpus
@pytest.mark.parametrize("force", [None, 0, 1])
def test_a_pool_on_the_second_gpu_works_with_the_first_current(force):
    torch.cuda.set_device(0)
    c, stream, doc = engine_loop_exact(force, "cuda:1", current=0)
    # A stream of device 0: refused before anything changes; the same plan then starts with
    # device 1's stream (its default stream is 0, as device 0's: the pool's device's, whichever is current).
    c.submit(3, doc + [7], max_new_tokens=4, stream=stream)
    plan = c.schedule()
    with pytest.raises(ValueError, match="device"):
        c.begin_loads(plan, torch.cuda.Stream(device=0).cuda_stream)
    c.check_invariants()
    loads = c.begin_loads(plan, stream)
    assert [s.id for s in loads.started] == [3] and torch.cuda.current_device() == 0
    c.complete(loads)
    c.release(3, None, stream)
    c.synchronize()
    c.check_invariants()


def tiny_llama_with_a_prefix(transformers, seed):
    """A 2-layer random Llama on the GPU, a StrataKVPool for it, and a 256-token context the model
    computed through the pool and committed (its 8 pages on the device, backed up to the host)."""
    from strata.transformers import StrataKVPool

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, 256, (256,), generator=gen).cuda()
    suffix = torch.randint(0, 256, (9,), generator=gen).cuda()
    pool = StrataKVPool(model.config, device_pages=64, host_pages=64, page_tokens=32, dtype=torch.bfloat16,
                        device="cuda")
    cache = pool.cache_for(context)
    with torch.no_grad():
        model(context[None], past_key_values=cache, use_cache=True)
    pool.commit(cache)
    return model, pool, context, suffix


@gpu
def test_transformers_on_the_gpu_is_bit_exact():
    transformers = pytest.importorskip("transformers")
    model, pool, context, suffix = tiny_llama_with_a_prefix(transformers, seed=1)
    pool.controller.synchronize()
    pool.controller.poll(torch.cuda.current_stream().cuda_stream)
    assert pool.controller.evict(strata.tier.device, 64, torch.cuda.current_stream().cuda_stream) == 8
    pool.controller.synchronize()
    for t in pool.k + pool.v:
        t.zero_()
    ids = torch.cat([context, suffix])
    cache = pool.cache_for(ids, max_new_tokens=8)
    assert cache.cached_pages == [0, 8, 0, 0]

    def run(c):
        with torch.no_grad():
            out = model.generate(ids[None], past_key_values=c, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        return torch.stack(out.logits)

    logits = run(cache)
    loads = pool.controller.executor_stats().transfers[0]
    assert sum(loads) > 0 and loads[2] == 0, "the integration's default: the automatic choice (no staged loads)"
    ref = transformers.DynamicCache()
    with torch.no_grad():
        model(context[None], past_key_values=ref, use_cache=True)
    assert torch.equal(logits, run(ref))
    pool.commit(cache)


@gpu
def test_a_forward_on_another_stream_reads_the_prefix_it_was_given():
    """cache_for copies the prefix's page index on the current stream; a forward run on another
    stream must wait for that copy. The current stream is held (a sleep) so that the copy lands late,
    and small zeroed blocks are freed first so that an index read too early names page 0."""
    transformers = pytest.importorskip("transformers")
    model, pool, context, suffix = tiny_llama_with_a_prefix(transformers, seed=2)  # a device hit next: no load
    ref = transformers.DynamicCache()
    with torch.no_grad():
        model(context[None], past_key_values=ref, use_cache=True)
        want = model(suffix[None], past_key_values=ref, use_cache=True).logits
    torch.cuda.synchronize()
    zeros = [torch.zeros(n, dtype=torch.long, device="cuda") for n in range(1, 65)]
    del zeros
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock on the current stream
    cache = pool.cache_for(torch.cat([context, suffix]), max_new_tokens=1)
    assert cache.cached_pages == [8, 0, 0, 0]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), torch.no_grad():
        got = model(suffix[None], past_key_values=cache, use_cache=True).logits
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    pool.abort(cache)


@gpu
def test_commit_right_after_the_forward_waits_for_a_load_still_in_flight():
    """A load is only ordered on the stream: commit may run while it is still copying (the current
    stream held by a sleep here). It must wait for the load, not take it for a failure, and cache
    what the model computed."""
    transformers = pytest.importorskip("transformers")
    model, pool, context, suffix = tiny_llama_with_a_prefix(transformers, seed=3)
    s = torch.cuda.current_stream().cuda_stream
    pool.controller.synchronize()
    pool.controller.poll(s)
    assert pool.controller.evict(strata.tier.device, 64, s) == 8
    pool.controller.synchronize()
    torch.cuda._sleep(200_000_000)  # the load below is ordered after ~0.1 s of GPU clock
    ids = torch.cat([context, suffix])
    cache = pool.cache_for(ids, max_new_tokens=1)
    assert cache.cached_pages == [0, 8, 0, 0]
    with torch.no_grad():
        model(ids[None], past_key_values=cache, use_cache=True)
    assert pool.controller.pending_submissions() > 0, "the load is still in flight at commit"
    pool.commit(cache)  # no host sync before it
    torch.cuda.synchronize()
    assert pool.controller.stats().failed_transfers == 0
    assert pool.controller.probe(ids.tolist()).fastest_tokens[0] == 256, "the context back on the device"
    pool.controller.check_invariants()


def assert_records_in_pool(host, k, v, perm, pt):
    """Record p of ``host`` ([layer][plane][token][head][dim]) is page ``perm[p]`` of the pool's
    per-layer K and V tensors ([pages * pt, heads, dim]): checked with torch indexing."""
    pages, layers = host.shape[0], len(k)
    heads, dim = k[0].shape[1], k[0].shape[2]
    rec = host.view(pages, layers, 2, pt, heads, dim)
    idx = torch.tensor(perm, device="cuda")
    for layer in range(layers):
        got_k = k[layer].view(-1, pt, heads, dim).index_select(0, idx).cpu()
        got_v = v[layer].view(-1, pt, heads, dim).index_select(0, idx).cpu()
        assert torch.equal(got_k, rec[:, layer, 0]) and torch.equal(got_v, rec[:, layer, 1]), f"layer {layer}"


@gpu
@pytest.mark.parametrize("backend", ["gpu_assisted", "dma_batch", "staged", "dma_copy"])
def test_gpu_copier_moves_scattered_pages_exactly_with_copies_in_flight(backend):
    """Host records -> an SGLang-like device pool -> other host records, through one backend, with
    several copies in flight on two streams; checked against torch indexing of the same bytes."""
    L, pt, H, D = 8, 16, 4, 64
    g = strata.kv_geometry(L, pt, H, D, 2, 2)
    pages = 512
    host = torch.from_dlpack(strata.pinned_host_pool(g, pages))  # [pages, page_bytes / (2 * D), D], 16-bit
    assert host.shape == (pages, g.page_bytes() // (2 * D), D) and host.is_pinned()
    host = host.view(torch.int16)
    gen = torch.Generator().manual_seed(7)
    host.copy_(torch.randint(-32768, 32768, host.shape, generator=gen, dtype=torch.int32).to(torch.int16))
    back = torch.from_dlpack(strata.pinned_host_pool(g, pages)).view(torch.int16)
    back.zero_()
    dev_pages = 600
    k = [torch.zeros(dev_pages * pt, H, D, dtype=torch.int16, device="cuda") for _ in range(L)]
    v = [torch.zeros_like(x) for x in k]
    pool = strata.sglang_layout(k, v, g)
    src = strata.page_first(host, g)
    dst_back = strata.page_first(back, g)
    copier = strata.gpu_copier(backend)
    assert copier.name == backend
    perm = torch.randperm(dev_pages, generator=gen)[:pages].tolist()  # scattered device pages
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    loads = []
    for i in range(8):  # 8 loads of 64 pages in flight at once, alternating streams
        pairs = [(p, perm[p]) for p in range(i * 64, (i + 1) * 64)]
        loads.append(copier.copy(strata.copy_plan(src, pool, pairs), streams[i % 2].cuda_stream))
    for t in loads:
        t.synchronize()
        assert t.done()
    assert_records_in_pool(host, k, v, perm, pt)
    # And back out to other records, per layer, waited for on a stream.
    s = torch.cuda.current_stream().cuda_stream
    t = copier.copy(strata.copy_plan(pool, dst_back, [(perm[p], p) for p in range(pages)]), s)
    for layer in range(L):
        t.wait_layer(layer, s)
    t.synchronize()
    assert torch.equal(back, host)


@gpu
@pytest.mark.parametrize("backend", ["gpu_assisted", "dma_batch", "staged"])
def test_gpu_copier_shared_by_threads_moves_every_page_exactly(backend):
    """One copier, four Python threads copying at once (copy releases the GIL; the backend's
    descriptor ring and events are shared): every page lands where its plan says."""
    import threading

    L, pt, H, D = 4, 16, 4, 64
    g = strata.kv_geometry(L, pt, H, D, 2, 2)
    pages = 256
    host = torch.from_dlpack(strata.pinned_host_pool(g, pages)).view(torch.int16)
    gen = torch.Generator().manual_seed(11)
    host.copy_(torch.randint(-32768, 32768, host.shape, generator=gen, dtype=torch.int32).to(torch.int16))
    k = [torch.zeros(pages * pt, H, D, dtype=torch.int16, device="cuda") for _ in range(L)]
    v = [torch.zeros_like(x) for x in k]
    pool = strata.sglang_layout(k, v, g)
    src = strata.page_first(host, g)
    copier = strata.gpu_copier(backend)
    perm = torch.randperm(pages, generator=gen).tolist()
    errors = []

    def worker(w):
        try:
            stream = torch.cuda.Stream()
            for rnd in range(40):  # each thread its own quarter of the pages, in 4-page copies
                mine = [p for p in range(pages) if p % 4 == w]
                at = (rnd * 4) % len(mine)
                pairs = [(p, perm[p]) for p in mine[at:at + 4]]
                copier.copy(strata.copy_plan(src, pool, pairs), stream.cuda_stream).synchronize()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    torch.cuda.synchronize()
    assert_records_in_pool(host, k, v, perm, pt)


@gpu
def test_gpu_copier_rejections_change_nothing():
    g = strata.kv_geometry(2, 16, 2, 64, 2, 2)
    k = [torch.zeros(64, 2, 64, dtype=torch.int16, device="cuda") for _ in range(2)]
    v = [torch.zeros(64, 2, 64, dtype=torch.int16, device="cuda") for _ in range(2)]
    pool = strata.sglang_layout(k, v, g)
    with pytest.raises(ValueError, match="unknown backend"):
        strata.gpu_copier("warp_drive")
    with pytest.raises(ValueError, match="page_first"):
        strata.gpu_copier("dma_batch").copy(strata.copy_plan(pool, pool, [(0, 1)]))
    pageable = torch.zeros(4, g.page_bytes() // 128, 64, dtype=torch.int16)  # not pinned
    with pytest.raises(ValueError):
        strata.gpu_copier("gpu_assisted").copy(strata.copy_plan(strata.page_first(pageable, g), pool, [(0, 0)]))
    with pytest.raises(ValueError):  # a page outside the pool
        strata.gpu_copier("dma_batch").copy(strata.copy_plan(strata.page_first(pageable, g), pool, [(9, 0)]))
    assert int(k[0].abs().sum()) == 0
