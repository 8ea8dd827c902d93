// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/file_store/format.hpp
 * @brief The file tier's on-disk record format: the 4 KiB header block, its constants and checksums
 *        (docs/file_tier.md describes the bytes).
 */
#pragma once

#include <strata/tier/detail/crc32c.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>

namespace strata::detail {

/// @brief The on-disk header of a record: the first 64 bytes of a zero-padded 4 KiB block.
struct file_record_header {
  std::uint64_t magic;          ///< `file_record_magic`
  std::uint32_t version;        ///< `file_format_version`
  std::uint32_t header_bytes;   ///< 4096
  std::uint64_t geometry_hash;  ///< `file_store::geometry_hash()` of the writer
  std::uint64_t key;            ///< content key of the page
  std::uint64_t payload_bytes;  ///< `page_bytes()` of the writer
  std::uint64_t sequence;       ///< store-wide write counter: tells a record from an older one in its slot
  std::uint64_t slot;           ///< the slot it was written to (catches misplaced bytes)
  std::uint32_t payload_crc;    ///< CRC-32C of the payload
  std::uint32_t header_crc;     ///< CRC-32C of the whole 4 KiB header block with this field zero
};
static_assert(sizeof(file_record_header) == 64);
static_assert(std::endian::native == std::endian::little, "file_store's format is little-endian");

inline constexpr std::uint64_t file_record_magic = 0x31564b4154525453ULL;  // the bytes "STRTAKV1" (little-endian)
inline constexpr std::uint32_t file_format_version = 2;  // 2: the page's identity after the 64-byte header
inline constexpr std::int64_t file_header_bytes = 4096;
/// @brief Why a record written by another configuration of the store does not check.
inline constexpr char const* file_other_configuration = "another geometry, tag or tensor-parallel rank or size";
inline constexpr std::int64_t file_alignment = 4096;
/// @brief Where a record's identity starts in its header block: parent key (8 bytes), id count (4),
///        zero (4), then the ids (4 bytes each).
inline constexpr std::size_t file_identity_offset = sizeof(file_record_header);
inline constexpr std::size_t file_ids_offset = file_identity_offset + 16;

/// @brief CRC-32C of a 4 KiB header block, taking its `header_crc` field as zero.
[[nodiscard]] inline std::uint32_t file_header_crc(std::byte const* block) noexcept
{
  constexpr std::size_t field = offsetof(file_record_header, header_crc);
  std::uint32_t const zero = 0;
  std::uint32_t c = crc32c(0, block, field);
  c = crc32c(c, &zero, sizeof zero);
  return crc32c(c, block + field + sizeof zero, static_cast<std::size_t>(file_header_bytes) - field - sizeof zero);
}

[[nodiscard]] constexpr std::int64_t round_up(std::int64_t v, std::int64_t a) noexcept { return (v + a - 1) / a * a; }

/// @brief 64-bit FNV-1a, for the geometry hash.
struct fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void bytes(void const* p, std::size_t n) noexcept
  {
    auto const* b = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h = (h ^ b[i]) * 0x100000001b3ULL;
    }
  }
  void i64(std::int64_t v) noexcept { bytes(&v, sizeof v); }
};

}  // namespace strata::detail
