// strata's simulator: one engine (or several behind a router) in virtual time, with the real
// prefix index and the real scheduler strategies; the cost model of one H200 is the clock.
//
//   simulate                       a small long-document workload under fifo, longest_prefix and
//                                  strata: the comparison, in seconds
//   simulate --workload short_chat --rate 40 --requests 20000 --strategy all --out results/
//   simulate --trace requests.jsonl --strategy strata
//   simulate --sweep --out docs/simulation      the acceptance sweeps (minutes)
//   simulate --help
#include <strata/sched/baselines.hpp>
#include <strata/sched/strata_scheduler.hpp>
#include <strata/sim/plot.hpp>
#include <strata/sim/report.hpp>
#include <strata/sim/workload.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace strata;
using namespace strata::sim;

namespace {

struct options {
  std::string workload = "long_documents";
  std::int64_t requests = 0;  // 0: the workload's default
  double rate = 0;            // 0: the workload's default
  std::uint64_t seed = 1;
  std::string strategy = "all";
  std::string system = "gpu_assisted";
  bool delay_hits = true, balance = true, bubbles = true;
  int instances = 1;
  std::string trace;
  bool trace_pages = false;
  std::string out;
  bool sweep = false;
  bool progress = false;
  std::int64_t budget = 8192;
  std::int64_t device_pages = -1, host_pages = -1;  // -1: the defaults of engine_for
};

[[noreturn]] void usage(int code)
{
  std::printf(
      "usage: simulate [options]\n"
      "  --workload long_documents|short_chat|multi_turn   (default long_documents)\n"
      "  --trace FILE [--trace-pages]    replay CSV / JSON lines instead (see sim/workload.hpp)\n"
      "  --requests N --rate R --seed S  size, arrival rate (requests/s), seed\n"
      "  --strategy fifo|longest_prefix|strata|all         (default all)\n"
      "  --no-delay-hits --no-balance --no-bubbles          switch strata's ideas off one by one\n"
      "  --system gpu_assisted|batched_dma|per_block_dma   transfer system (default gpu_assisted)\n"
      "  --instances N                   engines behind a cache-aware router\n"
      "  --budget TOKENS --device-pages N --host-pages N\n"
      "  --out DIR                       per-request CSV, summary.md, ttft_cdf.png\n"
      "  --sweep                         acceptance sweeps (50/80/95%% load, 3 seeds, every workload)\n"
      "  --progress                      progress bar\n");
  std::exit(code);
}

options parse(int argc, char** argv)
{
  options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "simulate: %s needs a value\n", argv[i]);
      usage(2);
    }
    return argv[++i];
  };
  try {
    for (int i = 1; i < argc; ++i) {
      std::string const a = argv[i];
      if (a == "--workload") {
        o.workload = value(i);
      } else if (a == "--requests") {
        o.requests = std::stoll(value(i));
      } else if (a == "--rate") {
        o.rate = std::stod(value(i));
      } else if (a == "--seed") {
        o.seed = std::stoull(value(i));
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
      } else if (a == "--instances") {
        o.instances = std::stoi(value(i));
      } else if (a == "--trace") {
        o.trace = value(i);
      } else if (a == "--trace-pages") {
        o.trace_pages = true;
      } else if (a == "--out") {
        o.out = value(i);
      } else if (a == "--sweep") {
        o.sweep = true;
      } else if (a == "--progress") {
        o.progress = true;
      } else if (a == "--budget") {
        o.budget = std::stoll(value(i));
      } else if (a == "--device-pages") {
        o.device_pages = std::stoll(value(i));
      } else if (a == "--host-pages") {
        o.host_pages = std::stoll(value(i));
      } else if (a == "--help" || a == "-h") {
        usage(0);
      } else {
        std::fprintf(stderr, "simulate: unknown option %s\n", a.c_str());
        usage(2);
      }
    }
  } catch (std::logic_error const&) {
    std::fprintf(stderr, "simulate: a numeric option has a value that is not a number\n");
    usage(2);
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

/// The engine: Llama-3.1-8B on one H200 with 512 GiB of pinned host memory (128K pages of 32
/// tokens); a 48 GiB KV pool (12K pages), or 24 GiB (6K pages: three documents) for long documents,
/// so that documents outgrow the GPU and come back from the host.
engine_config engine_for(options const& o, io_costs const& io, std::string const& workload = {})
{
  engine_config c;
  c.costs = h200::costs(models::llama31_8b, io);
  c.device_pages = o.device_pages >= 0 ? o.device_pages : (workload == "long_documents" ? 6144 : 12288);
  c.host_pages = o.host_pages >= 0 ? o.host_pages : 131072;  // 0: no host tier
  c.token_budget = o.budget;
  return c;
}

/// Documents and popularity of the long-document workload. The default is the acceptance regime:
/// popularity flat enough that most requests find their document on the host, not the device.
struct document_mix {
  std::int64_t documents = 40;
  double zipf = 0.3;
};

workload make_workload(std::string const& name, std::int64_t requests, double rate, std::uint64_t seed,
                       document_mix mix = {})
{
  if (name == "long_documents") {
    return long_documents({.requests = requests > 0 ? requests : 400,
                           .rate = rate > 0 ? rate : 1.5,
                           .seed = seed,
                           .documents = mix.documents,
                           .questions_per_visit = 1.5,
                           .zipf = mix.zipf});
  }
  if (name == "short_chat") {
    return short_chat({.requests = requests > 0 ? requests : 4000, .rate = rate > 0 ? rate : 40, .seed = seed});
  }
  if (name == "multi_turn") {
    return multi_turn({.requests = requests > 0 ? requests : 2000, .rate = rate > 0 ? rate : 10, .seed = seed});
  }
  throw invalid_argument("strata: unknown workload '" + name + "' (long_documents, short_chat, multi_turn)");
}

/// Runs one strategy by name.
simulation_result run(std::string const& strategy, workload const& w, engine_config const& c, strata_options const& so,
                      int instances, bool progress)
{
  if (strategy == "fifo") { return simulate(w, c, fifo{}, instances, progress); }
  if (strategy == "longest_prefix") { return simulate(w, c, longest_prefix{}, instances, progress); }
  if (strategy == "strata") { return simulate(w, c, strata_scheduler{so}, instances, progress); }
  throw invalid_argument("strata: unknown strategy '" + strategy + "' (fifo, longest_prefix, strata, all)");
}

std::string ablation_label(strata_options const& so)
{
  std::string l = "strata";
  if (!so.delay_hits) { l += " -delay-hits"; }
  if (!so.balance) { l += " -balance"; }
  if (!so.bubbles) { l += " -bubbles"; }
  if (so.balance && so.short_percent == 0) { l += " -short-first"; }
  if (so.balance && so.max_postponements > 0) { l += " +load-trimming"; }
  return l;
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
 * Saturating rate: the highest offered rate that longest_prefix keeps up with in steady state:
 * requests finishing in the second half of the arrival window (up to the last open-loop arrival,
 * i.e. the last session start for multi-turn) at >= 95% of the offered rate, by doubling from
 * `start` and bisection. For open-loop arrivals this is "the backlog does not grow"; for closed-loop
 * sessions, whose later turns slow down with the server, it is the throughput that stops following
 * the offered rate.
 */
double find_saturating_rate(std::function<workload(double)> const& make, engine_config const& fast, double start,
                            std::string const& name)
{
  auto keeps_up = [&](double rate) {
    workload const trial = make(rate);
    auto const r = run("longest_prefix", trial, fast, {}, 1, false);
    double last_start = 0;
    for (auto const& q : trial.requests) {
      if (q.after == request_id{}) { last_start = std::max(last_start, q.arrival_s); }
    }
    std::int64_t finished = 0;  // served requests only: one turned away is not throughput
    for (auto const& x : r.records) {
      finished += x.served() && x.finish_s >= last_start / 2 && x.finish_s <= last_start;
    }
    return double(finished) >= 0.95 * rate * (last_start / 2);
  };
  double lo = start, hi = start;
  if (keeps_up(start)) {
    do {
      lo = hi, hi *= 2;
      if (hi > 1e6) { throw std::runtime_error("simulate: " + name + " never saturates"); }
    } while (keeps_up(hi));
  } else {
    do {
      hi = lo, lo /= 2;
      if (lo < 1e-6) { throw std::runtime_error("simulate: " + name + " saturates at any rate"); }
    } while (!keeps_up(lo));
  }
  for (int k = 0; k < 10; ++k) {
    double const mid = std::sqrt(lo * hi);
    (keeps_up(mid) ? lo : hi) = mid;
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

int run_sweep(options const& o)
{
  std::string const dir = o.out.empty() ? "sweep" : o.out;
  std::filesystem::create_directories(dir);
  std::vector<std::string> const workloads{"long_documents", "short_chat", "multi_turn"};
  std::map<std::string, std::int64_t> const sizes{
      {"long_documents", 1200}, {"short_chat", 6000}, {"multi_turn", 20000}};
  std::vector<double> const loads{0.5, 0.8, 0.95};
  std::vector<std::uint64_t> const seeds{1, 2, 3};
  std::vector<sweep_row> rows;
  std::vector<chart> cdfs, curves;
  auto const t0 = std::chrono::steady_clock::now();
  std::ostringstream notes;
  std::map<std::string, std::map<std::uint64_t, double>> saturating_of;  // workload -> seed -> rate
  for (auto const& wname : workloads) {
    engine_config const fast = engine_for(o, h200::gpu_assisted_io(), wname);
    // Each seed draws its own documents and sessions, so each has its own saturating rate.
    auto saturating_rate = [&](std::uint64_t seed) {
      return find_saturating_rate([&](double rate) { return make_workload(wname, sizes.at(wname), rate, seed); }, fast,
                                  wname == "long_documents" ? 0.5
                                  : wname == "short_chat"   ? 10.0
                                                            : 3.0,
                                  wname);
    };
    std::map<std::uint64_t, double>& saturating = saturating_of[wname];
    notes << "- " << wname << ": saturating rate";
    for (auto seed : seeds) {
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
      for (auto seed : seeds) {
        workload const w = make_workload(wname, sizes.at(wname), load * saturating.at(seed), seed);
        auto add = [&](std::string label, simulation_result const& r) {
          rows.push_back({wname, label, load, seed, summarize(r, label)});
          bool const plotted = label.rfind("strata ", 0) != 0;  // ablations ("strata -x", "strata +x"): tables only
          if (load == 0.8 && seed == 1 && plotted) {
            if (cdfs.empty() || cdfs.back().title.find(wname) == std::string::npos) {
              cdfs.push_back(chart{wname + ", 80% load: TTFT CDF", "TTFT (S, LOG)", "FRACTION", {}, true});
            }
            std::string const short_label = label.rfind("vLLM", 0) == 0     ? "vLLM-like system"
                                            : label.rfind("SGLang", 0) == 0 ? "SGLang-like system"
                                                                            : label;
            cdfs.back().lines.push_back(ttft_cdf(r, short_label, palette[cdfs.back().lines.size() % 7]));
          }
        };
        add("fifo", run("fifo", w, fast, {}, 1, false));
        add("longest_prefix", run("longest_prefix", w, fast, {}, 1, false));
        add("strata", run("strata", w, fast, {}, 1, false));
        for (int off = 0; off < 4; ++off) {
          strata_options so;
          if (off == 3) {
            so.max_postponements = 2;  // balance also postpones load-heavy requests (off by default)
          } else {
            (off == 0 ? so.delay_hits : off == 1 ? so.balance : so.bubbles) = false;
          }
          add(ablation_label(so), run("strata", w, fast, so, 1, false));
        }
        add("vLLM-like: per-block DMA + fifo",
            run("fifo", w, engine_for(o, h200::per_block_dma_io(), wname), {}, 1, false));
        add("SGLang-like: batched DMA + longest_prefix",
            run("longest_prefix", w, engine_for(o, h200::batched_dma_io(), wname), {}, 1, false));
        std::fprintf(stderr, "  %s load %.2f seed %llu done\n", wname.c_str(), load, (unsigned long long)seed);
      }
    }
    chart curve{wname + ": mean TTFT vs load", "LOAD (FRACTION OF SATURATION)", "TTFT (S)", {}, false};
    std::vector<std::string> const shown{"fifo", "longest_prefix", "strata", "vLLM-like: per-block DMA + fifo",
                                         "SGLang-like: batched DMA + longest_prefix"};
    for (std::size_t k = 0; k < shown.size(); ++k) {
      std::string const name = k == 3 ? "vLLM-like system" : k == 4 ? "SGLang-like system" : shown[k];
      series s{name, {}, {}, palette[k]};
      for (double load : loads) {
        s.x.push_back(load);
        s.y.push_back(mean_of(rows, wname, shown[k], load, &summary::ttft_mean));
      }
      curve.lines.push_back(s);
    }
    curves.push_back(curve);
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_charts_png(dir + "/ttft_cdf_80.png", cdfs, 3);
  write_charts_png(dir + "/ttft_vs_load.png", curves, 3);

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
                "Means over seeds 1-3.\n\n",
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
  // The acceptance checks, per workload, load and seed.
  md << "## Acceptance checks\n\nPer workload, load and seed: strata's redundant prefill from delay hits is 0 tokens, "
        "and its"
        " TTFT p50 and p90 are within 2% of longest_prefix's. Failures:\n\n";
  int failures = 0;
  std::int64_t short_overlaps = 0;
  for (auto const& wname : workloads) {
    for (double load : loads) {
      for (auto seed : seeds) {
        summary const* st = &row_of(rows, wname, "strata", load, seed);
        summary const* lp = &row_of(rows, wname, "longest_prefix", load, seed);
        if (st->redundant_tokens - st->short_overlap_tokens != 0) {
          md << "- " << wname << " " << load * 100 << "% seed " << seed << ": strata redundant prefill from delay hits "
             << st->redundant_tokens - st->short_overlap_tokens << " tokens\n";
          ++failures;
        }
        short_overlaps += st->short_overlap_tokens;
        for (auto [name, a, b] :
             {std::tuple{"p50", st->ttft_p50, lp->ttft_p50}, std::tuple{"p90", st->ttft_p90, lp->ttft_p90}}) {
          if (a > b * 1.02) {
            char buf[256];
            std::snprintf(buf, sizeof buf,
                          "- %s %.0f%% seed %llu: strata TTFT %s %.3f s vs longest_prefix %.3f s (%+.1f%%)\n",
                          wname.c_str(), load * 100, (unsigned long long)seed, name, a, b, 100 * (a / b - 1));
            md << buf;
            ++failures;
          }
        }
      }
    }
  }
  md << (failures == 0 ? "- none\n\n" : "\n");
  // The same bound per workload and load on the means over seeds.
  double worst_pooled = 0;
  std::string worst_pooled_at;
  for (auto const& wname : workloads) {
    for (double load : loads) {
      for (auto [name, field] : {std::pair{"p50", &summary::ttft_p50}, std::pair{"p90", &summary::ttft_p90}}) {
        double const ratio =
            mean_of(rows, wname, "strata", load, field) / mean_of(rows, wname, "longest_prefix", load, field);
        if (ratio > worst_pooled) {
          worst_pooled = ratio;
          worst_pooled_at = wname + " at " + std::to_string(int(load * 100)) + "%, " + name;
        }
      }
    }
  }
  char pooled[256];
  std::snprintf(pooled, sizeof pooled,
                "- per workload and load, means over seeds: worst strata / longest_prefix TTFT p50 or p90 %.3fx "
                "(%s; bound 1.02x)\n",
                worst_pooled, worst_pooled_at.c_str());
  md << pooled;
  std::printf("%s", pooled);
  // p99 is no target, but balance trades it for the rest: show the worst ratio.
  double worst_p99 = 0;
  std::string worst_at;
  for (auto const& wname : workloads) {
    for (double load : loads) {
      double const ratio = mean_of(rows, wname, "strata", load, &summary::ttft_p99) /
                           mean_of(rows, wname, "longest_prefix", load, &summary::ttft_p99);
      if (ratio > worst_p99) { worst_p99 = ratio, worst_at = wname + " at " + std::to_string(int(load * 100)) + "%"; }
    }
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "- (not a target) worst TTFT p99 of strata / longest_prefix, means over seeds: %.2fx, %s\n", worst_p99,
                worst_at.c_str());
  md << line;
  double const lp80 = mean_of(rows, "long_documents", "longest_prefix", 0.8, &summary::ttft_mean);
  double const st80 = mean_of(rows, "long_documents", "strata", 0.8, &summary::ttft_mean);
  double const vl80 = mean_of(rows, "long_documents", "vLLM-like: per-block DMA + fifo", 0.8, &summary::ttft_mean);
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "- long_documents, 80%% load, mean TTFT: longest_prefix %.3f s / strata %.3f s = %.2fx (target 1.3x)\n"
      "- long_documents, 80%% load, mean TTFT: vLLM-like system %.3f s / strata system %.3f s = %.2fx (target 5x)\n"
      "- strata's redundant prefill in overlaps below the 64-token delay-hit threshold, all runs: %lld tokens\n"
      "- checks failed above: %d\n",
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
        "| documents | Zipf | host-tier requests | longest_prefix / strata mean TTFT, seeds 1 / 2 / 3 | pooled |\n"
        "|---|---|---|---|---|\n";
  for (document_mix const mix :
       {document_mix{}, document_mix{40, 0.5}, document_mix{40, 0.8}, document_mix{100, 0.5}}) {
    double lp_sum = 0, st_sum = 0, share = 0;
    std::string cells;
    for (auto seed : seeds) {
      auto make = [&](double rate) {
        return make_workload("long_documents", sizes.at("long_documents"), rate, seed, mix);
      };
      bool const sweeps_mix = mix.documents == document_mix{}.documents && mix.zipf == document_mix{}.zipf;
      workload const w = make(0.8 * (sweeps_mix ? saturating_of.at("long_documents").at(seed)
                                                : find_saturating_rate(make, docs_config, 0.5, "long_documents")));
      auto const lp = run("longest_prefix", w, docs_config, {}, 1, false);
      double const a = summarize(lp, "").ttft_mean,
                   b = summarize(run("strata", w, docs_config, {}, 1, false), "").ttft_mean;
      lp_sum += a, st_sum += b, share += host_tier_share(lp) / double(seeds.size());
      std::snprintf(buf, sizeof buf, "%s%.2fx", cells.empty() ? "" : " / ", a / b);
      cells += buf;
    }
    std::snprintf(buf, sizeof buf, "| %lld | %.1f | %.0f%% | %s | %.2fx |\n", (long long)mix.documents, mix.zipf,
                  100 * share, cells.c_str(), lp_sum / st_sum);
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
  std::printf("sweep: %zu runs in %.0f s; %s/sweep.md, sweep.csv, ttft_cdf_80.png, ttft_vs_load.png\n", rows.size(),
              seconds, dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  options const o = parse(argc, argv);
  try {
    STRATA_EXPECTS(o.instances > 0, "--instances must be positive, got ", o.instances);
    STRATA_EXPECTS(o.rate >= 0, "--rate must not be negative, got ", o.rate);
    STRATA_EXPECTS(o.requests >= 0, "--requests must not be negative, got ", o.requests);
    STRATA_EXPECTS(o.device_pages == -1 || o.device_pages > 0, "--device-pages must be positive, got ", o.device_pages);
    STRATA_EXPECTS(o.host_pages == -1 || o.host_pages >= 0, "--host-pages must not be negative, got ", o.host_pages);
    if (o.sweep) {
      // The sweep fixes its workloads, strategies and systems; it takes only pool sizes and budget.
      options const defaults;
      STRATA_EXPECTS(o.instances == 1 && o.strategy == defaults.strategy && o.system == defaults.system &&
                         o.workload == defaults.workload && o.seed == defaults.seed && o.trace.empty() &&
                         !o.trace_pages && !o.progress && o.delay_hits && o.balance && o.bubbles && o.rate == 0 &&
                         o.requests == 0,
                     "--sweep takes only --out, --budget, --device-pages and --host-pages");
      return run_sweep(o);
    }
    engine_config const c = engine_for(o, system_io(o.system), o.trace.empty() ? o.workload : "");
    c.validate();
    workload const w = o.trace.empty() ? make_workload(o.workload, o.requests, o.rate, o.seed)
                                       : replay(o.trace, c.costs.page_tokens(), o.trace_pages);
    strata_options so;
    so.delay_hits = o.delay_hits;
    so.balance = o.balance;
    so.bubbles = o.bubbles;
    std::vector<std::string> const strategies = o.strategy == "all"
                                                    ? std::vector<std::string>{"fifo", "longest_prefix", "strata"}
                                                    : std::vector<std::string>{o.strategy};
    std::printf("%s: %zu requests over %.0f s, Llama-3.1-8B on %d H200%s, %s I/O\n\n", w.name.c_str(),
                w.requests.size(), w.requests.empty() ? 0.0 : w.requests.back().arrival_s, o.instances,
                o.instances > 1 ? "s" : "", o.system.c_str());
    std::vector<summary> rows;
    std::vector<series> cdf;
    for (auto const& s : strategies) {
      auto const t0 = std::chrono::steady_clock::now();
      auto const r = run(s, w, c, so, o.instances, o.progress || w.requests.size() >= 20000);
      double const wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rows.push_back(summarize(r, s == "strata" ? ablation_label(so) : s));
      std::fprintf(stderr, "%s: simulated in %.2f s of wall time\n", s.c_str(), wall);
      if (!o.out.empty()) {
        std::filesystem::create_directories(o.out);
        write_requests_csv(o.out + "/requests_" + s + ".csv", r);
        cdf.push_back(ttft_cdf(r, s, palette[cdf.size() % 7]));
      }
    }
    print_table(std::cout, rows);
    if (!o.out.empty()) {
      std::ofstream md{o.out + "/summary.md"};
      print_table(md, rows);
      write_charts_png(o.out + "/ttft_cdf.png", {chart{w.name + ": TTFT CDF", "TTFT (S, LOG)", "FRACTION", cdf, true}},
                       1);
      std::printf("\nwrote %s/summary.md, requests_*.csv, ttft_cdf.png\n", o.out.c_str());
    }
  } catch (strata::invalid_argument const& e) {
    std::fprintf(stderr, "simulate: %s\n", e.what());
    return 2;
  } catch (std::exception const& e) {  // files, saturation searches that do not converge
    std::fprintf(stderr, "simulate: %s\n", e.what());
    return 1;
  }
  return 0;
}
