// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/file_store/recovery.inl
 * @brief Member definitions of `file_store` (tier/file_store.hpp, which includes this file) for
 *        reopening: the store's descriptor, checked before a reopen changes anything, and the
 *        recovery of intact records, which refuses rather than drops what it cannot read.
 */
#pragma once

namespace strata {

inline auto file_store::descriptor_path(std::int64_t d) const -> std::string
{
  return (std::filesystem::path{dirs_[static_cast<std::size_t>(d)]} /
          detail::concat("strata-kv.rank", options_.tp_rank, ".meta"))
      .string();
}

inline auto file_store::descriptor_text(std::int64_t d) const -> std::string
{
  return detail::concat("strata file_store\nformat ", detail::file_format_version, "\nconfiguration ", geometry_hash_,
                        "\nrecord_bytes ", record_bytes_, "\nfiles ", options_.files, "\nslots_per_file ",
                        slots_per_file_, "\ndrives ", drives_, "\ndrive ", d, "\n");
}

inline auto file_store::check_descriptor() const -> void
{
  for (std::int64_t d = 0; d < drives_; ++d) {
    std::ifstream in{descriptor_path(d)};
    if (!in) { continue; }  // a new drive, or a store made before descriptors: its records are checked one by one
    std::map<std::string, std::string> found, want;
    auto parse = [](std::istream& s, std::map<std::string, std::string>& into) {
      s.exceptions(std::ios::badbit);  // no memory: throw, never parse half a descriptor
      std::string k, v;
      while (s >> k && std::getline(s >> std::ws, v)) {
        into[k] = v;
      }
    };
    parse(in, found);
    std::istringstream mine{descriptor_text(d)};
    parse(mine, want);
    if (found.count("drives") == 0) {  // written before stores had several drives: one
      found["drives"] = "1";
      found["drive"] = "0";
    }
    for (char const* k : {"format", "configuration", "drives", "drive", "record_bytes", "files", "slots_per_file"}) {
      bool same = found[k] == want[k];
      if (!same && std::string_view{k} == "slots_per_file" && options_.files == 1) {  // one file may grow
        std::string const& v = found[k];
        long long n = 0;
        auto const [end, error] = std::from_chars(v.data(), v.data() + v.size(), n);
        same = !v.empty() && error == std::errc{} && end == v.data() + v.size() && n <= slots_per_file_;
      }
      STRATA_EXPECTS_AS(
          file_store_error, same, "file_store::open: ", descriptor_path(d), " says its records were written with ", k,
          " ", found[k].empty() ? "(missing)" : found[k], ", this store has ", want[k],
          std::string_view{k} == "configuration"     ? " (another geometry, page size, tag or tensor-parallel size)"
          : std::string_view{k}.starts_with("drive") ? " (directories given in another number or order)"
                                                     : "",
          ": refusing to open it, nothing changed (reopen with the configuration that wrote it, or remove "
          "the directory)");
    }
  }
}

inline auto file_store::write_descriptor() const -> void
{
  for (std::int64_t d = 0; d < drives_; ++d) {
    // Written to a temporary file and renamed: a crash leaves the old descriptor or the new one.
    std::string const path = descriptor_path(d), tmp = path + ".tmp";
    std::string const text = descriptor_text(d);
    detail::unique_fd fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    STRATA_EXPECTS_AS(file_store_error, fd.get() >= 0, "file_store: cannot create ", tmp, ": ",
                      detail::errno_text(errno));
    iovec v{const_cast<char*>(text.data()), text.size()};
    int const e = detail::transfer_all(io_backend{}, true, fd.get(), &v, 1, 0);
    STRATA_EXPECTS_AS(file_store_error, e == 0 && ::fsync(fd.get()) == 0, "file_store: cannot write ", tmp, ": ",
                      detail::errno_text(e != 0 ? e : errno));
    STRATA_EXPECTS_AS(file_store_error, ::rename(tmp.c_str(), path.c_str()) == 0, "file_store: cannot rename ", tmp,
                      ": ", detail::errno_text(errno));
    // The directory entries (the record files, the descriptor) survive a crash only once it is synced.
    auto const& directory = dirs_[static_cast<std::size_t>(d)];
    detail::unique_fd dir{::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    STRATA_EXPECTS_AS(file_store_error, dir.get() >= 0 && ::fsync(dir.get()) == 0, "file_store: cannot sync directory ",
                      directory, ": ", detail::errno_text(errno));
  }
}

inline auto file_store::recover() -> void
{
  std::vector<detail::file_record_header> found(static_cast<std::size_t>(capacity()));
  std::vector<char> intact(static_cast<std::size_t>(capacity()), 0);
  std::vector<char> unread(static_cast<std::size_t>(capacity()), 0);  // an I/O error: dropped, whatever it held
  std::vector<recovered_record> identity(static_cast<std::size_t>(capacity()));
  // Jobs of `chunk` adjacent records of one drive, on that drive's threads.
  std::int64_t const chunk = runs_max_;
  std::int64_t const per_drive = (capacity() + drives_ - 1) / drives_;
  std::int64_t const chunks = (per_drive + chunk - 1) / chunk;
  std::int64_t const jobs = chunks * drives_;
  std::atomic<std::int64_t> remaining{jobs};
  std::atomic<std::int64_t> other_configuration{0};  // records another configuration of the store wrote
  std::mutex m;
  std::condition_variable cv;
  std::string first_error, abort_error;  // abort_error: recovery could not finish (nothing may be dropped)
  auto job = [&](std::int64_t d, std::int64_t first, int worker) {
    try {
      auto& buf = worker_buffers_[static_cast<std::size_t>(d * options_.io_threads + worker)];
      buf.staging.ensure(static_cast<std::size_t>(record_bytes_));
      for (std::int64_t l = first; l < first + chunk; ++l) {
        std::int64_t const s = l * drives_ + d;
        if (s >= capacity()) { break; }
        auto const [fd, off] = where(s);
        iovec v{buf.staging.data(),
                static_cast<std::size_t>(options_.verify_on_reopen ? record_bytes_ : detail::file_header_bytes)};
        int const e = detail::transfer_all(options_.io, false, fd, &v, 1, off);
        detail::file_record_header h{};
        char const* const why = e == 0 ? check_header(buf.staging.data(), s, h) : "unread";
        if (why == detail::file_other_configuration) { other_configuration.fetch_add(1); }
        bool ok = why == nullptr;
        if (ok && options_.verify_on_reopen) {
          ok = detail::crc32c(0, buf.staging.data() + detail::file_header_bytes,
                              static_cast<std::size_t>(page_bytes_)) == h.payload_crc;
        }
        if (ok) {  // the header checksum covers the identity
          auto& r = identity[static_cast<std::size_t>(s)];
          std::uint32_t count = 0;
          std::memcpy(&r.parent_key, buf.staging.data() + detail::file_identity_offset, sizeof r.parent_key);
          std::memcpy(&count, buf.staging.data() + detail::file_identity_offset + 8, sizeof count);
          ok = std::int64_t(count) <= max_record_ids;
          if (ok) {
            r.ids.resize(count);
            if (count > 0) {
              std::memcpy(r.ids.data(), buf.staging.data() + detail::file_ids_offset, count * sizeof(std::int32_t));
            }
          }
        }
        if (e != 0) {
          std::lock_guard lock{m};
          if (first_error.empty()) { first_error = io_failure("recovery read", s, 1, e); }
        }
        found[static_cast<std::size_t>(s)] = h;
        intact[static_cast<std::size_t>(s)] = ok ? 1 : 0;
        unread[static_cast<std::size_t>(s)] = e != 0 ? 1 : 0;
      }
    } catch (std::exception const& e) {  // no memory for a buffer or an identity: recovery stops
      std::lock_guard lock{m};
      if (abort_error.empty()) { abort_error = e.what(); }
    }
    // Notified under the lock: the waiting thread returns (and its `cv` and `m` go) only once
    // this thread has let go of both.
    std::lock_guard lock{m};
    remaining.fetch_sub(1);
    cv.notify_all();
  };
  std::int64_t posted = 0;
  try {
    for (; posted < jobs; ++posted) {  // the drives' chunks interleaved
      std::int64_t const d = posted % drives_, first = posted / drives_ * chunk;
      pools_[static_cast<std::size_t>(d)]->post([&job, d, first](int worker) { job(d, first, worker); });
    }
  } catch (std::exception const& e) {  // the queue could not take a job: wait for those it took
    std::lock_guard lock{m};
    abort_error = e.what();
    remaining.fetch_sub(jobs - posted);
  }
  {
    std::unique_lock lock{m};
    cv.wait(lock, [&] { return remaining.load() == 0; });
  }
  // Nothing is released or dropped unless every slot was read: a store that cannot recover now
  // refuses to open, and opens whole once it can.
  std::string named = dirs_[0];
  for (std::size_t d = 1; d < dirs_.size(); ++d) {
    named += (d + 1 == dirs_.size() ? " and " : ", ") + dirs_[d];
  }
  STRATA_EXPECTS_AS(file_store_error, abort_error.empty(), "file_store::open: recovery of ", named,
                    " could not finish (", abort_error, "): refusing to open it, no record dropped");
  // Records of another configuration and none of this one: the store was opened with the wrong
  // settings (a few among this configuration's records are damage, dropped like any other).
  bool const ours = std::find(intact.begin(), intact.end(), char{1}) != intact.end();
  STRATA_EXPECTS_AS(file_store_error, ours || other_configuration.load() == 0, "file_store::open: ", named, " holds ",
                    other_configuration.load(), " records written with ", detail::file_other_configuration,
                    " and none of this one: refusing to open it, nothing changed (reopen with the configuration that "
                    "wrote them, or remove the directory)");
  last_error_ = first_error;
  // The allocator hands out slots from the back of its free stack: allocate everything, then
  // release the slots without an intact record (in descending order, so that ascending ids come
  // out first again).
  (void)slots_.allocate(capacity());
  std::vector<std::int64_t> free_slots;
  for (std::int64_t s = capacity() - 1; s >= 0; --s) {
    auto const& h = found[static_cast<std::size_t>(s)];
    if (intact[static_cast<std::size_t>(s)]) {
      index_[static_cast<std::size_t>(s)] = slot_state{h.key, h.sequence, true, false};
      next_sequence_ = std::max(next_sequence_, h.sequence + 1);
    } else {
      free_slots.push_back(s);
    }
  }
  if (!free_slots.empty()) { slots_.release(free_slots); }
  for (std::int64_t s = 0; s < capacity(); ++s) {
    if (!intact[static_cast<std::size_t>(s)]) { continue; }
    auto& r = identity[static_cast<std::size_t>(s)];
    r.slot = s;
    r.key = found[static_cast<std::size_t>(s)].key;
    recovered_.push_back(std::move(r));
  }
  dropped_ = 0;
  for (std::int64_t s = 0; s < capacity(); ++s) {
    auto const& h = found[static_cast<std::size_t>(s)];
    if (!intact[static_cast<std::size_t>(s)] && (h.magic != 0 || unread[static_cast<std::size_t>(s)])) {
      ++dropped_;  // zeros that read: never written
    }
  }
}

}  // namespace strata
