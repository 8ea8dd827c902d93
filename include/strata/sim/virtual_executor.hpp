// SPDX-License-Identifier: Apache-2.0
/**
 * @file sim/virtual_executor.hpp
 * @brief The simulator's copy executor: moves no bytes, only decides when each copy lands in
 *        virtual time, from the cost model.
 */
#pragma once

#include <strata/cache/executor.hpp>
#include <strata/sched/cost_model.hpp>

#include <limits>
#include <memory>
#include <set>

namespace strata::sim {

/**
 * @brief A `copy_executor` in virtual time. Loads land when the engine says (`land_at`: the
 *        simulator computes a batch's time from its loads and compute); backups and demotions run
 *        on one link per destination tier, one copy at a time, at the cost model's bandwidths
 *        (device -> host is the other direction of PCIe than loads: it does not slow them).
 */
class virtual_executor {
 public:
  /// @brief No streams in virtual time.
  struct stream_type {};
  /// @brief When a submission lands (shared with the executor's copies of it).
  struct handle_type {
    std::shared_ptr<double> lands_at;
  };

  virtual_executor() = default;
  /// @param costs the clock's cost model
  explicit virtual_executor(cost_model costs) : costs_{std::move(costs)} {}

  /// @brief Sets the virtual time (copies submitted from now start no earlier; `status` compares with it).
  void set_now(double t) noexcept { now_ = t; }
  /// @brief The virtual time.
  [[nodiscard]] double now() const noexcept { return now_; }

  /// @brief Loads: land when `land_at` says. Copies: queued on their destination's link.
  template <class Tiers>
  handle_type submit(Tiers&, std::span<copy_order const> orders, copy_kind kind, stream_type = {})
  {
    handle_type h{std::make_shared<double>(std::numeric_limits<double>::infinity())};
    if (kind == copy_kind::load) { return h; }
    double end = now_;
    for (auto const& o : orders) {
      double const bytes = double(o.from_pages.size()) * double(costs_.page_bytes());
      double const bw =
          o.to == tier::host ? costs_.io().backup_bytes_per_s : costs_.io().load_bytes_per_s[std::size_t(o.to)];
      double& link = link_free_[std::size_t(o.to)];
      link = std::max(now_, link) + bytes / bw;
      end = std::max(end, link);
      if (o.from == tier::device) { backup_pages_ += std::int64_t(o.from_pages.size()); }
    }
    *h.lands_at = end;
    copies_.insert(end);
    return h;
  }
  /// @brief A load submission lands at `t`.
  static void land_at(handle_type const& h, double t) noexcept { *h.lands_at = t; }
  /// @brief `done` once the virtual time reached its landing.
  [[nodiscard]] copy_status status(handle_type const& h) const noexcept
  {
    return *h.lands_at <= now_ ? copy_status::done : copy_status::pending;
  }
  /// @brief When the next copy (not load) lands after now; infinity if none.
  [[nodiscard]] double next_copy_landing()
  {
    while (!copies_.empty() && *copies_.begin() <= now_) {
      copies_.erase(copies_.begin());
    }
    return copies_.empty() ? std::numeric_limits<double>::infinity() : *copies_.begin();
  }
  /// @brief Device pages backed up or demoted so far.
  [[nodiscard]] std::int64_t backup_pages() const noexcept { return backup_pages_; }

 private:
  cost_model costs_;
  double now_ = 0;
  std::array<double, tier_count> link_free_{};
  std::multiset<double> copies_;
  std::int64_t backup_pages_ = 0;
};

}  // namespace strata::sim
