// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/keyed_record.hpp
 * @brief The value a keyed store keeps for one page: a 64-byte header (magic, version, namespace,
 *        key, sizes, CRC-32C), the page's ids, then its payload (docs/remote_tier.md describes the
 *        bytes). The CRC covers all of it, so a value checks only if every byte is the writer's.
 */
#pragma once

#include <strata/tier/detail/crc32c.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace strata::detail {

struct keyed_record_header {
  std::uint64_t magic;           ///< `keyed_record_magic`
  std::uint32_t version;         ///< `keyed_record_version`
  std::uint32_t id_count;        ///< ids after the header (0: the writer had none)
  std::uint64_t ns_hi, ns_lo;    ///< `namespace_key()` of the writer
  std::uint64_t key_hi, key_lo;  ///< content key of the page
  std::uint64_t payload_bytes;   ///< `page_bytes()` of the writer
  std::uint32_t crc;             ///< CRC-32C of header (this field zero), ids and payload
  std::uint32_t reserved;        ///< 0
};
static_assert(sizeof(keyed_record_header) == 64);
static_assert(std::endian::native == std::endian::little, "keyed records are little-endian");

inline constexpr std::uint64_t keyed_record_magic = 0x31564b5452545353ULL;  // the bytes "SSTRTKV1" (little-endian)

/// @brief Why a value is not the page asked for (`ok`: it is).
enum class keyed_record_check : std::uint8_t { ok, malformed, other_namespace, other_key, other_ids, damaged };

[[nodiscard]] constexpr std::size_t keyed_record_bytes(std::size_t id_count, std::int64_t payload_bytes) noexcept
{ return sizeof(keyed_record_header) + id_count * sizeof(std::int32_t) + static_cast<std::size_t>(payload_bytes); }

/// @brief The header and ids of a record (`head` holds `keyed_record_bytes(ids.size(), 0)` bytes);
///        the payload follows them in the value, unchanged.
inline void encode_keyed_record_head(std::byte* head, std::uint64_t ns_hi, std::uint64_t ns_lo, std::uint64_t key_hi,
                                     std::uint64_t key_lo, std::uint32_t version, std::span<std::int32_t const> ids,
                                     std::byte const* payload, std::int64_t payload_bytes) noexcept
{
  keyed_record_header h{keyed_record_magic,
                        version,
                        static_cast<std::uint32_t>(ids.size()),
                        ns_hi,
                        ns_lo,
                        key_hi,
                        key_lo,
                        static_cast<std::uint64_t>(payload_bytes),
                        0,
                        0};
  std::memcpy(head, &h, sizeof h);
  if (!ids.empty()) { std::memcpy(head + sizeof h, ids.data(), ids.size_bytes()); }
  std::uint32_t c = crc32c(0, head, sizeof h + ids.size_bytes());
  c = crc32c(c, payload, static_cast<std::size_t>(payload_bytes));
  std::memcpy(head + offsetof(keyed_record_header, crc), &c, sizeof c);
}

/**
 * @brief Checks a value against the page asked for: its size, magic and version, namespace, key,
 *        ids (when `ids` is not empty), then the CRC of every byte.
 */
[[nodiscard]] inline keyed_record_check check_keyed_record(std::span<std::byte const> value, std::uint64_t ns_hi,
                                                           std::uint64_t ns_lo, std::uint64_t key_hi,
                                                           std::uint64_t key_lo, std::uint32_t version,
                                                           std::span<std::int32_t const> ids,
                                                           std::int64_t payload_bytes) noexcept
{
  if (value.size() < sizeof(keyed_record_header)) { return keyed_record_check::malformed; }
  keyed_record_header h;
  std::memcpy(&h, value.data(), sizeof h);
  if (h.magic != keyed_record_magic || h.version != version ||
      h.payload_bytes != static_cast<std::uint64_t>(payload_bytes) ||
      value.size() != keyed_record_bytes(h.id_count, payload_bytes)) {
    return keyed_record_check::malformed;
  }
  if (h.ns_hi != ns_hi || h.ns_lo != ns_lo) { return keyed_record_check::other_namespace; }
  if (h.key_hi != key_hi || h.key_lo != key_lo) { return keyed_record_check::other_key; }
  if (!ids.empty() &&
      (h.id_count != ids.size() || std::memcmp(value.data() + sizeof h, ids.data(), ids.size_bytes()) != 0)) {
    return keyed_record_check::other_ids;
  }
  constexpr std::size_t at = offsetof(keyed_record_header, crc);
  std::uint32_t const zero = 0;
  std::uint32_t c = crc32c(0, value.data(), at);
  c = crc32c(c, &zero, sizeof zero);
  c = crc32c(c, value.data() + at + sizeof zero, value.size() - at - sizeof zero);
  return c == h.crc ? keyed_record_check::ok : keyed_record_check::damaged;
}

/// @brief Where the payload of a checked value starts.
[[nodiscard]] inline std::byte const* keyed_record_payload(std::span<std::byte const> value) noexcept
{
  keyed_record_header h;
  std::memcpy(&h, value.data(), sizeof h);
  return value.data() + sizeof h + std::size_t(h.id_count) * sizeof(std::int32_t);
}

}  // namespace strata::detail
