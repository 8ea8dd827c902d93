// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/gpu_executor.cuh
 * @brief `gpu_executor`: the cache controller's copy orders as GPU transfers, one backend chosen per
 *        transfer from measured costs (`presets/h200.hpp` by default). The bundle that uses it is
 *        `gpu_policies` (cache/gpu_policies.cuh).
 */
#pragma once

#include <strata/cache/detail/gpu_executor_state.cuh>
#include <strata/cache/detail/gpu_records.cuh>
#include <strata/cache/executor.hpp>
#include <strata/cache/gpu_executor_config.cuh>
#include <strata/layout/layer_first.hpp>
#include <strata/presets/h200.hpp>
#include <strata/tier/device_pool.hpp>
#include <strata/tier/file_store.hpp>
#include <strata/tier/pinned_host_pool.cuh>
#include <strata/tier/tier_stack.hpp>
#include <strata/transfer/backend.cuh>
#include <strata/transfer/choice.hpp>
#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/staged.cuh>
#include <strata/transfer/submit_thread.cuh>

#include <cuda/stream_ref>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

namespace strata {

/**
 * @brief A `copy_executor` for tier stacks of `addressable_store`s (`device_pool<Layout>`,
 *        `pinned_host_pool`): each submission's orders become one `copy_plan` per direction
 *        (`detail::for_each_direction`), each moved by a backend chosen with `choose_transfer` from
 *        the configured costs, the GPU activity the engine reports (`set_activity`), and the block
 *        size (or the one `gpu_executor_config::force` names).
 *
 * - Streams: `stream_type` is `cuda::stream_ref` (default: the legacy default stream). A submission's copies
 *   are ordered after the work already on that stream (an event recorded there: compute writing
 *   pages being backed up), but run on the executor's streams — loads on a high-priority stream,
 *   backups and demotions on a low-priority one — so later work on the caller's stream does not
 *   wait for them: make it wait per layer with `wait_layer`. Copies that `dma_batch` makes through
 *   the submit thread (below) run on that thread's streams, of the same priorities: the executor's
 *   streams (`load_stream()`, `copy_stream()`) do not cover them; the handles and `synchronize` do.
 * - Handles: `transfer_handle`. Loads complete per layer (`completion::per_layer`), copies as a
 *   whole. A submission with several directions issues them in order on one stream, so the last
 *   one's handle covers all. A submission refused before anything moved (a plan `validate` or a
 *   backend rejects) returns a failed handle; a CUDA error while enqueueing also fails it, after the
 *   stream has drained (nothing of it still writes).
 * - Record stores (a `file_store` below the host tier): no caller waits for a disk. Records read
 *   into or written from page-first host memory (prefetches into the pinned host tier, backups and
 *   demotions from it) move in place on an `async_record_store`'s own I/O queues; records to or
 *   from the device move on one of the executor's two record threads (one for loads, one for
 *   background copies: a load never queues behind a backup), chunk by chunk through the thread's
 *   bounded pinned staging (`record_staging_bytes`, two halves): the next chunk is read while the
 *   last one crosses PCIe, and a backup writes one chunk while the next is copied out. `submit`
 *   starts them and returns a pending handle (its host part, `transfer_handle::set_host_part`):
 *   `status` finishes it, `wait_layer` and `synchronize` wait for it. Records a read lost fail the
 *   submission (a load becomes a miss) and are named by `lost`; a failed write fails it too.
 * - `dma_batch` goes through the executor's `submit_thread` (when configured, for single-direction
 *   submissions): its CPU cost leaves the engine's thread.
 * - Devices: the executor copies on one device (`gpu_executor_config::device`, else the one current
 *   at construction), whichever device is current on the calling thread: each call that touches
 *   CUDA makes it current for its duration (`device_scope`) and restores the caller's. A stream of
 *   another device is refused (`check_stream`, which the controller calls before changing
 *   anything); a default stream (legacy or per-thread) means the executor's device's, whichever
 *   device is current; pages in another device's memory are refused (`gpu_assisted`'s check).
 * - Thread safety: `submit` is serialised by the controller's lock; `status`, `set_activity` and
 *   `stats` may be called from any thread.
 *
 * The CUDA parts (streams, backends, the submit thread) are created on the executor's device by
 * the first `submit`; the destructor waits for every transfer it issued (the pinned pool it reads
 * may be freed right after).
 */
class gpu_executor {
 public:
  using stream_type = cuda::stream_ref;  ///< what orders submissions (default: the legacy default stream)
  using handle_type = transfer_handle;   ///< one submission, per-layer completion for loads

  /// @brief The defaults: automatic choice from the H200's costs.
  gpu_executor() : gpu_executor(gpu_executor_config{}) {}
  /**
   * @param config backends' tuning, costs, forced backend, streams
   * @throw strata::invalid_argument for a non-positive descriptor time or negative CPU weight, a
   *        `device` that does not exist, or a configured stream of another device
   */
  explicit gpu_executor(gpu_executor_config config) : state_{std::make_unique<state>(std::move(config))}
  {
    if (state_->config.device) {
      detail::require_device(*state_->config.device, "gpu_executor");
      state_->device = *state_->config.device;
    } else if (int d = 0; cudaGetDevice(&d) == cudaSuccess) {
      state_->device = d;
    } else {
      (void)cudaGetLastError();  // no GPU: refused at the first call that needs one
    }
    for (auto const& given : {state_->config.load_stream, state_->config.copy_stream}) {
      if (given && state_->device >= 0 && !detail::is_default_stream(given->get())) {
        int of_stream = 0;
        STRATA_CUDA_TRY(cudaStreamGetDevice(given->get(), &of_stream));
        STRATA_EXPECTS(of_stream == state_->device, "gpu_executor: a configured stream belongs to device ", of_stream,
                       ", the executor copies on device ", state_->device);
      }
    }
    STRATA_EXPECTS(state_->config.dma_descriptor_us > 0 && state_->config.cpu_weight >= 0,
                   "gpu_executor: dma_descriptor_us must be positive and cpu_weight not negative (got ",
                   state_->config.dma_descriptor_us, ", ", state_->config.cpu_weight, ")");
    STRATA_EXPECTS(state_->config.record_staging_bytes > 0, "gpu_executor: record_staging_bytes must be positive (got ",
                   state_->config.record_staging_bytes, ")");
  }
  gpu_executor(gpu_executor&&) noexcept = default;
  gpu_executor& operator=(gpu_executor&&) noexcept = default;
  gpu_executor(gpu_executor const&) = delete;
  gpu_executor& operator=(gpu_executor const&) = delete;
  ~gpu_executor() = default;

  /**
   * @brief What the GPU does meanwhile, for the choice of later transfers: `prefill` (GEMM-bound),
   *        `decode` (memory-bound) or `idle`, and for how long (ms; 0: assume as long as the
   *        transfer itself, a balanced batch). Any thread.
   */
  void set_activity(gpu_activity activity, double compute_ms = 0) noexcept
  {
    state_->activity.store(activity, std::memory_order_relaxed);
    state_->compute_ms.store(compute_ms > 0 ? compute_ms : 0, std::memory_order_relaxed);
  }
  /**
   * @brief Readies the executor for its first transfer and puts its cost tables to this machine:
   *        makes its streams and backends, loads the copy kernels of `tiers`' layouts, then moves
   *        `scratch_bytes` of pages between scratch buffers of its own (none of the tiers' memory)
   *        with `gpu_assisted` and `dma_batch`, both ways, and scales the load and copy tables to
   *        the measured rates (the marginal rate: the extra bytes of the whole scratch over half of
   *        it by the extra time; every activity's rate by measured over the table's idle rate;
   *        `staged`, the same copy engine, as `dma_batch`) and `dma_descriptor_us` to the measured
   *        enqueue time. The tables' shape (what each activity costs) stays the H200's, their level
   *        becomes this link's. About 10–30 ms, plus the wait for the transfers in flight, which it
   *        lets land first; a `submit` meanwhile (another thread) waits for it. Best called before
   *        the first transfer (the controller's `executor()`). The scratch holds at least 2 pages.
   * @throw what CUDA throws
   */
  template <class Tiers>
  gpu_calibration warm_up(Tiers const& tiers, std::int64_t scratch_bytes = std::int64_t{64} << 20);

  /// @brief The device it copies on (-1 when none was current at construction and none was named).
  [[nodiscard]] int device() const noexcept { return state_->device; }

  /// @brief The activity last set.
  [[nodiscard]] gpu_activity activity() const noexcept { return state_->activity.load(std::memory_order_relaxed); }

  /**
   * @brief Starts every order (see the class comment for streams and handles).
   * @return one handle for the whole submission; failed (never throws) when it was refused
   */
  template <class Tiers>
  handle_type submit(Tiers& tiers, std::span<copy_order const> orders, copy_kind kind, stream_type stream = {})
  {
    state& st = *state_;
    layer_range const all = layer_range::all(tiers.geometry());
    try {
      std::lock_guard const serial{st.serial};
      device_scope const on{st.bound()};
      check_stream(stream);
      cuda_parts& cp = st.parts();
      cudaStream_t const s = kind == copy_kind::load ? cp.load_stream : cp.copy_stream;
      if (stream.get() != s) {  // after the caller's work, without holding the caller's later work back
        STRATA_CUDA_TRY(cudaEventRecord(cp.order.get(), stream.get()));
        STRATA_CUDA_TRY(cudaStreamWaitEvent(s, cp.order.get(), 0));
      }
      bool seen[tier_count][tier_count]{};
      int directions = 0;
      for (auto const& o : orders) {
        bool& b = seen[std::size_t(o.from)][std::size_t(o.to)];
        directions += b ? 0 : 1;
        b = true;
      }
      handle_type last;  // the last direction on the GPU: same stream, so it covers the earlier ones
      auto io = std::make_shared<detail::record_io>();    // record I/O off this thread
      std::vector<std::function<void()>> device_records;  // record <-> device, in order, on a record thread
      tier record_tier = tier::file;
      try {
        detail::for_each_direction(tiers, orders, [&](auto& src, auto& dst, detail::direction const& d) {
          std::span<page_pair const> const pairs{d.pairs};
          using S = std::remove_cvref_t<decltype(src)>;
          using D = std::remove_cvref_t<decltype(dst)>;
          if constexpr (addressable_store<S> && addressable_store<D>) {
            copy_plan const plan{src.layout(), dst.layout(), pairs, all};
            last = issue(plan, kind, s, directions == 1);
          } else if constexpr (record_store<S> && addressable_store<D>) {
            if constexpr (D::kind != tier::device && detail::holds_records<D>()) {  // in place, on the store's queues
              io->read(src, detail::record_legs::in_place(pairs, dst.layout(), true), d, "gpu_executor");
            } else {
              record_tier = S::kind;
              device_records.push_back([&rt = record_thread(kind), &st, &src, &dst, d, kind, s] {
                rt.load(src, dst, d, s, chunk_enqueuer{&st, kind});
              });
            }
          } else if constexpr (addressable_store<S> && record_store<D>) {
            if constexpr (S::kind != tier::device && detail::holds_records<S>()) {
              io->write(dst, detail::record_legs::in_place(pairs, src.layout(), false), d, "gpu_executor");
            } else {
              record_tier = D::kind;
              device_records.push_back([&rt = record_thread(kind), &st, &src, &dst, d, kind, s] {
                rt.store(src, dst, d, s, chunk_enqueuer{&st, kind});
              });
            }
          } else {
            STRATA_EXPECTS(false, "gpu_executor: no copy between the ", to_string(S::kind), " and ", to_string(D::kind),
                           " tiers (each needs a layout or records)");
          }
        });
        // Posted after every direction this thread issued: its events, recorded on the same stream
        // after its last copy, cover them too.
        if (!device_records.empty()) {
          last = start_records(record_thread(kind), std::move(device_records), record_tier, kind, s, all, *io);
        }
      } catch (invalid_argument const&) {
        (void)io->poll(true);  // what started must end before the index frees its pages
        if (directions > 1) { (void)cudaStreamSynchronize(s); }  // an earlier direction may be in flight
        throw;
      } catch (...) {
        (void)io->poll(true);
        (void)cudaStreamSynchronize(s);
        (void)cudaGetLastError();
        throw;
      }
      if (!io->empty()) {
        try {
          return with_records(std::move(last), all, io);
        } catch (...) {  // no memory for the handle's parts: the I/O started must end first
          (void)io->poll(true);
          (void)cudaStreamSynchronize(s);
          (void)cudaGetLastError();
          throw;
        }
      }
      return last.valid() ? last : failed_handle(all, nullptr);
    } catch (...) {
      ++st.failed;
      return failed_handle(all, std::current_exception());
    }
  }

  /**
   * @brief Throws unless `stream` can order this executor's copies: a stream of the executor's
   *        device, or a default stream (legacy or per-thread), which means the executor's device's
   *        whichever device the calling thread has current (as PyTorch's default stream of a
   *        device is handle 0: the executor makes its device current to use it, and so does
   *        `transfer_handle::wait_layer` for the handles it returns). The controller calls it
   *        before it changes anything.
   * @throw strata::invalid_argument naming both devices
   */
  void check_stream(stream_type stream) const
  {
    cudaStream_t const raw = stream.get();
    int const served = state_->bound();
    if (detail::is_default_stream(raw)) { return; }
    int of_stream = 0;
    STRATA_CUDA_TRY(cudaStreamGetDevice(raw, &of_stream));
    STRATA_EXPECTS(of_stream == served, "gpu_executor: the stream belongs to device ", of_stream,
                   ", the executor copies on device ", served);
  }

  /// @brief `done` once every copy landed, `failed` if enqueueing failed or a CUDA error surfaced,
  ///        else `pending`. An empty handle is done. Never blocks; any thread.
  [[nodiscard]] copy_status status(handle_type const& h) const noexcept
  {
    if (!h.valid()) { return copy_status::done; }
    if (h.failed()) { return copy_status::failed; }
    try {
      return h.done() ? copy_status::done : copy_status::pending;
    } catch (...) {
      return copy_status::failed;
    }
  }

  /// @brief The record pages a failed submission lost (`records_unread` made it fail); empty for
  ///        any other failure (a CUDA error, a refused plan: the records were not at fault).
  [[nodiscard]] std::vector<lost_record> lost(handle_type const& h) const
  { return detail::lost_records(h.valid() ? h.error() : nullptr); }

  /// @brief Blocks until every transfer issued so far has landed, record I/O included (tests,
  ///        shutdown). Any thread.
  void synchronize() const
  {
    state& st = *state_;
    st.records.wait_all();
    if (!st.cuda) { return; }
    device_scope const on{st.device};
    if (st.cuda->thread) { st.cuda->thread->drain(); }
    std::array<transfer_handle, 2> threaded;
    {
      std::lock_guard lock{st.cuda->threaded_mutex};  // `issue` replaces them (under the caller's lock, not ours)
      threaded = st.cuda->threaded;
    }
    for (auto const& h : threaded) {
      if (h.valid() && !h.failed()) { h.synchronize(); }
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(st.cuda->load_stream));
    STRATA_CUDA_TRY(cudaStreamSynchronize(st.cuda->copy_stream));
  }

  /// @brief The backend the choice picks for `bytes` in blocks of `block_bytes` (what `submit` does
  ///        per direction), for reports and tests. @param records whether `staged` can move it
  [[nodiscard]] gpu_backend choose(copy_kind kind, double bytes, double block_bytes, bool records = true) const
  { return state_->choose(kind, bytes, block_bytes, records); }

  /// @brief Transfers issued so far. Any thread.
  [[nodiscard]] gpu_executor_stats stats() const noexcept
  {
    gpu_executor_stats s;
    for (std::size_t k = 0; k < 2; ++k) {
      for (std::size_t b = 0; b < gpu_backend_count; ++b) {
        s.transfers[k][b] = state_->transfers[k][b].load(std::memory_order_relaxed);
        s.bytes[k][b] = state_->bytes[k][b].load(std::memory_order_relaxed);
      }
    }
    s.failed_submissions = state_->failed.load(std::memory_order_relaxed);
    s.dma_descriptor_us = state_->dma_cost.us();
    return s;
  }
  /// @brief The settings.
  [[nodiscard]] gpu_executor_config const& config() const noexcept { return state_->config; }
  /// @brief The stream loads are issued on (created on first use, on the executor's device), but
  ///        for those `dma_batch` makes on the submit thread's streams.
  [[nodiscard]] cuda::stream_ref load_stream()
  {
    device_scope const on{state_->bound()};
    return state_->parts().load_stream;
  }
  /// @brief The stream backups and demotions are issued on (created on first use, on the executor's
  ///        device), but for those `dma_batch` makes on the submit thread's streams.
  [[nodiscard]] cuda::stream_ref copy_stream()
  {
    device_scope const on{state_->bound()};
    return state_->parts().copy_stream;
  }

 private:
  using cuda_parts = detail::gpu_cuda_parts;
  using state = detail::gpu_executor_state;

  /// `last` (or, when no GPU copy was issued, a handle of its own) finishing once `io` has: the
  /// stores' queues and the record threads move the records; the handle's `done` polls them. A
  /// failure is reported only once what `last` enqueued has landed (nothing of it moves then).
  handle_type with_records(handle_type last, layer_range all, std::shared_ptr<detail::record_io> io)
  {
    if (!last.valid()) {
      last = transfer_handle{all, completion::whole};  // an event never recorded: done once `io` is
      last.mark_recorded(last.events().size());
    }
    state_->records.add(io);
    std::vector<cudaEvent_t> const events(last.events().begin(), last.events().end());  // owned by the handle
    last.set_host_part([io, events](bool block) {
      io_status const r = io->poll(block);
      if (r == io_status::failed) {
        for (auto e : events) {  // recorded by now, or never (an unrecorded event is complete)
          if (cudaEventSynchronize(e) != cudaSuccess) { (void)cudaGetLastError(); }
        }
        std::rethrow_exception(io->error());
      }
      return r == io_status::succeeded;
    });
    return last;
  }

  /// The record thread of `kind`'s copies, started at first use on the executor's device.
  detail::gpu_record_thread& record_thread(copy_kind kind)
  {
    state& st = *state_;
    auto& t = st.cuda->records[kind == copy_kind::load ? 0 : 1];
    if (!t) {
      auto const& c = st.config;
      t = std::make_unique<detail::gpu_record_thread>(st.cuda->device, c.record_staging_bytes,
                                                      kind == copy_kind::load ? c.load_kernel : c.copy_kernel,
                                                      st.dma_config(), c.staged);
    }
    return *t;
  }

  /// Starts `parts` (record <-> device directions) in order on `thread`, as a job of `io`; returns
  /// the submission's handle, whose events the job records on `s` after its last copy. A part that
  /// fails ends the job: what it enqueued lands first (nothing of the submission moves once it is
  /// reported failed).
  static handle_type start_records(detail::gpu_record_thread& thread, std::vector<std::function<void()>> parts,
                                   tier record_tier, copy_kind kind, cudaStream_t s, layer_range all,
                                   detail::record_io& io)
  {
    handle_type h{all, kind == copy_kind::load ? completion::per_layer : completion::whole};
    io.run(
        thread.pool(), kind == copy_kind::load, record_tier,
        [&thread, parts = std::move(parts), h, s] {
          try {
            thread.bind();
            for (auto const& p : parts) {
              p();
            }
            for (auto e : h.events()) {
              STRATA_CUDA_TRY(cudaEventRecord(e, s));
            }
          } catch (...) {
            if (cudaStreamSynchronize(s) != cudaSuccess) { (void)cudaGetLastError(); }
            throw;
          }
          h.mark_recorded(h.events().size());
        },
        "gpu_executor");
    return h;
  }

  /// What a record thread copies a chunk with: a backend chosen as for any transfer of `kind`
  /// (the thread's own instances), counted in the stats.
  struct chunk_enqueuer {
    state* st;
    copy_kind kind;
    template <kv_layout Src, kv_layout Dst>
    void operator()(copy_plan<Src, Dst> const& plan, cudaStream_t s, detail::gpu_backend_set& set) const
    {
      validate(plan);
      gpu_backend b = st->config.force.value_or(gpu_backend::gpu_assisted);
      if (!st->config.force) {
        b = st->choose(kind, double(plan.bytes()), st->descriptor_bytes(plan), true);
        st->chose(b);
      }
      switch (b) {
        case gpu_backend::gpu_assisted:
          std::get<gpu_assisted>(set).enqueue(plan, s, {});
          break;
        case gpu_backend::dma_batch:
          std::get<dma_batch>(set).enqueue(plan, s, {});
          break;
        case gpu_backend::staged:
          std::get<staged>(set).enqueue(plan, s, {});
          break;
      }
      std::size_t const k = kind == copy_kind::load ? 0 : 1;
      st->transfers[k][std::size_t(b)].fetch_add(1, std::memory_order_relaxed);
      st->bytes[k][std::size_t(b)].fetch_add(plan.bytes(), std::memory_order_relaxed);
    }
  };

  template <kv_layout Src, kv_layout Dst>
  transfer_handle issue(copy_plan<Src, Dst> const& plan, copy_kind kind, cudaStream_t s, bool alone)
  {
    validate(plan);
    state& st = *state_;
    cuda_parts& cp = *st.cuda;
    constexpr bool records = record_layout<Src> || record_layout<Dst>;
    gpu_backend b = st.config.force.value_or(gpu_backend::gpu_assisted);
    if (!st.config.force || (b == gpu_backend::staged && !records)) {
      b = st.choose(kind, double(plan.bytes()), st.descriptor_bytes(plan), records);
      st.chose(b);
    }
    completion const c = kind == copy_kind::load ? completion::per_layer : completion::whole;
    detail::gpu_backend_set& set = kind == copy_kind::load ? cp.load : cp.copy;
    std::size_t const k = kind == copy_kind::load ? 0 : 1;
    transfer_handle h;
    switch (b) {
      case gpu_backend::gpu_assisted:
        h = strata::submit(std::get<gpu_assisted>(set), plan, s, c);
        break;
      case gpu_backend::dma_batch:
        if (cp.thread && alone) {
          h = cp.thread->submit(std::get<dma_batch>(set), plan, s, c,
                                kind == copy_kind::load ? transfer_kind::load : transfer_kind::backup);
          std::lock_guard lock{cp.threaded_mutex};
          cp.threaded[k] = h;
        } else {
          h = strata::submit(cp.direct, plan, s, c);
        }
        break;
      case gpu_backend::staged:
        if constexpr (records) {
          h = strata::submit(std::get<staged>(set), plan, s, c);
        } else {
          STRATA_EXPECTS(false, "gpu_executor: staged needs a record layout on one side");
        }
        break;
    }
    st.transfers[k][std::size_t(b)].fetch_add(1, std::memory_order_relaxed);
    st.bytes[k][std::size_t(b)].fetch_add(plan.bytes(), std::memory_order_relaxed);
    return h;
  }

  static transfer_handle failed_handle(layer_range layers, std::exception_ptr e)
  {
    if (!e) { e = std::make_exception_ptr(invalid_argument("strata: gpu_executor: nothing to copy")); }
    // No CUDA call here: after a sticky error, creating events would throw out of `submit`.
    return transfer_handle::failed_before_start(layers.size() > 0 ? layers : layer_range{0, 1}, std::move(e));
  }

  std::unique_ptr<state> state_;
};
}  // namespace strata

#include <strata/cache/detail/gpu_warm_up.inl>

namespace strata {

static_assert(copy_executor<gpu_executor, tier_stack<device_pool<layer_first>, pinned_host_pool>>);
static_assert(copy_executor<gpu_executor, tier_stack<device_pool<layer_first>, pinned_host_pool, file_store&>>);

static_assert(stream_checked_executor<gpu_executor>);
static_assert(loss_reporting_executor<gpu_executor>);

}  // namespace strata
