// SPDX-License-Identifier: Apache-2.0
// An engine's loop around strata::cache_controller<gpu_policies<layer_first, strata_scheduler, file_store&>> on the
// GPU.
//
// The "model" is a Llama-3.1-8B-shaped layer (cuBLAS bf16 GEMMs of the batch's new tokens, see
// llama_gemms.cuh) plus two small kernels per layer: one reads every cached KV page of the batch for
// that layer and checks it against a content function (where attention would read it), one writes
// the layer's KV of the pages the batch computes. KV pages move layer by layer beside the compute:
// `wait_layer` before each layer's kernels. A few shared documents get several questions each, as
// multi-turn conversations; the device pool holds about two documents, so prefixes are evicted to
// the pinned host tier and loaded back (write-through backups). Below the host tier, an NVMe file
// tier (checksummed records in $STRATA_FILE_DIR, default the temporary folder), its rates in the
// cost model measured there first (`measure_store`: what the store reads there; STRATA_FILE_CALIBRATE=0: the H200
// disk's figures; STRATA_RECORD_STAGING_MIB: the executor's record staging). A helper thread polls.
//
// Then, in the same run (median of 5):
//   (a) load bandwidth through the controller (a host-cached document's pages into the device pool,
//       per layer) against one contiguous cudaMemcpyAsync of the same bytes from pinned memory;
//   (b) TTFT of a 100-token question on a host-cached document against its load time plus the
//       compute time of the new tokens, each measured alone;
//   (c) the same TTFT with the document on the file tier only: the controller's default path, a
//       prefetch into the pinned host tier when the question is submitted (file -> host), then the
//       layer-wise load (host -> device); against a plain sequential O_DIRECT read of the same bytes
//       from the same disk plus (b);
//   (d) the same TTFT with nothing cached (the document recomputed by the stand-in model: its
//       GEMMs, not attention's quadratic part, so a lower bound on a real model's recompute);
//   (e) (c) again right after (d), while (d)'s backups (device -> host, then host -> file) are in
//       flight: a load beside a backup, against (c) alone in the same repetition (the ratio is the
//       median of the repetitions' ratios).
//
//   bench_engine_loop [--quick]        (--quick: 4K/8K-token documents instead of 8K/16K/32K)
//   STRATA_BENCH_DOC_TOKENS=n          the measured document's tokens (default 32K; 8K with --quick)
//   STRATA_BENCH_REPS=n                repetitions of (a)-(e) (default 5)
//   STRATA_BENCH_REFERENCE_GIB=n       most GiB the plain read of (c) reads (default 4, the time scaled
//                                      to the document's bytes): set it to the document's size on a disk
//                                      whose short reads run faster than long ones
#include "llama_gemms.cuh"

#include <strata/cache/gpu_policies.cuh>
#include <strata/layout/layer_first.hpp>
#include <strata/tier/drive_rates.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {

using namespace strata;
using tokens_t = std::vector<std::int32_t>;
using controller = cache_controller<gpu_policies<layer_first, strata_scheduler, file_store&>>;
using clock_type = std::chrono::steady_clock;

kv_geometry const geo = models::llama31_8b.geometry(/*page_tokens=*/32);  // 4 MiB pages, 64 KiB blocks

__host__ __device__ inline std::uint64_t mix(std::uint64_t x)
{
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__host__ __device__ inline std::uint64_t word(std::uint64_t key, std::int64_t layer, std::int64_t plane, std::int64_t w)
{ return mix(key + std::uint64_t(((layer * 2 + plane) << 24) + w) * 0x9e3779b97f4a7c15ull); }
/// Keys of every whole page of `tokens`: page p's depends on every token up to its end (chained).
std::vector<std::uint64_t> page_keys(tokens_t const& tokens)
{
  std::vector<std::uint64_t> keys;
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::size_t p = 0; (p + 1) * std::size_t(geo.page_tokens) <= tokens.size(); ++p) {
    for (std::size_t i = p * std::size_t(geo.page_tokens); i < (p + 1) * std::size_t(geo.page_tokens); ++i) {
      h = mix(h ^ std::uint64_t(std::uint32_t(tokens[i])));
    }
    keys.push_back(h);
  }
  return keys;
}

struct page_job {
  std::int64_t page;  // device page
  std::uint64_t key;  // content
};

/// Where attention would read: every block of layer `layer` of the jobs' pages, checked word by word.
__global__ void read_layer(layer_first pool, page_job const* jobs, int n, std::int64_t layer, unsigned long long* bad)
{
  std::int64_t const words = pool.geometry().block_bytes() / 8;
  unsigned long long wrong = 0;
  for (int j = blockIdx.x; j < n; j += gridDim.x) {
    for (std::int64_t k = 0; k < 2; ++k) {
      auto const* b = reinterpret_cast<std::uint64_t const*>(pool.block(jobs[j].page, layer, k).data);
      for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        wrong += b[w] != word(jobs[j].key, layer, k, w) ? 1 : 0;
      }
    }
  }
  if (wrong != 0) { atomicAdd(bad, wrong); }
}
/// The layer's KV of the pages the batch computes.
__global__ void write_layer(layer_first pool, page_job const* jobs, int n, std::int64_t layer)
{
  std::int64_t const words = pool.geometry().block_bytes() / 8;
  for (int j = blockIdx.x; j < n; j += gridDim.x) {
    for (std::int64_t k = 0; k < 2; ++k) {
      auto* b = reinterpret_cast<std::uint64_t*>(pool.block(jobs[j].page, layer, k).data);
      for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        b[w] = word(jobs[j].key, layer, k, w);
      }
    }
  }
}

/// The model: per layer, read the cached pages, the GEMMs of the new tokens, write the new pages.
class model {
 public:
  explicit model(layer_first pool, int max_tokens, std::size_t max_jobs)
      : pool_{pool},
        gemms_{max_tokens},
        jobs_(2 * max_jobs * sizeof(page_job)),
        staging_(2 * max_jobs * sizeof(page_job)),
        bad_(sizeof(unsigned long long)),
        max_jobs_{max_jobs}
  { STRATA_CUDA_TRY(cudaMemset(bad_.data(), 0, sizeof(unsigned long long))); }

  /// Uploads the batch's page lists, growing the lists' buffers when a batch needs more (the previous
  /// batch's kernels must have finished: the caller syncs).
  void set_batch(std::vector<page_job> const& read, std::vector<page_job> const& write, int tokens, cudaStream_t s)
  {
    if (std::max(read.size(), write.size()) > max_jobs_) {  // requests sharing a document read its pages each
      STRATA_CUDA_TRY(cudaStreamSynchronize(s));
      max_jobs_ = std::max(read.size(), write.size());
      jobs_ = device_buffer(2 * max_jobs_ * sizeof(page_job));
      staging_ = pinned_buffer(2 * max_jobs_ * sizeof(page_job));
    }
    auto* host = reinterpret_cast<page_job*>(staging_.data());
    std::copy(read.begin(), read.end(), host);
    std::copy(write.begin(), write.end(), host + max_jobs_);
    STRATA_CUDA_TRY(cudaMemcpyAsync(jobs_.data(), staging_.data(), staging_.size(), cudaMemcpyHostToDevice, s));
    n_read_ = int(read.size()), n_write_ = int(write.size()), tokens_ = tokens;
  }
  /// Enqueues layer `layer` on `s`.
  void layer(std::int64_t layer, cudaStream_t s)
  {
    auto const* jobs = reinterpret_cast<page_job const*>(jobs_.data());
    if (n_read_ > 0) {
      read_layer<<<std::min(n_read_, 264), 512, 0, s>>>(pool_, jobs, n_read_, layer,
                                                        reinterpret_cast<unsigned long long*>(bad_.data()));
    }
    gemms_.layer(tokens_, s);
    if (n_write_ > 0) { write_layer<<<std::min(n_write_, 264), 512, 0, s>>>(pool_, jobs + max_jobs_, n_write_, layer); }
    STRATA_CUDA_TRY(cudaGetLastError());
  }
  /// Words read that differed from the content function so far.
  [[nodiscard]] unsigned long long bad_words() const
  {
    unsigned long long n = 0;
    STRATA_CUDA_TRY(cudaMemcpy(&n, bad_.data(), sizeof n, cudaMemcpyDeviceToHost));
    return n;
  }

 private:
  layer_first pool_;
  examples::llama_layer_gemms gemms_;
  device_buffer jobs_;
  pinned_buffer staging_;
  device_buffer bad_;
  std::size_t max_jobs_;
  int n_read_ = 0, n_write_ = 0, tokens_ = 0;
};

struct live_request {
  int conversation = -1;
  int turn = 0;
  tokens_t prompt;
  std::vector<std::uint64_t> keys;
  std::int64_t max_new = 1;
  clock_type::time_point submitted;
  std::array<std::int64_t, tier_count> cached_pages{};
  std::int64_t cached = 0;
  double ttft_ms = 0;
  bool done = false;
};

/// The engine: requests, batches, the model, the controller.
struct engine {
  controller& cache;
  model& m;
  cudaStream_t compute;
  std::map<std::uint64_t, live_request> live;
  std::uint64_t next_id = 1;

  std::uint64_t submit(tokens_t prompt, std::int64_t max_new, int conversation, int turn)
  {
    live_request r;
    r.conversation = conversation;
    r.turn = turn;
    r.prompt = std::move(prompt);
    r.keys = page_keys(r.prompt);
    r.max_new = max_new;
    r.submitted = clock_type::now();
    std::uint64_t const id = next_id++;
    cache.submit({request_id{id}, r.prompt, 0, max_new, 0.0});
    live.emplace(id, std::move(r));
    return id;
  }

  /// One batch: schedule, loads, per layer wait + model, first tokens out. Returns the requests
  /// whose prefill finished (their pages in the cache), or none when nothing ran.
  std::vector<std::uint64_t> batch(std::int64_t budget = 8192)
  {
    batch_plan const plan = cache.schedule({budget, 0, 0, 0});
    if (plan.prefills.empty()) { return {}; }
    cache.executor().set_activity(gpu_activity::prefill, plan.predicted_compute_s * 1e3);
    auto loads = cache.begin_loads(plan, compute);  // copies after the work already on `compute`
    std::vector<page_job> read, write;
    for (auto const& s : loads.started) {
      live_request& r = live.at(s.id.value);
      r.cached_pages = s.cached_pages;
      r.cached = 0;
      for (auto n : s.cached_pages) {
        r.cached += n;
      }
      auto const table = cache.page_table(s.id);
      for (std::int64_t p = 0; p < r.cached; ++p) {
        read.push_back({table[std::size_t(p)], r.keys[std::size_t(p)]});
      }
    }
    int tokens = 0;
    for (auto const& it : loads.ran) {
      live_request const& r = live.at(it.id.value);
      auto const table = cache.page_table(it.id);
      tokens += int(it.chunk_tokens);
      for (std::int64_t p = it.context_tokens / geo.page_tokens;
           p <
           std::min<std::int64_t>((it.context_tokens + it.chunk_tokens) / geo.page_tokens, std::int64_t(r.keys.size()));
           ++p) {
        write.push_back({table[std::size_t(p)], r.keys[std::size_t(p)]});
      }
    }
    m.set_batch(read, write, tokens, compute);
    for (std::int64_t l = 0; l < geo.layers; ++l) {
      if (!wait_layer(loads, l, compute)) {               // loads failed: the controller requeues the requests
        STRATA_CUDA_TRY(cudaStreamSynchronize(compute));  // the batch's staging copies are done with
        (void)cache.complete(loads);
        return {};
      }
      m.layer(l, compute);
    }
    std::vector<std::uint64_t> finished;
    for (auto const& it : loads.ran) {
      if (!it.last_chunk) { continue; }
      (void)cache.finish_prefill(it.id, compute);  // backups after the kernels that wrote the pages
      finished.push_back(it.id.value);
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute));  // first tokens out
    auto const now = clock_type::now();
    for (auto id : finished) {
      live_request& r = live.at(id);
      r.ttft_ms = std::chrono::duration<double, std::milli>(now - r.submitted).count();
      r.done = true;
    }
    return finished;
  }

  /// Decode stands in: the answer's pages written, then released with prompt + answer cached.
  tokens_t answer_and_release(std::uint64_t id)
  {
    live_request& r = live.at(id);
    tokens_t all = r.prompt;
    for (std::int64_t i = 0; i < r.max_new; ++i) {
      all.push_back(std::int32_t(120000 + (id * 7 + std::uint64_t(i)) % 97));
    }
    auto const keys = page_keys(all);
    auto const table = cache.page_table(request_id{id});
    std::vector<page_job> write;
    for (std::size_t p = r.keys.size(); p < keys.size(); ++p) {
      write.push_back({table[p], keys[p]});
    }
    if (!write.empty()) {
      m.set_batch({}, write, 0, compute);
      for (std::int64_t l = 0; l < geo.layers; ++l) {
        m.layer(l, compute);
      }
    }
    cache.release(request_id{id}, all, compute);
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute));
    live.erase(id);
    return all;
  }
};

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
tokens_t random_tokens(std::mt19937_64& rng, std::int64_t n, std::int32_t base)
{
  tokens_t t(static_cast<std::size_t>(n));
  for (auto& x : t) {
    x = base + std::int32_t(rng() % 100000);
  }
  return t;
}
/// Milliseconds of a plain sequential O_DIRECT read of `bytes` from a file written in `dir` first
/// (buffered I/O where the file system refuses O_DIRECT): the disk's own rate, for (c). At most
/// `STRATA_BENCH_REFERENCE_GIB` (default 4) GiB are read, and the time scaled to `bytes` (a
/// 128K-token document would need 16 GiB more of the disk, or of the RAM behind /dev/shm).
double sequential_read_ms(std::filesystem::path const& dir, std::size_t const full)
{
  std::size_t const chunk = std::size_t{64} << 20;
  std::size_t cap = std::size_t{4} << 30;
  if (char const* gib = std::getenv("STRATA_BENCH_REFERENCE_GIB")) { cap = std::size_t(std::atoll(gib)) << 30; }
  STRATA_EXPECTS(cap > 0, "bench_engine_loop: STRATA_BENCH_REFERENCE_GIB must be positive");
  std::size_t const bytes = std::min(full, cap);
  void* raw = nullptr;
  STRATA_EXPECTS(::posix_memalign(&raw, 4096, chunk) == 0, "bench_engine_loop: no memory for the read reference");
  std::unique_ptr<void, decltype(&std::free)> buf{raw, &std::free};
  std::memset(raw, 0x5a, chunk);
  auto const path = (dir / "sequential_reference.bin").string();
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  STRATA_EXPECTS(fd >= 0, "bench_engine_loop: cannot create ", path);
  for (std::size_t done = 0; done < bytes; done += chunk) {
    STRATA_EXPECTS(::pwrite(fd, raw, std::min(chunk, bytes - done), off_t(done)) > 0,
                   "bench_engine_loop: write failed");
  }
  ::fdatasync(fd);
  ::close(fd);
  fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) { fd = ::open(path.c_str(), O_RDONLY); }
  STRATA_EXPECTS(fd >= 0, "bench_engine_loop: cannot open ", path);
  auto const start = clock_type::now();
  for (std::size_t done = 0; done < bytes; done += chunk) {
    STRATA_EXPECTS(::pread(fd, raw, std::min(chunk, bytes - done), off_t(done)) > 0, "bench_engine_loop: read failed");
  }
  double const ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
  ::close(fd);
  std::filesystem::remove(path);
  return ms * double(full) / double(bytes);
}

double elapsed_ms(cuda_event const& a, cuda_event const& b)
{
  float ms = 0;
  STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return double(ms);
}

}  // namespace

int main(int argc, char** argv)
{
  bool const quick = argc > 1 && std::string(argv[1]) == "--quick";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_engine_loop: no CUDA device\n");
    return 77;
  }
  std::vector<std::int64_t> const doc_tokens =
      quick ? std::vector<std::int64_t>{4096, 8192} : std::vector<std::int64_t>{8192, 16384, 32768};
  std::int64_t measured_doc = quick ? 8192 : 32768;
  if (char const* n = std::getenv("STRATA_BENCH_DOC_TOKENS")) { measured_doc = std::atoll(n) / 32 * 32; }
  STRATA_EXPECTS(measured_doc >= 1024, "bench_engine_loop: STRATA_BENCH_DOC_TOKENS must be at least 1024");
  int const questions = quick ? 2 : 3;
  std::int64_t const largest = *std::max_element(doc_tokens.begin(), doc_tokens.end());
  // ~2 of the loop's documents, and the measured document beside (d)'s (e: a load beside a backup)
  std::int64_t const device_pages = (std::max(largest + doc_tokens.front(), 2 * measured_doc) + 4096) / geo.page_tokens;
  std::int64_t host_tokens = 2 * measured_doc + 16384;  // the measured document and (d)'s
  for (auto d : doc_tokens) {
    host_tokens += 2 * d;
  }
  std::int64_t const host_pages = host_tokens / geo.page_tokens;

  device_buffer memory(std::size_t(device_pages * geo.page_bytes()));
  layer_first const pool{memory.data(), geo, device_pages};
  char const* file_dir = std::getenv("STRATA_FILE_DIR");
  std::filesystem::path const dir =
      std::filesystem::path(file_dir != nullptr ? file_dir : std::filesystem::temp_directory_path().string()) /
      ("strata_engine_loop_" + std::to_string(::getpid()));
  file_store_options fo;
  fo.directory = dir.string();
  fo.tag = "Llama-3.1-8B/bf16 (bench_engine_loop)";
  // Room for the measured document and (d)'s, whose write-through (e) runs beside.
  file_store disk{geo, 2 * (measured_doc / geo.page_tokens) + 64, fo};
  // The file-tier rows measure the file path itself: every page goes there, whatever a later read
  // of it would cost against recomputing (the simulator's grid asks whether keeping it pays).
  controller_options options;
  options.records_by_cost = false;
  // The cost model's file tier is the directory's own measured rate (`measure_store`: what a store
  // with these options reads there, records checksummed into memory as large as the batch), so that the plan's
  // read-or-recompute choice fits the directory; STRATA_FILE_CALIBRATE=0 keeps the H200 disk's figures.
  char const* calibrate = std::getenv("STRATA_FILE_CALIBRATE");
  if (calibrate == nullptr || std::string(calibrate) != "0") {
    auto const rates = measure_store(geo, fo);
    options.costs = h200::costs_for(geo);
    options.costs.set_file_tier(rates.read_bytes_per_s, rates.write_bytes_per_s);
    std::printf("file tier calibrated on %s: read %.2f GB/s, write %.2f GB/s\n", dir.string().c_str(),
                rates.read_bytes_per_s / 1e9, rates.write_bytes_per_s / 1e9);
  }
  // STRATA_FILE_READ_GBPS: the read rate the plan assumes instead (to measure the file-hit path
  // where the calibrated rate would recompute); STRATA_PREFETCH: off, best_effort or wait_complete.
  if (char const* gbps = std::getenv("STRATA_FILE_READ_GBPS")) {
    if (calibrate != nullptr && std::string(calibrate) == "0") { options.costs = h200::costs_for(geo); }
    options.costs.set_file_tier(std::atof(gbps) * 1e9, options.costs.write_bytes_per_s(tier::file));
    std::printf("file tier read rate assumed: %.2f GB/s\n", std::atof(gbps));
  }
  if (char const* p = std::getenv("STRATA_PREFETCH")) {
    std::string const v = p;
    STRATA_EXPECTS(v == "off" || v == "best_effort" || v == "wait_complete",
                   "bench_engine_loop: STRATA_PREFETCH must be off, best_effort or wait_complete, got ", v);
    options.prefetch = v == "off"           ? prefetch_mode::off
                       : v == "best_effort" ? prefetch_mode::best_effort
                                            : prefetch_mode::wait_complete;
  }
  std::printf("prefetch %s\n", options.prefetch == prefetch_mode::off           ? "off"
                               : options.prefetch == prefetch_mode::best_effort ? "best_effort"
                                                                                : "wait_complete");
  // STRATA_RECORD_STAGING_MIB: the executor's pinned staging between the file tier and the device
  // (default 64 MiB: two halves, read and PCIe pipelined chunk by chunk).
  gpu_executor_config ec;
  if (char const* staging = std::getenv("STRATA_RECORD_STAGING_MIB")) {
    ec.record_staging_bytes = std::int64_t(std::atoll(staging)) << 20;
  }
  std::printf("record staging %lld MiB\n", (long long)(ec.record_staging_bytes >> 20));
  controller cache{controller::tiers_type{device_pool<layer_first>{pool}, pinned_host_pool{geo, host_pages}, disk},
                   options, strata_scheduler{}, gpu_executor{ec}};
  cuda_stream compute_stream;
  cudaStream_t const compute = compute_stream.get();
  model m{pool, 8192, std::size_t(device_pages)};
  engine e{cache, m, compute};

  std::printf(
      "bench_engine_loop: %s, 32-token pages (%lld MiB), device pool %lld pages (%lld tokens, %.1f GiB), "
      "pinned host tier %lld pages (%.1f GiB), file tier %lld pages in %s\n",
      models::llama31_8b.name, (long long)(geo.page_bytes() >> 20), (long long)device_pages,
      (long long)(device_pages * geo.page_tokens), double(device_pages * geo.page_bytes()) / double(1 << 30),
      (long long)host_pages, double(host_pages * geo.page_bytes()) / double(1 << 30), (long long)disk.capacity(),
      dir.string().c_str());

  std::atomic<bool> stop{false};
  std::thread poller{[&] {  // completions (backups, demotions) progress off the engine's thread
    while (!stop.load()) {
      (void)cache.poll();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }};

  // --- the loop: conversations over shared documents -----------------------------------------
  std::mt19937_64 rng{7};
  struct conversation {
    int document;
    tokens_t history;
    int turn = 0;
    bool busy = false;
  };
  std::vector<tokens_t> docs;
  for (auto n : doc_tokens) {
    docs.push_back(random_tokens(rng, n, 0));
  }
  std::vector<conversation> convs;
  for (std::size_t c = 0; c < 2 * docs.size(); ++c) {
    convs.push_back({int(c % docs.size()), docs[c % docs.size()]});
  }
  std::int64_t served = 0, total = std::int64_t(convs.size()) * questions;
  for (int step = 0; served < total && step < 10000; ++step) {
    for (std::size_t c = 0; c < convs.size(); ++c) {
      if (convs[c].busy || convs[c].turn >= questions || rng() % 2 != 0) { continue; }
      tokens_t prompt = convs[c].history;
      auto const q = random_tokens(rng, 40 + std::int64_t(rng() % 100), 110000);
      prompt.insert(prompt.end(), q.begin(), q.end());
      e.submit(std::move(prompt), 32 + std::int64_t(rng() % 64), int(c), ++convs[c].turn);
      convs[c].busy = true;
    }
    for (auto id : e.batch()) {
      live_request const& r = e.live.at(id);
      std::printf(
          "request %3llu  doc %d turn %d: %6zu prompt tokens, cached pages device %4lld host %4lld, TTFT "
          "%8.2f ms\n",
          (unsigned long long)id, convs[std::size_t(r.conversation)].document, r.turn, r.prompt.size(),
          (long long)r.cached_pages[0], (long long)r.cached_pages[1], r.ttft_ms);
      int const c = r.conversation;
      convs[std::size_t(c)].history = e.answer_and_release(id);
      convs[std::size_t(c)].busy = false;
      ++served;
    }
  }
  cache.executor().synchronize();

  auto settle_all = [&] {  // until a poll finds nothing more landing (what lands may start more)
    cache.executor().synchronize();
    for (int rounds = 0; cache.poll(compute) > 0; ++rounds) {
      if (rounds == 100) { throw std::runtime_error("bench_engine_loop: transfers still landing after 100 rounds"); }
      cache.executor().synchronize();
    }
  };
  // The conversations' pages leave the device and host tiers (the file tier keeps what fits), so
  // that the measured document alone moves between the tiers below.
  (void)cache.evict(tier::device, device_pages, compute);
  settle_all();
  (void)cache.evict(tier::host, host_pages, compute);
  settle_all();

  // --- (a) load bandwidth and (b) TTFT on a host-cached document ------------------------------
  tokens_t const doc = random_tokens(rng, measured_doc, 200000);
  {
    tokens_t first = doc;
    auto const q = random_tokens(rng, 100, 300000);
    first.insert(first.end(), q.begin(), q.end());
    auto const id = e.submit(first, 1, -1, 0);
    while (!e.live.at(id).done) {
      (void)e.batch();
    }
    cache.release(request_id{id}, first, compute);  // the document (and this question) stay cached
    e.live.erase(id);
  }
  auto host_only = [&] {  // every device copy goes; the document lives on the host tier only
    cache.executor().synchronize();
    (void)cache.poll();
    for (int i = 0; i < 8 && cache.probe(doc).tier_tokens[std::size_t(tier::device)] > 0; ++i) {
      (void)cache.evict(tier::device, device_pages, compute);
      cache.executor().synchronize();
      (void)cache.poll();
    }
  };
  auto file_only = [&] {  // and every host copy goes too: the document lives on the file tier only
    host_only();
    // A node leaves the host once its children have (a question's pages hang below the document):
    // evict until nothing of the document is left there.
    for (int i = 0; i < 8 && cache.probe(doc).tier_tokens[std::size_t(tier::host)] > 0; ++i) {
      (void)cache.evict(tier::host, host_pages, compute);
      settle_all();
    }
  };
  double last_submit_ms = 0;  // of the last `ttft_of`: the time inside `submit` (a prefetch runs there)
  auto ttft_of = [&](tokens_t prompt) {
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute));
    auto const start = clock_type::now();
    auto const id = e.submit(std::move(prompt), 1, -1, 0);
    last_submit_ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
    e.live.at(id).submitted = start;
    while (!e.live.at(id).done) {
      (void)e.batch();
    }
    double const ms = e.live.at(id).ttft_ms;
    std::array<std::int64_t, tier_count> const from = e.live.at(id).cached_pages;
    cache.release(request_id{id}, {}, compute);
    e.live.erase(id);
    return std::pair{ms, from};
  };
  std::int64_t const doc_pages = measured_doc / geo.page_tokens;
  std::size_t const bytes = std::size_t(doc_pages * geo.page_bytes());
  pinned_buffer ref_src(bytes);
  device_buffer ref_dst(bytes);
  STRATA_CUDA_TRY(cudaMemset(ref_dst.data(), 0, bytes));
  cuda_event a{true}, b{true};
  std::vector<double> load_ms, contiguous_ms, compute_ms, ttft_ms, file_ttft_ms, file_submit_ms, recompute_ms, disk_ms,
      beside_ms, beside_ratio;
  std::int64_t beside_written = 0;  // bytes (e)'s backups wrote into the file tier meanwhile (all repetitions)
  int beside_recomputed = 0;
  std::int64_t file_pages_loaded = 0;
  bool file_path_ok = true;
  int file_recomputed = 0;                               // repetitions in which the plan recomputed the document
  double predicted_read_s = 0, predicted_compute_s = 0;  // what it predicted then (the last)
  std::vector<page_job> read_jobs;
  int reps = 5;
  if (char const* n = std::getenv("STRATA_BENCH_REPS")) { reps = std::max(1, std::atoi(n)); }
  for (int rep = 0; rep < reps; ++rep) {
    // Reference: one contiguous copy of the same bytes from pinned memory.
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute));
    a.record(compute);
    STRATA_CUDA_TRY(cudaMemcpyAsync(ref_dst.data(), ref_src.data(), bytes, cudaMemcpyHostToDevice, compute));
    b.record(compute);
    STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
    contiguous_ms.push_back(elapsed_ms(a, b));

    // (a) the document's pages through the controller, every layer waited for, no compute.
    host_only();
    tokens_t p = doc;
    auto const q = random_tokens(rng, 100, 400000 + rep * 1000);
    p.insert(p.end(), q.begin(), q.end());
    auto const id = e.submit(p, 1, -1, 0);
    auto const plan = cache.schedule({8192, 0, 0, 0});
    cache.executor().set_activity(gpu_activity::idle);
    a.record(compute);
    auto loads = cache.begin_loads(plan, compute);
    for (std::int64_t l = 0; l < geo.layers; ++l) {
      (void)wait_layer(loads, l, compute);
    }
    b.record(compute);
    STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
    load_ms.push_back(elapsed_ms(a, b));
    if (loads.loaded_pages[1] != doc_pages) {
      std::printf("measurement: expected %lld pages from the host tier, the controller loaded %lld\n",
                  (long long)doc_pages, (long long)loads.loaded_pages[1]);
    }
    // The compute of the 100 new tokens alone (the pages are in place now).
    auto const table = cache.page_table(request_id{id});
    auto const keys = page_keys(p);
    read_jobs.clear();
    for (std::int64_t i = 0; i < doc_pages; ++i) {
      read_jobs.push_back({table[std::size_t(i)], keys[std::size_t(i)]});
    }
    std::vector<page_job> const write_jobs{
        {table[std::size_t(doc_pages)], keys.size() > std::size_t(doc_pages) ? keys[std::size_t(doc_pages)] : 0}};
    m.set_batch(read_jobs, write_jobs, 100, compute);
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute));
    a.record(compute);
    for (std::int64_t l = 0; l < geo.layers; ++l) {
      m.layer(l, compute);
    }
    b.record(compute);
    STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
    compute_ms.push_back(elapsed_ms(a, b));
    (void)cache.complete(loads);
    cache.release(request_id{id}, {}, compute);  // aborted: its question is not cached
    e.live.erase(id);

    // (b) TTFT: a new question on the host-cached document, loads beside the layers' compute.
    host_only();
    tokens_t t = doc;
    auto const q2 = random_tokens(rng, 100, 500000 + rep * 1000);
    t.insert(t.end(), q2.begin(), q2.end());
    ttft_ms.push_back(ttft_of(t).first);

    // (c) TTFT with the document on the file tier only: prefetched to the host at submit (what
    // has not landed when the request starts is read from the file tier by the load itself).
    file_only();
    if (cache.probe(doc).fastest_tokens[std::size_t(tier::file)] != doc_pages * geo.page_tokens) {
      std::printf("measurement: the document is not on the file tier only\n");
      file_path_ok = false;
    }
    tokens_t f = doc;
    auto const q3 = random_tokens(rng, 100, 600000 + rep * 1000);
    f.insert(f.end(), q3.begin(), q3.end());
    cache_stats const before_c = cache.stats();
    auto const [fms, ffrom] = ttft_of(f);
    file_ttft_ms.push_back(fms);
    file_submit_ms.push_back(last_submit_ms);
    cache_stats const after_c = cache.stats();
    // The plain read of the same bytes after (c), not before: its file's writing and freeing would
    // otherwise sit just before the hit that (e) is compared with.
    disk_ms.push_back(sequential_read_ms(dir, bytes));
    std::int64_t const up = after_c.prefetched_pages - before_c.prefetched_pages;
    file_pages_loaded = ffrom[std::size_t(tier::file)] + std::min(up, ffrom[std::size_t(tier::host)]);
    // Reading the file tier may be predicted slower than recomputing (a slow disk, a short
    // document): then the plan recomputes it, which is right, and the row says so.
    bool const recomputed = file_pages_loaded == 0 && after_c.recomputed_pages - before_c.recomputed_pages >= doc_pages;
    if (recomputed) {
      ++file_recomputed;
      predicted_read_s = after_c.recomputed_read_s - before_c.recomputed_read_s;
      predicted_compute_s = after_c.recomputed_compute_s - before_c.recomputed_compute_s;
    } else if (file_pages_loaded != doc_pages) {
      std::printf(
          "measurement: expected %lld pages from the file tier (directly or prefetched), got %lld "
          "(%lld from the file tier, %lld prefetched, %lld from the host)\n",
          (long long)doc_pages, (long long)file_pages_loaded, (long long)ffrom[std::size_t(tier::file)], (long long)up,
          (long long)ffrom[std::size_t(tier::host)]);
      file_path_ok = false;
    }

    // (d) TTFT with nothing cached: a document of the same length, computed, with the document
    // back on the file tier only first. Its backups start as its prefill finishes.
    file_only();
    tokens_t r = random_tokens(rng, measured_doc, 700000 + rep * 1000);
    r.insert(r.end(), q3.begin(), q3.end());
    recompute_ms.push_back(ttft_of(r).first);
    // (e) At once, (c) again: a file-tier hit while (d)'s backups move (device -> host, then the
    // host -> file write-through of its 4 GiB-per-32K pages).
    tokens_t f2 = doc;
    auto const q4 = random_tokens(rng, 100, 800000 + rep * 1000);
    f2.insert(f2.end(), q4.begin(), q4.end());
    cache_stats const before_e = cache.stats();
    auto const [ems, efrom] = ttft_of(f2);
    cache_stats const after_e = cache.stats();
    beside_ms.push_back(ems);
    beside_ratio.push_back(ems / fms);
    beside_written += (after_e.bytes_moved[1][2] - before_e.bytes_moved[1][2]) +
                      (after_e.bytes_moved[0][2] - before_e.bytes_moved[0][2]);
    if (efrom[std::size_t(tier::file)] + (after_e.prefetched_pages - before_e.prefetched_pages) < doc_pages) {
      ++beside_recomputed;
    }
  }
  stop = true;
  poller.join();
  cache.executor().synchronize();
  (void)cache.poll();

  cache_stats const s = cache.stats();
  auto const x = cache.executor().stats();
  std::printf("\nhit tokens: device %lld, host %lld, file %lld; computed %lld; evicted pages: device %lld, host %lld\n",
              (long long)s.hit_tokens[0], (long long)s.hit_tokens[1], (long long)s.hit_tokens[2],
              (long long)s.computed_tokens, (long long)s.evicted_pages[0], (long long)s.evicted_pages[1]);
  std::printf("bytes moved: host->device %.2f GiB, device->host %.2f GiB, host->file %.2f GiB, file->device %.2f GiB\n",
              double(s.bytes_moved[1][0]) / (1 << 30), double(s.bytes_moved[0][1]) / (1 << 30),
              double(s.bytes_moved[1][2]) / (1 << 30), double(s.bytes_moved[2][0]) / (1 << 30));
  for (std::size_t k = 0; k < 2; ++k) {
    std::printf("%s by backend:", k == 0 ? "loads" : "backups/demotions");
    for (std::size_t bk = 0; bk < gpu_backend_count; ++bk) {
      std::printf("  %s %lld (%.2f GiB)", to_string(gpu_backend(bk)), (long long)x.transfers[k][bk],
                  double(x.bytes[k][bk]) / (1 << 30));
    }
    std::printf("\n");
  }
  unsigned long long const bad = m.bad_words();
  double const gbps = double(bytes) / (median(load_ms) * 1e6);
  double const ref_gbps = double(bytes) / (median(contiguous_ms) * 1e6);
  double const ratio_a = gbps / ref_gbps;
  double const ratio_b = median(ttft_ms) / (median(load_ms) + median(compute_ms));
  std::printf("\n%lld-token document from the host tier (%.2f GiB), median of %d:\n", (long long)measured_doc,
              double(bytes) / (1 << 30), reps);
  std::printf("| measure | value | reference | ratio | target |\n|---|---|---|---|---|\n");
  std::printf(
      "| (a) load bandwidth through the controller | %.1f GB/s | contiguous cudaMemcpyAsync %.1f GB/s | %.3f | "
      ">= 0.9 |\n",
      gbps, ref_gbps, ratio_a);
  std::printf("| (b) TTFT, 100-token question | %.2f ms | load %.2f ms + compute %.2f ms | %.3f | <= 1.2 |\n",
              median(ttft_ms), median(load_ms), median(compute_ms), ratio_b);
  std::printf(
      "| (c) TTFT, document on the file tier only | %.2f ms | sequential read of the bytes %.2f ms (%.2f GB/s) "
      "+ (b) %.2f ms | %.3f | |\n",
      median(file_ttft_ms), median(disk_ms), double(bytes) / (median(disk_ms) * 1e6), median(ttft_ms),
      median(file_ttft_ms) / (median(disk_ms) + median(ttft_ms)));
  std::printf("| (c) of which inside submit (the file -> host prefetch) | %.2f ms | %.2f GB/s | | |\n",
              median(file_submit_ms), double(bytes) / (median(file_submit_ms) * 1e6));
  if (file_recomputed > 0) {
    std::printf(
        "| (c) note | recomputed in %d of %d repetitions | the plan predicted reading %.2f ms, recomputing %.2f ms "
        "| | |\n",
        file_recomputed, reps, predicted_read_s * 1e3, predicted_compute_s * 1e3);
  }
  std::printf("| (c') the same against the host-tier hit | %.2f ms | (b) %.2f ms | %.3f | |\n", median(file_ttft_ms),
              median(ttft_ms), median(file_ttft_ms) / median(ttft_ms));
  double const floor_ms = std::max(median(disk_ms), median(load_ms)) + median(compute_ms);
  std::printf(
      "| (c'') the same against max(read, PCIe load) + compute | %.2f ms | max(%.2f, %.2f) + %.2f ms | %.3f | <= 1.15 "
      "|\n",
      median(file_ttft_ms), median(disk_ms), median(load_ms), median(compute_ms), median(file_ttft_ms) / floor_ms);
  std::printf(
      "| (e) (c) with (d)'s backups in flight (%.2f GiB written meanwhile; %d of %d recomputed) | %.2f ms | (c) %.2f "
      "ms | %.3f (median of each repetition's (e)/(c)) | <= 1.05 |\n",
      double(beside_written) / double(reps) / double(1 << 30), beside_recomputed, reps, median(beside_ms),
      median(file_ttft_ms), median(beside_ratio));
  std::printf("| (d) TTFT, nothing cached (recompute) | %.2f ms | (c) file-tier hit %.2f ms | %.3f | |\n",
              median(recompute_ms), median(file_ttft_ms), median(recompute_ms) / median(file_ttft_ms));
  std::printf("KV words read that differed from what the model wrote: %llu\n", bad);
  cache.check_invariants();
  std::filesystem::remove_all(dir);
  bool const ok = bad == 0 && served == total && s.failed_transfers == 0 && file_path_ok;
  std::printf("bench_engine_loop: %s (%lld requests served)\n", ok ? "PASS" : "FAILED", (long long)served);
  return ok ? 0 : 1;
}
