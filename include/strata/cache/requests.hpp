// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/requests.hpp
 * @brief What an engine hands the cache controller and gets back: its settings, a request, the
 *        budget of a round, the handle of a batch's loads, what `finish_prefill` found, and the
 *        counters. Host-only; every type here is a plain value.
 */
#pragma once

#include <strata/sched/cost_model.hpp>
#include <strata/sched/scheduler.hpp>
#include <strata/types.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace strata {

/// @brief What a waiting request does while its prefix moves from the file (or remote) tier up to
///        the host (`controller_options::prefetch`).
enum class prefetch_mode {
  off,            ///< no prefetch: a load reads the lower tier when the request starts
  best_effort,    ///< prefetch at `submit`; the scheduler may start the request at once (what has
                  ///< not landed then is read from below: twice, beside the prefetch still reading it)
  wait_complete,  ///< prefetch at `submit`; the scheduler sees the request only once it has landed
                  ///< (the default: a prefix on its way up is waited for, never read twice)
  timeout,        ///< as `wait_complete`, for at most `prefetch_timeout_s`
};

/// @brief Settings of a `cache_controller` (defaults work out of the box).
struct controller_options {
  /// When device pages are backed up to the host: as soon as they are cached (`write_through`, the
  /// default), after `selective_hits` hits, or when they leave the device (`write_back`).
  write_policy backup_policy = write_policy::write_through;
  /// When host pages are copied to the file tier: as soon as they are on the host (`write_through`,
  /// the default: copied ahead of need in the background, so reclaiming host memory later drops a
  /// page at once instead of waiting for its write; what the host holds survives a restart), on
  /// host eviction (`write_back`: the write stands between reclamation and the freed page), or
  /// after `selective_hits` hits.
  write_policy file_backup_policy = write_policy::write_through;
  /// When host pages are copied to the remote tier: as soon as they are on the host
  /// (`write_through`, the default: other instances find a prefix as soon as one computed it), or
  /// when they leave the tier above (`write_back`).
  write_policy remote_backup_policy = write_policy::write_through;
  /// Prefetch of a submitted request's prefix from the file or remote tier into the host tier, on
  /// the record store's own I/O threads (`submit` returns at once). `wait_complete`, the default,
  /// holds the request until it landed: starting it at once (`best_effort`) would read the same
  /// pages from below a second time, while the prefetch still reads them (3.3 s instead of 1.25 s
  /// for a 32K-token document on the H200, docs/benchmarks.md).
  prefetch_mode prefetch = prefetch_mode::wait_complete;
  double prefetch_timeout_s = 0.05;  ///< how long `prefetch_mode::timeout` holds a request back
  /// Seconds on the engine's clock, for the prefetch timeout (empty: `std::chrono::steady_clock`;
  /// the simulator passes virtual time).
  std::function<double()> clock{};
  std::int64_t selective_hits = 2;     ///< hits before a `write_through_selective` backup
  std::int64_t delay_hit_tokens = 64;  ///< shortest prefix worth waiting for (delay hits)
  /// The scheduler's cost model (empty: `h200::costs_for(geometry)`, H200 figures, with the rates
  /// an engine set on the empty model through `set_file_tier`, `set_remote_tier`, `set_host_link`).
  cost_model costs{};
  /// The ids given to `submit` are one per page (the simulator's compact index), not token ids.
  bool ids_are_pages = false;
  /// Device pages are taken chunk by chunk, as SGLang and vLLM allocate them: each chunk's
  /// `begin_loads` adds the pages it computes into to the page table (the last chunk, the output's
  /// too), so a long prompt starts without all of its pages free. A request starts only if its
  /// whole page table fits beside those of the prefills under way (so every started prefill can
  /// finish), and one that lacks pages for its next chunk holds new requests back. Engines then
  /// read `page_table` after every `begin_loads`. false (the default): a request's first chunk takes
  /// all of its pages; in the simulator chunk by chunk changed strata's mean and p99 TTFT by
  /// less than 2% (docs/simulation.md, "Device pages chunk by chunk").
  bool device_pages_by_chunk = false;
  /// Copy into a record tier (file, remote) only the pages a later read of them would pay for: a
  /// read saves more than their write and read cost (`cost_model::record_breakeven_tokens`; on the
  /// H200 machine's 1.92 GB/s disk, pages beyond ~82K tokens into a Llama-3.1-8B prompt), with the
  /// shallower pages of their prompt they are found through (a restart, another instance). false:
  /// every page the write policies send (a mirror that survives restarts whatever it costs to
  /// read); the plans still choose per request whether to read it.
  bool records_by_cost = true;
  /// What a record tier (file, remote) may have on its way in at once, in seconds of its write
  /// bandwidth (`costs.write_bytes_per_s`: 1 s is 2.9 GB on the H200 machine's disk, 12 GB on a
  /// PCIe 5 drive; at least one node is always admitted). A write past it is dropped, not queued
  /// where its pinned source pages would wait for a tier that cannot keep up
  /// (`hiradix_stats::writes_dropped`); 0: no bound.
  double record_write_backlog_s = 1.0;
};

/// @brief A request for `submit`.
struct cache_request {
  request_id id{};                       ///< the engine's id (unique among live requests)
  std::span<std::int32_t const> tokens;  ///< prompt token ids (one id per page with `ids_are_pages`); copied
  /// Prompt tokens: 0 means `tokens.size()` (token ids); with `ids_are_pages`, the prompt's length
  /// (its partial last page, which is never cached, included).
  std::int64_t prompt_tokens = 0;
  std::int64_t max_new_tokens = 1;  ///< output tokens the page table reserves room for
  double arrival_s = 0;             ///< for strategies that age requests
};

/// @brief What `schedule` may use, and what runs beside it.
struct schedule_budget {
  std::int64_t tokens = 8192;               ///< most prefill tokens in the batch
  std::int64_t running_sequences = 0;       ///< requests decoding (for bubble filling)
  std::int64_t running_context_tokens = 0;  ///< their context
  std::int64_t running_max_remaining = 0;   ///< most decode steps any of them still needs
};

/// @brief A request whose first chunk `begin_loads` started.
struct started_request {
  request_id id{};
  /// Prompt pages found cached, by the tier they came from ([device]: already there).
  std::array<std::int64_t, tier_count> cached_pages{};
};

/**
 * @brief The loads of one batch and what the batch runs. Wait per layer with the free function
 *        `wait_layer(handle, layer, stream)` (the executor's: `cache/policies.hpp` on the CPU,
 *        `cache/gpu_policies.cuh` on the GPU); finish with `cache_controller::complete` (or `poll`).
 * @tparam Handle the executor's handle type
 */
template <class Handle>
struct load_handle {
  std::uint64_t round = 0;                              ///< the plan it executes
  std::vector<prefill_item> ran;                        ///< items that run (started or continued)
  std::vector<prefill_item> skipped;                    ///< chunks that could not run (see `begin_loads`)
  std::vector<started_request> started;                 ///< first chunks started, with their hits
  std::array<std::int64_t, tier_count> loaded_pages{};  ///< pages the loads bring, per source tier
  std::optional<Handle> transfer;                       ///< the executor's submission (none: no loads)
  /// Earlier batches' loads still filling pages this batch reads (their prefixes were on their way
  /// to the device): wait for them as for `transfer`.
  std::vector<Handle> after;
  std::uint64_t submission = 0;  ///< the controller's number for it
  [[nodiscard]] bool has_loads() const noexcept { return transfer.has_value(); }
};

/// @brief What `finish_prefill` found.
/// @tparam Handle the executor's handle type
template <class Handle>
struct prefill_result {
  /// Whole-page positions of the prompt that the request computed although the index already held
  /// them when it committed (another request computed the same pages meanwhile): the page table now
  /// points at the index's copy and the request's own page was freed.
  std::vector<std::int64_t> duplicate_positions;
  /// Loads still filling pages the page table now points at (duplicates swapped for pages another
  /// batch is loading): wait for them before reading the table.
  std::vector<Handle> after;
};

/// @brief Counters since construction.
struct cache_stats {
  std::array<std::int64_t, tier_count> hit_tokens{};  ///< prompt tokens found cached, by the tier they came from
  std::int64_t computed_tokens = 0;                   ///< prompt tokens planned for compute
  /// Bytes moved, [from][to] tier.
  std::array<std::array<std::int64_t, tier_count>, tier_count> bytes_moved{};
  std::array<std::int64_t, 5> deferrals{};               ///< by `deferral_reason`
  std::array<std::int64_t, tier_count> evicted_pages{};  ///< pages evicted from each tier
  std::int64_t submitted = 0;                            ///< requests submitted
  std::int64_t released = 0;                             ///< requests released (finished or aborted)
  std::int64_t failed_transfers = 0;                     ///< submissions that failed (their pages recomputed)
  std::int64_t requeued = 0;                             ///< requests sent back to wait by a failed load
  /// Pages whose copy in a record store (file, remote) failed to read back: dropped from the index,
  /// with every page cached only below them (their prefixes are recomputed).
  std::int64_t discarded_pages = 0;
  std::int64_t prefetched_pages = 0;   ///< pages copied up to the host tier for waiting requests (submitted)
  std::int64_t prefetch_waits = 0;     ///< rounds a request was held back for its prefetch
  std::int64_t prefetch_timeouts = 0;  ///< requests that stopped waiting for their prefetch (`prefetch_mode::timeout`)
  /// Pages below the host a prefetch left there for good: the host had no room for them after
  /// three tries.
  std::int64_t prefetch_abandoned_pages = 0;
  /// Pages below the host not prefetched because recomputing them is predicted faster than reading.
  std::int64_t prefetch_not_worth_pages = 0;
  /// Cached pages (in record tiers) the plans chose to recompute instead of reading
  /// (`choose_prefix`: a slow tier), and the predicted seconds of reading them and of recomputing
  /// them instead: why a file tier is written but not read.
  std::int64_t recomputed_pages = 0;
  double recomputed_read_s = 0;
  double recomputed_compute_s = 0;
  /// Pages kept out of each record tier because reading them back would not beat recomputing them,
  /// and pages not written because the tier's write backlog was full (it could not keep up), per tier.
  std::array<std::int64_t, tier_count> writes_not_worth{};
  std::array<std::int64_t, tier_count> writes_dropped{};
  /// File-tier pages the index learned at construction from records kept across a restart
  /// (`file_store::open`); `restore_dropped` counts the records it could not place (no chain to a
  /// first page, another page size, a duplicate): their slots are reused.
  std::int64_t restored_pages = 0;
  std::int64_t restore_dropped = 0;
  /// A remote tier over a shared store (`remote_tier`): prompts asked about, leading pages the
  /// store held beyond what this controller knew (adopted as remote-resident: other instances
  /// computed them), and rounds a request was held back for its lookup.
  std::int64_t remote_lookups = 0;
  std::int64_t remote_found_pages = 0;
  std::int64_t remote_lookup_waits = 0;
};

}  // namespace strata
