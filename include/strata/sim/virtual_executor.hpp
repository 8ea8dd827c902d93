// SPDX-License-Identifier: Apache-2.0
/**
 * @file sim/virtual_executor.hpp
 * @brief The simulator's copy executor: moves no bytes, only decides when each copy lands in
 *        virtual time, from the cost model.
 */
#pragma once

#include <strata/cache/executor.hpp>
#include <strata/sched/cost_model.hpp>
#include <strata/sim/shared_remote.hpp>

#include <limits>
#include <memory>
#include <set>
#include <type_traits>

namespace strata::sim {

/**
 * @brief A `copy_executor` in virtual time. Loads land when the engine says (`land_at`: the
 *        simulator computes a batch's time from its loads and compute); backups, demotions and
 *        prefetches run one at a time on one link per resource, for `cost_model::copy_s`: a copy
 *        from or into the file (remote) tier on that tier's link, reads and writes alike (one
 *        disk); device -> host backups on the host's, the other direction of PCIe than loads (it
 *        does not slow them). A batch's own loads are in its time and occupy no link here. Copies
 *        into a remote tier that keeps a log (`remote_write_log`: a store shared by instances) are
 *        reported to it with their landing time.
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
  handle_type submit(Tiers& tiers, std::span<copy_order const> orders, copy_kind kind, stream_type = {})
  {
    handle_type h{std::make_shared<double>(std::numeric_limits<double>::infinity())};
    if (kind == copy_kind::load) { return h; }
    double end = now_;
    for (auto const& o : orders) {
      // A copy from or into a record tier queues on that tier's disk (or network), else on its
      // destination's link: device -> host backups on PCIe's other direction.
      tier const on = is_record_tier(o.from) ? o.from : o.to;
      double& link = link_free_[std::size_t(on)];
      link = std::max(now_, link) + costs_.copy_s(o.from, o.to, std::int64_t(o.from_pages.size()));
      end = std::max(end, link);
      if constexpr (Tiers::has(tier::remote)) {  // a shared remote store: other instances find them once landed
        auto& remote = tiers.template get<tier::remote>();
        if constexpr (remote_write_log<std::remove_cvref_t<decltype(remote)>>) {
          if (o.to == tier::remote) { remote.written(o.keys, link); }
        }
      }
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
  { return *h.lands_at <= now_ ? copy_status::done : copy_status::pending; }
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
