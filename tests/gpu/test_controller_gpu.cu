// SPDX-License-Identifier: Apache-2.0
// cache_controller<gpu_policies<layer_first>> on the GPU: the engine loop with gpu_executor over every
// backend (forced one at a time, and the automatic choice beside each GPU activity). Multi-turn
// requests share documents, the device pool holds about two of them (evictions, demotions and
// backups under pressure), two batches are in flight before anything is polled. Every KV byte is
// checked against a content function the controller never sees: page p of a token sequence holds
// words derived from the tokens of its prefix, written by a kernel standing in for the model.
#include "../support/costs.hpp"
#include "../support/kv_content.hpp"
#include "gpu_support.cuh"
#include "kv_pages.cuh"

#include <strata/cache/gpu_policies.cuh>
#if STRATA_TEST_REDIS
#include "../support/redis_servers.hpp"

#include <strata/cache/remote_tier.hpp>
#include <strata/tier/redis_store.hpp>
#endif

#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <unordered_map>

#include <fcntl.h>
#include <unistd.h>

using namespace strata;
using test::check_layer;
using test::page_jobs;
using test::write_pages;

namespace {

using tokens_t = std::vector<std::int32_t>;

kv_geometry const geo{4, 16, 2, 64, 2, 2};  // 4 layers, 16-token pages, 128-byte head rows: 32 KiB pages

std::uint64_t page_key(tokens_t const& tokens, std::int64_t p) { return test::page_key(tokens, geo.page_tokens, p); }

bool block_ok(std::byte const* b, std::uint64_t key, std::int64_t layer, std::int64_t plane)
{
  for (std::int64_t w = 0; w < geo.block_bytes() / 8; ++w) {
    std::uint64_t v;
    std::memcpy(&v, b + w * 8, 8);
    if (v != test::kv_word(key, layer, plane, w)) { return false; }
  }
  return true;
}

/// The prefetch policy the engines below run with (the file-tier case runs both ways).
prefetch_mode engine_prefetch = prefetch_mode::best_effort;
write_policy engine_file_policy = write_policy::write_through;  // host -> file (the controller's default)

cost_model reading_pays() { return test::reading_pays(geo); }

/// A GPU engine driving the controller; it checks every page it reads. `Lower`: tiers below the
/// pinned host tier (a `file_store&`).
template <class... Lower>
struct basic_gpu_engine {
  using controller = cache_controller<gpu_policies<layer_first, strata_scheduler, Lower...>>;

  std::mt19937_64 rng;
  std::int64_t device_pages;
  test::device_storage memory;
  layer_first layout;
  cuda_stream compute;
  controller cache;
  std::vector<tokens_t> documents;
  struct req {
    tokens_t tokens;
    std::int64_t max_new = 1;
    std::int64_t cached = 0;  // whole pages found cached at start
    bool started = false, prefilled = false, running = false;
  };
  std::map<std::uint64_t, req> live;
  std::vector<tokens_t> finished_turns;  // prompts + answers released with their tokens (for later turns)
  std::unordered_map<std::uint64_t, std::uint64_t> key_of_word0;  // content function, inverted
  std::uint64_t next_id = 1;
  std::int64_t checked_pages = 0, checked_host_pages = 0;

  basic_gpu_engine(std::uint64_t seed, std::int64_t dev, std::int64_t host, gpu_executor_config config,
                   Lower&&... lower)
      : rng{seed},
        device_pages{dev},
        memory(std::size_t(dev * geo.page_bytes())),
        layout{memory.data(), geo, dev},
        cache{typename controller::tiers_type{device_pool<layer_first>{layout}, pinned_host_pool{geo, host},
                                              std::forward<Lower>(lower)...},
              options(), strata_scheduler{}, gpu_executor{std::move(config)}}
  {
    STRATA_CUDA_TRY(cudaMemset(memory.data(), 0xA5, memory.size()));  // poison
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
    for (int d = 0; d < 4; ++d) {
      tokens_t doc(std::size_t(geo.page_tokens * std::int64_t(6 + rng() % 8)));
      for (auto& t : doc) {
        t = std::int32_t(rng() % 30000);
      }
      documents.push_back(doc);
    }
  }
  static controller_options options()
  {
    controller_options o;
    o.backup_policy = write_policy::write_through;
    o.delay_hit_tokens = 32;
    o.prefetch = engine_prefetch;
    o.file_backup_policy = engine_file_policy;
    o.costs = reading_pays();
    return o;
  }

  void remember(tokens_t const& t)
  {
    for (std::int64_t p = 0; p < std::int64_t(t.size()) / geo.page_tokens; ++p) {
      std::uint64_t const k = page_key(t, p);
      key_of_word0[test::kv_word(k, 0, 0, 0)] = k;
    }
  }

  void write(std::vector<std::pair<std::int64_t, std::uint64_t>> const& pages)
  {
    for (std::size_t at = 0; at < pages.size(); at += 64) {
      page_jobs j;
      j.n = int(std::min<std::size_t>(64, pages.size() - at));
      for (int i = 0; i < j.n; ++i) {
        j.page[i] = pages[at + std::size_t(i)].first;
        j.key[i] = pages[at + std::size_t(i)].second;
      }
      write_pages<<<j.n, 256, 0, compute.get()>>>(layout, j);
      STRATA_CUDA_TRY(cudaGetLastError());
    }
  }

  /// Checks whole pages [0, pages) of a request's page table in device memory.
  void verify(std::uint64_t id, std::int64_t pages)
  {
    if (pages == 0) { return; }
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute.get()));
    auto const bytes = test::download(memory);
    layer_first const host_view{const_cast<std::byte*>(bytes.data()), geo, device_pages};
    auto const table = cache.page_table(request_id{id});
    tokens_t const& t = live.at(id).tokens;
    for (std::int64_t p = 0; p < pages; ++p) {
      std::uint64_t const key = page_key(t, p);
      for (std::int64_t layer = 0; layer < geo.layers; ++layer) {
        for (std::int64_t k = 0; k < geo.planes; ++k) {
          INFO("request " << id << " page " << p << " of " << pages << " device page " << table[std::size_t(p)]
                          << " layer " << layer << " plane " << k);
          REQUIRE(block_ok(host_view.block(table[std::size_t(p)], layer, k).data, key, layer, k));
        }
      }
      ++checked_pages;
    }
  }

  /// Every allocated host slot holds a whole, correct page of some sequence (after every copy landed).
  void verify_host()
  {
    cache.executor().synchronize();
    for (int i = 0; i < 100 && cache.poll() > 0; ++i) {
      cache.executor().synchronize();
    }
    REQUIRE(cache.pending_submissions() == 0);
    auto& host = cache.tiers().template get<tier::host>();
    page_first_chunked const l = host.layout();
    for (std::int64_t s = 0; s < host.capacity(); ++s) {
      if (!host.slots().is_allocated(s)) { continue; }
      std::uint64_t w0;
      std::memcpy(&w0, l.block(s, 0, 0).data, 8);
      auto const it = key_of_word0.find(w0);
      INFO("host slot " << s);
      REQUIRE(it != key_of_word0.end());
      for (std::int64_t layer = 0; layer < geo.layers; ++layer) {
        for (std::int64_t k = 0; k < geo.planes; ++k) {
          REQUIRE(block_ok(l.block(s, layer, k).data, it->second, layer, k));
        }
      }
      ++checked_host_pages;
    }
  }

  void submit()
  {
    tokens_t t;
    if (!finished_turns.empty() && rng() % 3 == 0) {  // a later turn of a finished conversation
      t = finished_turns[rng() % finished_turns.size()];
    } else {
      t = documents[rng() % documents.size()];
    }
    std::int64_t const question = std::int64_t(5 + rng() % 40);
    for (std::int64_t i = 0; i < question; ++i) {
      t.push_back(std::int32_t(30000 + rng() % 500));
    }
    std::uint64_t const id = next_id++;
    std::int64_t const max_new = std::int64_t(1 + rng() % 24);
    cache.submit({request_id{id}, t, 0, max_new, 0.0});
    live[id] = {t, max_new};
    remember(t);
  }

  /// Two batches in flight, then their loads checked (each after its handle synchronised), then the
  /// prefill "computed" and committed.
  void round()
  {
    std::vector<typename controller::load_handle_type> batches;
    for (int b = 0; b < 2; ++b) {
      batch_plan const plan = cache.schedule({std::int64_t(256 + rng() % 512), 0, 0, 0});
      batches.push_back(cache.begin_loads(plan, compute.get()));
      for (auto const& s : batches.back().started) {
        req& r = live.at(s.id.value);
        r.started = true;
        r.cached = 0;
        for (auto c : s.cached_pages) {
          r.cached += c;
        }
      }
    }
    for (auto const& h : batches) {
      for (std::int64_t l = 0; l < geo.layers; ++l) {
        REQUIRE(wait_layer(h, l, compute.get()));
      }
      if (h.transfer && h.transfer->valid()) {
        h.transfer->synchronize();
        CHECK(cache.executor().status(*h.transfer) == copy_status::done);
      }
      for (auto const& s : h.started) {
        verify(s.id.value, live.at(s.id.value).cached);
      }
      for (auto const& it : h.ran) {
        if (it.last_chunk) { live.at(it.id.value).prefilled = true; }
      }
    }
    if (rng() % 2 == 0) { (void)cache.poll(); }
    for (auto& [id, r] : live) {
      if (!r.prefilled || r.running) { continue; }
      auto const table = cache.page_table(request_id{id});
      std::int64_t const whole = std::int64_t(r.tokens.size()) / geo.page_tokens;
      std::vector<std::pair<std::int64_t, std::uint64_t>> jobs;
      for (std::int64_t p = r.cached; p < whole; ++p) {
        jobs.push_back({table[std::size_t(p)], page_key(r.tokens, p)});
      }
      write(jobs);
      (void)cache.finish_prefill(request_id{id}, compute.get());
      r.running = true;
      verify(id, whole);
    }
  }

  void release_some()
  {
    for (auto it = live.begin(); it != live.end();) {
      req& r = it->second;
      if (!r.running || rng() % 3 == 0) {
        ++it;
        continue;
      }
      std::uint64_t const id = it->first;
      tokens_t all = r.tokens;
      std::int64_t const out = std::int64_t(rng() % (r.max_new + 1));
      for (std::int64_t i = 0; i < out; ++i) {
        all.push_back(std::int32_t(31000 + rng() % 7));
      }
      remember(all);
      auto const table = cache.page_table(request_id{id});
      std::int64_t const whole = std::int64_t(r.tokens.size()) / geo.page_tokens;
      std::vector<std::pair<std::int64_t, std::uint64_t>> jobs;
      for (std::int64_t p = whole; p < std::int64_t(all.size()) / geo.page_tokens; ++p) {
        jobs.push_back({table[std::size_t(p)], page_key(all, p)});  // decode wrote these
      }
      write(jobs);
      cache.release(request_id{id}, all, compute.get());
      if (std::int64_t(all.size()) < 18 * geo.page_tokens) { finished_turns.push_back(all); }  // fits the pool
      it = live.erase(it);
    }
  }

  void drain()
  {
    for (int i = 0; i < 200 && !live.empty(); ++i) {
      round();
      release_some();
    }
    for (auto& [id, r] : live) {
      cache.release(request_id{id});
    }
    live.clear();
  }
};

using gpu_engine = basic_gpu_engine<>;

template <class Engine>
void run_rounds(Engine& e, int rounds)
{
  for (int i = 0; i < rounds; ++i) {
    for (int k = 0; k < 3; ++k) {
      e.submit();
    }
    e.round();
    e.release_some();
    if (i % 5 == 4) { (void)e.cache.evict(tier::device, std::int64_t(e.rng() % 6), e.compute.get()); }
    e.cache.check_invariants();
  }
  e.drain();
  e.verify_host();
  e.cache.check_invariants();
}

void run_loop(gpu_executor_config config, std::uint64_t seed, gpu_activity activity, int rounds)
{
  gpu_engine e{seed, 28, 96, config};  // ~2 documents on the device
  e.cache.executor().set_activity(activity);
  run_rounds(e, rounds);
  auto const s = e.cache.stats();
  auto const x = e.cache.executor().stats();
  WARN("pages checked: device " << e.checked_pages << ", host " << e.checked_host_pages << "; bytes host->device "
                                << s.bytes_moved[1][0] << ", device->host " << s.bytes_moved[0][1] << "; evicted "
                                << s.evicted_pages[0] << "; transfers by backend (loads) " << x.transfers[0][0] << "/"
                                << x.transfers[0][1] << "/" << x.transfers[0][2] << ", (copies) " << x.transfers[1][0]
                                << "/" << x.transfers[1][1] << "/" << x.transfers[1][2]);
  CHECK(e.checked_pages > 100);
  CHECK(e.checked_host_pages > 0);
  CHECK(s.hit_tokens[1] > 0);  // loads from the host tier happened
  CHECK(s.bytes_moved[0][1] > 0);
  CHECK(s.evicted_pages[0] > 0);
  CHECK(s.failed_transfers == 0);
  CHECK(x.failed_submissions == 0);
  if (config.force) {
    auto const b = std::size_t(*config.force);
    for (std::size_t k = 0; k < 2; ++k) {
      for (std::size_t o = 0; o < gpu_backend_count; ++o) {
        if (o != b) { CHECK(x.transfers[k][o] == 0); }
      }
    }
    CHECK(x.transfers[0][b] > 0);
    CHECK(x.transfers[1][b] > 0);
  }
}

}  // namespace

TEST_CASE("gpu controller: every KV byte right through each forced backend", "[gpu][controller]")
{
  int const rounds = std::getenv("STRATA_GPU_TEST_QUICK") != nullptr ? 12 : 40;
  for (gpu_backend b : {gpu_backend::gpu_assisted, gpu_backend::dma_batch, gpu_backend::staged}) {
    INFO("backend " << to_string(b));
    gpu_executor_config c;
    c.force = b;
    run_loop(c, 100 + std::uint64_t(b), gpu_activity::idle, rounds);
  }
}

TEST_CASE("gpu controller: every KV byte right with dma_batch on the calling thread", "[gpu][controller]")
{
  int const rounds = std::getenv("STRATA_GPU_TEST_QUICK") != nullptr ? 12 : 40;
  {
    gpu_executor_config c;
    c.force = gpu_backend::dma_batch;
    c.dma_submit_thread = false;
    run_loop(c, 7, gpu_activity::idle, rounds);
  }
}

TEST_CASE("gpu controller: every KV byte right with the automatic choice", "[gpu][controller]")
{
  int const rounds = std::getenv("STRATA_GPU_TEST_QUICK") != nullptr ? 12 : 40;
  for (gpu_activity a : {gpu_activity::idle, gpu_activity::prefill, gpu_activity::decode}) {
    INFO("activity " << int(a));
    gpu_executor_config c;
    c.staged_loads = a == gpu_activity::decode;
    run_loop(c, 200 + std::uint64_t(a), a, rounds);
  }
}

TEST_CASE("gpu_executor: the choice follows block size and activity", "[gpu][controller]")
{
  gpu_executor e;
  double const gib = double(1 << 30);
  CHECK(e.choose(copy_kind::load, gib, 64 << 10) == gpu_backend::dma_batch);    // large blocks: the copy engine
  CHECK(e.choose(copy_kind::load, gib, 8 << 10) == gpu_backend::gpu_assisted);  // 8 KiB blocks: DMA is CPU-bound
  e.set_activity(gpu_activity::prefill);
  CHECK(e.choose(copy_kind::load, gib, 64 << 10) == gpu_backend::dma_batch);
  CHECK(e.choose(copy_kind::background, gib, 4 << 10) == gpu_backend::gpu_assisted);
  e.set_activity(gpu_activity::decode);
  CHECK(e.choose(copy_kind::background, gib, 4 << 10) == gpu_backend::staged);  // records keep the link full
  CHECK(e.choose(copy_kind::background, gib, 4 << 10, false) == gpu_backend::gpu_assisted);
}

TEST_CASE("gpu_executor: a refused submission fails its handle, never throws", "[gpu][controller]")
{
  gpu_engine e{5, 8, 8, gpu_executor_config{}};
  auto& tiers = e.cache.tiers();
  copy_order bad;
  bad.from = tier::host;
  bad.to = tier::device;
  bad.from_pages = {0, 1};
  bad.to_pages = {3, 3};  // one destination twice: validate refuses it
  std::vector<copy_order> orders{bad};
  gpu_executor x;
  auto const h = x.submit(tiers, std::span<copy_order const>{orders}, copy_kind::load, e.compute.get());
  CHECK(x.status(h) == copy_status::failed);
  CHECK(x.stats().failed_submissions == 1);
  load_handle<transfer_handle> lh;
  lh.transfer = h;
  CHECK_FALSE(wait_layer(lh, 0, e.compute.get()));
}

TEST_CASE("gpu_executor: a corrupt record fails its own page, into the device and into the host",
          "[gpu][controller][file]")
{
  namespace fs = std::filesystem;
  fs::path const dir = fs::temp_directory_path() / ("strata_gpu_lost_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    file_store_options o;
    o.directory = dir.string();
    file_store disk{geo, 8, o};
    std::vector<std::int64_t> slots(8);
    std::iota(slots.begin(), slots.end(), std::int64_t{0});
    (void)disk.slots().allocate(8);
    std::vector<std::vector<std::byte>> pages(8, std::vector<std::byte>(std::size_t(geo.page_bytes())));
    std::vector<std::byte const*> sources;
    std::vector<std::uint64_t> keys;
    for (std::size_t i = 0; i < 8; ++i) {
      for (std::size_t j = 0; j < pages[i].size(); ++j) {
        pages[i][j] = std::byte((i * 131 + j * 7) & 0xff);
      }
      sources.push_back(pages[i].data());
      keys.push_back(0x1000 + i);
    }
    REQUIRE(disk.write(slots, sources, keys));
    {  // one payload bit of slot 5
      int const fd = ::open(disk.paths()[0].c_str(), O_RDWR);
      REQUIRE(fd >= 0);
      off_t const at = off_t(5 * disk.record_bytes() + 4096 + 17);
      unsigned char b{};
      REQUIRE(::pread(fd, &b, 1, at) == 1);
      b ^= 4;
      REQUIRE(::pwrite(fd, &b, 1, at) == 1);
      ::close(fd);
    }
    test::device_storage memory(std::size_t(8 * geo.page_bytes()));
    tier_stack<device_pool<layer_first>, pinned_host_pool, file_store&> tiers{
        device_pool<layer_first>{layer_first{memory.data(), geo, 8}}, pinned_host_pool{geo, 8}, disk};
    cuda_stream stream;
    // One chunk (the default staging), and chunks of two pages: the bad record in the third while
    // the fourth is read (its read lands before the failure is reported).
    for (auto const& [staging, to] :
         {std::pair{std::int64_t{64} << 20, tier::device}, std::pair{std::int64_t{64} << 20, tier::host},
          std::pair{4 * geo.page_bytes(), tier::device}}) {
      CAPTURE(to_string(to), staging);
      copy_order read;
      read.from = tier::file;
      read.to = to;
      read.from_pages = slots;
      read.to_pages = slots;
      read.keys = keys;
      std::vector<copy_order> orders{read};
      gpu_executor_config c;
      c.record_staging_bytes = staging;
      gpu_executor x{c};
      auto const h = x.submit(tiers, std::span<copy_order const>{orders},
                              to == tier::device ? copy_kind::load : copy_kind::background, stream.get());
      x.synchronize();  // into the host the store reads on its own threads: the handle is pending until then
      REQUIRE(x.status(h) == copy_status::failed);
      CHECK(x.lost(h) == std::vector<lost_record>{{tier::file, 5}});
      if (to == tier::host) {  // read in place: the other seven arrived
        auto const& host = tiers.get<tier::host>();
        for (std::int64_t i = 0; i < 8; ++i) {
          if (i == 5) { continue; }
          CHECK(std::memcmp(host.layout().page_data(i), pages[std::size_t(i)].data(), pages[0].size()) == 0);
        }
      }
    }
    // A submission that fails for another reason loses no record.
    copy_order bad;
    bad.from = tier::host;
    bad.to = tier::device;
    bad.from_pages = {0, 1};
    bad.to_pages = {3, 3};
    std::vector<copy_order> orders{bad};
    gpu_executor x;
    auto const h = x.submit(tiers, std::span<copy_order const>{orders}, copy_kind::load, stream.get());
    REQUIRE(x.status(h) == copy_status::failed);
    CHECK(x.lost(h).empty());
  }
  fs::remove_all(dir);
}

TEST_CASE("gpu controller: a stream of another device is refused before anything changes", "[gpu][controller]")
{
  gpu_engine e{6, 8, 8, gpu_executor_config{}};
  for (cudaStream_t s : {cudaStream_t{}, cudaStreamLegacy, cudaStreamPerThread, e.compute.get()}) {
    CHECK_NOTHROW(e.cache.executor().check_stream(s));
  }
  int devices = 0;
  STRATA_CUDA_TRY(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    WARN("one device: the other-device stream case needs two");
    return;
  }
  tokens_t const prompt(std::size_t(3 * geo.page_tokens), 7);
  e.cache.submit({request_id{1}, prompt, 0, 1, 0.0});
  batch_plan const plan = e.cache.schedule({4096, 0, 0, 0});
  REQUIRE(plan.prefills.size() == 1);
  STRATA_CUDA_TRY(cudaSetDevice(1));
  cuda_stream other;
  STRATA_CUDA_TRY(cudaSetDevice(0));
  auto const before = e.cache.stats();
  STRATA_REQUIRE_THROWS(invalid_argument, "belongs to device 1", e.cache.begin_loads(plan, other.get()));
  STRATA_REQUIRE_THROWS(invalid_argument, "belongs to device 1", e.cache.evict(tier::device, 1, other.get()));
  CHECK(e.cache.stats().computed_tokens == before.computed_tokens);
  auto loads = e.cache.begin_loads(plan, e.compute.get());  // the plan is still the one to begin
  CHECK(loads.ran.size() == 1);
  STRATA_CUDA_TRY(cudaStreamSynchronize(e.compute.get()));
  (void)e.cache.complete(loads);
  e.cache.release(request_id{1});
  e.cache.check_invariants();
}

TEST_CASE("gpu controller: every KV byte right with the NVMe file tier below the host", "[gpu][controller][file]")
{
  // A host tier of 12 pages over a file tier: documents are copied to the files as they reach the
  // host (write-through, the default) and loaded back file -> pinned bounce -> device (no prefetch),
  // or demoted to the files under host pressure (write-back) and prefetched file -> host when a
  // question arrives (best effort), checked byte for byte like every other load.
  namespace fs = std::filesystem;
  fs::path const dir = fs::temp_directory_path() / ("strata_gpu_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  int const rounds = std::getenv("STRATA_GPU_TEST_QUICK") != nullptr ? 12 : 40;
  for (gpu_backend b : {gpu_backend::gpu_assisted, gpu_backend::dma_batch}) {
    INFO("backend " << to_string(b));
    engine_prefetch = b == gpu_backend::gpu_assisted ? prefetch_mode::off : prefetch_mode::best_effort;
    engine_file_policy = b == gpu_backend::gpu_assisted ? write_policy::write_through : write_policy::write_back;
    file_store_options o;
    o.directory = dir.string();
    file_store disk{geo, 512, o};
    gpu_executor_config c;
    c.force = b;
    // Staging of 5 pages: chunks of 2, so that longer loads and backups through it take several
    // chunks, alternating halves.
    c.record_staging_bytes = 5 * geo.page_bytes();
    basic_gpu_engine<file_store&> e{300 + std::uint64_t(b), 28, 12, c, disk};
    run_rounds(e, rounds);
    auto const s = e.cache.stats();
    WARN("pages checked: device " << e.checked_pages << "; hit tokens device/host/file " << s.hit_tokens[0] << "/"
                                  << s.hit_tokens[1] << "/" << s.hit_tokens[2] << "; bytes file->device "
                                  << s.bytes_moved[2][0] << ", host->file " << s.bytes_moved[1][2]);
    CHECK(e.checked_pages > 100);
    if (engine_prefetch == prefetch_mode::off) {
      CHECK(s.hit_tokens[2] > 0);  // loads from the file tier happened
    } else {
      CHECK(s.prefetched_pages > 0);  // prefetches from the file tier happened
    }
    CHECK(s.bytes_moved[1][2] > 0);  // demotions to the files happened
    CHECK(s.failed_transfers == 0);
    CHECK(e.cache.executor().stats().failed_submissions == 0);
  }
  engine_prefetch = prefetch_mode::best_effort;
  engine_file_policy = write_policy::write_through;
  fs::remove_all(dir);
}

#if STRATA_TEST_REDIS
TEST_CASE("gpu controller: every KV byte right with a shared remote tier (Redis Cluster) below the host",
          "[gpu][controller][redis]")
{
  // Two engines in turn over one cluster: the second (an empty index, the same documents) finds
  // what the first computed and loads it remote -> pinned staging -> device (no prefetch), or
  // prefetches it to the host first (best effort), checked byte for byte like every other load.
  test::redis_servers servers = test::redis_servers::cluster();
  redis_store_options o;
  o.nodes = {servers.address(0)};
  o.space = {"gpu-controller-test", "bf16", "page_first", geo, 0, 1};
  redis_store store{o};
  int const rounds = std::getenv("STRATA_GPU_TEST_QUICK") != nullptr ? 12 : 40;
  for (gpu_backend b : {gpu_backend::gpu_assisted, gpu_backend::dma_batch}) {
    INFO("backend " << to_string(b));
    engine_prefetch = b == gpu_backend::gpu_assisted ? prefetch_mode::off : prefetch_mode::best_effort;
    gpu_executor_config c;
    c.force = b;
    c.record_staging_bytes = 5 * geo.page_bytes();  // chunks of 2 pages
    std::uint64_t const seed = 700 + std::uint64_t(b);
    {
      basic_gpu_engine<remote_tier<redis_store>> first{seed, 28, 12, c, remote_tier<redis_store>{store, geo}};
      run_rounds(first, rounds);
      CHECK(first.cache.stats().bytes_moved[1][3] > 0);  // written to the cluster
    }
    basic_gpu_engine<remote_tier<redis_store>> second{seed, 28, 12, c, remote_tier<redis_store>{store, geo}};
    run_rounds(second, rounds);
    auto const s = second.cache.stats();
    WARN("pages checked: device " << second.checked_pages << "; remote lookups " << s.remote_lookups << ", pages found "
                                  << s.remote_found_pages << "; bytes remote->device " << s.bytes_moved[3][0]
                                  << ", remote->host " << s.bytes_moved[3][1]);
    CHECK(second.checked_pages > 100);
    CHECK(s.remote_found_pages > 0);
    CHECK(s.bytes_moved[3][0] + s.bytes_moved[3][1] > 0);  // loads or prefetches from the cluster happened
    CHECK(s.failed_transfers == 0);
    CHECK(second.cache.executor().stats().failed_submissions == 0);
  }
  engine_prefetch = prefetch_mode::best_effort;
}
#endif

namespace {

/// Gates in front of a file_store's reads and writes (the disk "holds" them while closed).
struct disk_gates {
  std::mutex m;
  std::condition_variable cv;
  bool reads = true, writes = true;
  int held_reads = 0, held_writes = 0;

  static void hold(disk_gates& g, bool& open, int& held)
  {
    std::unique_lock lock{g.m};
    if (open) { return; }
    ++held;
    g.cv.notify_all();
    g.cv.wait_for(lock, std::chrono::seconds(20), [&] { return open; });  // bounded: a caller that waits fails
    --held;
  }
  void set(bool& gate, bool open)
  {
    {
      std::lock_guard lock{m};
      gate = open;
    }
    cv.notify_all();
  }
  bool wait_held(int& held)
  {
    std::unique_lock lock{m};
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return held > 0; });
  }
};

}  // namespace

TEST_CASE("gpu controller: file-tier loads and backups move off the engine's thread; each layer right on the device",
          "[gpu][controller][file]")
{
  // Records between the file tier and the device move on the executor's record threads. With the
  // disk's reads held, begin_loads returns at once and the load stays pending; once they go, each
  // layer is checked on the compute stream right after its wait_layer (a missing wait reads the
  // poison). With the disk's writes held, a backup into the file tier waits while a load from it
  // lands (loads and backups have their own threads and staging).
  namespace fs = std::filesystem;
  fs::path const dir = fs::temp_directory_path() / ("strata_gpu_off_thread_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  disk_gates g;
  {
    file_store_options o;
    o.directory = dir.string();
    o.io.context = &g;
    o.io.preadv = [](void* c, int fd, iovec const* iov, int n, off_t at) -> ssize_t {
      auto& x = *static_cast<disk_gates*>(c);
      disk_gates::hold(x, x.reads, x.held_reads);
      return ::preadv(fd, iov, n, at);
    };
    o.io.pwritev = [](void* c, int fd, iovec const* iov, int n, off_t at) -> ssize_t {
      auto& x = *static_cast<disk_gates*>(c);
      disk_gates::hold(x, x.writes, x.held_writes);
      return ::pwritev(fd, iov, n, at);
    };
    file_store disk{geo, 64, o};
    std::int64_t const device_pages = 40;
    test::device_storage memory(std::size_t(device_pages * geo.page_bytes()));
    STRATA_CUDA_TRY(cudaMemset(memory.data(), 0xA5, memory.size()));  // poison
    layer_first const pool{memory.data(), geo, device_pages};
    using controller = cache_controller<gpu_policies<layer_first, strata_scheduler, file_store&>>;
    controller_options opts;
    opts.costs = reading_pays();
    opts.prefetch = prefetch_mode::off;  // loads read the files into the device themselves
    gpu_executor_config c;
    c.record_staging_bytes = 5 * geo.page_bytes();  // chunks of 2 pages: several per load and backup
    controller cache{controller::tiers_type{device_pool<layer_first>{pool}, pinned_host_pool{geo, 4}, disk}, opts,
                     strata_scheduler{}, gpu_executor{c}};
    cuda_stream compute;
    test::device_storage bad_count(sizeof(unsigned long long));
    auto* bad = reinterpret_cast<unsigned long long*>(bad_count.data());
    STRATA_CUDA_TRY(cudaMemset(bad, 0, sizeof(unsigned long long)));
    auto const settle = [&] {
      for (int i = 0; i < 64 && cache.pending_submissions() > 0; ++i) {
        cache.executor().synchronize();
        (void)cache.poll(compute.get());
      }
    };
    auto const quick = [](auto&& f) {  // f returns before a disk held for 20 s would let it
      auto const t0 = std::chrono::steady_clock::now();
      f();
      return std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5);
    };
    auto const jobs_of = [&](std::uint64_t id, tokens_t const& t, std::int64_t from, std::int64_t to) {
      auto const table = cache.page_table(request_id{id});
      page_jobs j;
      for (std::int64_t p = from; p < to; ++p) {
        j.page[j.n] = table[std::size_t(p)];
        j.key[j.n++] = page_key(t, p);
      }
      return j;
    };
    // Runs a request: its cached pages checked layer by layer after each wait, the rest computed.
    auto const run = [&](std::uint64_t id, tokens_t const& t, std::int64_t file_pages) {
      auto h = cache.begin_loads(cache.schedule({4096, 0, 0, 0}), compute.get());
      REQUIRE(h.started.size() == 1);
      CHECK(h.started[0].cached_pages[2] == file_pages);
      page_jobs const cached = jobs_of(id, t, 0, file_pages);
      for (std::int64_t l = 0; l < geo.layers; ++l) {
        REQUIRE(wait_layer(h, l, compute.get()));
        if (cached.n > 0) { check_layer<<<cached.n, 256, 0, compute.get()>>>(pool, cached, l, bad); }
      }
      page_jobs const rest = jobs_of(id, t, file_pages, std::int64_t(t.size()) / geo.page_tokens);
      if (rest.n > 0) { write_pages<<<rest.n, 256, 0, compute.get()>>>(pool, rest); }
      STRATA_CUDA_TRY(cudaGetLastError());
      (void)cache.finish_prefill(request_id{id}, compute.get());
      cache.release(request_id{id});
      return h;
    };
    auto const doc = [](std::int32_t first) {
      tokens_t t(std::size_t(6 * geo.page_tokens));
      std::iota(t.begin(), t.end(), first);
      return t;
    };
    auto const q = [](tokens_t t, std::int32_t x) {
      t.push_back(x);
      return t;
    };
    tokens_t const a = doc(1), b = doc(5000);

    // Document a: computed, then (6 pages: more than the 4-page host tier) backed up from the
    // device to the file tier, and evicted from the device.
    cache.submit({request_id{1}, q(a, 1), 0, 1, 0.0});
    (void)run(1, q(a, 1), 0);
    settle();
    (void)cache.evict(tier::device, device_pages, compute.get());
    settle();
    REQUIRE(cache.probe(q(a, 2)).fastest_tokens[2] == 6 * geo.page_tokens);

    // 1. A load from the file tier with the disk's reads held.
    g.set(g.reads, false);
    cache.submit({request_id{2}, q(a, 2), 0, 1, 0.0});
    controller::load_handle_type h;
    CHECK(quick([&] { h = cache.begin_loads(cache.schedule({4096, 0, 0, 0}), compute.get()); }));
    REQUIRE(h.started.size() == 1);
    CHECK(h.started[0].cached_pages[2] == 6);
    REQUIRE(g.wait_held(g.held_reads));
    CHECK(quick([&] {
      for (int i = 0; i < 20; ++i) {
        (void)cache.poll(compute.get());
        (void)cache.stats();
      }
    }));
    CHECK(cache.executor().status(*h.transfer) == copy_status::pending);
    g.set(g.reads, true);
    page_jobs const cached = jobs_of(2, q(a, 2), 0, 6);
    for (std::int64_t l = 0; l < geo.layers; ++l) {
      REQUIRE(wait_layer(h, l, compute.get()));
      check_layer<<<cached.n, 256, 0, compute.get()>>>(pool, cached, l, bad);
    }
    (void)cache.finish_prefill(request_id{2}, compute.get());
    cache.release(request_id{2});
    settle();

    // 2. A backup to the file tier held by the disk's writes, and a load from it beside.
    g.set(g.writes, false);
    cache.submit({request_id{3}, q(b, 3), 0, 1, 0.0});
    CHECK(quick([&] {
      (void)run(3, q(b, 3), 0);  // its backup (6 pages, device -> file) starts
      (void)cache.poll(compute.get());
    }));
    REQUIRE(g.wait_held(g.held_writes));
    (void)cache.evict(tier::device, device_pages, compute.get());  // a: only on the file tier now
    (void)cache.poll(compute.get());
    cache.submit({request_id{4}, q(a, 4), 0, 1, 0.0});
    CHECK(quick([&] { (void)run(4, q(a, 4), 6); }));  // landed while the backup waits for the disk
    {
      std::lock_guard lock{g.m};
      CHECK(g.held_writes > 0);
    }
    g.set(g.writes, true);
    settle();
    (void)cache.evict(tier::device, device_pages, compute.get());
    settle();
    REQUIRE(cache.probe(q(b, 5)).fastest_tokens[2] == 6 * geo.page_tokens);  // b's backup landed
    cache.submit({request_id{5}, q(b, 5), 0, 1, 0.0});
    (void)run(5, q(b, 5), 6);
    settle();
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute.get()));
    unsigned long long wrong = 0;
    STRATA_CUDA_TRY(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
    CHECK(wrong == 0);
    CHECK(cache.stats().failed_transfers == 0);
    cache.check_invariants();
  }
  fs::remove_all(dir);
}

namespace {

/// Spins until the host opens its gate (a host-mapped flag): what a stream holds behind it waits.
__global__ void spin_until_open(int const volatile* open)
{
  while (*open == 0) {
    __nanosleep(1000);
  }
}

/// A gate on a stream: `close` queues a kernel that holds the stream's later work until `open`.
struct stream_gate {
  int* flag = nullptr;
  stream_gate() { STRATA_CUDA_TRY(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped)); }
  stream_gate(stream_gate const&) = delete;
  stream_gate& operator=(stream_gate const&) = delete;
  ~stream_gate()
  {
    open();
    (void)cudaDeviceSynchronize();
    (void)cudaFreeHost(flag);
  }
  void close(cudaStream_t s)
  {
    __atomic_store_n(flag, 0, __ATOMIC_SEQ_CST);
    spin_until_open<<<1, 1, 0, s>>>(flag);
    STRATA_CUDA_TRY(cudaGetLastError());
  }
  void open() { __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST); }
};

/// One run of the case below: loads from the host held behind a gate on the executor's load
/// stream; each layer of two batches checked on the compute stream right after its wait (the
/// second batch reads pages the first is still loading: `load_handle::after`). `skip_wait`: the
/// check of that layer does not wait (the control: poison must show). Returns the words found wrong.
unsigned long long held_loads_checked(kv_geometry const& g, gpu_executor_config c, std::int64_t skip_wait)
{
  std::int64_t const device_pages = 64;
  test::device_storage memory(std::size_t(device_pages * g.page_bytes()));
  STRATA_CUDA_TRY(cudaMemset(memory.data(), 0xA5, memory.size()));  // poison
  layer_first const pool{memory.data(), g, device_pages};
  cuda_stream compute, loads;
  c.load_stream = cuda::stream_ref{loads.get()};
  using controller = cache_controller<gpu_policies<layer_first>>;
  controller_options o;
  o.costs = test::reading_pays(g);
  o.delay_hit_tokens = 1 << 20;  // the second batch reads the first one's pages, it does not wait for them
  controller cache{controller::tiers_type{device_pool<layer_first>{pool}, pinned_host_pool{g, 64}}, o,
                   strata_scheduler{}, gpu_executor{c}};
  test::device_storage bad_count(sizeof(unsigned long long));
  auto* bad = reinterpret_cast<unsigned long long*>(bad_count.data());
  STRATA_CUDA_TRY(cudaMemset(bad, 0, sizeof(unsigned long long)));
  std::int64_t const pages = 12;
  tokens_t doc(std::size_t(pages * g.page_tokens));
  std::iota(doc.begin(), doc.end(), 100);
  auto const q = [&](std::int32_t x) {
    tokens_t t = doc;
    t.push_back(x);
    return t;
  };
  auto const jobs_of = [&](std::uint64_t id, tokens_t const& t, std::int64_t n) {
    auto const table = cache.page_table(request_id{id});
    page_jobs j;
    for (std::int64_t p = 0; p < n; ++p) {
      j.page[j.n] = table[std::size_t(p)];
      j.key[j.n++] = test::page_key(t, g.page_tokens, p);
    }
    return j;
  };
  auto const settle = [&] {
    for (int i = 0; i < 64 && cache.pending_submissions() > 0; ++i) {
      cache.executor().synchronize();
      (void)cache.poll(compute.get());
    }
  };
  // The document computed once, backed up to the host, dropped from the device.
  cache.submit({request_id{1}, q(1), 0, 1, 0.0});
  auto h = cache.begin_loads(cache.schedule({1 << 20, 0, 0, 0}), compute.get());
  REQUIRE(h.ran.size() == 1);
  write_pages<<<pages, 256, 0, compute.get()>>>(pool, jobs_of(1, q(1), pages));
  STRATA_CUDA_TRY(cudaGetLastError());
  (void)cache.finish_prefill(request_id{1}, compute.get());
  cache.release(request_id{1});
  settle();
  (void)cache.evict(tier::device, device_pages, compute.get());
  settle();
  STRATA_CUDA_TRY(cudaMemset(memory.data(), 0xA5, memory.size()));  // the device holds poison only
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE(cache.probe(q(2)).fastest_tokens[1] == pages * g.page_tokens);

  stream_gate gate;
  gate.close(loads.get());
  cache.submit({request_id{2}, q(2), 0, 1, 0.0});
  auto const first = cache.begin_loads(cache.schedule({1 << 20, 0, 0, 0}), compute.get());
  REQUIRE(first.started.size() == 1);
  REQUIRE(first.started[0].cached_pages[1] == pages);
  cache.submit({request_id{3}, q(3), 0, 1, 0.0});
  auto const second = cache.begin_loads(cache.schedule({1 << 20, 0, 0, 0}), compute.get());
  REQUIRE(second.started.size() == 1);
  CHECK(second.started[0].cached_pages[0] == pages);  // on their way to the device
  CHECK_FALSE(second.has_loads());
  REQUIRE_FALSE(second.after.empty());
  page_jobs const a = jobs_of(2, q(2), pages), b = jobs_of(3, q(3), pages);
  for (std::int64_t l = 0; l < g.layers; ++l) {
    for (auto const* batch : {&first, &second}) {
      if (l != skip_wait) { REQUIRE(wait_layer(*batch, l, compute.get())); }
      check_layer<<<pages, 128, 0, compute.get()>>>(pool, batch == &first ? a : b, l, bad);
      STRATA_CUDA_TRY(cudaGetLastError());
    }
  }
  gate.open();
  STRATA_CUDA_TRY(cudaStreamSynchronize(compute.get()));
  settle();
  unsigned long long wrong = 0;
  STRATA_CUDA_TRY(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
  for (std::uint64_t id : {2, 3}) {
    (void)cache.finish_prefill(request_id{id}, compute.get());
    cache.release(request_id{id});
  }
  settle();
  cache.check_invariants();
  return wrong;
}

}  // namespace

TEST_CASE("gpu controller: each layer is right on the compute stream the moment its wait returns", "[gpu][controller]")
{
  // The loads are held behind a gate while the checks are queued, so a wait that does not order
  // the compute stream after its layer reads poison; 1-token pages, fp8 and 96-wide heads too.
  kv_geometry const shapes[] = {geo, kv_geometry{3, 1, 2, 96, 1, 2}, kv_geometry{2, 16, 1, 96, 2, 2}};
  for (kv_geometry const& g : shapes) {
    for (int way = 0; way < 4; ++way) {
      gpu_executor_config c;
      c.force = way == 0 ? gpu_backend::gpu_assisted : way == 3 ? gpu_backend::staged : gpu_backend::dma_batch;
      c.dma_submit_thread = way != 2;
      INFO("page_tokens " << g.page_tokens << " head_dim " << g.head_dim << " elem_bytes " << g.elem_bytes
                          << " backend " << to_string(*c.force) << " submit thread " << c.dma_submit_thread);
      CHECK(held_loads_checked(g, c, -1) == 0);
      CHECK(held_loads_checked(g, c, 0) > 0);  // the control: layer 0 read without its wait shows poison
    }
  }
}
