// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/controller_impl.hpp
 * @brief `controller_impl<Controller, Hooks>`: a `cache_controller` behind `controller_api`.
 *
 * `Hooks` supplies what depends on the executor: turning an integer into a stream, waiting per
 * layer, the executor's extras. `host_hooks` (below) serves `cpu_executor`; `gpu.cu` has the
 * GPU's.
 */
#pragma once

#include "controller_api.hpp"

#include <strata/cache/controller.hpp>

#include <type_traits>
#include <utility>

namespace strata::python {

/**
 * @tparam Controller a `cache_controller<Policies>`
 * @tparam Hooks `to_stream(uintptr_t)`, `wait_layer(load_handle const&, layer, uintptr_t)`,
 *         `wait_after(prefill_result const&, uintptr_t)`, `set_activity(executor&, int, double)`,
 *         `synchronize(executor&)`, `stats(executor const&)`, `name`
 */
template <class Controller, class Hooks>
class controller_impl final : public controller_api {
 public:
  using load_handle_type = typename Controller::load_handle_type;
  using handle_type = typename Controller::handle_type;
  using prefill_type = prefill_result<handle_type>;

  template <class... Args>
  explicit controller_impl(Args&&... args) : c_{std::forward<Args>(args)...}
  {
  }

  void submit(cache_request const& r, std::uintptr_t stream) override { c_.submit(r, Hooks::to_stream(stream)); }
  batch_plan schedule(schedule_budget const& budget) override { return c_.schedule(budget); }
  loads_info begin_loads(batch_plan const& plan, std::uintptr_t stream) override
  {
    auto h = std::make_shared<load_handle_type>(c_.begin_loads(plan, Hooks::to_stream(stream)));
    loads_info out;
    out.round = h->round;
    out.ran = h->ran;
    out.skipped = h->skipped;
    out.started = h->started;
    out.loaded_pages = h->loaded_pages;
    out.has_loads = h->has_loads();
    out.after = h->after.size();
    out.owner = this;
    out.native = std::move(h);
    return out;
  }
  bool wait_layer(loads_info const& loads, std::int64_t layer, std::uintptr_t stream) override
  {
    auto const& h = own(loads);
    STRATA_EXPECTS(layer >= 0 && layer < c_.tiers().geometry().layers, "wait_layer: layer ", layer, " outside [0, ",
                   c_.tiers().geometry().layers, ")");
    return Hooks::wait_layer(c_.executor(), h, layer, stream);
  }
  bool complete(loads_info const& loads) override { return c_.complete(own(loads)); }
  std::size_t poll(std::uintptr_t stream) override { return c_.poll(Hooks::to_stream(stream)); }
  std::vector<std::int64_t> page_table(request_id id) const override { return c_.page_table(id); }
  prefill_info finish_prefill(request_id id, std::uintptr_t stream) override
  {
    auto r = std::make_shared<prefill_type>(c_.finish_prefill(id, Hooks::to_stream(stream)));
    prefill_info out;
    out.duplicate_positions = r->duplicate_positions;
    out.after = r->after.size();
    out.owner = this;
    out.native = std::move(r);
    return out;
  }
  bool wait_after(prefill_info const& r, std::uintptr_t stream) override
  {
    STRATA_EXPECTS(r.owner == this && r.native != nullptr, "wait_after: the result belongs to another controller");
    return Hooks::wait_after(*static_cast<prefill_type const*>(r.native.get()), stream);
  }
  void release(request_id id, std::span<std::int32_t const> cache_tokens, std::uintptr_t stream) override
  { c_.release(id, cache_tokens, Hooks::to_stream(stream)); }
  std::int64_t evict(tier t, std::int64_t pages, std::uintptr_t stream) override
  {
    STRATA_EXPECTS(Controller::tiers_type::has(t) && c_.tiers().capacity(t) > 0, "evict: the controller has no ",
                   to_string(t), " tier");
    return c_.evict(t, pages, Hooks::to_stream(stream));
  }
  match_result probe(std::span<std::int32_t const> tokens) const override { return c_.probe(tokens); }
  std::int64_t device_pages_available() const override { return c_.device_pages_available(); }
  std::size_t waiting() const override { return c_.waiting(); }
  bool failed(request_id id) const override { return c_.failed(id); }
  bool prefilled(request_id id) const override { return c_.prefilled(id); }
  std::size_t live_requests() const override { return c_.live_requests(); }
  std::size_t pending_submissions() const override { return c_.pending_submissions(); }
  cache_stats stats() const override { return c_.stats(); }
  hiradix_stats index_stats() const override { return c_.index_stats(); }
  void check_invariants() const override { c_.check_invariants(); }
  std::int64_t page_tokens() const override { return c_.page_tokens(); }
  kv_geometry geometry() const override { return const_cast<Controller&>(c_).tiers().geometry(); }
  controller_options const& options() const override { return c_.options(); }
  std::vector<tier> tiers() const override
  {
    std::vector<tier> out;
    const_cast<Controller&>(c_).tiers().for_each(
        [&](auto const& s) { out.push_back(std::remove_cvref_t<decltype(s)>::kind); });
    return out;
  }
  std::int64_t capacity(tier t) const override { return const_cast<Controller&>(c_).tiers().capacity(t); }
  std::string executor_name() const override { return Hooks::name; }
  void set_activity(int activity, double compute_ms) override
  {
    STRATA_EXPECTS(activity >= 0 && activity <= 2,
                   "set_activity: activity must be 0 (idle), 1 (prefill) or 2 (decode), got ", activity);
    Hooks::set_activity(c_.executor(), activity, compute_ms);
  }
  void synchronize() override { Hooks::synchronize(c_.executor()); }
  executor_stats stats_of_executor() const override { return Hooks::stats(c_.executor()); }
  executor_calibration warm_up() override { return Hooks::warm_up(c_.executor(), c_.tiers()); }

  Controller& controller() noexcept { return c_; }

 private:
  load_handle_type const& own(loads_info const& loads) const
  {
    STRATA_EXPECTS(loads.owner == this && loads.native != nullptr, "the load handle belongs to another controller");
    return *static_cast<load_handle_type const*>(loads.native.get());
  }

  Controller c_;
};

/// @brief Hooks of `cpu_executor`: no streams; copies done when `submit` returns, but record I/O on a store's queues.
struct host_hooks {
  static constexpr char const* name = "host";
  static cpu_executor::stream_type to_stream(std::uintptr_t stream)
  {
    STRATA_EXPECTS(stream == 0, "the host executor takes no stream (got ", stream, ")");
    return {};
  }
  template <class LoadHandle>
  static bool wait_layer(cpu_executor const&, LoadHandle const& h, std::int64_t layer, std::uintptr_t stream)
  { return strata::wait_layer(h, layer, to_stream(stream)); }
  template <class Result>
  static bool wait_after(Result const& r, std::uintptr_t stream)
  { return strata::wait_after(r, to_stream(stream)); }
  static void set_activity(cpu_executor&, int, double) {}
  static void synchronize(cpu_executor& e) { e.synchronize(); }
  static executor_stats stats(cpu_executor const&) { return {}; }
  template <class Tiers>
  static executor_calibration warm_up(cpu_executor&, Tiers const&)
  { return {}; }
};

}  // namespace strata::python
