// strata's simulator: one engine (or several behind a router) in virtual time, with the real
// prefix index and the real scheduler strategies; the cost model of one H200 is the clock.
//
//   simulate                       a small long-document workload under fifo, longest_prefix and
//                                  strata: the comparison, in seconds
//   simulate --workload short_chat --rate 40 --requests 20000 --strategy all --out results/
//   simulate --trace requests.jsonl --strategy strata
//   simulate --sweep --out docs/simulation      the acceptance sweeps (minutes)
//   simulate --file-sweep --out docs/simulation the file-tier scenario (minutes)
//   simulate --help
//
// A tool, built with the project and never installed: its reports, chart data and progress bar
// live beside it; plot_charts.py (matplotlib) draws the charts.
#include "chart.hpp"
#include "progress.hpp"
#include "report.hpp"

#include "calibration.hpp"

#include <strata/presets/h200.hpp>
#include <strata/sched/baselines.hpp>
#include <strata/sched/strata_scheduler.hpp>
#include <strata/sim/workload.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_set>
#include <vector>

using namespace strata;
using namespace strata::sim;

namespace {

/// Bounds of what the command line and traces may ask for: beyond them a value is a typo or a unit
/// mix-up, and the simulator's integer arithmetic (tokens, pages, seconds) stays far from overflow.
namespace limits {
constexpr std::int64_t max_requests = 10'000'000;
constexpr double min_rate = 1e-3, max_rate = 1e6;  // requests/s
constexpr int max_instances = 1024;
constexpr std::int64_t max_tokens = strata::sim::max_request_tokens;  // per request (prompt, output) and per batch
constexpr std::int64_t max_device_pages = std::int64_t{1} << 24;
constexpr std::int64_t max_host_pages = std::int64_t{1} << 30;  // and file tier pages
constexpr double min_gbps = 1e-3, max_gbps = 1e4;               // file tier bandwidths, GB/s
constexpr double max_seconds = strata::sim::max_arrival_s;      // trace arrivals and think times (about 32 years)
}  // namespace limits

/// Defaults of the generated workloads: requests and arrival rate.
struct workload_defaults {
  char const* name;
  std::int64_t requests;
  double rate;
};
/// Every strategy `--strategy all` runs, in report order: the baselines, then strata.
constexpr char const* strategy_names[] = {"fifo", "longest_prefix", "longest_prefix_sorted", "sjf", "srpt", "strata"};
constexpr char const* strategy_list = "fifo, longest_prefix, longest_prefix_sorted, sjf, srpt, strata, all";

constexpr workload_defaults defaults_of[] = {
    {"long_documents", 400, 1.5}, {"short_chat", 4000, 40}, {"multi_turn", 2000, 10}};

struct options {
  std::string workload = "long_documents";
  std::optional<std::int64_t> requests;  // unset: the workload's default (defaults_of)
  std::optional<double> rate;            // unset: the workload's default
  std::uint64_t seed = 1;
  std::string strategy = "all";
  std::string system = "gpu_assisted";
  bool delay_hits = true, balance = true, bubbles = true;
  std::optional<double> deadline_slack;  // unset: strata_options' default
  bool prefix_order = false;             // strata on longest_prefix's order (before issue 11)
  int instances = 1;
  std::string trace;
  bool trace_pages = false;
  std::optional<double> time_scale;  // traces: multiply arrival times
  std::string out;
  bool sweep = false;
  bool progress = false;
  std::int64_t budget = 8192;
  std::optional<std::int64_t> device_pages, host_pages;  // unset: the defaults of engine_for
  std::optional<std::int64_t> file_pages;                // unset: none (the file sweep: 131072)
  std::optional<double> file_gbps, file_write_gbps;      // unset: h200::file_*_bytes_per_s (measured)
  std::string file_bench;                                // bench_file_store output to calibrate from
  int file_drives = 1;                                   // drives the file tier stripes over (rates are each one's)
  std::optional<write_policy> policy;                    // unset: write_through (the file sweep: write_back)
  prefetch_mode prefetch = prefetch_mode::best_effort;
  bool file_sweep = false;
  bool file_grid = false;
  bool record_rules = true;           // false: record tiers take every page, unbounded backlog (before issue 20)
  bool pages_by_chunk = false;        // true: each prefill chunk takes the device pages it computes into
  std::optional<double> remote_gbps;  // set: a remote tier the instances share, at this rate (GB/s)
  bool scale_out = false;
};

[[noreturn]] void usage(int code)
{
  std::printf(
      "usage: simulate [options]\n"
      "  --workload long_documents|short_chat|multi_turn   generated workload (default long_documents)\n"
      "  --requests N                    requests to generate, 1..%lld (default: long_documents 400,\n"
      "                                  short_chat 4000, multi_turn 2000)\n"
      "  --rate R                        arrival rate, requests/s, %g..%g (default: long_documents 1.5,\n"
      "                                  short_chat 40, multi_turn 10)\n"
      "  --seed S                        random seed, 0..2^64-1 (default 1)\n"
      "  --trace FILE [--trace-pages]    replay CSV / JSON lines / Mooncake JSON lines (hash_ids) instead\n"
      "                                  (see sim/workload.hpp); arrivals below %g s, at most %lld prompt or\n"
      "                                  output tokens per request\n"
      "  --time-scale X                  with --trace: multiply arrival times by X (> 1: lighter load);\n"
      "                                  or --rate R with --trace: scale arrivals to R requests/s\n"
      "  --strategy fifo|longest_prefix|longest_prefix_sorted|sjf|srpt|strata|all   (default all)\n"
      "  --no-delay-hits --no-balance --no-bubbles          switch strata's ideas off one by one\n"
      "  --deadline-slack X              strata's deadlines: X times the first-come-first-served wait\n"
      "                                  (default 64; 0: none, plain remaining-work order)\n"
      "  --prefix-order                  strata on longest_prefix's order (the strategy before issue 11)\n"
      "  --system gpu_assisted|batched_dma|per_block_dma   transfer system (default gpu_assisted)\n"
      "  --instances N                   engines behind a cache-aware router, 1..%d (default 1)\n"
      "  --budget TOKENS                 prefill tokens per batch, 1..%lld (default 8192)\n"
      "  --device-pages N                KV pool pages of 32 tokens, 1..%lld (default 12288; 6144 for\n"
      "                                  long_documents)\n"
      "  --host-pages N                  host tier pages, 0 (none)..%lld (default 131072)\n"
      "  --file-pages N                  file tier (NVMe) pages, 0 (none)..%lld (default 0)\n"
      "  --file-gbps X                   file tier read bandwidth, GB/s, %g..%g (default %g: file_store measured\n"
      "                                  on the H200 machine's disk; %g: one PCIe 5 NVMe drive, assumed); its pages\n"
      "                                  then cross PCIe at the host tier's rate\n"
      "  --file-write-gbps X             file tier write bandwidth (demotions), GB/s, %g..%g (default %g: measured)\n"
      "  --file-bench FILE               file tier read and write bandwidth from bench_file_store's output\n"
      "                                  (medians of its runs of 32-token records) instead of --file-gbps\n"
      "  --file-drives N                 the file tier is an array of N drives, 1..64 (default 1), its records\n"
      "                                  striped across them (file_store over N directories): the rates above\n"
      "                                  are one drive's, the tier moves N times them\n"
      "  --write-policy write_through|write_back   device -> host backups (default write_through;\n"
      "                                  --file-sweep: write_back)\n"
      "  --prefetch off|best_effort|wait_complete|timeout   file -> host prefetch of a prefix at arrival\n"
      "                                  (default best_effort; timeout: 50 ms of virtual time)\n"
      "  --record-rules on|off           off: the file tier takes every page the write policies send and\n"
      "                                  queues every write (before issue 20); on (default): only pages a\n"
      "                                  later read pays for, writes past a 64 MiB backlog dropped\n"
      "  --device-pages-by prompt|chunk  prompt (default): a request's first chunk takes all of its device\n"
      "                                  pages; chunk: each chunk takes those it computes into\n"
      "  --out DIR                       per-request CSV, summary.md, chart data ttft_cdf.csv and, with\n"
      "                                  python3 + matplotlib, ttft_cdf.png (created if missing)\n"
      "  --sweep                         acceptance sweeps (50/80/95%% load, 3 seeds, every workload); takes\n"
      "                                  only --out (default sweep/), --budget, --device-pages, --host-pages,\n"
      "                                  and --trace FILE: one more workload, its arrivals scaled to each load\n"
      "  --file-sweep                    the file-tier scenario: long documents whose working set exceeds the\n"
      "                                  host tier (--host-pages, default a quarter of it) and a file tier\n"
      "                                  (--file-pages, default 131072) holds the rest, against host only and\n"
      "                                  device only; srpt and strata, 3 seeds, 50%% and 80%% load; takes --out\n"
      "                                  (default sweep/), --requests (default 1200), --budget, --device-pages and\n"
      "                                  the --file-* options\n"
      "  --file-grid                     the lower-tier acceptance grid: every workload (and --trace FILE) at\n"
      "                                  its default load, host tiers of 2048 pages and of a quarter of the\n"
      "                                  working set, file tiers of 1, 1.92, 12 and 48 GB/s with and without\n"
      "                                  the record rules, against no file tier; strata, 3 seeds; takes --out\n"
      "                                  (default sweep/), --requests, --trace and --progress\n"
      "  --remote-gbps X                 a remote tier (Redis Cluster) the instances share, X GB/s per\n"
      "                                  instance's link both ways, 0.5 ms a read (4M pages an index knows)\n"
      "  --scale-out                     the scale-out grid: 2, 4 and 8 instances behind the cache-aware\n"
      "                                  router, each with local tiers only or sharing a remote tier at 2.27\n"
      "                                  GB/s (bench_remote, loopback), 100 and 400 Gb/s; long documents (200\n"
      "                                  requests an instance at 1.5/s each, 3 seeds) and --trace FILE (its own\n"
      "                                  arrivals); host tiers of 131072 and 2048 pages; strata; takes --out\n"
      "                                  (default sweep/), --trace and --progress\n"
      "  --progress                      progress bar (on by itself from 20000 requests)\n"
      "exit status: 0 done, 1 failed (files, saturation search), 2 bad option or trace,\n"
      "             3 requests turned away (a prompt larger than the KV pool)\n",
      (long long)limits::max_requests, limits::min_rate, limits::max_rate, limits::max_seconds,
      (long long)limits::max_tokens, limits::max_instances, (long long)limits::max_tokens,
      (long long)limits::max_device_pages, (long long)limits::max_host_pages, (long long)limits::max_host_pages,
      limits::min_gbps, limits::max_gbps, h200::file_read_bytes_per_s / 1e9, h200::pcie5_nvme_bytes_per_s / 1e9,
      limits::min_gbps, limits::max_gbps, h200::file_write_bytes_per_s / 1e9);
  std::exit(code);
}

/// An option's value as an integer in [lo, hi]: the whole text, named with the option when it is not.
template <class Int>
Int integer_value(std::string const& option, std::string const& text, Int lo, Int hi)
{
  Int v{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool const too_large = ec == std::errc::result_out_of_range;
  bool const whole = (ec == std::errc{} || too_large) && end == text.data() + text.size();
  STRATA_EXPECTS(whole, option, ": '", text, "' is not ",
                 std::is_signed_v<Int> ? "an integer" : "a non-negative integer");
  STRATA_EXPECTS(!too_large && v >= lo && v <= hi, option, " must be in ", lo, "..", hi, ", got ", text);
  return v;
}

/// An option's value as a finite number in [lo, hi].
double number_value(std::string const& option, std::string const& text, double lo, double hi)
{
  double v = 0;
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool const whole = (ec == std::errc{} || ec == std::errc::result_out_of_range) && end == text.data() + text.size();
  STRATA_EXPECTS(whole, option, ": '", text, "' is not a number");
  STRATA_EXPECTS(ec == std::errc{} && std::isfinite(v) && v >= lo && v <= hi, option, " must be in ", lo, "..", hi,
                 ", got ", text);
  return v;
}

/// @throw strata::invalid_argument naming the option and the value it cannot take
options parse(int argc, char** argv)
{
  options o;
  auto value = [&](int& i) -> std::string {
    STRATA_EXPECTS(i + 1 < argc, argv[i], " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--workload") {
      o.workload = value(i);
    } else if (a == "--requests") {
      o.requests = integer_value<std::int64_t>(a, value(i), 1, limits::max_requests);
    } else if (a == "--rate") {
      o.rate = number_value(a, value(i), limits::min_rate, limits::max_rate);
    } else if (a == "--seed") {
      o.seed = integer_value<std::uint64_t>(a, value(i), 0, std::numeric_limits<std::uint64_t>::max());
    } else if (a == "--strategy") {
      o.strategy = value(i);
    } else if (a == "--system") {
      o.system = value(i);
    } else if (a == "--no-delay-hits") {
      o.delay_hits = false;
    } else if (a == "--no-balance") {
      o.balance = false;
    } else if (a == "--no-bubbles") {
      o.bubbles = false;
    } else if (a == "--deadline-slack") {
      o.deadline_slack = number_value(a, value(i), 0, 1e6);
    } else if (a == "--prefix-order") {
      o.prefix_order = true;
    } else if (a == "--instances") {
      o.instances = integer_value<int>(a, value(i), 1, limits::max_instances);
    } else if (a == "--trace") {
      o.trace = value(i);
    } else if (a == "--trace-pages") {
      o.trace_pages = true;
    } else if (a == "--time-scale") {
      o.time_scale = number_value(a, value(i), 1e-6, 1e6);
    } else if (a == "--out") {
      o.out = value(i);
      STRATA_EXPECTS(!o.out.empty(), "--out needs a folder, got ''");
    } else if (a == "--sweep") {
      o.sweep = true;
    } else if (a == "--progress") {
      o.progress = true;
    } else if (a == "--budget") {
      o.budget = integer_value<std::int64_t>(a, value(i), 1, limits::max_tokens);
    } else if (a == "--device-pages") {
      o.device_pages = integer_value<std::int64_t>(a, value(i), 1, limits::max_device_pages);
    } else if (a == "--host-pages") {
      o.host_pages = integer_value<std::int64_t>(a, value(i), 0, limits::max_host_pages);
    } else if (a == "--file-pages") {
      o.file_pages = integer_value<std::int64_t>(a, value(i), 0, limits::max_host_pages);
    } else if (a == "--file-gbps") {
      o.file_gbps = number_value(a, value(i), limits::min_gbps, limits::max_gbps);
    } else if (a == "--file-write-gbps") {
      o.file_write_gbps = number_value(a, value(i), limits::min_gbps, limits::max_gbps);
    } else if (a == "--file-bench") {
      o.file_bench = value(i);
      STRATA_EXPECTS(!o.file_bench.empty(), "--file-bench needs a file, got ''");
    } else if (a == "--file-drives") {
      o.file_drives = integer_value<int>(a, value(i), 1, 64);
    } else if (a == "--file-sweep") {
      o.file_sweep = true;
    } else if (a == "--file-grid") {
      o.file_grid = true;
    } else if (a == "--record-rules") {
      std::string const v = value(i);
      STRATA_EXPECTS(v == "on" || v == "off", "--record-rules must be on or off, got '", v, "'");
      o.record_rules = v == "on";
    } else if (a == "--device-pages-by") {
      std::string const v = value(i);
      STRATA_EXPECTS(v == "chunk" || v == "prompt", "--device-pages-by must be chunk or prompt, got '", v, "'");
      o.pages_by_chunk = v == "chunk";
    } else if (a == "--write-policy") {
      std::string const v = value(i);
      STRATA_EXPECTS(v == "write_through" || v == "write_back",
                     "--write-policy must be write_through or write_back, got '", v, "'");
      o.policy = v == "write_through" ? write_policy::write_through : write_policy::write_back;
    } else if (a == "--prefetch") {
      std::string const v = value(i);
      constexpr std::array<char const*, 4> names{"off", "best_effort", "wait_complete", "timeout"};
      auto const it = std::find_if(names.begin(), names.end(), [&](char const* n) { return v == n; });
      STRATA_EXPECTS(it != names.end(), "--prefetch must be off, best_effort, wait_complete or timeout, got '", v, "'");
      o.prefetch = prefetch_mode(it - names.begin());
    } else if (a == "--remote-gbps") {
      o.remote_gbps = number_value(a, value(i), limits::min_gbps, limits::max_gbps);
    } else if (a == "--scale-out") {
      o.scale_out = true;
    } else if (a == "--help" || a == "-h") {
      usage(0);
    } else {
      STRATA_EXPECTS(false, "unknown option '", a, "' (simulate --help lists them)");
    }
  }
  return o;
}

io_costs system_io(std::string const& name)
{
  if (name == "gpu_assisted") { return h200::gpu_assisted_io(); }
  if (name == "batched_dma") { return h200::batched_dma_io(); }
  if (name == "per_block_dma") { return h200::per_block_dma_io(); }
  throw invalid_argument("strata: unknown transfer system '" + name + "' (gpu_assisted, batched_dma, per_block_dma)");
}

/// The file tier's bandwidths: --file-bench, else --file-gbps / --file-write-gbps over the measured
/// defaults of `h200::lower_tiers`; one drive's, times --file-drives (records striped one by one:
/// a transfer of many pages keeps every drive busy).
/// @throw strata::invalid_argument for a benchmark output that cannot be read or has no read runs
void set_file_tier(options const& o, cost_model& costs)
{
  if (!o.file_bench.empty()) {
    try {
      (void)tools::calibrate_file_tier(costs, o.file_bench, costs.page_tokens());
    } catch (invalid_argument const& e) {
      throw invalid_argument(std::string{"--file-bench: "} + e.what());
    }
  }
  if (o.file_gbps || o.file_write_gbps) {
    costs.set_file_tier(o.file_gbps ? *o.file_gbps * 1e9 : costs.io().load_bytes_per_s[std::size_t(tier::file)],
                        o.file_write_gbps ? *o.file_write_gbps * 1e9 : costs.write_bytes_per_s(tier::file));
  }
  if (o.file_drives > 1) {
    costs.set_file_tier(costs.io().load_bytes_per_s[std::size_t(tier::file)] * o.file_drives,
                        costs.write_bytes_per_s(tier::file) * o.file_drives);
  }
}

/// A remote tier every instance shares (a Redis Cluster): `read` / `write` bytes/s per instance's
/// link, `latency` seconds a read; 4M pages (16 TiB of Llama-3.1-8B) an index may know of.
void share_remote(engine_config& c, double read, double write, double latency)
{
  c.remote_pages = std::int64_t{1} << 22;
  c.shared_remote = std::make_shared<sim::shared_remote_pages>();
  c.costs.set_remote_tier(read, write, latency);
}

/// The engine: Llama-3.1-8B on one H200 with 512 GiB of pinned host memory (128K pages of 32
/// tokens); a 48 GiB KV pool (12K pages), or 24 GiB (6K pages: three documents) for long documents,
/// so that documents outgrow the GPU and come back from the host. No file tier unless --file-pages.
engine_config engine_for(options const& o, io_costs const& io, std::string const& workload = {})
{
  engine_config c;
  c.costs = h200::costs(models::llama31_8b, io);
  set_file_tier(o, c.costs);
  c.device_pages = o.device_pages.value_or(workload == "long_documents" ? 6144 : 12288);
  c.host_pages = o.host_pages.value_or(131072);  // 0: no host tier
  c.file_pages = o.file_pages.value_or(0);
  c.backup_policy = o.policy.value_or(write_policy::write_through);
  c.prefetch = o.prefetch;
  c.token_budget = o.budget;
  c.record_rules = o.record_rules;
  c.pages_by_chunk = o.pages_by_chunk;
  if (o.remote_gbps) { share_remote(c, *o.remote_gbps * 1e9, *o.remote_gbps * 1e9, 0.5e-3); }
  return c;
}

/// Documents and popularity of the long-document workload. The default is the acceptance regime:
/// popularity flat enough that most requests find their document on the host, not the device.
struct document_mix {
  std::int64_t documents = 40;
  double zipf = 0.3;
};

/// The defaults of a generated workload.
/// @throw strata::invalid_argument for an unknown workload
workload_defaults const& defaults_for(std::string const& name)
{
  for (auto const& d : defaults_of) {
    if (name == d.name) { return d; }
  }
  throw invalid_argument("strata: unknown workload '" + name + "' (long_documents, short_chat, multi_turn)");
}

workload make_workload(std::string const& name, std::optional<std::int64_t> requests, std::optional<double> rate,
                       std::uint64_t seed, document_mix mix = {})
{
  auto const& d = defaults_for(name);
  std::int64_t const n = requests.value_or(d.requests);
  double const r = rate.value_or(d.rate);
  if (name == "long_documents") {
    return long_documents({.requests = n,
                           .rate = r,
                           .seed = seed,
                           .documents = mix.documents,
                           .questions_per_visit = 1.5,
                           .zipf = mix.zipf});
  }
  if (name == "short_chat") { return short_chat({.requests = n, .rate = r, .seed = seed}); }
  return multi_turn({.requests = n, .rate = r, .seed = seed});
}

/// Runs one strategy by name.
simulation_result run(std::string const& strategy, workload const& w, engine_config const& c, strata_options const& so,
                      int instances, bool progress)
{
  progress_bar bar{std::int64_t(w.requests.size()), progress};
  auto report = [&bar](std::int64_t done, std::int64_t) { bar.update(done); };
  if (strategy == "fifo") { return simulate(w, c, fifo{}, instances, report); }
  if (strategy == "longest_prefix") { return simulate(w, c, longest_prefix{}, instances, report); }
  if (strategy == "longest_prefix_sorted") { return simulate(w, c, longest_prefix_sorted{}, instances, report); }
  if (strategy == "sjf") { return simulate(w, c, sjf{}, instances, report); }
  if (strategy == "srpt") { return simulate(w, c, srpt{}, instances, report); }
  if (strategy == "strata") { return simulate(w, c, strata_scheduler{so}, instances, report); }
  throw invalid_argument("strata: unknown strategy '" + strategy + "' (" + strategy_list + ")");
}

std::string ablation_label(strata_options const& so)
{
  std::string l = "strata";
  if (!so.delay_hits) { l += " -delay-hits"; }
  if (!so.balance) { l += " -balance"; }
  if (!so.bubbles) { l += " -bubbles"; }
  if (so.balance && so.short_percent == 0) { l += " -short-first"; }
  if (so.balance && so.max_postponements > 0) { l += " +load-trimming"; }
  if (so.order == strata_order::longest_prefix) { l += " on longest_prefix order"; }
  if (so.order == strata_order::remaining_work && so.deadline_slack != strata_options{}.deadline_slack) {
    char buf[64];
    std::snprintf(buf, sizeof buf, so.deadline_slack == 0 ? " -deadlines" : " deadline-slack %g", so.deadline_slack);
    l += buf;
  }
  return l;
}

/// Creates `--out` (and its parents) and checks that a file can be written there, before anything runs.
/// @throw strata::invalid_argument naming the folder and the reason
void prepare_out(std::string const& dir)
{
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_EXPECTS(!ec, "--out ", dir, ": cannot create the folder (", ec.message(), ")");
  STRATA_EXPECTS(std::filesystem::is_directory(dir, ec), "--out ", dir, ": not a folder");
  auto const probe = std::filesystem::path{dir} / ".simulate_write_check";
  bool written = false;
  {
    std::ofstream f{probe};
    written = f.good() && (f << "ok").flush().good();
  }
  std::filesystem::remove(probe, ec);
  STRATA_EXPECTS(written, "--out ", dir, ": cannot write in the folder");
}

/// Checks a replayed trace against the tool's bounds (`limits`): finite arrivals and think times
/// below limits::max_seconds, token counts up to limits::max_tokens, and whole pages of ids that
/// match prompt_tokens (prompt_tokens / page_tokens of them).
/// @throw strata::invalid_argument naming the trace and the request (in arrival order)
void check_trace(workload const& w, std::string const& path)
{
  for (auto const& r : w.requests) {
    auto const pages = std::int64_t((r.shared ? r.shared->size() : 0) + r.own.size());
    auto const where = [&] {
      char buf[96];
      std::snprintf(buf, sizeof buf, "request %llu (arrival %.6g s)", (unsigned long long)r.id.value, r.arrival_s);
      return std::string(buf);
    };
    STRATA_EXPECTS(std::isfinite(r.arrival_s) && r.arrival_s >= 0 && r.arrival_s < limits::max_seconds &&
                       std::isfinite(r.think_s) && r.think_s >= 0 && r.think_s < limits::max_seconds,
                   "--trace ", path, ": ", where(), ": arrival and think time must be finite, in [0, ",
                   limits::max_seconds, ") s");
    STRATA_EXPECTS(r.prompt_tokens >= 1 && r.prompt_tokens <= limits::max_tokens && r.output_tokens >= 1 &&
                       r.output_tokens <= limits::max_tokens,
                   "--trace ", path, ": ", where(), ": prompt_tokens ", r.prompt_tokens, " and output_tokens ",
                   r.output_tokens, " must be in 1..", limits::max_tokens);
    STRATA_EXPECTS(pages == r.prompt_tokens / w.page_tokens, "--trace ", path, ": ", where(), ": prompt_tokens ",
                   r.prompt_tokens, " is ", r.prompt_tokens / w.page_tokens, " whole pages of ", w.page_tokens,
                   " tokens, but its ids make ", pages);
  }
}

/// Draws chart CSVs as PNGs beside them with plot_charts.py when python3 has matplotlib; says how
/// otherwise. Charts are an extra: their failure is reported, not fatal.
void render_charts(std::vector<std::string> const& csvs)
{
#ifndef STRATA_PLOT_CHARTS_SCRIPT
#define STRATA_PLOT_CHARTS_SCRIPT "tools/simulate/plot_charts.py"
#endif
  std::string const script = STRATA_PLOT_CHARTS_SCRIPT;
  std::string const cmd = plot_command(script, csvs);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(script, ec)) {
    std::fprintf(stderr, "simulate: charts not drawn: no %s; draw them with tools/simulate/plot_charts.py\n",
                 script.c_str());
    return;
  }
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    std::fprintf(stderr,
                 "simulate: charts not drawn: python3 with matplotlib not found (python3 -m pip install matplotlib); "
                 "then run:\n  %s\n",
                 cmd.c_str());
    return;
  }
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0) { std::fprintf(stderr, "simulate: drawing the charts failed: %s\n", cmd.c_str()); }
}

// --- the acceptance sweeps --------------------------------------------------------------------------

struct sweep_row {
  std::string workload, label;
  double load = 0;
  std::uint64_t seed = 0;
  summary s;
};

/// Mean over seeds of one figure (a member pointer or a callable on the summary) for a workload, run and load.
template <class Field>
double mean_of(std::vector<sweep_row> const& rows, std::string const& w, std::string const& label, double load,
               Field field)
{
  double sum = 0;
  int n = 0;
  for (auto const& r : rows) {
    if (r.workload == w && r.label == label && std::abs(r.load - load) < 1e-9) {
      sum += double(std::invoke(field, r.s));
      ++n;
    }
  }
  return n > 0 ? sum / n : 0;
}

/**
 * Saturating rate: the highest offered rate that longest_prefix keeps up with in steady state
 * (`sim::keeps_up`): requests finishing in the second half of the arrival window (from the first
 * open-loop arrival to the last, i.e. the last session start for multi-turn) at >= 95% of the
 * offered rate, by doubling from `start` and bisection. For open-loop arrivals this is "the backlog
 * does not grow"; for closed-loop sessions, whose later turns slow down with the server, it is the
 * throughput that stops following the offered rate.
 */
double find_saturating_rate(std::function<workload(double)> const& make, engine_config const& fast, double start,
                            std::string const& name)
{
  auto holds = [&](double rate) {
    workload const trial = make(rate);
    return sim::keeps_up(trial, run("longest_prefix", trial, fast, {}, 1, false), rate);
  };
  double lo = start, hi = start;
  if (holds(start)) {
    do {
      lo = hi, hi *= 2;
      if (hi > 1e6) { throw std::runtime_error("simulate: " + name + " never saturates"); }
    } while (holds(hi));
  } else {
    do {
      hi = lo, lo /= 2;
      if (lo < 1e-6) { throw std::runtime_error("simulate: " + name + " saturates at any rate"); }
    } while (!holds(lo));
  }
  for (int k = 0; k < 10; ++k) {
    double const mid = std::sqrt(lo * hi);
    (holds(mid) ? lo : hi) = mid;
  }
  return lo;
}

/// Requests that found most of their prompt on the host (more than on the device), as a share of those served.
double host_tier_share(simulation_result const& r)
{
  std::int64_t host = 0, served = 0;
  for (auto const& x : r.records) {
    if (!x.served()) { continue; }
    ++served;
    host += x.cached_tokens[std::size_t(tier::host)] > x.cached_tokens[std::size_t(tier::device)];
  }
  return served > 0 ? double(host) / double(served) : 0;
}

/// The summary of one run of the sweep (a workload, run, load and seed it ran).
summary const& row_of(std::vector<sweep_row> const& rows, std::string const& w, std::string const& label, double load,
                      std::uint64_t seed)
{
  for (auto const& r : rows) {
    if (r.workload == w && r.label == label && std::abs(r.load - load) < 1e-9 && r.seed == seed) { return r.s; }
  }
  throw std::logic_error("simulate: no sweep row for " + w + " / " + label);
}

/// strata with one idea switched off at a time, with binding deadlines, and on the order it had
/// before issue 11.
std::vector<strata_options> ablations()
{
  std::vector<strata_options> out;
  for (int k = 0; k < 6; ++k) {
    strata_options so;
    if (k == 0) { so.delay_hits = false; }
    if (k == 1) { so.balance = false; }
    if (k == 2) { so.bubbles = false; }
    if (k == 3) { so.deadline_slack = 0; }
    if (k == 4) { so.deadline_slack = 2; }  // deadlines that bind: what aging costs and buys
    if (k == 5) { so.order = strata_order::longest_prefix; }
    out.push_back(so);
  }
  return out;
}

int run_sweep(options const& o)
{
  std::string const dir = o.out.empty() ? "sweep" : o.out;
  prepare_out(dir);
  std::map<std::string, std::int64_t> const sizes{
      {"long_documents", 1200}, {"short_chat", 6000}, {"multi_turn", 20000}};
  std::vector<std::string> workloads{"long_documents", "short_chat", "multi_turn"};
  // A replayed trace (--trace): one more workload, its arrivals scaled to each load; one "seed".
  workload trace;
  std::string const trace_name = "trace";
  if (!o.trace.empty()) {
    trace = replay(o.trace, engine_for(o, h200::gpu_assisted_io()).costs.page_tokens(), o.trace_pages);
    check_trace(trace, o.trace);
    STRATA_EXPECTS(arrival_rate(trace) > 0, "--trace ", o.trace, ": its arrivals span no time, no load can be set");
    workloads.push_back(trace_name);
  }
  auto make = [&](std::string const& wname, double rate, std::uint64_t seed) {
    if (wname != trace_name) { return make_workload(wname, sizes.at(wname), rate, seed); }
    workload w = trace;
    scale_time(w, arrival_rate(trace) / rate);
    return w;
  };
  auto seeds_of = [&](std::string const& wname) {
    return wname == trace_name ? std::vector<std::uint64_t>{1} : std::vector<std::uint64_t>{1, 2, 3};
  };

  std::vector<double> const loads{0.5, 0.8, 0.95};
  std::vector<std::uint64_t> const seeds{1, 2, 3};  // of the generated workloads
  std::vector<sweep_row> rows;
  std::vector<chart> cdfs, curves;
  auto const t0 = std::chrono::steady_clock::now();
  std::ostringstream notes;
  std::map<std::string, std::map<std::uint64_t, double>> saturating_of;  // workload -> seed -> rate
  for (auto const& wname : workloads) {
    engine_config const fast = engine_for(o, h200::gpu_assisted_io(), wname);
    // Each seed draws its own documents and sessions, so each has its own saturating rate.
    auto saturating_rate = [&](std::uint64_t seed) {
      return find_saturating_rate([&](double rate) { return make(wname, rate, seed); }, fast,
                                  wname == "long_documents" ? 0.5
                                  : wname == "short_chat"   ? 10.0
                                  : wname == trace_name     ? arrival_rate(trace)
                                                            : 3.0,
                                  wname);
    };
    std::map<std::uint64_t, double>& saturating = saturating_of[wname];
    notes << "- " << wname << ": saturating rate";
    for (auto seed : seeds_of(wname)) {
      saturating[seed] = saturating_rate(seed);
      char rate_text[64];
      std::snprintf(rate_text, sizeof rate_text, "%s %.3f (seed %llu)", seed == seeds.front() ? "" : ",",
                    saturating[seed], (unsigned long long)seed);
      notes << rate_text;
      std::fprintf(stderr, "%s seed %llu: saturating rate %.3f requests/s\n", wname.c_str(), (unsigned long long)seed,
                   saturating[seed]);
    }
    notes << " requests/s\n";
    for (double load : loads) {
      for (auto seed : seeds_of(wname)) {
        workload const w = make(wname, load * saturating.at(seed), seed);
        auto add = [&](std::string label, simulation_result const& r) {
          rows.push_back({wname, label, load, seed, summarize(r, label)});
          // Ablations ("strata -x", "strata +x") and the decode-mixing variants: tables only.
          bool const plotted =
              label.rfind("strata ", 0) != 0 && label.find("decodes in prefill batches") == std::string::npos;
          if (load == 0.8 && seed == 1 && plotted) {
            if (cdfs.empty() || cdfs.back().title.find(wname) == std::string::npos) {
              cdfs.push_back(chart{
                  wname + ", 80% load: TTFT CDF", "TTFT (s)", "fraction of requests", {}, true, chart::kind::cdf});
            }
            std::string const short_label = label.rfind("vLLM", 0) == 0     ? "vLLM-like system"
                                            : label.rfind("SGLang", 0) == 0 ? "SGLang-like system"
                                                                            : label;
            cdfs.back().lines.push_back(ttft_cdf(r, short_label));
          }
        };
        for (auto const* name : strategy_names) {
          add(name, run(name, w, fast, {}, 1, false));
        }
        for (auto const& so : ablations()) {
          add(ablation_label(so), run("strata", w, fast, so, 1, false));
        }
        add("vLLM-like: per-block DMA + fifo",
            run("fifo", w, engine_for(o, h200::per_block_dma_io(), wname), {}, 1, false));
        add("SGLang-like: batched DMA + longest_prefix",
            run("longest_prefix", w, engine_for(o, h200::batched_dma_io(), wname), {}, 1, false));
        // vLLM's chunked prefill runs the decodes of running requests in every step beside the
        // prefill chunks; approximated by a decode step after each prefill batch. The same loop
        // on GPU-assisted I/O separates the I/O change from the scheduler change.
        auto mixed = [&](io_costs const& io) {
          engine_config c = engine_for(o, io, wname);
          c.decode_after_prefill = true;
          return c;
        };
        add("vLLM-like, decodes in prefill batches: per-block DMA + fifo",
            run("fifo", w, mixed(h200::per_block_dma_io()), {}, 1, false));
        add("GPU-assisted I/O + fifo, decodes in prefill batches",
            run("fifo", w, mixed(h200::gpu_assisted_io()), {}, 1, false));
        std::fprintf(stderr, "  %s load %.2f seed %llu done\n", wname.c_str(), load, (unsigned long long)seed);
      }
    }
    chart curve{wname + ": mean TTFT vs load",
                "load (fraction of the saturating rate)",
                "mean TTFT (s)",
                {},
                false,
                chart::kind::line};
    std::vector<std::string> shown(std::begin(strategy_names), std::end(strategy_names));
    shown.push_back("vLLM-like: per-block DMA + fifo");
    shown.push_back("SGLang-like: batched DMA + longest_prefix");
    for (std::size_t k = 0; k < shown.size(); ++k) {
      std::string const name = shown[k].rfind("vLLM", 0) == 0     ? "vLLM-like system"
                               : shown[k].rfind("SGLang", 0) == 0 ? "SGLang-like system"
                                                                  : shown[k];
      series s{name, {}, {}};
      for (double load : loads) {
        s.x.push_back(load);
        s.y.push_back(mean_of(rows, wname, shown[k], load, &summary::ttft_mean));
      }
      curve.lines.push_back(s);
    }
    curves.push_back(curve);
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_chart_csv(dir + "/ttft_cdf_80.csv", cdfs);
  write_chart_csv(dir + "/ttft_vs_load.csv", curves);

  std::ofstream md{dir + "/sweep.md"};
  engine_config const docs_config = engine_for(o, h200::gpu_assisted_io(), "long_documents"),
                      other_config = engine_for(o, h200::gpu_assisted_io());
  auto gib = [&](std::int64_t pages) { return double(pages * docs_config.costs.page_bytes()) / double(1 << 30); };
  char header[1024];
  std::snprintf(header, sizeof header,
                "# Simulation sweeps\n\nGenerated by `simulate --sweep` in %.0f s. Llama-3.1-8B on one H200 (cost "
                "model `h200::`), a %lld-page (%.0f GiB) KV pool (%lld pages, %.0f GiB, for long documents), a "
                "%lld-page (%.0f GiB) host tier, %lld-token prefill budget, write-through backups. Strategies "
                "compared on the same I/O (GPU-assisted, %.1f GB/s, layer-wise overlap); systems with their own I/O. "
                "Means over seeds 1-3 (a replayed trace: one run per load, its arrivals scaled to the load).\n\n",
                seconds, (long long)other_config.device_pages, gib(other_config.device_pages),
                (long long)docs_config.device_pages, gib(docs_config.device_pages), (long long)other_config.host_pages,
                gib(other_config.host_pages), (long long)other_config.token_budget,
                other_config.costs.io().load_bytes_per_s[1] / 1e9);
  md << header;
  md << notes.str() << "\n";
  for (auto const& wname : workloads) {
    md << "## " << wname
       << "\n\n| load | run | TTFT mean s | p50 | p90 | p99 | tokens/s | redundant prefill tokens | "
          "delay-hit deferrals | I/O stall s | bubble filled s | host hit rate "
          "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (double load : loads) {
      std::vector<std::string> labels;
      for (auto const& r : rows) {
        if (r.workload == wname && r.load == load && std::find(labels.begin(), labels.end(), r.label) == labels.end()) {
          labels.push_back(r.label);
        }
      }
      for (auto const& l : labels) {
        char buf[512];
        std::snprintf(
            buf, sizeof buf, "| %.0f%% | %s | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f | %.0f | %.1f | %.1f | %.2f |\n",
            load * 100, l.c_str(), mean_of(rows, wname, l, load, &summary::ttft_mean),
            mean_of(rows, wname, l, load, &summary::ttft_p50), mean_of(rows, wname, l, load, &summary::ttft_p90),
            mean_of(rows, wname, l, load, &summary::ttft_p99),
            mean_of(rows, wname, l, load, &summary::throughput_tokens_s),
            mean_of(rows, wname, l, load, &summary::redundant_tokens),
            mean_of(rows, wname, l, load, &summary::delay_hit_deferrals),
            mean_of(rows, wname, l, load, &summary::io_stall_s),
            mean_of(rows, wname, l, load, &summary::bubble_filled_s),
            mean_of(rows, wname, l, load, [](summary const& x) { return x.hit_rate[1]; }));
        md << buf;
      }
    }
    md << "\n";
  }
  // The acceptance checks of issue 11, per workload and load on the means over seeds (the trace: one run).
  md << "## Acceptance checks\n\nPer workload and load, means over seeds: strata's mean TTFT against the best "
        "baseline's (the lowest mean of fifo, longest_prefix, longest_prefix_sorted, sjf, srpt), its p99 against "
        "longest_prefix's, and on short chat and multi-turn its p50 and p90 within 2% of longest_prefix's. "
        "Redundant prefill from delay hits is checked per seed.\n\n"
        "| workload | load | strata mean s | best baseline mean s | strata / best | strata p99 s | longest_prefix "
        "p99 s | strata / longest_prefix p99 | p50, p90 vs longest_prefix |\n|---|---|---|---|---|---|---|---|---|\n";
  int failures = 0;
  std::int64_t short_overlaps = 0;
  std::ostringstream failed;
  for (auto const& wname : workloads) {
    for (double load : loads) {
      for (auto seed : seeds_of(wname)) {
        summary const& st = row_of(rows, wname, "strata", load, seed);
        if (st.redundant_tokens - st.short_overlap_tokens != 0) {
          failed << "- " << wname << " " << load * 100 << "% seed " << seed
                 << ": strata redundant prefill from delay hits " << st.redundant_tokens - st.short_overlap_tokens
                 << " tokens\n";
          ++failures;
        }
        short_overlaps += st.short_overlap_tokens;
      }
      auto at = [&](char const* label, auto field) { return mean_of(rows, wname, label, load, field); };
      std::string best = "fifo";
      for (auto const* name : strategy_names) {
        if (std::string{name} != "strata" && at(name, &summary::ttft_mean) < at(best.c_str(), &summary::ttft_mean)) {
          best = name;
        }
      }
      double const st_mean = at("strata", &summary::ttft_mean), best_mean = at(best.c_str(), &summary::ttft_mean);
      double const st_p99 = at("strata", &summary::ttft_p99), lp_p99 = at("longest_prefix", &summary::ttft_p99);
      double const p50 = at("strata", &summary::ttft_p50) / at("longest_prefix", &summary::ttft_p50);
      double const p90 = at("strata", &summary::ttft_p90) / at("longest_prefix", &summary::ttft_p90);
      bool const chat_like = wname == "short_chat" || wname == "multi_turn";
      char buf[512];
      std::snprintf(
          buf, sizeof buf, "| %s | %.0f%% | %.4g | %.4g (%s) | %.3fx%s | %.4g | %.4g | %.3fx%s | %.3fx, %.3fx%s |\n",
          wname.c_str(), load * 100, st_mean, best_mean, best.c_str(), st_mean / best_mean,
          st_mean > best_mean ? " **miss**" : "", st_p99, lp_p99, st_p99 / lp_p99, st_p99 > lp_p99 ? " **miss**" : "",
          p50, p90, chat_like && (p50 > 1.02 || p90 > 1.02) ? " **miss**" : "");
      md << buf;
      for (auto [what, bad] :
           {std::pair{"mean TTFT above the best baseline's", st_mean > best_mean},
            std::pair{"p99 above longest_prefix's", st_p99 > lp_p99},
            std::pair{"p50 or p90 over 2% above longest_prefix's", chat_like && (p50 > 1.02 || p90 > 1.02)}}) {
        if (bad) {
          failed << "- " << wname << " " << load * 100 << "%: strata " << what << "\n";
          ++failures;
        }
      }
    }
  }
  md << "\nMisses:\n\n" << (failures == 0 ? std::string{"- none\n"} : failed.str()) << "\n";
  double const lp80 = mean_of(rows, "long_documents", "longest_prefix", 0.8, &summary::ttft_mean);
  double const st80 = mean_of(rows, "long_documents", "strata", 0.8, &summary::ttft_mean);
  double const vl80 = mean_of(rows, "long_documents", "vLLM-like: per-block DMA + fifo", 0.8, &summary::ttft_mean);
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "- long_documents, 80%% load, mean TTFT: longest_prefix %.3f s / strata %.3f s = %.2fx (target 1.3x)\n"
      "- long_documents, 80%% load, mean TTFT: vLLM-like system %.3f s / strata system %.3f s = %.2fx (target 5x)\n"
      "- strata's redundant prefill in overlaps below the 64-token delay-hit threshold, all runs: %lld tokens\n"
      "- misses above: %d\n",
      lp80, st80, lp80 / st80, vl80, st80, vl80 / st80, (long long)short_overlaps, failures);
  md << buf;
  std::printf("%s", buf);
  // The pooled means above weigh an overloaded seed heavily; the same ratios per seed.
  std::string per_seed =
      "- long_documents, 80% load, mean TTFT per seed (longest_prefix / strata; vLLM-like / strata):";
  for (auto seed : seeds) {
    auto at = [&](std::string const& l) { return row_of(rows, "long_documents", l, 0.8, seed).ttft_mean; };
    double const st = at("strata");
    std::snprintf(buf, sizeof buf, "%s seed %llu: %.2fx; %.2fx", seed == seeds.front() ? "" : ",",
                  (unsigned long long)seed, at("longest_prefix") / st, at("vLLM-like: per-block DMA + fifo") / st);
    per_seed += buf;
  }
  per_seed += "\n";
  md << per_seed;
  std::printf("%s", per_seed.c_str());
  // The 1.3x target is stated for the regime where loads are a large share of the work; the same
  // comparison with other document mixes, each at 80% of its own saturating rate, shows how it moves.
  md << "\n## Long documents: regime sensitivity (80% load)\n\n"
        "Each document mix at 80% of its own saturating rate per seed; the first row is the sweep's. "
        "Host-tier requests: the share of requests that found more of their prompt on the host than on "
        "the device, under longest_prefix.\n\n"
        "| documents | Zipf | host-tier requests | longest_prefix / strata mean TTFT, seeds 1 / 2 / 3 | pooled | "
        "srpt / strata, seeds 1 / 2 / 3 | pooled |\n"
        "|---|---|---|---|---|---|---|\n";
  for (document_mix const mix :
       {document_mix{}, document_mix{40, 0.5}, document_mix{40, 0.8}, document_mix{100, 0.5}}) {
    double lp_sum = 0, st_sum = 0, sr_sum = 0, share = 0;
    std::string cells, sr_cells;
    for (auto seed : seeds) {
      auto make = [&](double rate) {
        return make_workload("long_documents", sizes.at("long_documents"), rate, seed, mix);
      };
      bool const sweeps_mix = mix.documents == document_mix{}.documents && mix.zipf == document_mix{}.zipf;
      workload const w = make(0.8 * (sweeps_mix ? saturating_of.at("long_documents").at(seed)
                                                : find_saturating_rate(make, docs_config, 0.5, "long_documents")));
      auto const lp = run("longest_prefix", w, docs_config, {}, 1, false);
      double const a = summarize(lp, "").ttft_mean,
                   b = summarize(run("strata", w, docs_config, {}, 1, false), "").ttft_mean,
                   c = summarize(run("srpt", w, docs_config, {}, 1, false), "").ttft_mean;
      lp_sum += a, st_sum += b, sr_sum += c, share += host_tier_share(lp) / double(seeds.size());
      std::snprintf(buf, sizeof buf, "%s%.2fx", cells.empty() ? "" : " / ", a / b);
      cells += buf;
      std::snprintf(buf, sizeof buf, "%s%.2fx", sr_cells.empty() ? "" : " / ", c / b);
      sr_cells += buf;
    }
    std::snprintf(buf, sizeof buf, "| %lld | %.1f | %.0f%% | %s | %.2fx | %s | %.2fx |\n", (long long)mix.documents,
                  mix.zipf, 100 * share, cells.c_str(), lp_sum / st_sum, sr_cells.c_str(), sr_sum / st_sum);
    md << buf;
    std::printf("document mix %lld/%.1f: %s", (long long)mix.documents, mix.zipf, buf);
  }
  std::ofstream csv{dir + "/sweep.csv"};
  csv << "workload,run,load,seed,ttft_mean,ttft_p50,ttft_p90,ttft_p99,tokens_per_s,redundant_tokens,delay_hit_"
         "deferrals,"
         "io_stall_s,bubble_filled_s,hit_device,hit_host\n";
  for (auto const& r : rows) {
    csv << r.workload << ",\"" << r.label << "\"," << r.load << ',' << r.seed << ',' << r.s.ttft_mean << ','
        << r.s.ttft_p50 << ',' << r.s.ttft_p90 << ',' << r.s.ttft_p99 << ',' << r.s.throughput_tokens_s << ','
        << r.s.redundant_tokens << ',' << r.s.delay_hit_deferrals << ',' << r.s.io_stall_s << ',' << r.s.bubble_filled_s
        << ',' << r.s.hit_rate[0] << ',' << r.s.hit_rate[1] << '\n';
  }
  std::printf("sweep: %zu runs in %.0f s; %s/sweep.md, sweep.csv, chart data ttft_cdf_80.csv, ttft_vs_load.csv\n",
              rows.size(), seconds, dir.c_str());
  render_charts({dir + "/ttft_cdf_80.csv", dir + "/ttft_vs_load.csv"});
  std::int64_t rejected = 0;
  for (auto const& r : rows) {
    rejected += r.s.rejected;
  }
  if (rejected > 0) {
    std::fprintf(stderr,
                 "simulate: %lld requests turned away over the sweep's runs: prompts larger than the KV pool "
                 "(raise --device-pages)\n",
                 (long long)rejected);
    return 3;
  }
  return 0;
}

/// Distinct pages of every prompt in `w`: its working set, what the tiers would need to keep it all.
std::int64_t working_set_pages(workload const& w)
{
  std::unordered_set<std::int32_t> ids;
  for (auto const& r : w.requests) {
    for (auto const id : r.pages()) {
      ids.insert(id);
    }
  }
  return std::int64_t(ids.size());
}

/**
 * The file-tier scenario (issue 12): long documents (the sweep's mix: 40 documents of 20K-100K
 * tokens) whose working set exceeds the host tier (a quarter of it unless --host-pages), with a
 * file tier holding the rest; against the same host tier alone, and against no lower tier at all
 * (every page that leaves the GPU is recomputed). Loads: 50% and 80% of the saturating rate of
 * longest_prefix with the host tier alone, per seed; strategies srpt (the strongest baseline) and strata.
 * Every run is checked: all requests served, every prompt token cached or computed once.
 */
int run_file_sweep(options const& o)
{
  std::string const dir = o.out.empty() ? "sweep" : o.out;
  prepare_out(dir);
  std::int64_t const requests = o.requests.value_or(1200);
  std::vector<double> const loads{0.5, 0.8};
  std::vector<std::uint64_t> const seeds{1, 2, 3};
  std::vector<std::string> const strategies{"srpt", "strata"};
  engine_config const base = engine_for(o, h200::gpu_assisted_io(), "long_documents");
  char const* const policy = base.backup_policy == write_policy::write_back ? "write-back" : "write-through";
  double const file_gbps = base.costs.io().load_bytes_per_s[std::size_t(tier::file)] / 1e9;
  double const write_gbps = base.costs.write_bytes_per_s(tier::file) / 1e9;
  char buf[1024];
  std::snprintf(buf, sizeof buf, "host + file (%.3g GB/s)", file_gbps);
  std::string const with_file = buf;
  std::snprintf(buf, sizeof buf, "host + file (%.3g GB/s, assumed PCIe 5 NVMe)", h200::pcie5_nvme_bytes_per_s / 1e9);
  std::string const with_fast_file = buf;
  std::string const host_only = "host only", device_only = "device only (recompute what leaves the GPU)";
  bool const fast_differs = std::abs(file_gbps * 1e9 - h200::pcie5_nvme_bytes_per_s) > 1e6;
  std::vector<std::string> configs{with_file};
  if (fast_differs) { configs.push_back(with_fast_file); }
  configs.push_back(host_only);
  configs.push_back(device_only);

  std::vector<sweep_row> rows;
  std::ostringstream notes, problems;
  auto const t0 = std::chrono::steady_clock::now();
  for (auto seed : seeds) {
    auto make = [&](double rate) { return make_workload("long_documents", requests, rate, seed); };
    std::int64_t const working_set = working_set_pages(make(1.0));
    engine_config file_config = base;
    file_config.host_pages = o.host_pages.value_or(working_set / 4);
    file_config.file_pages = o.file_pages.value_or(131072);
    auto config_of = [&](std::string const& name) {
      engine_config c = file_config;
      if (name == with_fast_file) { c.costs.set_file_tier(h200::pcie5_nvme_bytes_per_s, h200::pcie5_nvme_bytes_per_s); }
      if (name == host_only || name == device_only) { c.file_pages = 0; }
      if (name == device_only) { c.host_pages = 0; }
      return c;
    };
    // The load is set without the tier under study, so that it is the same whatever the file tier does.
    double const saturating = find_saturating_rate(make, config_of(host_only), 0.5, "long_documents, host only");
    std::snprintf(buf, sizeof buf,
                  "- seed %llu: working set %lld pages (%.0f GiB), host tier %lld pages, file tier %lld pages; "
                  "saturating rate %.3f requests/s\n",
                  (unsigned long long)seed, (long long)working_set,
                  double(working_set) * double(base.costs.page_bytes()) / double(1 << 30),
                  (long long)file_config.host_pages, (long long)file_config.file_pages, saturating);
    notes << buf;
    std::fprintf(stderr, "%s", buf);
    if (file_config.host_pages + file_config.file_pages < working_set) {
      problems << "- seed " << seed << ": host and file tiers together hold less than the working set\n";
    }
    for (double load : loads) {
      workload const w = make(load * saturating);
      for (auto const& cname : configs) {
        engine_config const c = config_of(cname);
        for (auto const& sname : strategies) {
          auto const r = run(sname, w, c, {}, 1, o.progress);
          // The simulator's invariants: every request served, every prompt token cached or computed once.
          for (auto const& x : r.records) {
            std::int64_t cached = 0;
            for (auto t : x.cached_tokens) {
              cached += t;
            }
            if (!x.served() || x.first_token_s < x.arrival_s || cached + x.computed_tokens != x.prompt_tokens) {
              problems << "- " << cname << ", " << sname << ", seed " << seed << ", load " << load << ": request "
                       << x.id.value << " served wrong\n";
            }
          }
          sweep_row row{cname, sname, load, seed, summarize(r, sname)};
          row.s.io_stall_s = 0;
          for (auto const& k : r.counters) {
            row.s.io_stall_s += k.record_read_s;  // this table's column: seconds reading file records
          }
          rows.push_back(std::move(row));
          std::fprintf(stderr, "%s, %s, seed %llu, %.0f%%: mean %.3f s, file hits %.3f\n", cname.c_str(), sname.c_str(),
                       (unsigned long long)seed, load * 100, rows.back().s.ttft_mean,
                       rows.back().s.hit_rate[std::size_t(tier::file)]);
        }
      }
    }
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream md{dir + "/file_tier.md"};
  md << "# File-tier scenario (simulate --file-sweep)\n\nLong documents (" << requests
     << " requests per seed, 40 documents of 20K-100K tokens, Zipf 0.3, 1.5 questions per visit), Llama-3.1-8B "
        "on one H200, GPU-assisted I/O, "
     << policy << " device -> host, a " << base.device_pages << "-page device pool. File tier: reads " << file_gbps
     << " GB/s, writes " << write_gbps << " GB/s, " << base.costs.io().load_latency_s[std::size_t(tier::file)] * 1e6
     << " us per load, its pages then over PCIe at the host tier's rate; its reads precede the batch's compute. "
        "Load: a share of the saturating rate of longest_prefix with the host tier alone (per seed). Means over seeds "
        "1-3 "
        "(of each seed's mean and percentiles). Hits: the share of prompt tokens found in each tier (the fastest "
        "holding them); the rest was computed. File read s: batch time spent reading file records, summed.\n\n"
     << notes.str()
     << "\n| load | tiers | strategy | TTFT mean s | p50 | p99 | hits device / host / file | "
        "computed | file read s |\n|---|---|---|---|---|---|---|---|---|\n";
  for (double load : loads) {
    for (auto const& cname : configs) {
      for (auto const& sname : strategies) {
        auto at = [&](auto field) { return mean_of(rows, cname, sname, load, field); };
        auto hit = [&](tier t) { return at([t](summary const& x) { return x.hit_rate[std::size_t(t)]; }); };
        double const computed = 1 - hit(tier::device) - hit(tier::host) - hit(tier::file);
        std::snprintf(buf, sizeof buf, "| %.0f%% | %s | %s | %.3f | %.3f | %.2f | %.3f / %.3f / %.3f | %.3f | %.0f |\n",
                      load * 100, cname.c_str(), sname.c_str(), at(&summary::ttft_mean), at(&summary::ttft_p50),
                      at(&summary::ttft_p99), hit(tier::device), hit(tier::host), hit(tier::file), computed,
                      at(&summary::io_stall_s));
        md << buf;
        std::printf("%s", buf);
      }
    }
  }
  md << "\nChecks: "
     << (problems.str().empty() ? std::string{"every request of every run served, every prompt token "
                                              "cached or computed once.\n"}
                                : "\n" + problems.str());
  std::ofstream csv{dir + "/file_tier.csv"};
  csv << "tiers,strategy,load,seed,ttft_mean,ttft_p50,ttft_p90,ttft_p99,hit_device,hit_host,hit_file,file_read_s\n";
  for (auto const& r : rows) {
    csv << '"' << r.workload << "\"," << r.label << ',' << r.load << ',' << r.seed << ',' << r.s.ttft_mean << ','
        << r.s.ttft_p50 << ',' << r.s.ttft_p90 << ',' << r.s.ttft_p99 << ',' << r.s.hit_rate[0] << ','
        << r.s.hit_rate[1] << ',' << r.s.hit_rate[2] << ',' << r.s.io_stall_s << '\n';
  }
  std::printf("file sweep: %zu runs in %.0f s; %s/file_tier.md, file_tier.csv\n", rows.size(), seconds, dir.c_str());
  if (!problems.str().empty()) {
    std::fprintf(stderr, "simulate: %s", problems.str().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

/**
 * The lower-tier acceptance grid (issue 20): does a file tier ever make serving worse? Every
 * workload at its default load (the demo's as a user runs it; the trace at its own arrivals),
 * host tiers of 2,048 pages and of a quarter of the working set, file tiers of 1, 1.92 (the H200
 * machine's disk, measured), 12 (one PCIe 5 drive) and 48 GB/s (four in RAID-0) of reads
 * (writes: 1.5x the reads at the two slow rates, as measured at 1.92; equal at the fast ones),
 * with the record rules (today) and without them (every page written, every write queued: the
 * tier before issue 20), each against the same run with no file tier. strata, seeds 1-3.
 */
int run_file_grid(options const& o)
{
  std::string const dir = o.out.empty() ? "sweep" : o.out;
  prepare_out(dir);
  std::vector<std::string> workloads{"long_documents", "multi_turn", "short_chat"};
  std::string const trace_name = "Mooncake trace";
  workload trace;
  if (!o.trace.empty()) {
    trace = replay(o.trace, engine_for(o, h200::gpu_assisted_io()).costs.page_tokens(), o.trace_pages);
    check_trace(trace, o.trace);
    workloads.push_back(trace_name);
  }
  struct rate {
    double read_gbps, write_gbps;
  };
  std::vector<rate> const rates{{1, 1.5}, {1.92, 2.88}, {12, 12}, {48, 48}};
  struct cell {
    std::string workload, host;
    int rate = -1;  // index into rates; -1: no file tier
    bool rules = true;
    std::uint64_t seed = 0;
    summary s;
  };
  std::vector<cell> cells;
  std::ostringstream notes, problems;
  char buf[1024];
  auto const t0 = std::chrono::steady_clock::now();
  for (auto const& wname : workloads) {
    bool const is_trace = wname == trace_name;
    std::vector<std::uint64_t> const seeds =
        is_trace ? std::vector<std::uint64_t>{1} : std::vector<std::uint64_t>{1, 2, 3};
    for (auto seed : seeds) {
      workload const w = is_trace ? trace : make_workload(wname, o.requests, std::nullopt, seed);
      std::int64_t const working_set = working_set_pages(w);
      // The file tier holds the whole working set (the design's premise: NVMe arrays hold terabytes).
      std::int64_t const file_pages = o.file_pages.value_or(working_set);
      std::vector<std::int64_t> hosts{2048};
      if (working_set / 4 != 2048) { hosts.push_back(working_set / 4); }
      options base_o = o;
      base_o.file_pages = 0;
      engine_config const base = engine_for(base_o, h200::gpu_assisted_io(), is_trace ? "" : wname);
      std::snprintf(buf, sizeof buf,
                    "- %s, seed %llu: %zu requests, working set %lld pages (%.0f GiB), file tier %lld pages\n",
                    wname.c_str(), (unsigned long long)seed, w.requests.size(), (long long)working_set,
                    double(working_set) * double(base.costs.page_bytes()) / double(1 << 30), (long long)file_pages);
      notes << buf;
      std::fprintf(stderr, "%s", buf);
      for (std::size_t h = 0; h < hosts.size(); ++h) {
        std::string const host = h == 0 ? "2048" : "1/4 working set";
        auto add = [&](int ri, bool rules) {
          engine_config c = base;
          c.host_pages = hosts[h];
          if (ri >= 0) {
            c.file_pages = file_pages;
            c.costs.set_file_tier(rates[ri].read_gbps * 1e9, rates[ri].write_gbps * 1e9);
          }
          c.record_rules = rules;
          auto const r = run("strata", w, c, {}, 1, o.progress);
          for (auto const& x : r.records) {
            std::int64_t cached = 0;
            for (auto t : x.cached_tokens) {
              cached += t;
            }
            bool const rejected =  // turned away at arrival: larger than the device pool
                !x.served() &&
                first_chunk_pages(x.prompt_tokens, x.output_tokens, 0, 0, c.costs.page_tokens()) > c.device_pages;
            // A prompt cached whole still computes its last token (for its logits).
            bool const once =
                cached + x.computed_tokens == x.prompt_tokens || (cached == x.prompt_tokens && x.computed_tokens == 1);
            if (!rejected && (!x.served() || x.first_token_s < x.arrival_s || !once)) {
              problems << "- " << wname << ", seed " << seed << ", host " << hosts[h] << ", rate " << ri << ": request "
                       << x.id.value << " served wrong\n";
            }
          }
          cells.push_back({wname, host, ri, rules, seed, summarize(r, "strata")});
        };
        add(-1, true);
        for (int ri = 0; ri < int(rates.size()); ++ri) {
          add(ri, true);
          add(ri, false);
        }
      }
    }
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Means over seeds of one configuration's figure.
  auto mean = [&](std::string const& w, std::string const& host, int ri, bool rules, auto field) {
    double sum = 0;
    int n = 0;
    for (auto const& c : cells) {
      if (c.workload == w && c.host == host && c.rate == ri && c.rules == rules) {
        sum += field(c.s);
        ++n;
      }
    }
    return n ? sum / n : std::nan("");
  };
  auto ttft_mean = [](summary const& x) { return x.ttft_mean; };
  auto ttft_p99 = [](summary const& x) { return x.ttft_p99; };
  auto file_hits = [](summary const& x) { return x.hit_rate[std::size_t(tier::file)]; };
  std::ofstream md{dir + "/file_grid.md"};
  md << "# Lower-tier acceptance grid (simulate --file-grid)\n\n"
        "Does a file tier ever make serving worse? strata on Llama-3.1-8B, one H200, GPU-assisted I/O, each workload "
        "at "
        "its default load (the trace at its own arrivals; requests larger than the device pool turned away), "
        "write-through device -> host, a file tier of the working set's size unless --file-pages (below). Reads at 1 "
        "and 1.92 GB/s (the H200 machine's disk, measured) write at 1.5x the read rate "
        "(as measured), at 12 (one PCIe 5 NVMe drive) and 48 GB/s (four in RAID-0, the design's array) at the read "
        "rate; both assumed beyond 1.92. *rules*: today's file tier (a page goes there only if a later read pays, "
        "`cost_model::record_breakeven_tokens`; copied as it reaches the host, write-through, so that reclaiming the "
        "host never waits for a write; writes past one second of the tier's bandwidth dropped). *before*: every page, "
        "written back on host eviction, every write queued (`--record-rules off`). Ratios: mean (or p99) TTFT over "
        "seeds 1-3 "
        "with the file tier / the same without it; below 1 is better.\n\n"
     << notes.str()
     << "\n| workload | host pages | file GB/s | TTFT mean s, no file | with file (rules) | mean ratio | p99 ratio | "
        "file hits | mean ratio, before | p99 ratio, before | file hits, before |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::ofstream csv{dir + "/file_grid.csv"};
  csv << "workload,host,file_gbps,rules,seed,ttft_mean,ttft_p50,ttft_p90,ttft_p99,hit_device,hit_host,hit_file\n";
  for (auto const& c : cells) {
    csv << '"' << c.workload << "\",\"" << c.host << "\"," << (c.rate < 0 ? 0.0 : rates[c.rate].read_gbps) << ','
        << (c.rules ? "on" : "off") << ',' << c.seed << ',' << c.s.ttft_mean << ',' << c.s.ttft_p50 << ','
        << c.s.ttft_p90 << ',' << c.s.ttft_p99 << ',' << c.s.hit_rate[0] << ',' << c.s.hit_rate[1] << ','
        << c.s.hit_rate[2] << '\n';
  }
  double worst_mean = 0, worst_p99 = 0, best_mean = 1e300;
  std::string best_at;
  std::ostringstream over;
  for (auto const& wname : workloads) {
    for (std::string const host : {"2048", "1/4 working set"}) {
      double const none = mean(wname, host, -1, true, ttft_mean), none99 = mean(wname, host, -1, true, ttft_p99);
      if (std::isnan(none)) { continue; }
      for (int ri = 0; ri < int(rates.size()); ++ri) {
        double const m = mean(wname, host, ri, true, ttft_mean) / none;
        double const p = mean(wname, host, ri, true, ttft_p99) / none99;
        double const mb = mean(wname, host, ri, false, ttft_mean) / none;
        double const pb = mean(wname, host, ri, false, ttft_p99) / none99;
        std::snprintf(buf, sizeof buf, "| %s | %s | %.3g | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                      wname.c_str(), host.c_str(), rates[ri].read_gbps, none, mean(wname, host, ri, true, ttft_mean), m,
                      p, mean(wname, host, ri, true, file_hits), mb, pb, mean(wname, host, ri, false, file_hits));
        md << buf;
        std::printf("%s", buf);
        worst_mean = std::max(worst_mean, m);
        worst_p99 = std::max(worst_p99, p);
        if (m < best_mean) {
          best_mean = m;
          std::snprintf(buf, sizeof buf, "%s, host %s, %.3g GB/s", wname.c_str(), host.c_str(), rates[ri].read_gbps);
          best_at = buf;
        }
        if (m > 1.02 || p > 1.02) {
          std::snprintf(buf, sizeof buf, "- %s, host %s, %.3g GB/s: mean ratio %.3f, p99 ratio %.3f\n", wname.c_str(),
                        host.c_str(), rates[ri].read_gbps, m, p);
          over << buf;
        }
      }
    }
  }
  std::snprintf(buf, sizeof buf,
                "\nWith the rules: worst mean ratio %.3f, worst p99 ratio %.3f (target: at most 1.02); best mean "
                "ratio %.3f (%s).\n",
                worst_mean, worst_p99, best_mean, best_at.c_str());
  md << buf;
  std::printf("%s", buf);
  std::string const verdict =
      over.str().empty() ? std::string{"Every cell with the rules within 1.02 of no file tier, mean and p99.\n"}
                         : "Cells with the rules over 1.02:\n" + over.str();
  md << verdict;
  std::printf("%s", verdict.c_str());
  md << "\nChecks: "
     << (problems.str().empty() ? std::string{"every request of every run served (but those larger than the device "
                                              "pool, turned away), every prompt token cached or computed once.\n"}
                                : "\n" + problems.str());
  std::printf("file grid: %zu runs in %.0f s; %s/file_grid.md, file_grid.csv\n", cells.size(), seconds, dir.c_str());
  if (!problems.str().empty()) {
    std::fprintf(stderr, "simulate: %s", problems.str().c_str());
    return 1;
  }
  return 0;
}

/// The scale-out grid: instances behind the cache-aware router, local tiers only or sharing a remote
/// tier at three rates; long documents at a per-instance load equal to the default, the trace at its
/// own arrivals.
int run_scale_out(options const& o)
{
  std::string const dir = o.out.empty() ? "sweep" : o.out;
  prepare_out(dir);
  std::string const trace_name = "Mooncake trace";
  std::vector<std::string> workloads{"long_documents"};
  workload trace;
  if (!o.trace.empty()) {
    trace = replay(o.trace, engine_for(o, h200::gpu_assisted_io()).costs.page_tokens(), o.trace_pages);
    check_trace(trace, o.trace);
    workloads.push_back(trace_name);
  }
  struct remote {
    char const* name;
    double read_gbps, write_gbps, latency_s;  // read_gbps 0: no remote tier
  };
  // Loopback: bench_remote's medians (docs/remote_tier.md), one key's round trip about 0.1 ms.
  std::vector<remote> const remotes{{"none", 0, 0, 0},
                                    {"loopback 2.27 GB/s", 2.27, 1.56, 0.1e-3},
                                    {"100 Gb/s", 12.5, 12.5, 0.5e-3},
                                    {"400 Gb/s", 50, 50, 0.5e-3}};
  std::vector<int> const counts{2, 4, 8};
  std::vector<std::int64_t> const hosts{131072, 2048};
  struct cell {
    std::string workload;
    int instances = 0;
    std::int64_t host = 0;
    int remote = 0;
    std::uint64_t seed = 0;
    summary s;
  };
  std::vector<cell> cells;
  std::ostringstream problems;
  auto const t0 = std::chrono::steady_clock::now();
  for (auto const& wname : workloads) {
    bool const is_trace = wname == trace_name;
    for (int n : counts) {
      std::vector<std::uint64_t> const seeds =
          is_trace ? std::vector<std::uint64_t>{1} : std::vector<std::uint64_t>{1, 2, 3};
      for (auto seed : seeds) {
        auto const& d = defaults_for("long_documents");
        workload const w = is_trace ? trace : make_workload(wname, 200 * n, d.rate * n, seed);
        for (auto host : hosts) {
          for (int ri = 0; ri < int(remotes.size()); ++ri) {
            options base_o = o;
            base_o.host_pages = host;
            engine_config c = engine_for(base_o, h200::gpu_assisted_io(), is_trace ? "" : wname);
            if (remotes[ri].read_gbps > 0) {
              share_remote(c, remotes[ri].read_gbps * 1e9, remotes[ri].write_gbps * 1e9, remotes[ri].latency_s);
            }
            auto const r = run("strata", w, c, {}, n, o.progress);
            for (auto const& x : r.records) {
              std::int64_t cached = 0;
              for (auto t : x.cached_tokens) {
                cached += t;
              }
              bool const rejected = !x.served() && first_chunk_pages(x.prompt_tokens, x.output_tokens, 0, 0,
                                                                     c.costs.page_tokens()) > c.device_pages;
              bool const once = cached + x.computed_tokens == x.prompt_tokens ||
                                (cached == x.prompt_tokens && x.computed_tokens == 1);
              if (!rejected && (!x.served() || x.first_token_s < x.arrival_s || !once)) {
                problems << "- " << wname << ", " << n << " instances, seed " << seed << ", host " << host << ", "
                         << remotes[ri].name << ": request " << x.id.value << " served wrong\n";
              }
            }
            cells.push_back({wname, n, host, ri, seed, summarize(r, "strata")});
            std::fprintf(stderr, "scale-out: %s, %d instances, seed %llu, host %lld, %s done\n", wname.c_str(), n,
                         (unsigned long long)seed, (long long)host, remotes[ri].name);
          }
        }
      }
    }
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto mean = [&](std::string const& w, int n, std::int64_t host, int ri, auto field) {
    double sum = 0;
    int k = 0;
    for (auto const& c : cells) {
      if (c.workload == w && c.instances == n && c.host == host && c.remote == ri) {
        sum += field(c.s);
        ++k;
      }
    }
    return k ? sum / k : std::nan("");
  };
  std::ofstream md{dir + "/scale_out.md"};
  md << "# Scale-out with a shared remote tier (simulate --scale-out)\n\n"
        "N engine instances (strata on Llama-3.1-8B, one H200 each, GPU-assisted I/O, 6144 device pages for long "
        "documents, 12288 for the trace) behind the cache-aware router (the instance with the longest prefix it holds "
        "itself or is computing — a page only in the shared tier is as near to all —; the least loaded on ties), "
        "each with its own device and host tiers, alone or sharing a remote tier (a Redis Cluster): pages any "
        "instance computes go there as they reach its host if a later read pays for them (write-through, the record "
        "rules), and a request's instance asks it at submit which leading pages exist, adopts them if reading beats "
        "recomputing, then prefetches them. "
        "Remote rates per instance's link: loopback as measured by bench_remote (2.27 GB/s reads, 1.56 writes, 0.1 "
        "ms), 100 Gb/s and 400 Gb/s (0.5 ms a read). Long documents: 200 requests an instance at 1.5 requests/s "
        "each (the default per-instance load; 40 documents in all), means over seeds 1-3; the Mooncake trace at its "
        "own arrivals (3,993 requests). Ratios: the figure with the remote tier / without it, same instances and "
        "host; below 1 is better.\n\n"
        "| workload | instances | host pages | remote | TTFT mean s | p99 s | mean ratio | p99 ratio | hits "
        "device/host/remote |\n|---|---|---|---|---|---|---|---|---|\n";
  char buf[1024];
  auto ttft_mean = [](summary const& x) { return x.ttft_mean; };
  auto ttft_p99 = [](summary const& x) { return x.ttft_p99; };
  for (auto const& wname : workloads) {
    for (int n : counts) {
      for (auto host : hosts) {
        double const none = mean(wname, n, host, 0, ttft_mean), none99 = mean(wname, n, host, 0, ttft_p99);
        for (int ri = 0; ri < int(remotes.size()); ++ri) {
          double const m = mean(wname, n, host, ri, ttft_mean), p = mean(wname, n, host, ri, ttft_p99);
          std::snprintf(buf, sizeof buf, "| %s | %d | %lld | %s | %.3f | %.3f | %.3f | %.3f | %.2f/%.2f/%.2f |\n",
                        wname.c_str(), n, (long long)host, remotes[ri].name, m, p, m / none, p / none99,
                        mean(wname, n, host, ri, [](summary const& x) { return x.hit_rate[0]; }),
                        mean(wname, n, host, ri, [](summary const& x) { return x.hit_rate[1]; }),
                        mean(wname, n, host, ri, [](summary const& x) { return x.hit_rate[3]; }));
          md << buf;
          std::printf("%s", buf);
        }
      }
    }
  }
  md << "\nChecks: "
     << (problems.str().empty() ? std::string{"every request of every run served (but those larger than the device "
                                              "pool, turned away), every prompt token cached or computed once.\n"}
                                : "\n" + problems.str());
  std::ofstream csv{dir + "/scale_out.csv"};
  csv << "workload,instances,host,remote,seed,ttft_mean,ttft_p50,ttft_p90,ttft_p99,hit_device,hit_host,hit_remote\n";
  for (auto const& c : cells) {
    csv << '"' << c.workload << "\"," << c.instances << ',' << c.host << ",\"" << remotes[c.remote].name << "\","
        << c.seed << ',' << c.s.ttft_mean << ',' << c.s.ttft_p50 << ',' << c.s.ttft_p90 << ',' << c.s.ttft_p99 << ','
        << c.s.hit_rate[0] << ',' << c.s.hit_rate[1] << ',' << c.s.hit_rate[3] << '\n';
  }
  md << "\nGenerated by `simulate --scale-out` in " << std::lround(seconds) << " s.\n";
  std::printf("scale-out: %zu runs in %.0f s; %s/scale_out.md, scale_out.csv\n", cells.size(), seconds, dir.c_str());
  if (!problems.str().empty()) {
    std::fprintf(stderr, "simulate: %s", problems.str().c_str());
    return 1;
  }
  return 0;
}

int main(int argc, char** argv)
{
  try {
    options const o = parse(argc, argv);
    options const defaults;
    if (o.sweep) {
      // The sweep fixes its workloads, strategies and systems; it takes only pool sizes and budget.
      STRATA_EXPECTS(
          o.instances == 1 && o.strategy == defaults.strategy && o.system == defaults.system &&
              o.workload == defaults.workload && o.seed == defaults.seed && !o.time_scale && !o.progress &&
              o.delay_hits && o.balance && o.bubbles && !o.rate && !o.requests && !o.file_sweep && !o.file_pages &&
              !o.file_gbps && !o.file_write_gbps && o.file_bench.empty() && o.file_drives == 1 && !o.policy &&
              !o.file_grid && !o.scale_out && !o.remote_gbps,
          "--sweep takes only --out, --trace (with --trace-pages), --budget, --device-pages, --host-pages and "
          "--device-pages-by");
      return run_sweep(o);
    }
    STRATA_EXPECTS(o.file_bench.empty() || (!o.file_gbps && !o.file_write_gbps),
                   "--file-bench and --file-gbps / --file-write-gbps all set the file tier's bandwidth: give one");
    if (o.scale_out) {
      // The grid fixes its workloads, loads, instances, tiers, rates and seeds.
      STRATA_EXPECTS(o.instances == 1 && o.strategy == defaults.strategy && o.system == defaults.system &&
                         o.workload == defaults.workload && o.seed == defaults.seed && !o.time_scale && !o.rate &&
                         !o.requests && !o.file_grid && !o.file_sweep && !o.host_pages && !o.device_pages &&
                         !o.file_pages && !o.remote_gbps,
                     "--scale-out takes only --out, --trace (with --trace-pages) and --progress");
      return run_scale_out(o);
    }
    if (o.file_grid) {
      // The grid fixes its workloads, loads, tiers, rates and seeds.
      STRATA_EXPECTS(o.instances == 1 && o.strategy == defaults.strategy && o.system == defaults.system &&
                         o.workload == defaults.workload && o.seed == defaults.seed && !o.time_scale && !o.rate &&
                         o.delay_hits && o.balance && o.bubbles && !o.deadline_slack && !o.prefix_order &&
                         !o.file_sweep && !o.host_pages && !o.device_pages && !o.file_gbps && !o.file_write_gbps &&
                         o.file_bench.empty() && o.file_drives == 1 && !o.policy && o.record_rules,
                     "--file-grid takes only --out, --requests, --trace (with --trace-pages), --file-pages and "
                     "--progress");
      return run_file_grid(o);
    }
    if (o.file_sweep) {
      // The scenario fixes its workload, strategies, loads and seeds.
      STRATA_EXPECTS(
          o.instances == 1 && o.strategy == defaults.strategy && o.system == defaults.system &&
              o.workload == defaults.workload && o.seed == defaults.seed && !o.time_scale && !o.rate && o.delay_hits &&
              o.balance && o.bubbles && !o.deadline_slack && !o.prefix_order && o.trace.empty(),
          "--file-sweep takes only --out, --requests, --budget, --device-pages, --host-pages, "
          "--file-pages, --file-gbps, --file-write-gbps, --file-bench, --file-drives, --write-policy, --prefetch and "
          "--progress");
      options f = o;
      if (!f.policy) { f.policy = write_policy::write_back; }  // the file tier holds what the host lets go
      return run_file_sweep(f);
    }
    STRATA_EXPECTS(o.trace.empty() || (o.workload == defaults.workload && !o.requests && o.seed == defaults.seed),
                   "--trace replays its own requests: --workload, --requests and --seed do not apply");
    STRATA_EXPECTS(!o.trace_pages || !o.trace.empty(), "--trace-pages needs --trace");
    STRATA_EXPECTS(!o.time_scale || !o.trace.empty(), "--time-scale needs --trace");
    STRATA_EXPECTS(!o.time_scale || !o.rate, "--time-scale and --rate both set the trace's load: give one");
    STRATA_EXPECTS(
        o.strategy == "all" || std::find_if(std::begin(strategy_names), std::end(strategy_names),
                                            [&](auto n) { return o.strategy == n; }) != std::end(strategy_names),
        "unknown strategy '", o.strategy, "' (", strategy_list, ")");
    if (o.trace.empty()) { (void)defaults_for(o.workload); }
    engine_config const c = engine_for(o, system_io(o.system), o.trace.empty() ? o.workload : "");
    c.validate();
    if (!o.out.empty()) { prepare_out(o.out); }
    workload w;
    if (o.trace.empty()) {
      w = make_workload(o.workload, o.requests, o.rate, o.seed);
    } else {
      w = replay(o.trace, c.costs.page_tokens(), o.trace_pages);
      if (o.time_scale) { scale_time(w, *o.time_scale); }
      if (o.rate) {
        double const now = arrival_rate(w);
        STRATA_EXPECTS(now > 0, "--rate: the trace's arrivals span no time, so no rate can be set");
        scale_time(w, now / *o.rate);
      }
      check_trace(w, o.trace);
    }
    strata_options so;
    so.delay_hits = o.delay_hits;
    so.balance = o.balance;
    so.bubbles = o.bubbles;
    if (o.deadline_slack) { so.deadline_slack = *o.deadline_slack; }
    if (o.prefix_order) { so.order = strata_order::longest_prefix; }
    std::vector<std::string> const strategies =
        o.strategy == "all" ? std::vector<std::string>(std::begin(strategy_names), std::end(strategy_names))
                            : std::vector<std::string>{o.strategy};
    std::string file_tier;
    if (c.file_pages > 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ", file tier %lld pages (reads %.3g GB/s, writes %.3g GB/s)",
                    (long long)c.file_pages, c.costs.io().load_bytes_per_s[std::size_t(tier::file)] / 1e9,
                    c.costs.write_bytes_per_s(tier::file) / 1e9);
      file_tier = buf;
    }
    std::printf("%s: %zu requests over %.0f s, Llama-3.1-8B on %d H200%s, %s I/O%s\n\n", w.name.c_str(),
                w.requests.size(), w.requests.empty() ? 0.0 : w.requests.back().arrival_s, o.instances,
                o.instances > 1 ? "s" : "", o.system.c_str(), file_tier.c_str());
    std::vector<summary> rows;
    std::vector<series> cdf;
    for (auto const& s : strategies) {
      auto const t0 = std::chrono::steady_clock::now();
      auto const r = run(s, w, c, so, o.instances, o.progress || w.requests.size() >= 20000);
      double const wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rows.push_back(summarize(r, s == "strata" ? ablation_label(so) : s));
      std::fprintf(stderr, "%s: simulated in %.2f s of wall time\n", s.c_str(), wall);
      if (!o.out.empty()) {
        write_requests_csv(o.out + "/requests_" + s + ".csv", r);
        cdf.push_back(ttft_cdf(r, s));
      }
    }
    print_table(std::cout, rows);
    if (!o.out.empty()) {
      std::ofstream md{o.out + "/summary.md"};
      print_table(md, rows);
      write_chart_csv(o.out + "/ttft_cdf.csv",
                      {chart{w.name + ": TTFT CDF", "TTFT (s)", "fraction of requests", cdf, true, chart::kind::cdf}});
      std::printf("\nwrote %s/summary.md, requests_*.csv, chart data ttft_cdf.csv\n", o.out.c_str());
      render_charts({o.out + "/ttft_cdf.csv"});
    }
    int status = 0;
    for (auto const& row : rows) {
      if (row.rejected > 0) {
        std::fprintf(stderr,
                     "simulate: %s turned away %lld of %zu requests: prompts larger than the KV pool (%lld pages of "
                     "%lld tokens; raise --device-pages)\n",
                     row.label.c_str(), (long long)row.rejected, w.requests.size(), (long long)c.device_pages,
                     (long long)c.costs.page_tokens());
        status = 3;
      }
    }
    return status;
  } catch (strata::invalid_argument const& e) {
    std::fprintf(stderr, "simulate: %s\n", e.what());
    return 2;
  } catch (std::exception const& e) {  // files, saturation searches that do not converge
    std::fprintf(stderr, "simulate: %s\n", e.what());
    return 1;
  }
}
