/**
 * @file sim/workload.hpp
 * @brief Seeded workload generators (long documents with questions, short chat, multi-turn sessions)
 *        and trace replay, as request streams for the simulator.
 *
 * A request's prompt is a sequence of page ids: one int32 per whole page of tokens (equal pages,
 * equal ids), so a 100K-token prompt is 3,125 ids and documents shared by many requests are stored
 * once. A partial last page is counted in `prompt_tokens` but never cached.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata::sim {

using page_ids = std::vector<std::int32_t>;

/// @brief One request of a workload.
struct sim_request {
  request_id id{};
  double arrival_s = 0;
  std::shared_ptr<page_ids const> shared;  ///< leading pages shared with other requests (document, history)
  page_ids own;                            ///< the request's own whole pages after them
  std::int64_t prompt_tokens = 0;          ///< all prompt tokens (whole pages and a partial tail)
  std::int64_t output_tokens = 1;          ///< tokens to generate (at least 1)
  /// Page ids of prompt + output, when a later request (the next turn) reuses the answer: the
  /// engine caches them when the request finishes. Empty: the answer is not cached.
  std::shared_ptr<page_ids const> continuation;
  /// Closed-loop sessions: when set, the request arrives `think_s` after request `after` finishes
  /// (`arrival_s` is then only an estimate, used to order the workload).
  request_id after{};
  double think_s = 0;

  /// @brief The prompt's whole pages.
  [[nodiscard]] page_ids pages() const
  {
    page_ids p;
    if (shared) { p.reserve(shared->size() + own.size()), p.insert(p.end(), shared->begin(), shared->end()); }
    p.insert(p.end(), own.begin(), own.end());
    return p;
  }
};

/// @brief A workload: requests sorted by arrival.
struct workload {
  std::string name;
  std::int64_t page_tokens = 32;
  std::vector<sim_request> requests;
};

/**
 * @brief Checks a workload before it is simulated: positive page size, unique non-zero ids, finite
 *        non-negative arrivals and think times, prompts of at least one token whose whole pages fit
 *        in them, at least one output token, and predecessors (`after`) earlier in the list (so no
 *        session waits on itself).
 * @throw strata::invalid_argument naming the first bad request
 */
inline void validate(workload const& w)
{
  STRATA_EXPECTS(w.page_tokens > 0, "workload ", w.name, ": page_tokens must be positive, got ", w.page_tokens);
  std::unordered_map<std::uint64_t, std::size_t> position;
  position.reserve(w.requests.size());
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    auto const& r = w.requests[i];
    STRATA_EXPECTS(r.id.value != 0 && position.emplace(r.id.value, i).second, "workload ", w.name, ": request id ",
                   r.id.value, r.id.value == 0 ? " is reserved" : " appears twice");
  }
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    auto const& r = w.requests[i];
    std::int64_t const pages = std::int64_t((r.shared ? r.shared->size() : 0) + r.own.size());
    STRATA_EXPECTS(std::isfinite(r.arrival_s) && r.arrival_s >= 0 && std::isfinite(r.think_s) && r.think_s >= 0,
                   "workload ", w.name, ": request ", r.id.value,
                   " has a negative or non-finite arrival or think time");
    STRATA_EXPECTS(r.prompt_tokens >= 1 && pages <= r.prompt_tokens / w.page_tokens, "workload ", w.name, ": request ",
                   r.id.value, " has ", r.prompt_tokens, " prompt tokens, fewer than its ", pages, " whole pages of ",
                   w.page_tokens);
    STRATA_EXPECTS(r.output_tokens >= 1, "workload ", w.name, ": request ", r.id.value,
                   " must generate at least one token, got ", r.output_tokens);
    auto const before = r.after.value == 0 ? position.end() : position.find(r.after.value);
    STRATA_EXPECTS(r.after.value == 0 || (before != position.end() && before->second < i), "workload ", w.name,
                   ": request ", r.id.value, " follows request ", r.after.value,
                   ", which is not earlier in the workload");
  }
}

namespace detail {
/// @brief 1 plus a Poisson draw of mean `mean - 1` (exactly 1 when `mean` is 1: a Poisson
///        distribution of mean 0 is undefined).
inline std::int64_t one_plus_poisson(double mean, std::mt19937_64& rng)
{ return mean > 1 ? 1 + std::poisson_distribution<std::int64_t>{mean - 1}(rng) : 1; }

/// @brief Hands out page ids: distinct contents get distinct ids.
class page_id_source {
 public:
  page_ids take(std::int64_t n)
  {
    page_ids v(static_cast<std::size_t>(n));
    for (auto& x : v) {
      x = next_++;
    }
    return v;
  }

 private:
  std::int32_t next_ = 1;
};
/// @brief Dense, collision-free page ids for chained page contents: the id of a page is a function
///        of its parent's id and its own content, assigned 1, 2, ... in order of first appearance.
///        The key holds the content itself, so two different prefixes never share an id.
class chained_page_ids {
 public:
  /// @brief The id of the page with content `content` after the page `parent` (0: the first page).
  /// @throw strata::invalid_argument when more distinct pages than int32 ids appear
  ///        `kind` keeps contents of different kinds (token ids, block ids) apart.
  std::int32_t child(std::int32_t parent, std::span<std::int64_t const> content, char kind = 't')
  {
    std::string key(1 + sizeof parent + content.size_bytes(), kind);
    std::memcpy(key.data() + 1, &parent, sizeof parent);
    std::memcpy(key.data() + 1 + sizeof parent, content.data(), content.size_bytes());
    auto const [it, fresh] = ids_.try_emplace(std::move(key), next_);
    if (fresh) {
      STRATA_EXPECTS(next_ < std::numeric_limits<std::int32_t>::max(), "replay: more than ",
                     std::numeric_limits<std::int32_t>::max() - 1, " distinct pages");
      ++next_;
    }
    return it->second;
  }
  /// @brief Distinct pages seen.
  [[nodiscard]] std::size_t size() const noexcept { return ids_.size(); }

 private:
  std::unordered_map<std::string, std::int32_t> ids_;
  std::int32_t next_ = 1;
};
inline std::int64_t lognormal_tokens(std::mt19937_64& rng, double mean, double sigma, std::int64_t lo, std::int64_t hi)
{
  double const mu = std::log(mean) - sigma * sigma / 2;
  double const x = std::lognormal_distribution<double>{mu, sigma}(rng);
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(x), lo, hi);
}
inline void finish(workload& w)
{
  std::stable_sort(w.requests.begin(), w.requests.end(),
                   [](sim_request const& a, sim_request const& b) { return a.arrival_s < b.arrival_s; });
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    w.requests[i].id = request_id{i + 1};
  }
}
}  // namespace detail

/// @brief Parameters of `long_documents`.
struct long_documents_options {
  std::int64_t requests = 1000;  ///< questions in all
  double rate = 1.0;             ///< requests per second (Poisson over visit bursts)
  std::uint64_t seed = 1;
  std::int64_t documents = 0;       ///< distinct documents (0: requests / 12, at least 8)
  std::int64_t min_tokens = 20000;  ///< document length range (LooGLE / NarrativeQA: 20K–100K)
  std::int64_t max_tokens = 100000;
  double questions_per_visit = 4;  ///< mean questions asked together about one document
  double burst_gap_s = 0.3;        ///< mean gap between questions of a visit
  double zipf = 1.0;               ///< popularity skew of documents (revisits)
  std::int64_t min_output = 8;     ///< answer length range: LooGLE / NarrativeQA answers are short
  std::int64_t max_output = 64;
  std::int64_t page_tokens = 32;
};

/**
 * @brief Long documents with several questions each (LooGLE- and NarrativeQA-like): documents of
 *        20K–100K tokens, visited in bursts of short questions (30–120 tokens, answers of 8–64);
 *        visits arrive as a Poisson process, documents chosen with Zipf popularity, so that bursts
 *        create delay hits and revisits hit whatever tier the document was evicted to.
 */
inline workload long_documents(long_documents_options const& o)
{
  STRATA_EXPECTS(o.requests > 0, "long_documents: requests must be positive, got ", o.requests);
  STRATA_EXPECTS(o.rate > 0, "long_documents: rate must be positive, got ", o.rate);
  STRATA_EXPECTS(o.min_tokens > 0 && o.min_tokens <= o.max_tokens, "long_documents: bad token range [", o.min_tokens,
                 ", ", o.max_tokens, "]");
  STRATA_EXPECTS(o.questions_per_visit >= 1 && o.burst_gap_s >= 0 && o.zipf >= 0 && o.page_tokens > 0,
                 "long_documents: bad burst or popularity parameters");
  STRATA_EXPECTS(o.min_output > 0 && o.min_output <= o.max_output, "long_documents: bad output range [", o.min_output,
                 ", ", o.max_output, "]");
  std::mt19937_64 rng{o.seed};
  detail::page_id_source ids;
  std::int64_t const n_docs = o.documents > 0 ? o.documents : std::max<std::int64_t>(8, o.requests / 12);
  std::vector<std::shared_ptr<page_ids const>> docs;
  std::vector<std::int64_t> doc_tokens;
  for (std::int64_t d = 0; d < n_docs; ++d) {
    std::int64_t const pages =
        std::uniform_int_distribution<std::int64_t>{o.min_tokens, o.max_tokens}(rng) / o.page_tokens;
    docs.push_back(std::make_shared<page_ids const>(ids.take(pages)));
    doc_tokens.push_back(pages * o.page_tokens);
  }
  std::vector<double> weights(static_cast<std::size_t>(n_docs));
  for (std::size_t d = 0; d < weights.size(); ++d) {
    weights[d] = 1.0 / std::pow(double(d + 1), o.zipf);
  }
  std::discrete_distribution<std::size_t> pick_doc{weights.begin(), weights.end()};
  double const visit_rate = o.rate / o.questions_per_visit;
  workload w{"long_documents", o.page_tokens, {}};
  double t = 0;
  while (std::int64_t(w.requests.size()) < o.requests) {
    t += std::exponential_distribution<double>{visit_rate}(rng);
    std::size_t const d = pick_doc(rng);
    std::int64_t const q = detail::one_plus_poisson(o.questions_per_visit, rng);
    double at = t;
    for (std::int64_t k = 0; k < q && std::int64_t(w.requests.size()) < o.requests; ++k) {
      sim_request r;
      r.arrival_s = at;
      r.shared = docs[d];
      std::int64_t const question = std::uniform_int_distribution<std::int64_t>{30, 120}(rng);
      r.own = ids.take(question / o.page_tokens);
      r.prompt_tokens = doc_tokens[d] + question;
      r.output_tokens = std::uniform_int_distribution<std::int64_t>{o.min_output, o.max_output}(rng);
      w.requests.push_back(std::move(r));
      if (o.burst_gap_s > 0) { at += std::exponential_distribution<double>{1 / o.burst_gap_s}(rng); }
    }
  }
  detail::finish(w);
  return w;
}

/// @brief Parameters of `short_chat`.
struct short_chat_options {
  std::int64_t requests = 5000;
  double rate = 20;  ///< requests per second, Poisson
  std::uint64_t seed = 1;
  std::int64_t system_prompts = 16;  ///< shared system prompts (100–600 tokens)
  double mean_prompt = 680;          ///< mean prompt tokens (ShareGPT-like), system prompt included
  double mean_output = 200;          ///< mean output tokens
  std::int64_t page_tokens = 32;
};

/// @brief Short chat (ShareGPT-like): ~680-token prompts behind a few shared system prompts.
inline workload short_chat(short_chat_options const& o)
{
  STRATA_EXPECTS(o.requests > 0 && o.rate > 0 && o.system_prompts > 0 && o.mean_prompt > 0 && o.mean_output > 0 &&
                     o.page_tokens > 0,
                 "short_chat: requests, rate, system prompts, means and page size must be positive");
  std::mt19937_64 rng{o.seed};
  detail::page_id_source ids;
  std::vector<std::shared_ptr<page_ids const>> systems;
  for (std::int64_t s = 0; s < o.system_prompts; ++s) {
    std::int64_t const tokens = std::uniform_int_distribution<std::int64_t>{100, 600}(rng);
    systems.push_back(std::make_shared<page_ids const>(ids.take(tokens / o.page_tokens)));
  }
  workload w{"short_chat", o.page_tokens, {}};
  double t = 0;
  for (std::int64_t i = 0; i < o.requests; ++i) {
    t += std::exponential_distribution<double>{o.rate}(rng);
    sim_request r;
    r.arrival_s = t;
    r.shared = systems[std::size_t(std::uniform_int_distribution<std::int64_t>{0, o.system_prompts - 1}(rng))];
    std::int64_t const system_tokens = std::int64_t(r.shared->size()) * o.page_tokens;
    std::int64_t const user = detail::lognormal_tokens(rng, std::max(16.0, o.mean_prompt - 350), 0.8, 8, 8000);
    r.own = ids.take(user / o.page_tokens);
    r.prompt_tokens = system_tokens + user;
    r.output_tokens = detail::lognormal_tokens(rng, o.mean_output, 0.7, 1, 2000);
    w.requests.push_back(std::move(r));
  }
  detail::finish(w);
  return w;
}

/// @brief Parameters of `multi_turn`.
struct multi_turn_options {
  std::int64_t requests = 3000;  ///< turns in all
  double rate = 5;               ///< turns per second (sessions start as a Poisson process)
  std::uint64_t seed = 1;
  double mean_turns = 5;      ///< turns per session
  double think_s = 8;         ///< mean time between a turn's answer and the next turn's arrival
  double mean_message = 120;  ///< user tokens per turn
  double mean_output = 180;   ///< answer tokens per turn
  std::int64_t page_tokens = 32;
};

/**
 * @brief Multi-turn sessions with growing history: turn k's prompt is the session's system prompt,
 *        every earlier message and answer, and a new message; answers are cached when a turn ends.
 *        Sessions start as a Poisson process; a later turn arrives a think time (exponential,
 *        mean `think_s`) after the previous turn's answer is complete (closed loop).
 */
inline workload multi_turn(multi_turn_options const& o)
{
  STRATA_EXPECTS(o.requests > 0 && o.rate > 0 && o.mean_turns >= 1 && o.think_s >= 0 && o.mean_message > 0 &&
                     o.mean_output > 0 && o.page_tokens > 0,
                 "multi_turn: requests, rate, turns, think time and sizes must be positive");
  std::mt19937_64 rng{o.seed};
  detail::page_id_source ids;
  auto system = std::make_shared<page_ids const>(ids.take(256 / o.page_tokens));
  workload w{"multi_turn", o.page_tokens, {}};
  double t = 0;
  double const session_rate = o.rate / o.mean_turns;
  std::vector<std::pair<std::size_t, std::int64_t>> turn_of;  // (session, turn) of each request
  while (std::int64_t(w.requests.size()) < o.requests) {
    t += std::exponential_distribution<double>{session_rate}(rng);
    std::int64_t const turns = detail::one_plus_poisson(o.mean_turns, rng);
    auto history = system;  // whole pages only: a partial page is recomputed by the next turn
    std::int64_t history_tokens = std::int64_t(system->size()) * o.page_tokens;
    double at = t;
    std::size_t const session = turn_of.empty() ? 0 : turn_of.back().first + 1;
    for (std::int64_t k = 0; k < turns && std::int64_t(w.requests.size()) < o.requests; ++k) {
      sim_request r;
      r.arrival_s = at;
      r.think_s = k > 0 ? std::exponential_distribution<double>{1 / std::max(o.think_s, 1e-9)}(rng) : 0;
      turn_of.emplace_back(session, k);
      r.shared = history;
      std::int64_t const message = detail::lognormal_tokens(rng, o.mean_message, 0.6, 4, 4000);
      r.own = ids.take(message / o.page_tokens);
      r.prompt_tokens = history_tokens + message;
      r.output_tokens = detail::lognormal_tokens(rng, o.mean_output, 0.6, 1, 4000);
      // The next turn's history: this prompt's whole pages and the answer's.
      std::int64_t const next_tokens = r.prompt_tokens + r.output_tokens;
      page_ids next = r.pages();
      auto const answer = ids.take(next_tokens / o.page_tokens - std::int64_t(next.size()));
      next.insert(next.end(), answer.begin(), answer.end());
      auto next_ptr = std::make_shared<page_ids const>(std::move(next));
      r.continuation = next_ptr;
      history = next_ptr;
      history_tokens = std::int64_t(history->size()) * o.page_tokens;
      w.requests.push_back(std::move(r));
      at += o.think_s + 2.0;  // an estimate for ordering: the real arrival follows the previous answer
    }
  }
  // Order by estimated arrival, then chain each turn to the previous turn of its session.
  std::vector<std::size_t> order(w.requests.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return w.requests[a].arrival_s < w.requests[b].arrival_s; });
  std::vector<sim_request> sorted;
  std::map<std::pair<std::size_t, std::int64_t>, request_id> id_of;
  for (std::size_t n = 0; n < order.size(); ++n) {
    sorted.push_back(std::move(w.requests[order[n]]));
    sorted.back().id = request_id{n + 1};
    id_of[turn_of[order[n]]] = sorted.back().id;
  }
  for (std::size_t n = 0; n < order.size(); ++n) {
    auto const [session, k] = turn_of[order[n]];
    if (k > 0) { sorted[n].after = id_of.at({session, k - 1}); }
  }
  w.requests = std::move(sorted);
  return w;
}

/// @brief Most prompt or output tokens one replayed request may have.
inline constexpr std::int64_t max_request_tokens = 10'000'000;
/// @brief Tokens per `hash_ids` block of Mooncake's trace format.
inline constexpr std::int64_t mooncake_block_tokens = 512;
/// @brief Latest arrival a replayed trace may hold, in seconds.
inline constexpr double max_arrival_s = 1e9;

/**
 * @brief Replays a trace: CSV lines `arrival_s,output_tokens,prompt_tokens,id id id ...` (ids are
 *        token ids, turned here into page ids, or page ids when `ids_are_pages`), JSON lines
 *        `{"arrival": 1.5, "output_tokens": 64, "tokens": [1, 2, ...]}` (or `"pages": [...]` and
 *        `"prompt_tokens": n`), or Mooncake's JSON lines `{"timestamp": ms, "input_length": n,
 *        "output_length": m, "hash_ids": [...]}` (recognized by `hash_ids`: one id per 512-token
 *        block, equal leading ids meaning an equal prefix). Lines starting with `#` and a CSV header
 *        are skipped.
 *
 * Token ids and Mooncake blocks become dense page ids (1, 2, ... in order of first appearance),
 * each page keyed by its parent page's id and its exact content (32 token ids, or a block id and
 * the page's position in the block): equal prefixes get equal ids and different prefixes never
 * share one. A Mooncake block is `mooncake_block_tokens / page_tokens` pages; a request gets the
 * whole pages of its `input_length` (a partial last block gives its whole pages; a prompt shorter
 * than a page is padded to one, since the controller caches whole pages and needs one). Page ids given
 * as such (`"pages"`, `ids_are_pages`) are taken as they are: do not mix them with token ids or
 * Mooncake lines in one trace.
 *
 * Every number is read whole (`"12abc"` is rejected); arrivals are finite in [0, `max_arrival_s`);
 * token counts are whole numbers in [1, `max_request_tokens`]; with token ids the prompt is exactly
 * the ids given; with page ids `prompt_tokens` covers the whole pages.
 * @throw strata::invalid_argument naming the file, line, field and value of anything it cannot read
 */
inline workload replay(std::string const& path, std::int64_t page_tokens = 32, bool ids_are_pages = false)
{
  std::ifstream in{path};
  STRATA_EXPECTS(in.good(), "replay: cannot read ", path);
  STRATA_EXPECTS(page_tokens > 0, "replay: page_tokens must be positive");
  workload w{"trace:" + path, page_tokens, {}};
  std::string line;
  std::int64_t line_no = 0;
  auto trim = [](std::string const& cell) {
    auto const b = cell.find_first_not_of(" \t\r\"");
    auto const e = cell.find_last_not_of(" \t\r\"");
    return b == std::string::npos ? std::string{} : cell.substr(b, e - b + 1);
  };
  // An id: the whole cell must be one integer (no silent truncation of "12abc" or "1.5").
  auto parse_id = [&](std::string const& raw) {
    std::string const cell = trim(raw);
    std::int64_t x = 0;
    auto const [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), x);
    STRATA_EXPECTS(ec == std::errc{} && end == cell.data() + cell.size() && !cell.empty(), "replay: ", path, ":",
                   line_no, ": '", cell, "' is not an integer id");
    return x;
  };
  // A number field, read whole and finite.
  auto parse_number = [&](std::string const& raw, std::string const& field) {
    std::string const cell = trim(raw);
    double x = 0;
    auto const [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), x);
    STRATA_EXPECTS(ec == std::errc{} && end == cell.data() + cell.size() && !cell.empty() && std::isfinite(x),
                   "replay: ", path, ":", line_no, ": ", field, ": '", cell, "' is not a finite number");
    return x;
  };
  // A token count: a whole number in [1, max_request_tokens] (checked before any cast).
  auto token_count = [&](double v, char const* field) {
    STRATA_EXPECTS(v == std::floor(v) && v >= 1 && v <= double(max_request_tokens), "replay: ", path, ":", line_no,
                   ": ", field, " must be a whole number in 1..", max_request_tokens, ", got ", v);
    return static_cast<std::int64_t>(v);
  };
  // A page id must fit the index's 32-bit ids.
  auto page_id = [&](std::int64_t x) {
    STRATA_EXPECTS(x >= std::numeric_limits<std::int32_t>::min() && x <= std::numeric_limits<std::int32_t>::max(),
                   "replay: ", path, ":", line_no, ": page id ", x, " does not fit 32 bits");
    return static_cast<std::int32_t>(x);
  };
  // Token ids to page ids: each whole page is keyed by its parent page's id and its exact tokens,
  // and keys get dense ids in order of first appearance, so equal prefixes get equal ids and
  // different prefixes never share one (no hash is truncated: the key is the content itself).
  detail::chained_page_ids chain;
  auto hash_pages = [&](std::vector<std::int64_t> const& tokens) {
    page_ids out;
    std::int32_t parent = 0;
    for (std::size_t p = 0; (p + 1) * std::size_t(page_tokens) <= tokens.size(); ++p) {
      parent = chain.child(parent, std::span{tokens}.subspan(p * std::size_t(page_tokens), std::size_t(page_tokens)));
      out.push_back(parent);
    }
    return out;
  };
  // Mooncake blocks to page ids: block b of `mooncake_block_tokens` tokens becomes that many
  // tokens' worth of pages, each keyed by its parent page and (block id, position in the block),
  // so equal leading blocks give equal pages; whole pages of `prompt` only (a partial last block
  // gives its whole pages); pages beyond the blocks given are the request's own content.
  auto block_pages = [&](std::vector<std::int64_t> const& blocks, std::int64_t prompt) {
    STRATA_EXPECTS(mooncake_block_tokens % page_tokens == 0, "replay: ", path, ":", line_no, ": ", page_tokens,
                   "-token pages do not divide Mooncake's ", mooncake_block_tokens, "-token blocks");
    std::int64_t const per_block = mooncake_block_tokens / page_tokens;
    page_ids out;
    std::int32_t parent = 0;
    for (std::int64_t p = 0; p < prompt / page_tokens; ++p) {
      std::size_t const b = std::size_t(p / per_block);
      std::array<std::int64_t, 3> const key{b < blocks.size() ? 0 : -1, b < blocks.size() ? blocks[b] : line_no,
                                            p % per_block};
      parent = chain.child(parent, key, 'b');
      out.push_back(parent);
    }
    return out;
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#' ||
        (line_no == 1 && line.find("arrival") != std::string::npos && line[0] != '{')) {
      continue;
    }
    sim_request r;
    std::vector<std::int64_t> ids;
    std::int64_t prompt = -1;
    {
      if (line[0] == '{') {
        auto number_after = [&](std::string const& key, double& out) {
          auto const k = line.find("\"" + key + "\"");
          if (k == std::string::npos) { return false; }
          auto const from = line.find(':', k) + 1;
          auto const to = line.find_first_of(",}", from);
          out = parse_number(line.substr(from, to == std::string::npos ? std::string::npos : to - from), key);
          return true;
        };
        double v = 0;
        // Mooncake's format: timestamp in ms, input/output lengths, one hash id per block.
        bool const mooncake = line.find("\"hash_ids\"") != std::string::npos;
        if (mooncake) {
          STRATA_EXPECTS(number_after("timestamp", v), "replay: ", path, ":", line_no, ": no \"timestamp\"");
          r.arrival_s = v / 1000;
          STRATA_EXPECTS(number_after("output_length", v), "replay: ", path, ":", line_no, ": no \"output_length\"");
          r.output_tokens = token_count(v, "output_length");
          STRATA_EXPECTS(number_after("input_length", v), "replay: ", path, ":", line_no, ": no \"input_length\"");
          prompt = token_count(v, "input_length");
        } else {
          STRATA_EXPECTS(number_after("arrival", v), "replay: ", path, ":", line_no, ": no \"arrival\"");
          r.arrival_s = v;
          STRATA_EXPECTS(number_after("output_tokens", v), "replay: ", path, ":", line_no, ": no \"output_tokens\"");
          r.output_tokens = token_count(v, "output_tokens");
          if (number_after("prompt_tokens", v)) { prompt = token_count(v, "prompt_tokens"); }
        }
        bool const pages = !mooncake && line.find("\"pages\"") != std::string::npos;
        auto const k = line.find(mooncake ? "\"hash_ids\"" : pages ? "\"pages\"" : "\"tokens\"");
        STRATA_EXPECTS(k != std::string::npos, "replay: ", path, ":", line_no, ": no \"tokens\" or \"pages\"");
        auto const open = line.find('[', k), close = line.find(']', k);
        STRATA_EXPECTS(open != std::string::npos && close != std::string::npos, "replay: ", path, ":", line_no,
                       ": unterminated array");
        std::stringstream ss{line.substr(open + 1, close - open - 1)};
        for (std::string cell; std::getline(ss, cell, ',');) {
          if (cell.find_first_not_of(" \t") != std::string::npos) { ids.push_back(parse_id(cell)); }
          STRATA_EXPECTS(std::int64_t(ids.size()) <= max_request_tokens, "replay: ", path, ":", line_no, ": more than ",
                         max_request_tokens, " ids");
        }
        if (mooncake) {
          std::int64_t const blocks = (prompt + mooncake_block_tokens - 1) / mooncake_block_tokens;
          STRATA_EXPECTS(std::int64_t(ids.size()) == blocks, "replay: ", path, ":", line_no, ": ", ids.size(),
                         " hash_ids for input_length ", prompt, " (one per ", mooncake_block_tokens,
                         "-token block: ", blocks, ")");
          // A prompt shorter than a page is padded to one: the controller needs a whole page.
          prompt = std::max(prompt, page_tokens);
          r.own = block_pages(ids, prompt);
          r.prompt_tokens = prompt;
        } else if (pages) {
          for (auto x : ids) {
            r.own.push_back(page_id(x));
          }
          r.prompt_tokens = prompt >= 0 ? prompt : std::int64_t(ids.size()) * page_tokens;
        } else {
          STRATA_EXPECTS(prompt < 0 || prompt == std::int64_t(ids.size()), "replay: ", path, ":", line_no,
                         ": prompt_tokens ", prompt, " but ", ids.size(), " token ids");
          r.own = hash_pages(ids);
          r.prompt_tokens = std::int64_t(ids.size());
        }
      } else {
        std::stringstream ss{line};
        std::string a, o, p, rest;
        STRATA_EXPECTS(std::getline(ss, a, ',') && std::getline(ss, o, ',') && std::getline(ss, p, ','),
                       "replay: ", path, ":", line_no, ": expected arrival_s,output_tokens,prompt_tokens,ids");
        std::getline(ss, rest);
        r.arrival_s = parse_number(a, "arrival_s");
        r.output_tokens = token_count(parse_number(o, "output_tokens"), "output_tokens");
        prompt = token_count(parse_number(p, "prompt_tokens"), "prompt_tokens");
        std::stringstream is{rest};
        for (std::string cell; is >> cell;) {
          ids.push_back(parse_id(cell));
          STRATA_EXPECTS(std::int64_t(ids.size()) <= max_request_tokens, "replay: ", path, ":", line_no, ": more than ",
                         max_request_tokens, " ids");
        }
        if (ids_are_pages) {
          for (auto x : ids) {
            r.own.push_back(page_id(x));
          }
        } else {
          STRATA_EXPECTS(prompt == std::int64_t(ids.size()), "replay: ", path, ":", line_no, ": prompt_tokens ", prompt,
                         " but ", ids.size(), " token ids");
          r.own = hash_pages(ids);
        }
        r.prompt_tokens = prompt;
      }
    }
    STRATA_EXPECTS(r.arrival_s >= 0 && r.arrival_s < max_arrival_s, "replay: ", path, ":", line_no, ": arrival ",
                   r.arrival_s, " s is outside [0, ", max_arrival_s, ")");
    STRATA_EXPECTS(r.prompt_tokens > 0 && r.prompt_tokens >= std::int64_t(r.own.size()) * page_tokens, "replay: ", path,
                   ":", line_no, ": prompt_tokens ", r.prompt_tokens, " does not cover ", r.own.size(), " pages");
    w.requests.push_back(std::move(r));
  }
  STRATA_EXPECTS(!w.requests.empty(), "replay: ", path, " holds no requests");
  detail::finish(w);
  return w;
}

/**
 * @brief Multiplies every arrival and think time of `w` by `factor` (> 1: a lighter load, < 1: a
 *        heavier one), the way a replayed trace is set to a load.
 * @throw strata::invalid_argument for a factor that is not finite and positive
 */
inline void scale_time(workload& w, double factor)
{
  STRATA_EXPECTS(std::isfinite(factor) && factor > 0, "scale_time: factor must be finite and positive, got ", factor);
  for (auto& r : w.requests) {
    r.arrival_s *= factor;
    r.think_s *= factor;
  }
}

/// @brief Requests per second of a workload's arrivals: requests over the span from the first to
///        the last arrival (0 for fewer than two requests or one instant).
inline double arrival_rate(workload const& w)
{
  if (w.requests.size() < 2) { return 0; }
  double const span = w.requests.back().arrival_s - w.requests.front().arrival_s;
  return span > 0 ? double(w.requests.size() - 1) / span : 0;
}

}  // namespace strata::sim
