// Cost model and scheduler strategies.
#include "../support/catch.hpp"

#include "../../tools/simulate/calibration.hpp"

#include <strata/presets/h200.hpp>
#include <strata/sched/baselines.hpp>
#include <strata/sched/strata_scheduler.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace strata;
using strata::tools::calibrate_file_tier;
using strata::tools::calibrate_from_csv;

namespace {

cost_model costs(io_costs io = h200::gpu_assisted_io()) { return h200::costs(models::llama31_8b, io); }

std::vector<std::int32_t> pages(std::int32_t first, std::int64_t n)
{
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

/// A tree holding page-id sequences, as the simulator's index does (one id per 32-token page).
struct fixture {
  static hiradix_config tree_config(std::int64_t file_pages)
  {
    hiradix_config h;
    h.page_tokens = 1;
    h.tokens_per_id = 32;
    h.capacity = {100000, 100000, file_pages, 0};
    h.backup_policy = write_policy::write_back;
    h.delay_hit_tokens = 64;
    return h;
  }
  fixture() = default;
  /// With a file tier of `file_pages` pages below the host.
  explicit fixture(std::int64_t file_pages) : tree{tree_config(file_pages)} {}

  cost_model c = costs();
  hiradix_tree tree{tree_config(0)};
  std::vector<std::vector<std::int32_t>> token_store;
  std::vector<waiting_request> waiting;
  std::int64_t next_page = 0;

  /// Caches `seq` on the device (and, with `to_host`, moves it to the host).
  void cache(std::vector<std::int32_t> const& seq, bool to_host)
  {
    std::vector<std::int64_t> ids(seq.size());
    std::iota(ids.begin(), ids.end(), next_page);
    next_page += std::int64_t(seq.size());
    (void)tree.insert(seq, ids);
    if (to_host) {
      auto const e = tree.evict(tier::device, std::int64_t(seq.size()));
      for (auto const& d : e.demotions) {
        (void)tree.complete(d.id);
      }
    }
  }
  /// Moves the `n` least recently used host pages down to the file tier (demotions landed).
  void to_file(std::int64_t n)
  {
    auto const e = tree.evict(tier::host, n);
    REQUIRE(!e.demotions.empty());
    for (auto const& d : e.demotions) {
      REQUIRE(d.to == tier::file);
      (void)tree.complete(d.id);
    }
  }
  void wait(std::vector<std::int32_t> seq, std::int64_t prompt_tokens, double arrival = 0)
  {
    token_store.push_back(std::move(seq));
    waiting_request w;
    w.id = request_id{waiting.size() + 1};
    w.arrival_s = arrival;
    w.prompt_tokens = prompt_tokens;
    w.output_tokens = 16;
    waiting.push_back(w);
  }
  scheduler_view view(std::int64_t budget = 8192, std::int64_t running = 0)
  {
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      waiting[i].tokens = token_store[i];
    }
    scheduler_view v;
    v.waiting = waiting;
    v.tree = &tree;
    v.costs = &c;
    v.page_tokens = 32;
    v.token_budget = budget;
    v.device_pages_available = 100000;
    v.running_sequences = running;
    v.running_context_tokens = running * 60000;
    v.running_max_remaining = running > 0 ? 40 : 0;
    return v;
  }
};

std::vector<request_id> ids_of(batch_plan const& p)
{
  std::vector<request_id> out;
  for (auto const& it : p.prefills) {
    out.push_back(it.id);
  }
  return out;
}

}  // namespace

TEST_CASE("the cost model predicts loads, prefill, decode and overlap", "[cpu][sched]")
{
  cost_model const c = costs();
  CHECK(c.page_bytes() == 4 << 20);
  CHECK(c.load_s({0, 256, 0, 0}) == Catch::Approx(20e-6 + 256.0 * (4 << 20) / 49.4e9));
  CHECK(c.load_s({0, 0, 0, 0}) == 0);
  CHECK(c.prefill_s(4096, 0) > 0.08);  // measured: GEMMs of 4,096 tokens in 75-78 ms, plus the rest
  CHECK(c.prefill_s(4096, 0) < 0.11);
  CHECK(c.prefill_s(1000, 50000) > c.prefill_s(1000, 0));  // attention grows with context
  CHECK(c.decode_s(0, 0) == 0);
  CHECK(c.decode_s(8, 8 * 1000) < c.decode_s(8, 8 * 60000));
  // Layer-wise overlap: the longer of the two, plus a layer of the shorter; compute slowed 4.4%.
  double const both = c.batch_s(0.100, 0.050);
  CHECK(both == Catch::Approx(0.100 + 0.050 * 1.044 / 32));
  CHECK(c.batch_s(0, 0.05) == 0.05);
  // The stall decode steps may fill: what the batch takes beyond its compute.
  // The time computing nothing: the load beyond the (slowed) compute, and the first layer's load.
  CHECK(c.stall_s(0.100, 0.050) == Catch::Approx(0.100 + 0.050 * 1.044 / 32 - 0.050 * 1.044));
  CHECK(c.stall_s(0.010, 0.050) == Catch::Approx(0.010 / 32));  // compute-bound: only the pipeline fill
  CHECK(c.stall_s(0, 0.05) == 0);
  cost_model const serial = costs(h200::per_block_dma_io());
  CHECK(serial.batch_s(0.1, 0.05) == Catch::Approx(0.15));
  CHECK(serial.stall_s(0.1, 0.05) == Catch::Approx(0.1));  // no overlap: the whole load stalls
  CHECK(serial.stall_s(0.01, 0.05) == Catch::Approx(0.01));
  // The other models scale by their size.
  cost_model const big = h200::costs(models::llama31_70b, h200::gpu_assisted_io());
  CHECK(big.prefill_s(1000, 0) > 5 * c.prefill_s(1000, 0));
  CHECK(big.decode_s(1, 1000) > c.decode_s(1, 1000));
  STRATA_REQUIRE_THROWS(invalid_argument, "no figures for DeepSeek", (void)h200::model_costs(models::deepseek_v3));
  // A model is known by its whole shape, not its layer count alone.
  model_shape const other{"Other-32L", 32, 4, 64, 2};
  STRATA_REQUIRE_THROWS(invalid_argument, "no figures for Other-32L (32 layers, 4 KV heads of 64)",
                        (void)h200::model_costs(other));
}

TEST_CASE("the cost model rejects bad parameters and calibrates from benchmark output", "[cpu][sched]")
{
  compute_costs cc = h200::model_costs(models::llama31_8b);
  io_costs io = h200::gpu_assisted_io();
  STRATA_REQUIRE_THROWS(invalid_argument, "page_bytes and page_tokens must be positive", cost_model(cc, io, 0, 32));
  io_costs bad = io;
  bad.load_bytes_per_s[2] = 0;
  STRATA_REQUIRE_THROWS(invalid_argument, "load bandwidth from the file tier must be positive",
                        cost_model(cc, bad, 1024, 32));
  bad = io;
  bad.prefill_slowdown = -0.1;
  STRATA_REQUIRE_THROWS(invalid_argument, "must not be negative", cost_model(cc, bad, 1024, 32));
  compute_costs zero = cc;
  zero.layers = 0;
  STRATA_REQUIRE_THROWS(invalid_argument, "layers must be positive", cost_model(zero, io, 1024, 32));

  std::string const path = "strata_test_transfer.csv";
  auto write_csv = [&](char const* extra_row) {
    std::ofstream f{path};
    f << "model,kv_heads,page_tokens,context,direction,backend,GBps,vs_contiguous\n"
         "llama3.1-8b,8,32,8192,load,gpu_assisted/2,50.0,0.9\n"
         "llama3.1-8b,8,32,8192,backup,gpu_assisted/2,40.0,0.8\n"
         "llama3.1-8b,8,32,65536,load,gpu_assisted/2,52.0,0.9\n"
         "llama3.1-8b,1,32,8192,load,gpu_assisted/2,20.0,0.4\n"
      << extra_row;
  };
  write_csv("");
  cost_model c = costs();
  double const file_before = c.io().load_bytes_per_s[2], remote_before = c.io().load_bytes_per_s[3];
  calibrate_from_csv(c, path, "gpu_assisted/2", 8, 32);
  CHECK(c.io().load_bytes_per_s[1] == Catch::Approx(52e9));  // the best of the contexts
  CHECK(c.io().backup_bytes_per_s == Catch::Approx(40e9));
  CHECK(c.io().load_bytes_per_s[2] == file_before);  // other links: unchanged
  CHECK(c.io().load_bytes_per_s[3] == remote_before);
  for (char const* row :
       {"llama3.1-8b,8,32,8192,sideways,gpu_assisted/2,50.0,0.9\n",
        "llama3.1-8b,eight,32,8192,load,gpu_assisted/2,50.0,0.9\n",
        "llama3.1-8b,8x,32,8192,load,gpu_assisted/2,50.0,0.9\n", "llama3.1-8b,8,32,8192,load,gpu_assisted/2\n"}) {
    write_csv(row);
    cost_model d = costs();
    STRATA_REQUIRE_THROWS(invalid_argument, ":6: ", calibrate_from_csv(d, path, "gpu_assisted/2", 8, 32));
    CHECK(d.io().load_bytes_per_s[1] == costs().io().load_bytes_per_s[1]);  // unchanged
  }
  write_csv("");
  STRATA_REQUIRE_THROWS(invalid_argument, "no load and backup rows for staged",
                        calibrate_from_csv(c, path, "staged", 8, 32));
  STRATA_REQUIRE_THROWS(invalid_argument, "cannot read", calibrate_from_csv(c, "no/such/file.csv", "x", 8, 32));
  std::remove(path.c_str());
}

TEST_CASE("the file tier costs its measured read, then the PCIe leg, before the batch computes", "[cpu][sched]")
{
  cost_model c = costs();
  double const page = double(c.page_bytes());
  // The default is the figure measured on the H200 machine's disk, not the assumed 12 GB/s drive.
  CHECK(c.io().load_bytes_per_s[2] == 1.92e9);
  CHECK(c.io().load_bytes_per_s[2] == h200::file_read_bytes_per_s);
  CHECK(c.write_bytes_per_s(tier::file) == 2.88e9);
  CHECK(c.io().load_latency_s[2] == 100e-6);
  // N pages from the file: the read (latency + bytes / 1.92 GB/s), then a host-tier copy over PCIe
  // (20 us + bytes / 49.4 GB/s); the same pages from the host: the PCIe copy alone.
  std::int64_t const n = 256;
  double const read = 100e-6 + n * page / 1.92e9, pcie = 20e-6 + n * page / 49.4e9;
  CHECK(c.load_s({0, 0, n, 0}) == Catch::Approx(read + pcie));
  CHECK(c.load_s({0, n, 0, 0}) == Catch::Approx(pcie));
  CHECK(c.load_s({0, 0, n, 0}) > 10 * c.load_s({0, n, 0, 0}));
  CHECK(c.load_s({0, n, n, 0}) == Catch::Approx(read + 2 * pcie));  // tiers share the link: times add
  CHECK(c.record_read_s({0, n, n, 0}) == Catch::Approx(read));
  CHECK(c.record_read_s({0, n, 0, 0}) == 0);
  // Engine-thread CPU counts once per byte copied to the device, not for the read as well.
  io_costs cpu = h200::gpu_assisted_io();
  cpu.cpu_s_per_byte = 1e-11;
  CHECK(costs(cpu).load_s({0, 0, n, 0}) == Catch::Approx(read + pcie + n * page * 1e-11));
  // The read precedes the compute (the executors read records on the calling thread before they
  // issue the copies); only the PCIe leg pipelines layer by layer.
  CHECK(c.serial_load_s({0, 0, n, 0}) == Catch::Approx(read));
  double const load = c.load_s({0, 0, n, 0}), serial = c.serial_load_s({0, 0, n, 0}), compute = 0.5;
  double const piped = std::max(pcie, compute + pcie * 0.044) + std::min(pcie, compute + pcie * 0.044) / 32;
  CHECK(c.batch_s(load, compute, serial) == Catch::Approx(read + piped));
  CHECK(c.batch_s(load, compute, serial) > c.batch_s(load, compute));  // as if the read pipelined
  CHECK(c.stall_s(load, compute, serial) == Catch::Approx(read + piped - (compute + pcie * 0.044)));
  CHECK(c.batch_s(0.1, 0.05, 0) == c.batch_s(0.1, 0.05));  // no record reads: as before
  io_costs overlapped = h200::gpu_assisted_io();
  overlapped.record_reads_overlap = true;
  CHECK(costs(overlapped).serial_load_s({0, 0, n, 0}) == 0);
  CHECK(costs(h200::per_block_dma_io()).batch_s(load, compute, serial) == Catch::Approx(load + compute));
  // Background copies: demotions into the file at its write rate, prefetches out of it at its read rate.
  CHECK(c.copy_s(tier::host, tier::file, n) == Catch::Approx(n * page / 2.88e9));
  CHECK(c.copy_s(tier::file, tier::host, n) == Catch::Approx(n * page / 1.92e9));
  CHECK(c.copy_s(tier::device, tier::host, n) == Catch::Approx(n * page / 52.4e9));
  CHECK(c.copy_s(tier::device, tier::file, n) == Catch::Approx(n * page / 52.4e9 + n * page / 2.88e9));

  // The assumed PCIe 5 drive is one call away; bad bandwidths are refused, the model unchanged.
  c.set_file_tier(h200::pcie5_nvme_bytes_per_s, h200::pcie5_nvme_bytes_per_s);
  CHECK(c.load_s({0, 0, n, 0}) == Catch::Approx(100e-6 + n * page / 12e9 + pcie));
  CHECK(c.write_bytes_per_s(tier::file) == 12e9);
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    INFO(bad);
    STRATA_REQUIRE_THROWS(invalid_argument, "cost_model::set_file_tier: the read bandwidth must be a positive, finite",
                          c.set_file_tier(bad, 1e9));
    STRATA_REQUIRE_THROWS(invalid_argument, "cost_model::set_file_tier: the write bandwidth must be a positive, finite",
                          c.set_file_tier(1e9, bad));
  }
  CHECK(c.io().load_bytes_per_s[2] == 12e9);
  CHECK(c.write_bytes_per_s(tier::file) == 12e9);
  io_costs negative = h200::gpu_assisted_io();
  negative.store_bytes_per_s[2] = -1;
  STRATA_REQUIRE_THROWS(invalid_argument, "write bandwidth into the file tier must not be negative", costs(negative));
}

TEST_CASE("a record tier is worth a page past the depth where reading and writing it beat recomputing it",
          "[cpu][sched]")
{
  cost_model base = h200::costs(models::llama31_8b, h200::gpu_assisted_io());
  io_costs io = base.io();
  for (auto& l : io.load_latency_s) {
    l = 0;  // per load, not per page: the rule is per page
  }
  double const inf = std::numeric_limits<double>::infinity();
  CHECK(base.record_breakeven_tokens(tier::host) == -inf);  // not a record tier
  std::int64_t const p = base.page_tokens();
  for (double gbps : {1.0, 1.92, 12.0, 48.0}) {
    cost_model c{base.compute(), io, base.page_bytes(), p};
    c.set_file_tier(gbps * 1e9, gbps * 1.5e9);
    double const m = c.record_breakeven_tokens(tier::file);
    // Keeping one page: read it back (disk, then PCIe) and write it once; against prefilling its P
    // tokens whose middle lies `depth` tokens in.
    double const keep = c.load_s({0, 0, 1, 0}) + c.copy_s(tier::host, tier::file, 1);
    auto recompute = [&](double depth) { return c.prefill_s(p, std::int64_t(std::llround(depth - 0.5 * double(p)))); };
    INFO(gbps << " GB/s: break-even " << m << " tokens");
    if (m <= 0.5 * double(p)) {                  // -infinity, or shallower than the first page's middle
      CHECK(recompute(0.5 * double(p)) > keep);  // pays even for the first page
      continue;
    }
    CHECK(recompute(m) == Catch::Approx(keep).epsilon(1e-3));
    CHECK(recompute(m + 1000) > keep);
    CHECK(recompute(std::max(0.5 * double(p), m - 1000)) < keep);
  }
  // The H200 machine's disk (1.92 GB/s reads, 2.88 GB/s writes): the tails of long documents only.
  CHECK(base.record_breakeven_tokens(tier::file) > 70e3);
  CHECK(base.record_breakeven_tokens(tier::file) < 95e3);
  // Neither reads nor attention: never pays (+infinity) or always (-infinity).
  compute_costs flat = base.compute();
  flat.attention_flop_per_pair = 0;
  CHECK(cost_model{flat, io, base.page_bytes(), p}.record_breakeven_tokens(tier::file) == inf);
}

TEST_CASE("the file tier calibrates from bench_file_store's output", "[cpu][sched]")
{
  std::string const path = "strata_test_file_store.txt";
  auto write = [&](char const* extra) {
    std::ofstream f{path};
    f << "Running build/benchmarks/bench_file_store\n"
         "Benchmark                                        Time             CPU   Iterations UserCounters...\n"
         "-------------------------------------------------------------------------------------------------\n"
         "llama3.1-8b-p32/write/min_time:1.000/manual_time  187 ms  74.7 ms  7 GB/s=2.8 MiB=512 vs_seq=1.00\n"
         "llama3.1-8b-p32/write/min_time:1.000/manual_time  217 ms   104 ms  7 GB/s=2.4 MiB=512 vs_seq=0.96\n"
         "llama3.1-8b-p32/write/min_time:1.000/manual_time  187 ms  73.8 ms  7 GB/s=3.0 MiB=512 vs_seq=1.02\n"
         "llama3.1-8b-p32/write/min_time:1.000/manual_time_median 187 ms 74.7 ms 3 GB/s=9.9 MiB=512\n"
         "llama3.1-8b-p32/read/min_time:1.000/manual_time   297 ms  84.5 ms  4 GB/s=1.8 MiB=512 vs_seq=0.99\n"
         "llama3.1-8b-p32/read/min_time:1.000/manual_time   278 ms  81.4 ms  4 GB/s=1.9 MiB=512 vs_seq=0.98\n"
         "llama3.1-8b-p32/read/min_time:1.000/manual_time_mean 285 ms 83.7 ms 3 GB/s=7.7 MiB=512\n"
         "llama3.1-8b-p32/read(shuffled slots)/min_time:1.000/manual_time 276 ms 83.3 ms 5 GB/s=2.0 MiB=512\n"
         "llama3.1-8b-p32/read(shuffled slots)/min_time:1.000/manual_time 276 ms 74.9 ms 5 GB/s=2.1 MiB=512\n"
         "llama3.1-8b-p16/read/min_time:1.000/manual_time   291 ms  89.2 ms  5 GB/s=5.5 MiB=512 vs_seq=0.99\n"
      << extra;
  };
  write("");
  cost_model c = costs();
  auto const [read, written] = calibrate_file_tier(c, path, 32);
  CHECK(read == Catch::Approx(1.95e9));  // median of 1.8, 1.9, 2.0, 2.1: aggregates and 16-token pages left out
  CHECK(written == Catch::Approx(2.8e9));
  CHECK(c.io().load_bytes_per_s[2] == Catch::Approx(1.95e9));
  CHECK(c.write_bytes_per_s(tier::file) == Catch::Approx(2.8e9));
  CHECK(c.io().load_bytes_per_s[1] == costs().io().load_bytes_per_s[1]);  // the host link: unchanged
  CHECK(calibrate_file_tier(c, path, 16).first == Catch::Approx(5.5e9));  // no writes: write rate kept
  CHECK(c.write_bytes_per_s(tier::file) == Catch::Approx(2.8e9));
  // Bad rows are named; the model is then unchanged.
  for (char const* row : {"llama3.1-8b-p32/read/min_time:1.000/manual_time 1 ms 1 ms 1 MiB=512\n",
                          "llama3.1-8b-p32/read/min_time:1.000/manual_time 1 ms 1 ms 1 GB/s=fast MiB=512\n",
                          "llama3.1-8b-p32/read/min_time:1.000/manual_time 1 ms 1 ms 1 GB/s=-2 MiB=512\n"}) {
    write(row);
    cost_model d = costs();
    STRATA_REQUIRE_THROWS(invalid_argument, path + ":14: no positive GB/s= counter", calibrate_file_tier(d, path, 32));
    CHECK(d.io().load_bytes_per_s[2] == h200::file_read_bytes_per_s);
  }
  write("");
  STRATA_REQUIRE_THROWS(invalid_argument, "no read runs of p64 records in " + path, calibrate_file_tier(c, path, 64));
  STRATA_REQUIRE_THROWS(invalid_argument, "calibrate_file_tier: cannot read",
                        calibrate_file_tier(c, "no/such/output.txt", 32));
  std::remove(path.c_str());
}

TEST_CASE("the scheduler sees a file-tier hit at the file tier's cost", "[cpu][sched]")
{
  // Two questions on 800-page documents: one document on the host, the other only in the file tier.
  fixture f{100000};
  auto const on_file = pages(1000, 800), on_host = pages(5000, 800);
  f.cache(on_file, true);
  f.to_file(800);
  f.cache(on_host, true);
  auto q1 = on_file, q2 = on_host;
  q1.push_back(1);
  q2.push_back(2);
  f.wait(q1, 801 * 32);
  f.wait(q2, 801 * 32);
  f.wait(pages(9000, 250), 250 * 32);  // a miss: 8,000 tokens to compute, more than the PCIe legs take
  double const page = double(f.c.page_bytes());
  {
    // At the measured 1.92 GB/s, reading the 800 pages (1.75 s) loses to recomputing their 25,600
    // tokens (about 0.6 s): the plan recomputes them (`choose_prefix`), and nothing is read.
    auto const v = f.view();
    prefill_item const slow = size_item(v, 0, 8192);
    CHECK(slow.load_pages == std::array<std::int64_t, tier_count>{0, 0, 0, 0});
    CHECK(slow.cached_tokens == 0);
    CHECK(slow.prefix_pages == 0);
    CHECK(choose_prefix(v, 0, f.tree.probe(q1)).prefix_pages == 0);
    CHECK(remaining_work_s(v, 0, f.tree.probe(q1)) == Catch::Approx(f.c.prefill_s(801 * 32, 0)));
    auto const p = match_plan(f.tree, v, [&] {
      batch_plan b;
      b.prefills.push_back(slow);
      return b;
    }());
    REQUIRE(p.prefills.size() == 1);
    CHECK(f.tree.path_length(p.prefills[0].cached_node) == 0);  // the match stopped above the file pages
  }
  // A file tier fast enough that reading beats recomputing: the file hit is costed at its rate.
  f.c.set_file_tier(20e9, 20e9);
  auto const v = f.view();
  prefill_item const from_file = size_item(v, 0, 8192), from_host = size_item(v, 1, 8192);
  CHECK(from_file.load_pages == std::array<std::int64_t, tier_count>{0, 0, 800, 0});
  CHECK(from_file.prefix_pages == -1);
  CHECK(from_host.load_pages == std::array<std::int64_t, tier_count>{0, 800, 0, 0});
  CHECK(item_load_s(v, from_file) == Catch::Approx(100e-6 + 800 * page / 20e9 + 20e-6 + 800 * page / 49.4e9));
  CHECK(item_load_s(v, from_host) == Catch::Approx(20e-6 + 800 * page / 49.4e9));
  // srpt ranks the file hit last (the most remaining work: 0.17 s of reads), and its plan predicts
  // the read before the compute.
  auto const p = plan_batch(srpt{}, f.view(), f.tree);
  REQUIRE(p.prefills.size() == 3);
  CHECK(ids_of(p) == std::vector<request_id>{request_id{2}, request_id{3}, request_id{1}});
  CHECK(p.predicted_load_s == Catch::Approx(f.c.load_s({0, 800, 800, 0})));
  CHECK(p.predicted_serial_load_s == Catch::Approx(100e-6 + 800 * page / 20e9));
  // strata's bubbles fill the read as well: the GPU computes nothing while the records are read (the
  // compute hides the PCIe legs, not the read).
  auto const b = plan_batch(strata_scheduler{}, f.view(8192, 4), f.tree);
  REQUIRE(b.prefills.size() == 3);
  CHECK(b.predicted_compute_s > f.c.load_s({0, 800, 0, 0}) * 2);
  double const step = f.c.decode_s(4, 4 * 60000) * (1 + f.c.io().decode_slowdown);
  double const stall = f.c.stall_s(b.predicted_load_s, b.predicted_compute_s, b.predicted_serial_load_s);
  CHECK(stall > f.c.stall_s(b.predicted_load_s, b.predicted_compute_s));
  CHECK(b.bubble_decode_steps == std::min<std::int64_t>(40, std::int64_t(stall / step)));
}

TEST_CASE("fifo takes arrival order; longest_prefix the longest cached prefix", "[cpu][sched]")
{
  fixture f;
  auto const doc = pages(1000, 100);
  f.cache(doc, false);
  f.wait(pages(1, 10), 10 * 32 + 5);  // a miss
  auto hit = doc;
  hit.push_back(7);
  f.wait(hit, 101 * 32);  // a hit on 100 pages
  auto const a = plan_batch(fifo{}, f.view(), f.tree);
  CHECK(ids_of(a) == std::vector<request_id>{request_id{1}, request_id{2}});
  auto const b = plan_batch(longest_prefix{}, f.view(), f.tree);
  CHECK(ids_of(b) == std::vector<request_id>{request_id{2}, request_id{1}});
  REQUIRE(b.prefills[0].cached_tokens == 100 * 32);
  CHECK(b.prefills[0].chunk_tokens == 32);
  // Over max_sorted waiting, longest_prefix falls back to arrival order, as SGLang does.
  CHECK(ids_of(plan_batch(longest_prefix{.max_sorted = 1}, f.view(), f.tree)) == ids_of(a));
}

TEST_CASE("sjf takes the shortest prompt; srpt the least remaining work; longest_prefix_sorted never falls back",
          "[cpu][sched]")
{
  for (bool const on_host : {false, true}) {
    fixture f;
    auto const doc = pages(1000, 100);
    f.cache(doc, on_host);
    f.wait(pages(1, 62), 2000);  // a long miss: 2,000 tokens to compute
    auto hit = doc;
    hit.push_back(7);
    f.wait(hit, 101 * 32);        // the longest prompt, but a hit on 100 pages: 32 tokens to compute
    f.wait(pages(200, 10), 325);  // a short miss
    CHECK(ids_of(plan_batch(sjf{}, f.view(), f.tree)) ==
          std::vector<request_id>{request_id{3}, request_id{1}, request_id{2}});
    // srpt counts what is left: the hit's compute, plus its load when the document is on the host
    // (100 pages at ~49 GB/s: ~8.5 ms, more than the short miss's ~325 tokens of compute).
    auto const expected = on_host ? std::vector<request_id>{request_id{3}, request_id{2}, request_id{1}}
                                  : std::vector<request_id>{request_id{2}, request_id{3}, request_id{1}};
    CHECK(ids_of(plan_batch(srpt{}, f.view(), f.tree)) == expected);
    CHECK(srpt::remaining_s(f.view(), 1) < srpt::remaining_s(f.view(), 0));
    // longest_prefix falls back to arrival order past max_sorted waiting; the sorted variant never does.
    CHECK(ids_of(plan_batch(longest_prefix{.max_sorted = 2}, f.view(), f.tree)) ==
          std::vector<request_id>{request_id{1}, request_id{2}, request_id{3}});
    CHECK(ids_of(plan_batch(longest_prefix_sorted{}, f.view(), f.tree)) ==
          std::vector<request_id>{request_id{2}, request_id{1}, request_id{3}});
    CHECK(std::string{longest_prefix_sorted::name} == "longest_prefix_sorted");
  }
}

TEST_CASE("every strategy keeps to the token budget and the device memory", "[cpu][sched]")
{
  std::mt19937_64 rng{5};
  for (int trial = 0; trial < 200; ++trial) {
    fixture f;
    int const docs = 1 + int(rng() % 4);
    std::vector<std::vector<std::int32_t>> cached;
    for (int d = 0; d < docs; ++d) {
      cached.push_back(pages(100000 * (d + 1), 50 + std::int64_t(rng() % 500)));
      f.cache(cached.back(), rng() % 2 == 0);
    }
    int const n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      std::vector<std::int32_t> seq =
          rng() % 3 == 0 ? pages(5000000 + 1000 * i, 1 + std::int64_t(rng() % 3000)) : cached[rng() % cached.size()];
      seq.push_back(std::int32_t(9000000 + i));
      f.wait(seq, std::int64_t(seq.size()) * 32 - std::int64_t(rng() % 31));
      if (rng() % 4 == 0) {
        waiting_request& w = f.waiting.back();
        w.started = true;
        w.prefilled_tokens = w.prompt_tokens / 2;
        w.table_pages = (w.prefilled_tokens + 31) / 32;  // its prefix and the chunks that ran
      }
    }
    std::int64_t const budget = 1 + std::int64_t(rng() % 16384);
    auto v = f.view(budget, std::int64_t(rng() % 8));
    v.device_pages_available = std::int64_t(rng() % 5000);
    v.pages_by_chunk = trial % 2 == 1;
    if (v.pages_by_chunk) { v.device_pages_unreserved = std::int64_t(rng() % 8000); }
    auto check = [&](batch_plan const& p, char const* name) {
      INFO(name << " trial " << trial << " budget " << budget << " by chunk " << v.pages_by_chunk);
      CHECK(p.tokens() <= budget);
      std::int64_t mem = 0, reserved = 0;
      bool started_short = false;  // a prefill under way that lacked pages: no new request may start
      std::vector<char> planned(v.waiting.size(), 0);
      for (auto const& it : p.prefills) {
        CHECK(it.chunk_tokens > 0);
        planned[it.index] = 1;
        mem += it.new_pages;
        waiting_request const& w = v.waiting[it.index];
        std::int64_t const output_pages = (w.output_tokens + 31) / 32;
        if (it.first_chunk) {
          reserved += v.pages_by_chunk ? (w.prompt_tokens + 31) / 32 + output_pages : 0;
          continue;
        }
        // A later chunk adds the pages up to its end it lacks (the output's with the last), by chunk only.
        std::int64_t const end = w.prefilled_tokens + it.chunk_tokens;
        std::int64_t const want =
            std::max<std::int64_t>(0, (end + 31) / 32 - w.table_pages) + (end == w.prompt_tokens ? output_pages : 0);
        CHECK(it.new_pages == (v.pages_by_chunk ? want : 0));
        started_short = started_short || (end < w.prompt_tokens && p.tokens() < budget);
      }
      for (std::size_t i = 0; i < v.waiting.size(); ++i) {
        started_short = started_short || (v.waiting[i].started && !planned[i] && p.tokens() < budget);
      }
      CHECK(mem <= v.device_pages_available);
      CHECK(reserved <= v.device_pages_unreserved);
      if (started_short) {
        CHECK(v.pages_by_chunk);
        CHECK(std::none_of(p.prefills.begin(), p.prefills.end(), [](auto const& it) { return it.first_chunk; }));
      }
      std::vector<std::size_t> seen;  // no request both planned and deferred, none twice
      for (auto const& it : p.prefills) {
        seen.push_back(it.index);
      }
      for (auto const& d : p.deferred) {
        seen.push_back(d.index);
      }
      std::sort(seen.begin(), seen.end());
      CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
    };
    check(plan_batch(fifo{}, v, f.tree), "fifo");
    check(plan_batch(longest_prefix{}, v, f.tree), "longest_prefix");
    check(plan_batch(longest_prefix_sorted{}, v, f.tree), "longest_prefix_sorted");
    check(plan_batch(sjf{}, v, f.tree), "sjf");
    check(plan_batch(srpt{}, v, f.tree), "srpt");
    check(plan_batch(strata_scheduler{}, v, f.tree), "strata");
  }
}

TEST_CASE("by chunk, a prefill under way gets its pages before any new request", "[cpu][sched]")
{
  // A: 320 prompt tokens (10 pages), 9 computed, table of 10 pages; its last chunk needs its output's
  // page too. B: a new 32-token prompt needing 1 page and 1 for its output.
  fixture f;
  f.wait(pages(100, 10), 320);
  f.waiting[0].started = true;
  f.waiting[0].prefilled_tokens = 300;
  f.waiting[0].table_pages = 10;
  f.waiting[0].output_tokens = 96;  // 3 pages
  f.wait(pages(200, 1), 32);
  auto v = f.view();
  v.pages_by_chunk = true;
  auto const plans = [&] {
    return std::vector<batch_plan>{plan_batch(fifo{}, v, f.tree), plan_batch(srpt{}, v, f.tree),
                                   plan_batch(longest_prefix{}, v, f.tree), plan_batch(strata_scheduler{}, v, f.tree),
                                   plan_batch(strata_scheduler{strata_options{.balance = false}}, v, f.tree)};
  };
  SECTION("enough pages: A's last chunk takes its output's, B starts")
  {
    v.device_pages_available = 5;
    for (auto const& p : plans()) {
      REQUIRE(p.prefills.size() == 2);  // (strata's balance puts the short B first)
      auto const& a = p.prefills[p.prefills[0].id == request_id{1} ? 0 : 1];
      auto const& b = p.prefills[p.prefills[0].id == request_id{1} ? 1 : 0];
      CHECK(a.id == request_id{1});
      CHECK(a.last_chunk);
      CHECK(a.new_pages == 3);
      CHECK(b.new_pages == 2);
    }
  }
  SECTION("too few for A's output: A stops a token short, and B, though its pages are free, waits")
  {
    v.device_pages_available = 2;
    for (auto const& p : plans()) {
      REQUIRE(p.prefills.size() == 1);
      CHECK(p.prefills[0].chunk_tokens == 19);
      CHECK(p.prefills[0].new_pages == 0);
      REQUIRE(p.deferred.size() == 1);
      CHECK(p.deferred[0].reason == deferral_reason::memory);
    }
  }
  SECTION("B's whole table does not fit what A left unreserved: it waits")
  {
    v.device_pages_unreserved = 1;
    for (auto const& p : plans()) {
      CHECK(ids_of(p) == std::vector<request_id>{request_id{1}});
    }
  }
}

TEST_CASE("strata defers a request whose prefix another request is computing", "[cpu][sched]")
{
  fixture f;
  auto const doc = pages(1000, 100);
  auto q1 = doc, q2 = doc;
  q1.push_back(1);
  q2.push_back(2);
  f.tree.mark_in_queue(request_id{1}, q1);
  f.wait(q1, 101 * 32);
  f.wait(q2, 101 * 32);
  strata_scheduler const s;
  CHECK(s.uses_transient_nodes());
  auto const p = plan_batch(s, f.view(), f.tree);
  CHECK(ids_of(p) == std::vector<request_id>{request_id{1}});
  REQUIRE(p.deferred.size() == 1);
  CHECK(p.deferred[0].reason == deferral_reason::delay_hit);
  CHECK(p.deferred[0].waiting_for == request_id{1});
  // Without delay hits it computes the prefix again; the baselines do so too.
  CHECK(ids_of(plan_batch(strata_scheduler{{.delay_hits = false}}, f.view(), f.tree)).size() == 2);
  CHECK(ids_of(plan_batch(longest_prefix{}, f.view(), f.tree)).size() == 2);
  // Deferred for a delay hit, it goes first next round.
  f.waiting[1].delay_hit_deferred = true;
  f.tree.abort(request_id{1});
  CHECK(ids_of(plan_batch(s, f.view(), f.tree)).front() == request_id{2});
}

TEST_CASE("strata puts hits before chunked prefills and trims loads the batch cannot hide", "[cpu][sched]")
{
  fixture f;
  std::vector<std::vector<std::int32_t>> docs;
  for (int d = 0; d < 3; ++d) {
    docs.push_back(pages(1000 * (d + 1), 600));
    f.cache(docs.back(), true);  // on the host: a load of 600 pages (2.4 GiB)
  }
  // A long prompt already chunking, and three host hits.
  f.wait(pages(500000, 2000), 2000 * 32);
  f.waiting[0].started = true;
  f.waiting[0].prefilled_tokens = 8192;
  for (auto const& d : docs) {
    auto q = d;
    q.push_back(std::int32_t(q.size()));
    f.wait(q, std::int64_t(q.size()) * 32);
  }
  auto const lp = plan_batch(longest_prefix{}, f.view(), f.tree);
  CHECK(ids_of(lp).front() == request_id{1});  // the chunk first, with the whole budget
  CHECK(lp.prefills.front().chunk_tokens == 8192);
  auto count_trimmed = [](batch_plan const& p) {
    return std::count_if(p.deferred.begin(), p.deferred.end(),
                         [](deferral const& d) { return d.reason == deferral_reason::balance; });
  };
  // By default no load is postponed: hits first, all of them, with the chunk.
  auto const plain = plan_batch(strata_scheduler{}, f.view(), f.tree);
  REQUIRE(plain.prefills.size() == 4);
  CHECK(plain.prefills.front().id != request_id{1});
  CHECK(count_trimmed(plain) == 0);
  // The chunk's compute hides the three loads (49 ms each): nothing to trim even when allowed.
  strata_options const trimming{.max_postponements = 2};
  auto const st = plan_batch(strata_scheduler{trimming}, f.view(), f.tree);
  CHECK(st.predicted_load_s <= st.predicted_compute_s);
  CHECK(st.prefills.size() == 4);
  CHECK(count_trimmed(st) == 0);
  // Without the chunk the hits alone are load-bound: trimming keeps one and postpones the others.
  fixture hits_only;
  for (auto const& d : docs) {
    hits_only.cache(d, true);
    auto q = d;
    q.push_back(std::int32_t(q.size()));
    hits_only.wait(q, std::int64_t(q.size()) * 32);
  }
  auto const untrimmed = plan_batch(strata_scheduler{}, hits_only.view(), hits_only.tree);
  CHECK(untrimmed.prefills.size() == 3);
  CHECK(untrimmed.predicted_load_s > untrimmed.predicted_compute_s);
  auto const trimmed = plan_batch(strata_scheduler{trimming}, hits_only.view(), hits_only.tree);
  CHECK(trimmed.prefills.size() == 1);
  CHECK(count_trimmed(trimmed) == 2);
  // A request passed over max_postponements times is not trimmed again.
  for (auto& w : hits_only.waiting) {
    w.deferrals = 2;
  }
  CHECK(plan_batch(strata_scheduler{trimming}, hits_only.view(), hits_only.tree).prefills.size() == 3);
  // On longest_prefix's order, balance off: the chunk first.
  auto const prefix_order = strata_order::longest_prefix;
  CHECK(ids_of(plan_batch(strata_scheduler{{.order = prefix_order, .balance = false}}, f.view(), f.tree)).front() ==
        request_id{1});
  // No short share: the chunk goes first again, with the whole budget.
  auto const trim_only = plan_batch(
      strata_scheduler{{.order = prefix_order, .max_postponements = 2, .short_percent = 0}}, f.view(), f.tree);
  REQUIRE(!trim_only.prefills.empty());
  CHECK(trim_only.prefills.front().id == request_id{1});
  CHECK(trim_only.prefills.front().chunk_tokens == 8192);
}

TEST_CASE("chunked prefills under way go before every request not yet started", "[cpu][sched]")
{
  // Request 1's prefill is under way (it holds its device pages, 48,000 tokens to go); request 2,
  // a 10,000-token miss, has less work left, but starting it would leave request 1 holding its pages
  // while it waits. Request 3 is a device hit with 32 tokens to compute.
  fixture f;
  auto const doc = pages(1000, 100);
  f.cache(doc, false);
  f.wait(pages(500000, 1750), 1750 * 32);
  f.waiting[0].started = true;
  f.waiting[0].prefilled_tokens = 8000;
  f.wait(pages(600000, 313), 10000);
  auto const started_first = [&](batch_plan const& p, std::int64_t chunk) {
    REQUIRE(!p.prefills.empty());
    CHECK(p.prefills.front().id == request_id{1});
    CHECK(p.prefills.front().chunk_tokens == chunk);
  };
  // Every order, with or without balance and deadlines (no short request waits: balance has no share).
  for (strata_options const so : {strata_options{}, strata_options{.deadline_slack = 0},
                                  strata_options{.balance = false}, strata_options{.deadline_slack = 1}}) {
    started_first(plan_batch(strata_scheduler{so}, f.view(), f.tree), 8192);
  }
  // The baselines (the toolkit's fill, as SGLang's prefill adder takes its chunked request first).
  started_first(plan_batch(sjf{}, f.view(), f.tree), 8192);
  started_first(plan_batch(srpt{}, f.view(), f.tree), 8192);
  started_first(plan_batch(longest_prefix{}, f.view(), f.tree), 8192);
  started_first(plan_batch(fifo{}, f.view(), f.tree), 8192);
  // Two under way keep their relative order, both before the miss.
  fixture g;
  g.wait(pages(500000, 1750), 1750 * 32);
  g.waiting[0].started = true;
  g.waiting[0].prefilled_tokens = 8000;
  g.wait(pages(600000, 313), 10000);
  g.wait(pages(700000, 400), 400 * 32);
  g.waiting[2].started = true;
  g.waiting[2].prefilled_tokens = 400 * 32 - 100;
  auto const two = plan_batch(strata_scheduler{{.balance = false}}, g.view(), g.tree);
  REQUIRE(two.prefills.size() == 2);
  CHECK(two.prefills[0].id == request_id{3});  // its rest is shorter: the remaining-work order's
  CHECK(two.prefills[0].chunk_tokens == 100);
  CHECK(two.prefills[1].id == request_id{1});
  CHECK(two.prefills[1].chunk_tokens == 8092);

  // A hit waits too. Balance: it rides beside the chunk within half the budget; the chunk gets the
  // rest, never less than half. Without balance the chunk takes the whole budget first.
  auto hit = doc;
  hit.push_back(7);
  f.wait(hit, 101 * 32);
  auto const balanced = plan_batch(strata_scheduler{}, f.view(), f.tree);
  CHECK(ids_of(balanced) == std::vector<request_id>{request_id{3}, request_id{1}});
  CHECK(balanced.prefills[1].chunk_tokens == 8192 - 32);
  started_first(plan_batch(strata_scheduler{{.balance = false}}, f.view(), f.tree), 8192);
  // Many short requests: they take half the budget, the chunk the other half.
  for (int k = 0; k < 20; ++k) {
    f.wait(pages(800000 + 100 * k, 20), 20 * 32);
  }
  auto const crowded = plan_batch(strata_scheduler{}, f.view(), f.tree);
  std::int64_t chunk = 0;
  for (auto const& it : crowded.prefills) {
    chunk += it.id == request_id{1} ? it.chunk_tokens : 0;
  }
  CHECK(chunk >= 4096);
  CHECK(crowded.tokens() == 8192);
}

TEST_CASE("strata ranks by remaining work per request served, and serves requests past their deadline first",
          "[cpu][sched]")
{
  fixture f;
  auto const doc = pages(1000, 100);
  f.cache(doc, false);
  f.wait(pages(1, 120), 120 * 32);  // 1: a long miss (3,840 tokens)
  auto hit = doc;
  hit.push_back(7);
  f.wait(hit, 101 * 32);        // 2: a hit: 32 tokens to compute
  f.wait(pages(200, 10), 325);  // 3: a short miss
  strata_scheduler const s{{.deadline_slack = 0}};
  CHECK(ids_of(plan_batch(s, f.view(), f.tree)) ==
        std::vector<request_id>{request_id{2}, request_id{3}, request_id{1}});
  // The budget goes in that order: with 400 tokens the long miss waits.
  auto const tight = plan_batch(s, f.view(400), f.tree);
  CHECK(ids_of(tight) == std::vector<request_id>{request_id{2}, request_id{3}, request_id{1}});
  CHECK(tight.prefills.back().chunk_tokens == 400 - 32 - 325);

  // Smith's rule: a prompt that delay hits wait on carries them. Request 4 computes a 3,000-token
  // document that five questions (5-9) wait on; request 10 is a 2,000-token miss: 4 goes first.
  fixture g;
  auto const shared = pages(50000, 94);
  auto owner = shared;
  owner.push_back(1);
  g.wait(owner, 95 * 32);
  for (int q = 0; q < 5; ++q) {
    auto question = shared;
    question.push_back(std::int32_t(100 + q));
    g.wait(question, 95 * 32);
  }
  g.wait(pages(90000, 62), 62 * 32 + 7);
  auto v = g.view(4096);
  for (std::size_t i = 0; i < g.waiting.size(); ++i) {
    (void)g.tree.mark_in_queue(g.waiting[i].id, g.token_store[i]);  // as the controller marks arrivals
  }
  auto const p = plan_batch(strata_scheduler{{.deadline_slack = 0}}, v, g.tree);
  REQUIRE(!p.prefills.empty());
  CHECK(p.prefills.front().id == request_id{1});
  CHECK(std::count_if(p.deferred.begin(), p.deferred.end(),
                      [](deferral const& d) { return d.reason == deferral_reason::delay_hit; }) == 5);

  // Deadlines: a long miss seen when little waited is overdue once more than its work has been
  // planned for others; it then goes first, within half the budget while others wait.
  fixture h;
  h.wait(pages(1, 200), 200 * 32);  // 6,400 tokens
  strata_scheduler const d{{.deadline_slack = 1}};
  (void)plan_batch(d, h.view(1), h.tree);  // first sight of 1: its deadline is its own work (1 token planned)
  for (int k = 0; k < 40; ++k) {
    h.wait(pages(10000 + 100 * k, 10), 320);
  }
  auto order_of = [&](batch_plan const& plan) { return ids_of(plan); };
  auto first = plan_batch(d, h.view(2048), h.tree);  // short ones first: 1 is not overdue yet
  CHECK(order_of(first).front() != request_id{1});
  for (int round = 0; round < 60 && order_of(first).front() != request_id{1}; ++round) {
    std::vector<std::size_t> planned;  // the planned ones leave
    for (auto const& it : first.prefills) {
      planned.push_back(it.index);
    }
    std::sort(planned.rbegin(), planned.rend());
    for (auto i : planned) {
      h.waiting.erase(h.waiting.begin() + std::ptrdiff_t(i));
      h.token_store.erase(h.token_store.begin() + std::ptrdiff_t(i));
    }
    first = plan_batch(d, h.view(2048), h.tree);
  }
  REQUIRE(order_of(first).front() == request_id{1});
  CHECK(first.prefills.front().chunk_tokens == 1024);  // half the budget while others wait
  STRATA_REQUIRE_THROWS(invalid_argument, "deadline_slack must be finite and not negative",
                        strata_scheduler({.deadline_slack = -1}));
}

TEST_CASE("strategies count a use of the index only for the requests they plan", "[cpu][sched]")
{
  // Request 1: a question on document A (300 pages on the device). Request 2: a long prompt on
  // document B (100 pages on the host). Passed over for the budget, or (sized, then) for memory.
  for (bool by_memory : {false, true}) {
    auto check = [&](auto const& strategy) {
      fixture f;
      auto const a = pages(1000, 300), b = pages(5000, 100);
      f.cache(b, true);  // first: `cache` evicts the least recently used pages
      f.cache(a, false);
      auto qa = a;
      qa.push_back(900000);
      f.wait(qa, std::int64_t(qa.size()) * 32);
      auto qb = b;
      for (std::int32_t k = 0; k < 300; ++k) {
        qb.push_back(910000 + k);
      }
      f.wait(qb, std::int64_t(qb.size()) * 32);
      auto v = f.view(by_memory ? 8192 : 32);
      if (by_memory) { v.device_pages_available = 10; }  // room for request 1 only
      auto const before = f.tree.stats();
      auto const plan = plan_batch(strategy, v, f.tree);
      INFO(strategy.name << (by_memory ? ", memory" : ", budget"));
      REQUIRE(plan.prefills.size() == 1);
      REQUIRE(plan.deferred.size() == 1);
      CHECK(plan.deferred[0].reason == (by_memory ? deferral_reason::memory : deferral_reason::budget));
      CHECK(plan.prefills[0].id == request_id{1});
      CHECK(f.tree.stats().matched_tokens - before.matched_tokens == 300 * 32);  // request 1's prefix only
      CHECK(f.tree.path_length(plan.prefills[0].cached_node) == 300);            // the node ends where the prefix does
    };
    check(fifo{});
    check(longest_prefix{});
    check(strata_scheduler{});
  }
}

TEST_CASE("an item whose match disagrees with its probe leaves the plan", "[cpu][sched]")
{
  // Selective backups after one hit, and a host tier that holds document B only: matching request
  // 1 (document A, on the device) backs A up, which evicts B from the host, so request 2's probed
  // load of B is gone by the time it is matched.
  fixture f;
  hiradix_config h;
  h.page_tokens = 1;
  h.tokens_per_id = 32;
  h.capacity = {100000, 100, 0, 0};
  h.backup_policy = write_policy::write_through_selective;
  h.selective_hits = 1;
  h.delay_hit_tokens = 64;
  f.tree = hiradix_tree{h};
  auto const a = pages(1000, 100), b = pages(5000, 100);
  {  // B: inserted, hit once (backed up to the host), then evicted from the device
    std::vector<std::int64_t> ids(b.size());
    std::iota(ids.begin(), ids.end(), 0);
    (void)f.tree.insert(b, ids);
    (void)f.tree.match(b);
    for (auto const& c : f.tree.take_copies()) {
      (void)f.tree.complete(c.id);
    }
    for (auto const& d : f.tree.evict(tier::device, 100).demotions) {
      (void)f.tree.complete(d.id);
    }
    f.next_page = 100;
  }
  f.cache(a, false);
  for (auto const* doc : {&a, &b}) {
    auto q = *doc;
    q.push_back(900000 + std::int32_t(doc == &b));
    f.wait(q, std::int64_t(q.size()) * 32);
  }
  REQUIRE(f.tree.probe(f.token_store[1]).fastest_tokens[1] == 100 * 32);  // B is on the host
  auto const plan = plan_batch(fifo{}, f.view(), f.tree);
  CHECK(f.tree.probe(f.token_store[1]).tokens == 0);  // evicted by A's backup
  REQUIRE(plan.prefills.size() == 1);
  CHECK(plan.prefills[0].id == request_id{1});
  REQUIRE(plan.deferred.size() == 1);
  CHECK(plan.deferred[0].id == request_id{2});
  CHECK(plan.deferred[0].reason == deferral_reason::changed);
  CHECK(plan.predicted_load_s == 0);  // B's load left with it
  CHECK(plan.predicted_compute_s == Catch::Approx(f.c.prefill_s(32, 100 * 32)));
  // Next round it is sized afresh: a miss, computed in full.
  auto const next = plan_batch(fifo{}, f.view(), f.tree);
  auto const again = std::find_if(next.prefills.begin(), next.prefills.end(),
                                  [](prefill_item const& it) { return it.id == request_id{2}; });
  REQUIRE(again != next.prefills.end());
  CHECK(again->cached_tokens == 0);
}

TEST_CASE("strata's probes kept across rounds plan as fresh probes while the index changes", "[cpu][sched]")
{
  // One strata_scheduler kept for every round (its probes reused through memos), and a new one
  // each round (every request probed afresh), on the same queue and index; no deadlines, so that
  // the memos are all the kept one has that the new one lacks. Between rounds, what serving does:
  // planned requests finish (their prompts cached), others arrive, documents are computed,
  // demoted to the host and to the file tier, loaded back.
  fixture f{4000};
  std::mt19937_64 rng{23};
  std::vector<std::vector<std::int32_t>> docs;
  std::int32_t next_id = 1;
  auto const new_doc = [&] {
    docs.push_back(pages(next_id, std::int64_t(20 + rng() % 400)));
    next_id += 1000;
    return docs.back();
  };
  for (int d = 0; d < 12; ++d) {
    f.cache(new_doc(), d % 3 == 0);
  }
  std::uint64_t next_request = 1;
  auto const arrive = [&] {
    auto q = rng() % 4 == 0 ? new_doc() : docs[rng() % docs.size()];
    for (int k = 0; k < 1 + int(rng() % 3); ++k) {
      q.push_back(900000 + std::int32_t(next_request) * 4 + k);
    }
    f.token_store.push_back(std::move(q));
    waiting_request w;
    w.id = request_id{next_request++};
    w.prompt_tokens = std::int64_t(f.token_store.back().size()) * 32 - 5;
    w.output_tokens = 16;
    f.waiting.push_back(w);
  };
  for (int i = 0; i < 40; ++i) {
    arrive();
  }
  strata_options const options{.deadline_slack = 0};
  strata_scheduler kept{options};
  std::int64_t reused = 0, planned = 0;
  for (int round = 0; round < 150; ++round) {
    INFO("round " << round);
    if (round == 75) {  // a copy whose source is gone goes on with memos of its own
      strata_scheduler copy{kept};
      kept = strata_scheduler{options};  // the source's memos are freed
      kept = std::move(copy);
    }
    auto const v = f.view(2048);
    batch_plan const fresh = strata_scheduler{options}.schedule(v);
    batch_plan const plan = kept.schedule(v);
    REQUIRE(plan.prefills.size() == fresh.prefills.size());
    for (std::size_t k = 0; k < plan.prefills.size(); ++k) {
      auto const &a = plan.prefills[k], &b = fresh.prefills[k];
      CHECK(a.index == b.index);
      CHECK(a.chunk_tokens == b.chunk_tokens);
      CHECK(a.cached_tokens == b.cached_tokens);
      CHECK(a.load_pages == b.load_pages);
      CHECK(a.new_pages == b.new_pages);
      CHECK(a.prefix_pages == b.prefix_pages);
      REQUIRE(a.probe != nullptr);
      reused += a.probe->reuses() > 0;
    }
    REQUIRE(plan.deferred.size() == fresh.deferred.size());
    for (std::size_t k = 0; k < plan.deferred.size(); ++k) {
      CHECK(plan.deferred[k].index == fresh.deferred[k].index);
      CHECK(plan.deferred[k].reason == fresh.deferred[k].reason);
    }
    // The final match follows the memos: the same prefixes as a match of the tokens would find.
    batch_plan const done = plan_batch(kept, v, f.tree);
    planned += std::int64_t(done.prefills.size());
    std::vector<std::size_t> finished;
    for (auto const& it : done.prefills) {
      std::int64_t const matched = f.tree.path_length(it.cached_node) * 32;  // the node ends where the prefix does
      CHECK(matched >= it.cached_tokens);
      CHECK(matched < it.cached_tokens + 32);
      if (rng() % 2 == 0) { finished.push_back(it.index); }
    }
    std::sort(finished.rbegin(), finished.rend());
    for (std::size_t i : finished) {  // computed: cached on the device, gone from the queue
      std::vector<std::int32_t> const& t = f.token_store[i];
      std::vector<std::int64_t> ids(t.size());
      std::iota(ids.begin(), ids.end(), f.next_page);
      f.next_page += std::int64_t(t.size());
      auto const r = f.tree.insert(t, ids);
      (void)r;
      f.token_store.erase(f.token_store.begin() + std::ptrdiff_t(i));
      f.waiting.erase(f.waiting.begin() + std::ptrdiff_t(i));
    }
    while (f.waiting.size() < 40) {
      arrive();
    }
    switch (rng() % 4) {
      case 0:
        f.cache(new_doc(), false);
        break;
      case 1:
        for (auto const& d : f.tree.evict(tier::device, std::int64_t(50 + rng() % 300)).demotions) {
          (void)f.tree.complete(d.id);
        }
        break;
      case 2:
        for (auto const& d : f.tree.evict(tier::host, 50).demotions) {  // to the file tier
          (void)f.tree.complete(d.id);
        }
        break;
      default: {
        auto const& d = docs[rng() % docs.size()];
        auto const m = f.tree.match(d);
        std::vector<std::int64_t> ids(std::size_t(f.tree.pages_to_load(m.node)));
        std::iota(ids.begin(), ids.end(), f.next_page);
        f.next_page += std::int64_t(ids.size());
        for (auto const& o : f.tree.load(m.node, ids)) {
          (void)f.tree.complete(o.id);
        }
      }
    }
    for (auto const& c : f.tree.take_copies()) {  // backups the matches queued
      (void)f.tree.complete(c.id);
    }
  }
  INFO("planned " << planned << ", of them sized from a reused probe " << reused);
  CHECK(planned > 300);
  CHECK(reused > planned / 4);  // the memos were used, not just refilled
}

TEST_CASE("stable_radix_sort orders as a stable comparison sort; ordered_key as the doubles do", "[cpu][sched]")
{
  std::mt19937_64 rng{5};
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(300), std::size_t(5000)}) {
    std::vector<std::pair<double, std::uint32_t>> items;
    for (std::size_t i = 0; i < n; ++i) {
      double x = double(rng() % 50) * 0.125;  // many ties
      if (rng() % 7 == 0) { x = -x; }
      if (rng() % 11 == 0) { x = -0.0; }
      if (rng() % 13 == 0) { x = std::ldexp(double(rng() % 1000), int(rng() % 200) - 100); }
      items.emplace_back(x, std::uint32_t(i));
    }
    auto expected = items;
    std::stable_sort(expected.begin(), expected.end(), [](auto const& a, auto const& b) { return a.first < b.first; });
    std::vector<std::pair<double, std::uint32_t>> scratch;
    detail::stable_radix_sort(items, scratch, [](auto const& x) { return detail::ordered_key(x.first); });
    CHECK(items == expected);
  }
}

TEST_CASE("strata fills a load-bound batch's stall with decode steps", "[cpu][sched]")
{
  fixture f;
  auto const doc = pages(1000, 800);
  f.cache(doc, true);
  auto q = doc;
  q.push_back(1);
  f.wait(q, 801 * 32);
  auto const p = plan_batch(strata_scheduler{}, f.view(8192, 4), f.tree);
  REQUIRE(p.prefills.size() == 1);
  CHECK(p.predicted_load_s > p.predicted_compute_s);
  double const step = f.c.decode_s(4, 4 * 60000) * (1 + f.c.io().decode_slowdown);
  // Idle time: the load beyond the compute slowed 4.4% beside it, plus one layer of that compute.
  double const slowed = p.predicted_compute_s * 1.044;
  double const idle = p.predicted_load_s + slowed / 32 - slowed;
  CHECK(p.bubble_decode_steps == std::min<std::int64_t>(40, std::int64_t(idle / step)));
  CHECK(p.bubble_decode_steps > 0);
  // Without layer-wise overlap the whole load stalls: more steps fit.
  f.c = costs(h200::per_block_dma_io());
  auto const serial = plan_batch(strata_scheduler{}, f.view(8192, 4), f.tree);
  double const serial_step = f.c.decode_s(4, 4 * 60000) * (1 + f.c.io().decode_slowdown);
  CHECK(serial.bubble_decode_steps == std::min<std::int64_t>(40, std::int64_t(serial.predicted_load_s / serial_step)));
  CHECK(serial.bubble_decode_steps > p.bubble_decode_steps);
  f.c = costs();
  CHECK(plan_batch(strata_scheduler{{.bubbles = false}}, f.view(8192, 4), f.tree).bubble_decode_steps == 0);
  CHECK(plan_batch(strata_scheduler{}, f.view(8192, 0), f.tree).bubble_decode_steps == 0);  // nothing decoding
}

TEST_CASE("strata rejects bad options", "[cpu][sched]")
{
  STRATA_REQUIRE_THROWS(invalid_argument, "max_postponements must not be negative",
                        strata_scheduler({.max_postponements = -1}));
  STRATA_REQUIRE_THROWS(invalid_argument, "window must be positive", strata_scheduler({.window = 0}));
  STRATA_REQUIRE_THROWS(invalid_argument, "short_percent must be in [0, 100], got 101",
                        strata_scheduler({.short_percent = 101}));
  STRATA_REQUIRE_THROWS(invalid_argument, "short_percent must be in [0, 100], got -1",
                        strata_scheduler({.short_percent = -1}));
}

TEST_CASE("strata: an id that comes back with another prompt is probed afresh", "[cpu][sched]")
{
  // The strategy keeps each request's probe memo across rounds, and a memo knows its tokens by
  // their buffer's address and size: an engine that releases an id and submits it again with
  // another prompt of the same size in the same buffer (an allocator's reuse) must not be planned
  // from the old prompt's cached path. The submission number tells them apart.
  fixture f;
  f.cache(pages(1, 8), false);
  f.wait(pages(1, 12), 12 * 32);  // shares the 8 cached pages
  strata_scheduler s{strata_options{.delay_hits = false}};
  auto v = f.view();
  f.waiting[0].submission = 1;
  v.waiting = f.waiting;
  auto const a = s.schedule(v);
  REQUIRE(a.prefills.size() == 1);
  CHECK(a.prefills[0].cached_tokens == 8 * 32);
  // Released, and the id comes back: other tokens in the same buffer, a new submission.
  std::vector<std::int32_t>& buf = f.token_store[0];
  std::iota(buf.begin(), buf.end(), 500);
  f.waiting[0].submission = 2;
  v.waiting = f.waiting;
  auto const b = s.schedule(v);
  REQUIRE(b.prefills.size() == 1);
  CHECK(b.prefills[0].cached_tokens == 0);
  CHECK(plan_batch(strata_scheduler{strata_options{.delay_hits = false}}, v, f.tree).prefills[0].cached_tokens == 0);
}

TEST_CASE("strata: an unlimited token budget plans every prompt whole, in either order", "[cpu][sched]")
{
  // schedule({INT64_MAX}) is how an engine says "no token limit"; halving or scaling the budget
  // must not overflow (UBSan saw `token_budget + 1` and `token_budget * short_percent`).
  for (auto order : {strata_order::remaining_work, strata_order::longest_prefix}) {
    fixture f;
    f.cache(pages(1, 8), false);
    f.wait(pages(1, 12), 12 * 32);
    f.wait(pages(900, 3), 3 * 32 - 5);
    strata_scheduler s{strata_options{.order = order}};
    auto const p = plan_batch(s, f.view(std::numeric_limits<std::int64_t>::max()), f.tree);
    REQUIRE(p.prefills.size() == 2);
    for (auto const& it : p.prefills) {
      CHECK(it.chunk_tokens + it.cached_tokens == f.waiting[it.index].prompt_tokens);
    }
  }
}
