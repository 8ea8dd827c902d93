// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/file_store/file_store.inl
 * @brief Member definitions of `file_store` (tier/file_store.hpp, which includes this file): opening
 *        the files, batches of record reads and writes on io_uring or the I/O threads. Reopening
 *        (the descriptor and recovery): recovery.inl; io_uring runs: uring_runs.inl.
 */
#pragma once

namespace strata {

inline file_store::file_store(kv_geometry const& geometry, std::int64_t pages, file_store_options options)
    : geometry_{(geometry.validate(), geometry)}, slots_{checked_pages(geometry, pages)}, options_{std::move(options)}
{
  dirs_ = drive_directories(options_, "file_store");
  std::vector<std::filesystem::path> seen;  // the same directory under two names is refused too
  for (std::size_t d = 0; d < dirs_.size(); ++d) {
    STRATA_EXPECTS(!dirs_[d].empty(), "file_store: directory ", d, " must not be empty");
    std::error_code ec;
    auto name = std::filesystem::weakly_canonical(dirs_[d], ec);
    if (ec) { name = std::filesystem::path{dirs_[d]}.lexically_normal(); }
    STRATA_EXPECTS(std::find(seen.begin(), seen.end(), name) == seen.end(), "file_store: directory ", dirs_[d],
                   " is given twice");
    seen.push_back(std::move(name));
  }
  drives_ = static_cast<std::int64_t>(dirs_.size());
  STRATA_EXPECTS(drives_ <= pages, "file_store: ", drives_, " directories for ", pages,
                 " pages (at most one directory per page)");
  STRATA_EXPECTS(options_.files > 0 && options_.files <= pages / drives_, "file_store: files must be in [1, ",
                 pages / drives_, "] (the records of a drive), got ", options_.files);
  STRATA_EXPECTS(options_.tp_size > 0 && options_.tp_rank >= 0 && options_.tp_rank < options_.tp_size,
                 "file_store: tp_rank=", options_.tp_rank, " is not in [0, tp_size=", options_.tp_size, ")");
  STRATA_EXPECTS(options_.io_threads > 0 && options_.io_threads <= 256,
                 "file_store: io_threads must be in [1, 256], got ", options_.io_threads);
  STRATA_EXPECTS(options_.max_io_bytes > 0, "file_store: max_io_bytes must be positive, got ", options_.max_io_bytes);
  STRATA_EXPECTS(options_.io_timeout_ms > 0 && options_.uring_staging_bytes > 0,
                 "file_store: io_timeout_ms and uring_staging_bytes must be positive, got ", options_.io_timeout_ms,
                 " and ", options_.uring_staging_bytes);
  STRATA_EXPECTS(options_.io.preadv && options_.io.pwritev && options_.io.allocate && options_.io.sync,
                 "file_store: io_backend has a null function");
  page_bytes_ = geometry_.page_bytes();
  STRATA_EXPECTS(page_bytes_ <= (std::int64_t{1} << 40), "file_store: page_bytes ", page_bytes_, " is too large");
  record_bytes_ = detail::file_header_bytes + detail::round_up(page_bytes_, detail::file_alignment);
  std::int64_t const per_drive = (pages + drives_ - 1) / drives_;  // drive 0 holds the most
  slots_per_file_ = (per_drive + options_.files - 1) / options_.files;
  STRATA_EXPECTS(detail::checked_mul(slots_per_file_, record_bytes_).has_value(), "file_store: ", slots_per_file_,
                 " records of ", record_bytes_, " bytes overflow a file");
  runs_max_ = std::max<std::int64_t>(1, std::min<std::int64_t>(IOV_MAX / 3, options_.max_io_bytes / record_bytes_));
  geometry_hash_ = compute_geometry_hash();
  index_.assign(static_cast<std::size_t>(pages), slot_state{});
  if (options_.reopen) { check_descriptor(); }  // before anything on disk changes
  open_files();
  worker_buffers_.resize(static_cast<std::size_t>(drives_ * options_.io_threads));
  for (std::int64_t d = 0; d < drives_; ++d) {
    pools_.push_back(std::make_unique<detail::thread_pool>(options_.io_threads));
  }
  if (options_.reopen) { recover(); }
  write_descriptor();
#ifdef STRATA_FILE_STORE_URING
  io_backend const posix{};
  bool const default_io = options_.io.context == nullptr && options_.io.preadv == posix.preadv &&
                          options_.io.pwritev == posix.pwritev && options_.io.sync == posix.sync;
  if (options_.use_io_uring &&
      (default_io || options_.io.filter_completion != nullptr || options_.io.uring_target != nullptr)) {
    ring_ = detail::io_uring_ring::create(256);
  }
#endif
}

inline auto file_store::checked_pages(kv_geometry const& geometry, std::int64_t pages) -> std::int64_t
{
  STRATA_EXPECTS(pages > 0, "file_store: pages must be positive, got ", pages);
  std::int64_t const page_bytes = geometry.page_bytes();
  STRATA_EXPECTS(page_bytes <= (std::int64_t{1} << 40), "file_store: page_bytes ", page_bytes, " is too large");
  std::int64_t const record = detail::file_header_bytes + detail::round_up(page_bytes, detail::file_alignment);
  STRATA_EXPECTS(detail::checked_mul(pages, record).has_value(), "file_store: ", pages, " records of ", record,
                 " bytes overflow 64 bits");
  return pages;
}

inline auto file_store::open(kv_geometry const& geometry, std::int64_t pages, file_store_options options) -> file_store
{
  options.reopen = true;
  return file_store{geometry, pages, std::move(options)};
}

inline file_store::~file_store()
{
#ifdef STRATA_FILE_STORE_URING
  while (ring_ && !uring_runs_.empty()) {  // the kernel must not write into freed buffers
    try {
      reap(true);  // bounded: a run that never completes is abandoned
    } catch (...) {
      std::this_thread::yield();
    }
  }
  for (auto& u : abandoned_) {
    (void)u.release();  // the kernel may still use their buffers: never freed
  }
#endif
  pools_.clear();
}

inline auto file_store::uses_io_uring() const noexcept -> bool
{
#ifdef STRATA_FILE_STORE_URING
  std::lock_guard lock{state_mutex_};
  return ring_ != nullptr && !ring_gave_up_;
#else
  return false;
#endif
}

inline auto file_store::key(std::int64_t slot) const -> std::optional<std::uint64_t>
{
  STRATA_EXPECTS(slot >= 0 && slot < capacity(), "file_store: slot ", slot, " out of range [0, ", capacity(), ")");
  std::lock_guard lock{state_mutex_};
  auto const& s = index_[static_cast<std::size_t>(slot)];
  return s.valid ? std::optional{s.key} : std::nullopt;
}

inline auto file_store::submit_write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                                     std::span<std::uint64_t const> keys, std::span<std::uint64_t const> parent_keys,
                                     std::span<std::int32_t const> ids) -> io_ticket
{
  std::lock_guard lock{state_mutex_};
  validate(slots, sources.size(), keys.size(), true);
  for (auto const* p : sources) {
    STRATA_EXPECTS(p != nullptr, "file_store: write: null source");
  }
  STRATA_EXPECTS(parent_keys.empty() || parent_keys.size() == slots.size(), "file_store: write: ", slots.size(),
                 " slots but ", parent_keys.size(), " parent keys");
  std::size_t const per_page = slots.empty() ? 0 : ids.size() / slots.size();
  STRATA_EXPECTS(per_page * slots.size() == ids.size() && std::int64_t(per_page) <= max_record_ids,
                 "file_store: write: ", ids.size(), " ids for ", slots.size(),
                 " slots (the same number per slot, at most ", max_record_ids, ")");
  auto b = std::make_shared<batch>();
  b->write = true;
  b->items.resize(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto& it = b->items[i];
    it.slot = slots[i];
    it.src = sources[i];
    it.key = keys.empty() ? 0 : keys[i];
    it.parent_key = parent_keys.empty() ? 0 : parent_keys[i];
    it.ids.assign(ids.begin() + std::ptrdiff_t(i * per_page), ids.begin() + std::ptrdiff_t((i + 1) * per_page));
    it.sequence = next_sequence_++;
  }
  return launch(std::move(b));
}

inline auto file_store::submit_read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                                    std::span<std::uint64_t const> expected_keys) -> io_ticket
{
  std::lock_guard lock{state_mutex_};
  validate(slots, records.size(), expected_keys.size(), false);
  for (auto* p : records) {
    STRATA_EXPECTS(p != nullptr, "file_store: read: null destination");
  }
  auto b = std::make_shared<batch>();
  b->items.resize(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto& it = b->items[i];
    auto const& s = index_[static_cast<std::size_t>(slots[i])];
    it.slot = slots[i];
    it.dst = records[i];
    it.key = s.key;
    it.sequence = s.sequence;
    std::size_t const one[1] = {i};
    if (!s.valid) {
      b->fail(one, [&] { return detail::concat("file_store: slot ", it.slot, " holds no record"); });
    } else if (!expected_keys.empty() && expected_keys[i] != s.key) {
      b->fail(one, [&] {
        return detail::concat("file_store: slot ", it.slot, " holds key ", s.key, ", not the expected ",
                              expected_keys[i]);
      });
    }
  }
  return launch(std::move(b));  // records known to fail already are not read
}

inline auto file_store::poll(io_ticket t, std::span<bool> intact) -> io_status
{
  std::lock_guard lock{state_mutex_};
  auto it = find(t);
  STRATA_EXPECTS(intact.empty() || intact.size() == it->second->items.size(), "file_store: poll: ", intact.size(),
                 " statuses for ", it->second->items.size(), " records");
#ifdef STRATA_FILE_STORE_URING
  if (ring_) { reap(false); }
#endif
  if (it->second->remaining.load() > 0) { return io_status::pending; }
  return finish(it, intact) ? io_status::succeeded : io_status::failed;
}

inline auto file_store::wait(io_ticket t, std::span<bool> intact) -> bool
{
  std::unique_lock state{state_mutex_};
  auto it = find(t);
  STRATA_EXPECTS(intact.empty() || intact.size() == it->second->items.size(), "file_store: wait: ", intact.size(),
                 " statuses for ", it->second->items.size(), " records");
  std::shared_ptr<batch> const b = it->second;
#ifdef STRATA_FILE_STORE_URING
  while (ring_ && b->remaining.load() > 0 && !uring_runs_.empty()) {
    reap(true);  // the ring is the store's: other callers wait meanwhile (bounded by io_timeout_ms)
  }
#endif
  state.unlock();  // the I/O threads finish the batch; other threads may poll and submit meanwhile
  {
    std::unique_lock lock{done_mutex_};
    done_cv_.wait(lock, [&] { return b->remaining.load() == 0; });
  }
  state.lock();
  return finish(find(t), intact);  // map iterators stay valid, but the ticket is looked up again
}

inline auto file_store::compute_geometry_hash() const noexcept -> std::uint64_t
{
  detail::fnv1a h;
  h.i64(detail::file_format_version);
  for (auto v : {geometry_.layers, geometry_.page_tokens, geometry_.kv_heads, geometry_.head_dim, geometry_.elem_bytes,
                 geometry_.planes, std::int64_t{options_.tp_rank}, std::int64_t{options_.tp_size}, record_bytes_}) {
    h.i64(v);
  }
  h.bytes(options_.tag.data(), options_.tag.size());
  return h.h;
}

inline auto file_store::validate(std::span<std::int64_t const> slots, std::size_t buffers, std::size_t keys,
                                 bool write) const -> void
{
  char const* const what = write ? "write" : "read";
  STRATA_EXPECTS(buffers == slots.size(), "file_store: ", what, ": ", slots.size(), " slots but ", buffers, " buffers");
  STRATA_EXPECTS(keys == 0 || keys == slots.size(), "file_store: ", what, ": ", slots.size(), " slots but ", keys,
                 " keys");
  std::vector<std::int64_t> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    auto const s = sorted[i];
    STRATA_EXPECTS(s >= 0 && s < capacity(), "file_store: ", what, ": slot ", s, " out of range [0, ", capacity(), ")");
    STRATA_EXPECTS(slots_.is_allocated(s), "file_store: ", what, ": slot ", s, " is not allocated");
    STRATA_EXPECTS(i == 0 || sorted[i - 1] != s, "file_store: ", what, ": slot ", s, " is listed twice");
    auto const& x = index_[static_cast<std::size_t>(s)];
    STRATA_EXPECTS(!x.writing && (!write || x.readers == 0), "file_store: ", what, ": slot ", s,
                   x.writing ? " has a write in flight" : " has a read in flight");
  }
}

inline auto file_store::open_files() -> void
{
  direct_ = options_.use_direct_io;
  for (std::int64_t d = 0; d < drives_; ++d) {
    auto const& directory = dirs_[static_cast<std::size_t>(d)];
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    STRATA_EXPECTS_AS(file_store_error, !ec, "file_store: cannot create directory ", directory, ": ", ec.message());
    std::int64_t const drive_slots = (capacity() - d + drives_ - 1) / drives_;
    for (int f = 0; f < options_.files; ++f) {
      auto const path =
          (std::filesystem::path{directory} / detail::concat("strata-kv.rank", options_.tp_rank, ".", f, ".dat"))
              .string();
      int flags = O_RDWR | O_CREAT | O_CLOEXEC;
      int fd = direct_ ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
      if (fd < 0) {
        direct_ = false;  // the file system refuses O_DIRECT (tmpfs): buffered I/O for every file
        fd = ::open(path.c_str(), flags, 0644);
      }
      STRATA_EXPECTS_AS(file_store_error, fd >= 0, "file_store: cannot open ", path, ": ", detail::errno_text(errno));
      detail::unique_fd file{fd};
      int locked = ::flock(fd, LOCK_EX | LOCK_NB);
      for (int waited = 0; locked != 0 && errno == EWOULDBLOCK && waited < options_.lock_wait_ms; ++waited) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        locked = ::flock(fd, LOCK_EX | LOCK_NB);
      }
      STRATA_EXPECTS_AS(file_store_error, locked == 0, "file_store: ", path,
                        " is in use by another store (flock: ", detail::errno_text(errno), ")");
      std::int64_t const slots_here = std::clamp<std::int64_t>(drive_slots - f * slots_per_file_, 0, slots_per_file_);
      auto const bytes = static_cast<off_t>(slots_here * record_bytes_);
      if (!options_.reopen) {
        STRATA_EXPECTS_AS(file_store_error, ::ftruncate(fd, 0) == 0, "file_store: cannot truncate ", path, ": ",
                          detail::errno_text(errno));
      }
      int const e =
          bytes > 0 ? options_.io.allocate(options_.io.context, fd, 0, bytes) : 0;  // 9 pages in 4 files: 3+3+3+0
      STRATA_EXPECTS_AS(file_store_error, e == 0, "file_store: cannot preallocate ", bytes, " bytes for ", path, ": ",
                        e == ENOSPC ? "no space left on the device" : "", e == ENOSPC ? "" : detail::errno_text(e));
      files_.push_back(std::move(file));
      paths_.push_back(path);
    }
  }
  if (!direct_) {  // a later file refused O_DIRECT: reopen the earlier ones buffered, so that all agree
    for (std::size_t f = 0; f < files_.size(); ++f) {
      int const flags = ::fcntl(files_[f].get(), F_GETFL);
      if (flags >= 0 && (flags & O_DIRECT)) { (void)::fcntl(files_[f].get(), F_SETFL, flags & ~O_DIRECT); }
    }
  }
}

inline auto file_store::place(std::int64_t s) const noexcept -> std::pair<std::size_t, std::int64_t>
{
  auto const local = s / drives_;  // the record's index on its drive
  auto const f = local / slots_per_file_;
  return {static_cast<std::size_t>(s % drives_ * options_.files + f), local - f * slots_per_file_};
}

inline auto file_store::where(std::int64_t s) const noexcept -> std::pair<int, off_t>
{
  auto const [f, r] = place(s);
  return {files_[f].get(), static_cast<off_t>(r * record_bytes_)};
}

inline auto file_store::check_header(std::byte const* block, std::int64_t slot,
                                     detail::file_record_header& h) const noexcept -> char const*
{
  std::memcpy(&h, block, sizeof h);
  if (h.magic != detail::file_record_magic) { return "bad magic (no record, or overwritten)"; }
  if (h.version != detail::file_format_version) { return "another format version"; }
  if (h.header_bytes != detail::file_header_bytes) { return "bad header size"; }
  if (detail::file_header_crc(block) != h.header_crc) { return "header checksum mismatch"; }
  if (h.geometry_hash != geometry_hash_) { return detail::file_other_configuration; }
  if (h.payload_bytes != static_cast<std::uint64_t>(page_bytes_)) { return "bad payload length"; }
  if (h.slot != static_cast<std::uint64_t>(slot)) { return "record of another slot"; }
  return nullptr;
}

inline auto file_store::fill_header(std::byte* block, item const& it, std::uint32_t payload_crc) const noexcept -> void
{
  std::memset(block, 0, static_cast<std::size_t>(detail::file_header_bytes));
  detail::file_record_header h{};
  h.magic = detail::file_record_magic;
  h.version = detail::file_format_version;
  h.header_bytes = static_cast<std::uint32_t>(detail::file_header_bytes);
  h.geometry_hash = geometry_hash_;
  h.key = it.key;
  h.payload_bytes = static_cast<std::uint64_t>(page_bytes_);
  h.sequence = it.sequence;
  h.slot = static_cast<std::uint64_t>(it.slot);
  h.payload_crc = payload_crc;
  std::memcpy(block, &h, sizeof h);
  auto const count = static_cast<std::uint32_t>(it.ids.size());
  std::memcpy(block + detail::file_identity_offset, &it.parent_key, sizeof it.parent_key);
  std::memcpy(block + detail::file_identity_offset + 8, &count, sizeof count);
  if (count > 0) { std::memcpy(block + detail::file_ids_offset, it.ids.data(), count * sizeof(std::int32_t)); }
  h.header_crc = detail::file_header_crc(block);
  std::memcpy(block, &h, sizeof h);
}

inline auto file_store::launch(std::shared_ptr<batch> b) -> io_ticket
{
  // Everything is allocated before the batch is published (its slots marked in flight, its ticket
  // issued): a failed allocation throws with nothing changed. Once published, a run that cannot
  // start fails the batch instead of leaving its slots in flight.
  std::vector<std::pair<std::size_t, std::int64_t>> places(b->items.size());  // (file, record in it) of each item
  std::vector<std::size_t> order;  // the items to move (a read's records known to fail are not)
  order.reserve(b->items.size());
  for (std::size_t i = 0; i < b->items.size(); ++i) {
    places[i] = place(b->items[i].slot);
    if (!b->items[i].failed) { order.push_back(i); }
  }
  auto const n = order.size();
  // Runs of adjacent records in one file, at most runs_max_ records each, and short enough that
  // every I/O thread of a drive has a run of the batch (a 32 MiB batch on one drive is four 8 MiB
  // runs, not two of 16 MiB leaving two threads idle), but never below 1 MiB.
  std::vector<std::int64_t> on_drive(static_cast<std::size_t>(drives_), 0);
  for (auto i : order) {
    ++on_drive[static_cast<std::size_t>(b->items[i].slot % drives_)];
  }
  std::int64_t const floor_records = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / record_bytes_);
  std::vector<std::int64_t> cap(static_cast<std::size_t>(drives_));
  for (std::size_t d = 0; d < cap.size(); ++d) {
    auto const share = (on_drive[d] + options_.io_threads - 1) / options_.io_threads;
    cap[d] = std::min(runs_max_, std::max(floor_records, share));
  }
  std::sort(order.begin(), order.end(), [&](auto x, auto y) { return places[x] < places[y]; });
  struct run_range {
    std::size_t first, last;   // [first, last) into `order`
    std::int64_t drive, rank;  // the drive, and the run's place among that drive's runs
  };
  std::vector<run_range> runs;
  std::vector<std::int64_t> runs_on(static_cast<std::size_t>(drives_), 0);
  for (std::size_t i = 0; i < n;) {
    auto const d = b->items[order[i]].slot % drives_;
    auto const longest = static_cast<std::size_t>(cap[static_cast<std::size_t>(d)]);
    std::size_t j = i + 1;
    while (j < n && j - i < longest && places[order[j]].first == places[order[i]].first &&
           places[order[j]].second == places[order[j - 1]].second + 1) {
      ++j;
    }
    runs.push_back({i, j, d, runs_on[static_cast<std::size_t>(d)]++});
    i = j;
  }
  // The drives' runs interleaved: every drive has work from the start of the batch.
  std::stable_sort(runs.begin(), runs.end(), [](auto const& x, auto const& y) { return x.rank < y.rank; });
  auto shared_order = std::make_shared<std::vector<std::size_t> const>(std::move(order));
  auto const id = next_ticket_;
  tickets_.emplace(id, b);  // the last allocation before publishing
  ++next_ticket_;
  for (auto const& it : b->items) {
    auto& s = index_[static_cast<std::size_t>(it.slot)];
    if (b->write) {
      s.writing = true;
      s.valid = false;  // its content is unknown until the write completes
    } else {
      ++s.readers;
    }
  }
  b->remaining.store(static_cast<int>(runs.size()));
  auto unstarted = [&](run_range const& r, std::exception const& e) {
    b->fail(std::span<std::size_t const>{shared_order->data() + r.first, r.last - r.first},
            [&] { return detail::concat("file_store: a run could not start: ", e.what()); });
    std::lock_guard lock{done_mutex_};
    b->remaining.fetch_sub(1);
  };
  for (auto const& r : runs) {
#ifdef STRATA_FILE_STORE_URING
    if (ring_ && !ring_gave_up_) {
      try {
        if (start_uring_run(b, shared_order, {r.first, r.last})) { continue; }  // else: the I/O threads
      } catch (std::exception const& e) {  // no memory for the run's state or its buffers
        unstarted(r, e);
        continue;
      }
    }
#endif
    auto const buffers = static_cast<std::size_t>(r.drive * options_.io_threads);
    try {
      auto& pool = *pools_[static_cast<std::size_t>(r.drive)];
      pool.post(!b->write, [this, b, shared_order, r, buffers](int worker) {
        std::span<std::size_t const> const run{shared_order->data() + r.first, r.last - r.first};
        try {
          thread_run(*b, run, buffers + static_cast<std::size_t>(worker));
        } catch (std::exception const& e) {  // allocation failure of a staging buffer
          b->fail(run, [&] { return detail::concat("file_store: ", e.what()); });
        }
        {
          std::lock_guard lock{done_mutex_};
          b->remaining.fetch_sub(1);
        }
        done_cv_.notify_all();
      });
    } catch (std::exception const& e) {  // the drive's queue could not take the run
      unstarted(r, e);
    }
  }
  return io_ticket{id};
}

inline auto file_store::aligned_for_direct(void const* p) const noexcept -> bool
{
  return !direct_ || (reinterpret_cast<std::uintptr_t>(p) % detail::file_alignment == 0 &&
                      page_bytes_ % detail::file_alignment == 0);
}

inline auto file_store::io_failure(char const* what, std::int64_t first_slot, std::size_t n, int e) const -> std::string
{
  auto const [fd, off] = where(first_slot);
  (void)fd;
  auto const last = first_slot + static_cast<std::int64_t>(n - 1) * drives_;
  return detail::concat("file_store: ", what, " of ", drives_ == 1 ? "slots [" : "every ",
                        drives_ == 1 ? "" : detail::concat(drives_, "th slot of ["), first_slot, ", ", last + 1,
                        ") in ", paths_[place(first_slot).first], " at offset ", off,
                        " failed: ", e == ENOSPC ? "no space left on the device: " : "", detail::errno_text(e));
}

inline auto file_store::prepare_run(batch& b, std::span<std::size_t const> run, worker_buffers& buf,
                                    std::vector<iovec>& iov, bool stage) const -> bool
{
  auto const n = run.size();
  auto const pad = static_cast<std::size_t>(record_bytes_ - detail::file_header_bytes - page_bytes_);
  auto const rb = static_cast<std::size_t>(record_bytes_);
  auto const hb = static_cast<std::size_t>(detail::file_header_bytes);
  auto const pb = static_cast<std::size_t>(page_bytes_);
  bool const staged = (stage && !b.write) || std::any_of(run.begin(), run.end(), [&](auto i) {
                        return !aligned_for_direct(b.write ? static_cast<void const*>(b.items[i].src) : b.items[i].dst);
                      });
  iov.clear();
  if (staged) {
    buf.staging.ensure(n * rb);
    if (b.write) {
      for (std::size_t k = 0; k < n; ++k) {
        auto const& it = b.items[run[k]];
        auto* rec = buf.staging.data() + k * rb;
        std::memcpy(rec + hb, it.src, pb);
        std::memset(rec + hb + pb, 0, pad);
        fill_header(rec, it, detail::crc32c(0, rec + hb, pb));
      }
    }
    iov.push_back({buf.staging.data(), n * rb});
    return true;
  }
  buf.headers.ensure(n * hb);
  buf.pad.ensure(static_cast<std::size_t>(detail::file_alignment));
  if (b.write) { std::memset(buf.pad.data(), 0, static_cast<std::size_t>(detail::file_alignment)); }
  for (std::size_t k = 0; k < n; ++k) {
    auto const& it = b.items[run[k]];
    auto* h = buf.headers.data() + k * hb;
    if (b.write) { fill_header(h, it, detail::crc32c(0, it.src, pb)); }
    iov.push_back({h, hb});
    iov.push_back({b.write ? const_cast<std::byte*>(it.src) : it.dst, pb});
    if (pad > 0) { iov.push_back({buf.pad.data(), pad}); }
  }
  return false;
}

inline auto file_store::verify_read(batch& b, std::span<std::size_t const> run, worker_buffers const& buf,
                                    bool staged) const -> void
{
  for (std::size_t k = 0; k < run.size(); ++k) {
    auto const& it = b.items[run[k]];
    std::byte const* header = staged ? buf.staging.data() + k * static_cast<std::size_t>(record_bytes_)
                                     : buf.headers.data() + k * static_cast<std::size_t>(detail::file_header_bytes);
    std::byte const* payload = staged ? header + detail::file_header_bytes : it.dst;
    detail::file_record_header h{};
    char const* why = check_header(header, it.slot, h);
    if (why == nullptr && (h.key != it.key || h.sequence != it.sequence)) {
      why = "the record is not the one last written (stale or torn write)";
    }
    if (why == nullptr && detail::crc32c(0, payload, static_cast<std::size_t>(page_bytes_)) != h.payload_crc) {
      why = "payload checksum mismatch";
    }
    if (why != nullptr) {  // this record only: the run's others are checked on
      b.fail(run.subspan(k, 1), [&] {
        return detail::concat("file_store: read of slot ", it.slot, " in ", paths_[place(it.slot).first], ": ", why);
      });
      continue;
    }
    if (staged) { std::memcpy(it.dst, payload, static_cast<std::size_t>(page_bytes_)); }
  }
}

inline auto file_store::thread_run(batch& b, std::span<std::size_t const> run, std::size_t buffers) -> void
{
  auto& buf = worker_buffers_[buffers];
  std::vector<iovec> iov;
  bool const staged = prepare_run(b, run, buf, iov);
  auto const first = b.items[run[0]].slot;
  auto const [fd, off] = where(first);
  int e = detail::transfer_all(options_.io, b.write, fd, iov.data(), static_cast<int>(iov.size()), off);
  if (e == 0 && b.write && options_.sync_writes) { e = options_.io.sync(options_.io.context, fd) == 0 ? 0 : errno; }
  if (e != 0) {
    b.fail(run, [&] { return io_failure(b.write ? "write" : "read", first, run.size(), e); });
    return;
  }
  if (!b.write) { verify_read(b, run, buf, staged); }
}

inline auto file_store::find(io_ticket t) -> std::map<std::uint64_t, std::shared_ptr<batch>>::iterator
{
  auto it = tickets_.find(t.id);
  STRATA_EXPECTS(it != tickets_.end(), "file_store: unknown or consumed ticket ", t.id);
  return it;
}

inline auto file_store::finish(std::map<std::uint64_t, std::shared_ptr<batch>>::iterator it, std::span<bool> intact)
    -> bool
{
  auto const b = std::move(it->second);
  tickets_.erase(it);
  bool const ok = !b->failed.load();
  for (std::size_t i = 0; i < b->items.size(); ++i) {
    auto const& x = b->items[i];
    if (!intact.empty()) { intact[i] = b->write ? ok : !x.failed; }
    auto& s = index_[static_cast<std::size_t>(x.slot)];
    if (!b->write) { --s.readers; }
    if (b->write) {
      s.writing = false;
      s.valid = ok;
      s.key = x.key;
      s.sequence = x.sequence;
    }
  }
  if (!ok) {
    std::lock_guard lock{b->error_mutex};
    last_error_ = b->error;
  }
  return ok;
}

}  // namespace strata
