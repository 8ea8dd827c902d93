// SPDX-License-Identifier: Apache-2.0
// Damage done to files on disk by the file-tier tests (corruption that a checksum must catch).
#pragma once

#include "catch.hpp"

#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

namespace strata::test {

/// @brief Flips bit `bit` of the byte at `offset` of `file`, and syncs it.
inline void flip_bit(std::filesystem::path const& file, off_t offset, int bit)
{
  int const fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char b{};
  REQUIRE(::pread(fd, &b, 1, offset) == 1);
  b = static_cast<unsigned char>(b ^ (1U << bit));
  REQUIRE(::pwrite(fd, &b, 1, offset) == 1);
  ::fsync(fd);
  ::close(fd);
}

}  // namespace strata::test
