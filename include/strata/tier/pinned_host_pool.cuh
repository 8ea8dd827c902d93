// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/pinned_host_pool.cuh
 * @brief The host tier's memory: pinned, device-mapped page-first records, allocated in chunks.
 */
#pragma once

#include <strata/cuda.cuh>
#include <strata/layout/page_first.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/slot_allocator.hpp>

#include <sys/mman.h>

#include <utility>
#include <vector>

namespace strata {

/// @brief How the pool's memory is obtained.
enum class pinned_allocation {
  host_alloc,  ///< `cudaHostAlloc` per chunk
  registered,  ///< `mmap` per chunk, then `cudaHostRegister` (the route for huge pages)
};

/// @brief Huge pages for `pinned_allocation::registered` (fewer TLB misses for the copy engine and the CPU).
enum class huge_pages {
  none,         ///< 4 KiB pages
  transparent,  ///< `madvise(MADV_HUGEPAGE)`: best effort, never fails
  reserved,     ///< `MAP_HUGETLB` from the reserved 2 MiB pool: fails if too few are reserved
};

/// @brief Options of `pinned_host_pool`.
struct pinned_pool_options {
  pinned_allocation allocation = pinned_allocation::host_alloc;  ///< how memory is obtained
  /// Bytes per chunk, rounded down to whole pages (at least one). Large single registrations fail
  /// or stall; 1 GiB chunks register quickly.
  std::int64_t chunk_bytes = std::int64_t{1} << 30;
  huge_pages huge = huge_pages::none;  ///< only with `registered`
};

/**
 * @brief Pinned host memory holding `num_pages` page-first records, and their slot allocator.
 *
 * Memory comes in chunks of whole pages, each followed by unused slack so that no two chunks are
 * adjacent: no merged copy run (and no copy descriptor) crosses a chunk. Every chunk is mapped into
 * the device's address space, so `gpu_assisted` kernels read it directly.
 */
class pinned_host_pool {
 public:
  static constexpr tier kind = tier::host;  ///< the tier it serves (a `tier_stack` store)

  /**
   * @param geometry shape of the cache
   * @param num_pages records to hold
   * @param options allocation route, chunk size, huge pages
   * @throw strata::invalid_argument for an invalid geometry, a non-positive page count, a
   *        non-positive chunk size, huge pages without `registered`, or more chunks than a layout holds
   * @throw strata::out_of_memory when the memory cannot be allocated or pinned (nothing is kept)
   */
  pinned_host_pool(kv_geometry const& geometry, std::int64_t num_pages, pinned_pool_options options = {})
      : geometry_{geometry}, options_{options}, slots_{num_pages > 0 ? num_pages : 1}
  {
    geometry.validate();
    STRATA_EXPECTS(num_pages > 0, "pinned_host_pool: num_pages must be positive, got ", num_pages);
    STRATA_EXPECTS(options.chunk_bytes > 0, "pinned_host_pool: chunk_bytes must be positive, got ",
                   options.chunk_bytes);
    STRATA_EXPECTS(options.huge == huge_pages::none || options.allocation == pinned_allocation::registered,
                   "pinned_host_pool: huge pages need pinned_allocation::registered");
    pages_per_chunk_ = std::max<std::int64_t>(1, options.chunk_bytes / geometry.page_bytes());
    std::int64_t const chunks = (num_pages + pages_per_chunk_ - 1) / pages_per_chunk_;
    STRATA_EXPECTS(chunks <= max_layer_tables, "pinned_host_pool: ", num_pages, " pages need ", chunks, " chunks of ",
                   pages_per_chunk_, " pages, more than the ", max_layer_tables, " a layout holds; raise chunk_bytes");
    (void)detail::checked_extent(num_pages, geometry.page_bytes(), "pinned_host_pool");
    num_pages_ = num_pages;
    try {
      for (std::int64_t c = 0; c < chunks; ++c) {
        std::int64_t const pages = std::min(pages_per_chunk_, num_pages - c * pages_per_chunk_);
        chunks_.push_back(allocate_chunk(pages * geometry.page_bytes()));
      }
    } catch (...) {
      release_chunks();
      throw;
    }
  }
  pinned_host_pool(pinned_host_pool const&) = delete;
  pinned_host_pool& operator=(pinned_host_pool const&) = delete;
  /// @brief Takes over `other`'s memory and slots (into a `tier_stack`); `other` holds nothing after.
  pinned_host_pool(pinned_host_pool&& other) noexcept
      : geometry_{other.geometry_},
        options_{other.options_},
        slots_{std::move(other.slots_)},
        pages_per_chunk_{other.pages_per_chunk_},
        num_pages_{std::exchange(other.num_pages_, 0)},
        chunks_{std::exchange(other.chunks_, {})}
  {
  }
  /**
   * @brief Frees the memory. The owner must first have completed every transfer that reads or
   *        writes it (`transfer_handle::synchronize`, or a synchronised stream): the pool does not
   *        know the streams its pages travel on. It does not rely on `cudaFreeHost` /
   *        `cudaHostUnregister` synchronising the device (they happen to, today), and it does not
   *        call `cudaDeviceSynchronize` either, which would also wait for unrelated work.
   */
  ~pinned_host_pool() { release_chunks(); }

  /// @brief The records as a layout (host addresses, which are also the device addresses).
  [[nodiscard]] page_first_chunked layout() const
  {
    std::vector<std::byte*> bases;
    for (auto const& c : chunks_) {
      bases.push_back(c.data);
    }
    return page_first_chunked{bases, geometry_, pages_per_chunk_, num_pages_};
  }
  /// @brief Shape of the cache.
  [[nodiscard]] kv_geometry const& geometry() const noexcept { return geometry_; }
  /// @brief Records in the pool.
  [[nodiscard]] std::int64_t num_pages() const noexcept { return num_pages_; }
  /// @brief Records in the pool (the `page_store` name).
  [[nodiscard]] std::int64_t capacity() const noexcept { return num_pages_; }
  /// @brief Records per chunk.
  [[nodiscard]] std::int64_t pages_per_chunk() const noexcept { return pages_per_chunk_; }
  /// @brief Chunks allocated.
  [[nodiscard]] std::int64_t num_chunks() const noexcept { return static_cast<std::int64_t>(chunks_.size()); }
  /// @brief Pinned bytes holding records.
  [[nodiscard]] std::int64_t bytes() const noexcept { return num_pages_ * geometry_.page_bytes(); }

  /// @brief The page slots. `allocate` throws `strata::out_of_memory` with the pages asked and
  ///        available and leaves the pool usable.
  [[nodiscard]] slot_allocator& slots() noexcept { return slots_; }
  /// @brief The page slots.
  [[nodiscard]] slot_allocator const& slots() const noexcept { return slots_; }

 private:
  struct chunk {
    std::byte* data{};
    std::size_t mapped{};  // bytes mmapped (registered route), 0 for cudaHostAlloc
  };
  static constexpr std::size_t slack = 4096;

  chunk allocate_chunk(std::int64_t bytes) const
  {
    auto const want = static_cast<std::size_t>(bytes);
    if (options_.allocation == pinned_allocation::host_alloc) {
      void* p = nullptr;
      cudaError_t const e = cudaHostAlloc(&p, want + slack, cudaHostAllocMapped | cudaHostAllocPortable);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw out_of_memory(detail::concat("strata: pinned_host_pool: cudaHostAlloc of ", want + slack,
                                           " bytes failed (", cudaGetErrorName(e), ")"));
      }
      try {
        check_mapping(static_cast<std::byte*>(p));
      } catch (...) {
        (void)cudaFreeHost(p);
        throw;
      }
      return {static_cast<std::byte*>(p), 0};
    }
    std::size_t const align = options_.huge == huge_pages::reserved ? std::size_t{2} << 20 : 4096;
    std::size_t const mapped = (want + slack + align - 1) / align * align;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    if (options_.huge == huge_pages::reserved) { flags |= MAP_HUGETLB; }
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) {
      throw out_of_memory(
          detail::concat("strata: pinned_host_pool: mmap of ", mapped, " bytes failed",
                         options_.huge == huge_pages::reserved ? " (too few reserved huge pages?)" : ""));
    }
    if (options_.huge == huge_pages::transparent) { (void)madvise(p, mapped, MADV_HUGEPAGE); }
    cudaError_t const e = cudaHostRegister(p, want, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      munmap(p, mapped);
      throw out_of_memory(detail::concat("strata: pinned_host_pool: cudaHostRegister of ", want, " bytes failed (",
                                         cudaGetErrorName(e), ")"));
    }
    chunk c{static_cast<std::byte*>(p), mapped};
    try {
      check_mapping(c.data);
    } catch (...) {
      (void)cudaHostUnregister(p);
      munmap(p, mapped);
      throw;
    }
    return c;
  }

  /// strata's layouts hand host addresses to kernels: require that the device sees the same address.
  static void check_mapping(std::byte* host)
  {
    void* device = nullptr;
    STRATA_CUDA_TRY(cudaHostGetDevicePointer(&device, host, 0));
    STRATA_EXPECTS_AS(cuda_error, device == host, "pinned_host_pool: device address ", device,
                      " differs from host address ", static_cast<void*>(host), " (no unified addressing)");
  }

  void release_chunks() noexcept
  {
    for (auto const& c : chunks_) {
      if (c.mapped == 0) {
        STRATA_ASSERT_CUDA_SUCCESS(cudaFreeHost(c.data));
      } else {
        STRATA_ASSERT_CUDA_SUCCESS(cudaHostUnregister(c.data));
        munmap(c.data, c.mapped);
      }
    }
    chunks_.clear();
  }

  kv_geometry geometry_;
  pinned_pool_options options_;
  slot_allocator slots_;
  std::int64_t pages_per_chunk_{};
  std::int64_t num_pages_{};
  std::vector<chunk> chunks_;
};
static_assert(addressable_store<pinned_host_pool>);

}  // namespace strata
