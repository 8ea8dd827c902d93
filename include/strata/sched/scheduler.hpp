// SPDX-License-Identifier: Apache-2.0
/**
 * @file sched/scheduler.hpp
 * @brief What a scheduler strategy sees (waiting requests, the prefix index, running decodes, costs)
 *        and what it returns (a batch plan); the `scheduler_strategy` concept.
 */
#pragma once

#include <strata/index/hiradix_tree.hpp>
#include <strata/sched/cost_model.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace strata {

/// @brief A request waiting for (the rest of) its prefill.
struct waiting_request {
  request_id id{};
  /// Which submission of `id` this is (an engine may submit an id again once it released it): what
  /// a strategy keeps of a request across rounds is keyed by both (the controller numbers them).
  std::uint64_t submission = 0;
  double arrival_s = 0;                  ///< arrival time
  std::span<std::int32_t const> tokens;  ///< what the index holds: token ids, or one id per page
  std::int64_t prompt_tokens = 0;        ///< tokens to prefill in all
  std::int64_t output_tokens = 0;        ///< tokens to generate
  std::int64_t prefilled_tokens = 0;     ///< tokens already cached or computed (prefill under way)
  std::int64_t cached_tokens = 0;        ///< tokens found cached when its prefill started
  /// Device pages its page table holds (prefill under way): its cached prefix and the pages of the
  /// chunks that ran (`scheduler_view::pages_by_chunk`; all of them otherwise).
  std::int64_t table_pages = 0;
  bool started = false;             ///< its first chunk ran (loads done, device pages held)
  int deferrals = 0;                ///< rounds it was passed over
  bool delay_hit_deferred = false;  ///< last passed over for a delay hit: goes first next round
};

/// @brief Why a request was passed over this round.
enum class deferral_reason {
  delay_hit,  ///< another request computes its prefix: it runs as a hit once that commits
  balance,    ///< its load would make the batch load-bound: waits for compute to hide it under
  memory,     ///< not enough device pages now
  budget,     ///< the token budget is spent
  changed,    ///< what it found cached changed while the batch was formed: sized again next round
};

/// @brief One prefill (or one chunk of it) in a batch.
struct prefill_item {
  std::size_t index = 0;                              ///< position in the view's waiting list
  request_id id{};                                    ///< the request
  std::int64_t chunk_tokens = 0;                      ///< tokens computed this round
  std::int64_t context_tokens = 0;                    ///< tokens before the chunk (cached or computed)
  std::int64_t cached_tokens = 0;                     ///< prefix found cached (first chunk)
  std::array<std::int64_t, tier_count> load_pages{};  ///< pages to load from each tier (first chunk)
  std::int64_t new_pages = 0;                         ///< device pages the chunk adds to its page table
  bool first_chunk = false;                           ///< its loads run now
  bool last_chunk = false;                            ///< its first token comes out of this batch
  node_ref cached_node{};  ///< deepest cached node (first chunk), ending where the prefix ends: set by the final match
  /// First chunk: the whole pages of the prompt its cached prefix is taken from (-1: all). Fewer
  /// when recomputing the part cached only in record tiers (file, remote) is predicted faster than
  /// reading it (`choose_prefix`); those pages are computed, and cached on the device afterwards.
  std::int64_t prefix_pages = -1;
  /// First chunk, optional: the strategy's memo of the probe the item was sized from (kept across
  /// rounds); `match_plan` then follows its path where it is unchanged instead of comparing tokens.
  /// It belongs to the strategy: valid until its next `schedule`.
  probe_memo* probe = nullptr;
};

/// @brief A request passed over.
struct deferral {
  std::size_t index = 0;  ///< position in the view's waiting list
  request_id id{};
  deferral_reason reason{};
  request_id waiting_for{};  ///< the request computing its prefix (delay hits)
};

/// @brief What runs next.
struct batch_plan {
  std::vector<prefill_item> prefills;
  std::vector<deferral> deferred;
  std::int64_t bubble_decode_steps = 0;  ///< decode steps to run while the batch waits for its loads
  double predicted_load_s = 0;           ///< loads of the batch's first chunks
  /// Of `predicted_load_s`, what precedes the compute (`cost_model::serial_load_s`: record reads)
  double predicted_serial_load_s = 0;
  double predicted_compute_s = 0;  ///< compute of all its chunks
  std::uint64_t round = 0;         ///< which `cache_controller::schedule` made it (0: none)
  [[nodiscard]] std::int64_t tokens() const noexcept
  {
    std::int64_t n = 0;
    for (auto const& p : prefills) {
      n += p.chunk_tokens;
    }
    return n;
  }
};

/**
 * @brief The state a strategy decides on. The engine (or the simulator) fills it each round.
 */
struct scheduler_view {
  std::span<waiting_request const> waiting;  ///< in arrival order
  /// The prefix index, read-only: strategies `probe` it. The final plan is matched (a use of the
  /// cache, and the splits that make `prefill_item::cached_node` end where each prefix ends) by
  /// whoever owns the index, after the strategy: `plan_batch`.
  hiradix_tree const* tree = nullptr;
  cost_model const* costs = nullptr;        ///< predictions
  std::int64_t page_tokens = 32;            ///< real tokens per page
  std::int64_t token_budget = 8192;         ///< most tokens computed per batch
  std::int64_t device_pages_available = 0;  ///< free device pages plus those eviction could free
  /// Device pages no prefill under way has reserved: the pool's size less the whole page tables
  /// (held or still to come) of the requests with chunks left. With `pages_by_chunk` a request
  /// starts only if its whole table fits here, so every prefill started can finish, whatever else
  /// runs (the default: no bound).
  std::int64_t device_pages_unreserved = std::numeric_limits<std::int64_t>::max();
  /// Each chunk takes the device pages it computes into (the last one, the output's too), as SGLang
  /// and vLLM allocate (`controller_options::device_pages_by_chunk`); false: a request's first
  /// chunk takes all of its pages.
  bool pages_by_chunk = false;
  std::int64_t running_sequences = 0;       ///< requests decoding
  std::int64_t running_context_tokens = 0;  ///< their context
  std::int64_t running_max_remaining = 0;   ///< most decode steps any of them still needs
};

/**
 * @brief A scheduling policy: `s.schedule(view)` proposes the next batch plan from probes of the
 *        index (it cannot change the index); `S::name` names it; `s.uses_transient_nodes()` says
 *        whether the engine marks waiting requests' prefixes as transient in the index (needed for
 *        delay hits). `plan_batch` (sched/toolkit.hpp) matches the proposal against the index.
 */
template <class S>
concept scheduler_strategy = requires(S& s, scheduler_view const& v) {
  { s.schedule(v) } -> std::same_as<batch_plan>;
  { S::name } -> std::convertible_to<char const*>;
  { s.uses_transient_nodes() } -> std::convertible_to<bool>;
};

/**
 * @brief A strategy that completes its plan once it has been matched: `s.finish_plan(view, plan)`
 *        sees the items that stayed (matching drops an item whose cached prefix changed while the
 *        plan was formed) with their final predictions, e.g. to size decode steps for the batch's
 *        I/O stall or to keep its own accounts of the work it planned.
 */
template <class S>
concept plan_finishing_strategy = scheduler_strategy<S> && requires(S& s, scheduler_view const& v, batch_plan& p) {
  { s.finish_plan(v, p) } -> std::same_as<void>;
};

}  // namespace strata
