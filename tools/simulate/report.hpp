/**
 * @file report.hpp
 * @brief The simulator tool's reports (not installed): summaries of simulation results (TTFT
 *        percentiles, throughput, redundant prefill, I/O stall, bubble time filled, hit rates per
 *        tier), per-request CSV, text tables, and TTFT CDFs as chart data.
 */
#pragma once

#include "chart.hpp"

#include <strata/sim/engine.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

namespace strata::sim {

/// @brief The figures of one run.
struct summary {
  std::string label;
  std::int64_t requests = 0;                                       ///< served
  std::int64_t rejected = 0;                                       ///< larger than the device pool
  double ttft_mean = 0, ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;  ///< seconds
  double throughput_tokens_s = 0;         ///< (prompt + output) tokens served per second of makespan
  std::int64_t short_overlap_tokens = 0;  ///< of the redundant, in overlaps below the delay-hit threshold
  std::int64_t redundant_tokens = 0;      ///< prefilled, then found cached by another request
  std::int64_t delay_hit_deferrals = 0;
  double io_stall_s = 0;                      ///< prefill batch time spent waiting for loads
  double bubble_filled_s = 0;                 ///< of that, used by decode steps
  std::array<double, tier_count> hit_rate{};  ///< prompt tokens found in each tier / prompt tokens
  double makespan_s = 0;
};

/// @brief Nearest-rank percentile of sorted values.
inline double percentile(std::vector<double> const& sorted, double p)
{
  if (sorted.empty()) { return 0; }
  auto const rank = static_cast<std::size_t>(std::ceil(p / 100.0 * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

/// @brief Sorted TTFTs of the served requests.
inline std::vector<double> ttfts(simulation_result const& r)
{
  std::vector<double> t;
  for (auto const& x : r.records) {
    if (x.served()) { t.push_back(x.ttft_s()); }
  }
  std::sort(t.begin(), t.end());
  return t;
}

/// @brief The summary of a run.
inline summary summarize(simulation_result const& r, std::string label = {})
{
  summary s;
  s.label = label.empty() ? r.strategy : std::move(label);
  auto const t = ttfts(r);
  s.requests = std::int64_t(t.size());
  double sum = 0;
  for (double v : t) {
    sum += v;
  }
  s.ttft_mean = t.empty() ? 0 : sum / double(t.size());
  s.ttft_p50 = percentile(t, 50);
  s.ttft_p90 = percentile(t, 90);
  s.ttft_p99 = percentile(t, 99);
  double tokens = 0, prompt = 0;
  std::array<double, tier_count> cached{};
  for (auto const& x : r.records) {
    if (!x.served()) { continue; }
    tokens += double(x.prompt_tokens + x.output_tokens);
    prompt += double(x.prompt_tokens);
    for (std::size_t i = 0; i < tier_count; ++i) {
      cached[i] += double(x.cached_tokens[i]);
    }
    s.redundant_tokens += x.redundant_tokens;
    s.short_overlap_tokens += x.short_overlap_tokens;
    s.delay_hit_deferrals += x.delay_hit_deferrals;
  }
  for (auto const& c : r.counters) {
    s.io_stall_s += c.io_stall_s;
    s.bubble_filled_s += c.bubble_filled_s;
    s.rejected += c.rejected;
  }
  for (std::size_t i = 0; i < tier_count; ++i) {
    s.hit_rate[i] = prompt > 0 ? cached[i] / prompt : 0;
  }
  s.makespan_s = r.makespan_s;
  s.throughput_tokens_s = r.makespan_s > 0 ? tokens / r.makespan_s : 0;
  return s;
}

/// @brief Writes one CSV line per request.
inline void write_requests_csv(std::string const& path, simulation_result const& r)
{
  std::ofstream out{path};
  STRATA_EXPECTS(out.good(), "write_requests_csv: cannot write ", path);
  out << "id,instance,arrival_s,first_token_s,ttft_s,finish_s,prompt_tokens,output_tokens,cached_device,cached_host,"
         "cached_file,cached_remote,computed_tokens,redundant_tokens,short_overlap_tokens,answer_race_tokens,deferrals,"
         "delay_hit_deferrals\n";
  for (auto const& x : r.records) {
    out << x.id.value << ',' << x.instance << ',' << x.arrival_s << ',' << x.first_token_s << ','
        << (x.served() ? x.ttft_s() : -1) << ',' << x.finish_s << ',' << x.prompt_tokens << ',' << x.output_tokens;
    for (auto c : x.cached_tokens) {
      out << ',' << c;
    }
    out << ',' << x.computed_tokens << ',' << x.redundant_tokens << ',' << x.short_overlap_tokens << ','
        << x.answer_race_tokens << ',' << x.deferrals << ',' << x.delay_hit_deferrals << '\n';
  }
}

/// @brief A markdown table of summaries.
inline void print_table(std::ostream& out, std::vector<summary> const& rows)
{
  out << "| run | served | TTFT mean s | p50 | p90 | p99 | tokens/s | redundant prefill tokens | I/O stall s | "
         "bubble filled s | hits device/host/file/remote |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (auto const& s : rows) {
    std::snprintf(buf, sizeof buf,
                  "| %s | %lld%s | %.3f | %.3f | %.3f | %.3f | %.0f | %lld | %.1f | %.1f | %.2f/%.2f/%.2f/%.2f |\n",
                  s.label.c_str(), (long long)s.requests,
                  s.rejected > 0 ? (" (" + std::to_string(s.rejected) + " rejected)").c_str() : "", s.ttft_mean,
                  s.ttft_p50, s.ttft_p90, s.ttft_p99, s.throughput_tokens_s, (long long)s.redundant_tokens,
                  s.io_stall_s, s.bubble_filled_s, s.hit_rate[0], s.hit_rate[1], s.hit_rate[2], s.hit_rate[3]);
    out << buf;
  }
}

/// @brief The TTFT CDF of a run as a chart series (at most `points` + 1 distinct points, the last at 1).
inline series ttft_cdf(simulation_result const& r, std::string label, std::size_t points = 200)
{
  auto const t = ttfts(r);
  series s{std::move(label), {}, {}};
  if (t.empty()) { return s; }
  for (std::size_t k = 0; k <= points; ++k) {
    std::size_t const i = std::min(t.size() - 1, k * t.size() / points);
    double const x = std::max(t[i], 1e-3), y = double(i + 1) / double(t.size());
    if (!s.x.empty() && s.x.back() == x && s.y.back() == y) { continue; }  // fewer requests than points
    s.x.push_back(x);
    s.y.push_back(y);
  }
  return s;
}

}  // namespace strata::sim
