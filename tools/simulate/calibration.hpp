// SPDX-License-Identifier: Apache-2.0
/**
 * @file tools/simulate/calibration.hpp
 * @brief Calibration of a `cost_model` from the output of strata's benchmarks (`bench_file_store`,
 *        `bench_transfer`), as committed under docs/results/: tooling, not installed.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/sched/cost_model.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace strata::tools {

/**
 * @brief Sets `model`'s file tier's read and write bandwidth from the output of `bench_file_store`
 *        (Google Benchmark's console format, as committed under docs/results/): the median over
 *        every repetition of the `read` and `read(shuffled slots)` runs of `-p<page_tokens>`
 *        records, and of their `write` runs (aggregate rows such as `_median` are skipped; the
 *        write bandwidth is unchanged when the file has no write runs). Each `GB/s=` counter is
 *        the store's payload rate, checksums and headers included.
 * @param path the benchmark's output
 * @param page_tokens selects the records (`llama3.1-8b-p32`: 32)
 * @return the read and write bandwidth now in `model`, bytes per second
 * @throw strata::invalid_argument when the file cannot be read, a matching row has no readable
 *        `GB/s=` counter, or no read row matches; the model is then unchanged
 */
inline std::pair<double, double> calibrate_file_tier(cost_model& model, std::string const& path,
                                                     std::int64_t page_tokens)
{
  std::ifstream in{path};
  STRATA_EXPECTS(in.good(), "calibrate_file_tier: cannot read ", path);
  std::string const records = "-p" + std::to_string(page_tokens) + "/";
  std::vector<double> reads, writes;
  std::string line;
  for (std::int64_t line_no = 1; std::getline(in, line); ++line_no) {
    std::istringstream words{line};
    std::string name;
    words >> name;
    std::size_t const at = name.find(records);
    if (at == std::string::npos) { continue; }
    std::string const op = name.substr(at + records.size());
    bool const read = op.rfind("read", 0) == 0, write = op.rfind("write", 0) == 0;
    bool const aggregate = name.find("_mean") != std::string::npos || name.find("_median") != std::string::npos ||
                           name.find("_stddev") != std::string::npos || name.find("_cv") != std::string::npos;
    if ((!read && !write) || aggregate) { continue; }
    std::size_t const counter = line.find(" GB/s=");
    double gbps = 0;
    bool parsed = counter != std::string::npos;
    if (parsed) {
      try {
        std::size_t used = 0;
        std::string const cell = line.substr(counter + 6, line.find(' ', counter + 6) - (counter + 6));
        gbps = std::stod(cell, &used);
        parsed = used == cell.size() && std::isfinite(gbps) && gbps > 0;
      } catch (std::logic_error const&) {  // std::stod
        parsed = false;
      }
    }
    STRATA_EXPECTS(parsed, "calibrate_file_tier: ", path, ":", line_no, ": no positive GB/s= counter in '", line, "'");
    (read ? reads : writes).push_back(gbps * 1e9);
  }
  STRATA_EXPECTS(!reads.empty(), "calibrate_file_tier: no read runs of ", records.substr(1, records.size() - 2),
                 " records in ", path);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::size_t const n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  model.set_file_tier(median(reads), writes.empty() ? model.write_bytes_per_s(tier::file) : median(writes));
  return {model.io().load_bytes_per_s[std::size_t(tier::file)], model.io().store_bytes_per_s[std::size_t(tier::file)]};
}

/**
 * @brief Replaces `model`'s host tier's load bandwidth and the backup bandwidth with the best `GBps` of
 *        the matching rows of a `bench_transfer` CSV (one backend, KV head count and page size;
 *        the best of the contexts measured). File and remote tiers are other links: unchanged.
 * @param path the CSV (`transfer.csv` under `$OUT`)
 * @param backend e.g. "gpu_assisted/2"; @param kv_heads, page_tokens select the rows
 * @throw strata::invalid_argument when the file cannot be read, a row cannot be parsed, or no
 *        load and backup rows match; the model is then unchanged
 */
inline void calibrate_from_csv(cost_model& model, std::string const& path, std::string const& backend,
                               std::int64_t kv_heads, std::int64_t page_tokens)
{
  std::ifstream in{path};
  STRATA_EXPECTS(in.good(), "calibrate_from_csv: cannot read ", path);
  std::string line;
  std::getline(in, line);  // header
  double load = 0, backup = 0;
  for (std::int64_t line_no = 2; std::getline(in, line); ++line_no) {
    std::vector<std::string> f;
    std::stringstream ss{line};
    for (std::string cell; std::getline(ss, cell, ',');) {
      f.push_back(cell);
    }
    if (f.size() < 6 || f[5] != backend) { continue; }
    STRATA_EXPECTS(f.size() >= 7, "calibrate_from_csv: ", path, ":", line_no, ": a ", backend,
                   " row without a GBps cell");
    STRATA_EXPECTS(f[4] == "load" || f[4] == "backup", "calibrate_from_csv: ", path, ":", line_no, ": direction '",
                   f[4], "' is neither load nor backup");
    std::int64_t heads = 0, page = 0;
    double gbps = 0;
    bool parsed = true;
    try {  // each cell whole: "8x" is not 8
      std::size_t used_heads = 0, used_page = 0, used_gbps = 0;
      heads = std::stoll(f[1], &used_heads), page = std::stoll(f[2], &used_page), gbps = std::stod(f[6], &used_gbps);
      parsed = used_heads == f[1].size() && used_page == f[2].size() && used_gbps == f[6].size();
    } catch (std::logic_error const&) {  // std::stoll / std::stod
      parsed = false;
    }
    STRATA_EXPECTS(parsed, "calibrate_from_csv: ", path, ":", line_no, ": cannot parse '", line, "'");
    if (heads != kv_heads || page != page_tokens) { continue; }
    double& best = f[4] == "load" ? load : backup;
    best = std::max(best, gbps * 1e9);
  }
  STRATA_EXPECTS(load > 0 && backup > 0, "calibrate_from_csv: no load and backup rows for ", backend, ", ", kv_heads,
                 " KV heads, ", page_tokens, "-token pages in ", path);
  model.set_host_link(load, backup);
}

}  // namespace strata::tools
