/**
 * @file progress.hpp
 * @brief The simulator tool's progress bar (stderr); the engine reports progress through a callback.
 */
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace strata::sim {

/// @brief Prints a progress bar on stderr for long runs.
class progress_bar {
 public:
  /// @param total requests in the run; @param enabled false: `update` prints nothing
  explicit progress_bar(std::int64_t total, bool enabled) : total_{total}, enabled_{enabled && total > 0} {}
  /// @brief Redraws the bar when the percentage changed; a newline when `done` reaches the total.
  void update(std::int64_t done)
  {
    if (!enabled_) { return; }
    int const pct = int(done * 100 / total_);
    if (pct == last_) { return; }
    last_ = pct;
    std::fprintf(stderr, "\r  [%-40s] %3d%% %lld/%lld requests", std::string(std::size_t(pct * 40 / 100), '#').c_str(),
                 pct, (long long)done, (long long)total_);
    if (done == total_) { std::fprintf(stderr, "\n"); }
  }

 private:
  std::int64_t total_;
  bool enabled_;
  int last_ = -1;
};

}  // namespace strata::sim
