// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/backend.cuh
 * @brief The `transfer_backend` concept, transfer handles with per-layer completion, and the
 *        functions that submit a plan to a backend.
 *
 * ```
 * auto h = strata::submit(backend, plan, copy_stream);          // per-layer events
 * for (layer ...) { strata::wait_layer(h, layer, compute_stream); attention(layer); }
 * ```
 */
#pragma once

#include <strata/cuda.cuh>
#include <strata/layout/layer_first.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/transfer/copy_plan.hpp>

#include <cuda/stream_ref>

#include <atomic>
#include <concepts>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace strata {

/**
 * @brief A way to move pages between two layouts on a CUDA stream.
 *
 * `b.enqueue(plan, stream, layer_events)` takes a plan that `validate` accepted and enqueues the
 * copy so that work enqueued on `stream` afterwards runs after it. `layer_events` is empty, or holds
 * one event per layer of `plan.layers`: the backend records event `i` on `stream` once layer
 * `plan.layers.begin + i` has fully landed (backends that move whole pages record them all at the
 * end). `B::name` names it in reports. Backends are not thread-safe: one thread uses an instance
 * at a time.
 */
template <class B>
concept transfer_backend = requires(B& b, copy_plan<page_first, layer_first> const& plan, cuda::stream_ref s,
                                    std::span<cudaEvent_t const> ev) {
  { B::name } -> std::convertible_to<char const*>;
  b.enqueue(plan, s, ev);
};

/// @brief When the consumer of a transfer learns that its data landed.
enum class completion {
  per_layer,  ///< one event per layer: compute on layer l may start when layer l has landed
  whole,      ///< one event for the whole transfer (cheaper; for bulk moves and backups)
};

/**
 * @brief Completion of one submitted transfer: one CUDA event per layer (or one for the whole).
 *
 * Cheap to move; copies share the same events. For a backup, `wait` / `synchronize` /
 * `done_event` mark the point after which the source pages may be reused.
 */
class transfer_handle {
 public:
  transfer_handle() = default;

  /// @brief A handle for `layers` with events created (not yet recorded).
  transfer_handle(layer_range layers, completion c) : state_{std::make_shared<state>()}, layers_{layers}
  {
    state_->device = current_device();
    auto const n = c == completion::per_layer ? layers.size() : 1;
    state_->events.reserve(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      state_->events.emplace_back();
    }
    state_->raw.reserve(static_cast<std::size_t>(n));
    for (auto const& e : state_->events) {
      state_->raw.push_back(e.get());
    }
  }

  /// @brief Layers the transfer covers.
  [[nodiscard]] layer_range layers() const noexcept { return layers_; }
  /// @brief Whether the handle refers to a transfer.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  /// @brief Whether completion is tracked per layer.
  [[nodiscard]] bool per_layer() const noexcept { return valid() && state_->events.size() > 1; }

  /**
   * @brief Makes `stream` wait until `layer` has landed (and only that layer, where tracked per
   *        layer). Blocks the calling thread only while a submit thread has not yet enqueued it.
   *        A default stream (0, legacy, per-thread) is the default stream of the device the
   *        transfer was submitted on, whichever device is current.
   * @throw strata::invalid_argument for a layer outside the transfer, or an empty handle
   * @throw the submit thread's error, if enqueueing failed there
   */
  void wait_layer(std::int64_t layer, cuda::stream_ref stream) const
  {
    STRATA_EXPECTS(valid(), "transfer_handle: empty handle");
    STRATA_EXPECTS(layer >= layers_.begin && layer < layers_.end, "transfer_handle: layer ", layer,
                   " is not in the transfer's range [", layers_.begin, ", ", layers_.end, ")");
    std::size_t const i = index(layer);
    (void)host_finished(true);
    await_recorded(i + 1);
    stream_wait(stream.get(), {&state_->raw[i], 1});
  }

  /// @brief Makes `stream` wait until the whole transfer has landed (a default stream: as `wait_layer`).
  void wait(cuda::stream_ref stream) const
  {
    STRATA_EXPECTS(valid(), "transfer_handle: empty handle");
    (void)host_finished(true);
    await_recorded(state_->raw.size());
    stream_wait(stream.get(), state_->raw);
  }

  /// @brief Blocks the calling thread until the whole transfer has landed.
  void synchronize() const
  {
    STRATA_EXPECTS(valid(), "transfer_handle: empty handle");
    (void)host_finished(true);
    await_recorded(state_->raw.size());
    for (auto e : state_->raw) {
      STRATA_CUDA_TRY(cudaEventSynchronize(e));
    }
  }

  /**
   * @brief True once the whole transfer has landed (never blocks). A failed transfer is not done:
   *        it never lands.
   * @throw the submit thread's error, if enqueueing failed there (see `failed`)
   * @throw strata::cuda_error if querying an event fails (an earlier asynchronous error)
   */
  [[nodiscard]] bool done() const
  {
    if (!valid()) { return false; }
    if (!host_finished(false)) { return false; }
    if (state_->failed.load(std::memory_order_acquire)) { rethrow(); }
    if (state_->recorded.load(std::memory_order_acquire) < state_->raw.size()) { return false; }
    for (auto e : state_->raw) {
      cudaError_t const r = cudaEventQuery(e);
      if (r == cudaErrorNotReady) { return false; }
      STRATA_CUDA_TRY(r);
    }
    return true;
  }

  /// @brief Whether enqueueing the transfer failed (on a submit thread); never blocks or throws.
  [[nodiscard]] bool failed() const noexcept { return valid() && state_->failed.load(std::memory_order_acquire); }

  /// @brief What made a `failed()` transfer fail (null when it did not); never blocks or throws.
  [[nodiscard]] std::exception_ptr error() const noexcept
  {
    if (!failed()) { return nullptr; }
    std::lock_guard lock{state_->m};
    return state_->error;
  }

  /// @brief The event of the last layer to land (the whole transfer's, for `completion::whole`).
  [[nodiscard]] cudaEvent_t done_event() const
  {
    STRATA_EXPECTS(valid(), "transfer_handle: empty handle");
    (void)host_finished(true);
    await_recorded(state_->raw.size());
    return state_->raw.back();
  }

  /// @brief For backends and submit threads: the events to record, in layer order.
  [[nodiscard]] std::span<cudaEvent_t const> events() const noexcept { return state_->raw; }
  /// @brief For submit threads: the first `n` events are recorded (waiters may go ahead).
  void mark_recorded(std::size_t n) const noexcept
  {
    state_->recorded.store(n, std::memory_order_release);
    state_->recorded.notify_all();
  }
  /**
   * @brief A handle that failed before anything was enqueued, created without CUDA calls (so it can
   *        be made after a sticky CUDA error): `failed()` is true, waits rethrow `e`.
   */
  [[nodiscard]] static transfer_handle failed_before_start(layer_range layers, std::exception_ptr e)
  {
    transfer_handle h;
    h.state_ = std::make_shared<state>();
    h.layers_ = layers;
    h.fail(std::move(e));
    return h;
  }
  /**
   * @brief For executors: work on the host that must finish before the transfer counts as landed
   *        (record I/O on a store's or a record thread's queues). `poll(block)` returns whether
   *        it finished (`block`: waits until it has) and throws what made it fail, which fails
   *        the handle (it must throw only once nothing of the transfer moves any more). `done`
   *        polls it (never waiting, not even for a thread that waits for it); `synchronize`,
   *        `wait` and `wait_layer` wait for it. Set once, before the handle is handed out.
   */
  void set_host_part(std::function<bool(bool)> poll) const { state_->host = std::move(poll); }

  /// @brief For submit threads: enqueueing failed; waiters rethrow `e`.
  void fail(std::exception_ptr e) const noexcept
  {
    {
      std::lock_guard lock{state_->m};
      state_->error = std::move(e);
    }
    state_->failed.store(true, std::memory_order_release);
    mark_recorded(state_->raw.size());
  }

 private:
  struct state {
    std::vector<cuda_event> events;
    std::vector<cudaEvent_t> raw;
    std::atomic<std::size_t> recorded{0};
    std::mutex m;
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    std::function<bool(bool)> host;  // `set_host_part` (empty: none)
    std::mutex host_m;
    bool host_done = false;
    int device = -1;  // current at construction, where the events were made (-1: `failed_before_start`)
  };
  /// Makes `stream` wait for `events`; a default stream on the transfer's device.
  void stream_wait(cudaStream_t stream, std::span<cudaEvent_t const> events) const
  {
    std::optional<device_scope> on;
    if (detail::is_default_stream(stream) && state_->device >= 0) { on.emplace(state_->device); }
    for (auto e : events) {
      STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, e, 0));
    }
  }
  /// Whether the host part finished (or there is none); a failure fails the handle (and throws).
  /// Without `block` it never waits, not even for another thread blocked in it (then: not yet).
  bool host_finished(bool block) const
  {
    if (!state_->host) { return true; }
    std::unique_lock lock{state_->host_m, std::defer_lock};
    if (block) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return false;
    }
    if (state_->host_done) { return true; }
    try {
      if (!state_->host(block)) { return false; }
    } catch (...) {
      state_->host_done = true;
      fail(std::current_exception());
      throw;
    }
    state_->host_done = true;
    return true;
  }
  [[nodiscard]] std::size_t index(std::int64_t layer) const noexcept
  { return state_->raw.size() == 1 ? 0 : static_cast<std::size_t>(layer - layers_.begin); }
  void await_recorded(std::size_t n) const
  {
    // A failed handle may have fewer events recorded than asked for (none, if it failed before it
    // started): the failure ends the wait.
    for (auto r = state_->recorded.load(std::memory_order_acquire);
         r < n && !state_->failed.load(std::memory_order_acquire);
         r = state_->recorded.load(std::memory_order_acquire)) {
      state_->recorded.wait(r, std::memory_order_acquire);
    }
    if (state_->failed.load(std::memory_order_acquire)) { rethrow(); }
  }
  [[noreturn]] void rethrow() const
  {
    std::exception_ptr e;
    {
      std::lock_guard lock{state_->m};
      e = state_->error;
    }
    std::rethrow_exception(e);
  }

  std::shared_ptr<state> state_;
  layer_range layers_{};
};

/// @brief Makes `stream` wait for one layer of a transfer: `handle.wait_layer(layer, stream)`.
inline void wait_layer(transfer_handle const& handle, std::int64_t layer, cuda::stream_ref stream)
{ handle.wait_layer(layer, stream); }

/**
 * @brief Validates `plan`, then enqueues it on `stream` from the calling thread; returns its handle.
 * @throw strata::invalid_argument for a bad plan, before anything is enqueued
 * @throw strata::cuda_error when a CUDA call fails
 */
template <transfer_backend B, kv_layout Src, kv_layout Dst>
transfer_handle submit(B& backend, copy_plan<Src, Dst> const& plan, cuda::stream_ref stream,
                       completion c = completion::per_layer)
{
  validate(plan);
  transfer_handle h{plan.layers, c};
  if (c == completion::per_layer) {
    backend.enqueue(plan, stream, h.events());
  } else {
    backend.enqueue(plan, stream, {});
    STRATA_CUDA_TRY(cudaEventRecord(h.events()[0], stream.get()));
  }
  h.mark_recorded(h.events().size());
  return h;
}

/**
 * @brief Validates `plan`, then enqueues it on `stream`; later work on `stream` sees the pages.
 * @throw strata::invalid_argument for a bad plan, before anything is enqueued
 */
template <transfer_backend B, kv_layout Src, kv_layout Dst>
void copy(B& backend, copy_plan<Src, Dst> const& plan, cuda::stream_ref stream)
{
  validate(plan);
  backend.enqueue(plan, stream, {});
}

}  // namespace strata
