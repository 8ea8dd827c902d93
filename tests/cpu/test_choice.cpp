// SPDX-License-Identifier: Apache-2.0
#include "../support/catch.hpp"

#include <strata/transfer/choice.hpp>

#include <thread>
#include <vector>

using namespace strata;

namespace {
// Shaped like the H200 measurements of DESIGN.md: SM copies fast everywhere but costly beside
// decode; batched DMA nearly free for compute but slow on small blocks and costly for the CPU.
std::vector<transfer_option> options()
{
  return {
      {"gpu_assisted/2", {51, 50, 48}, {0, 0.085, 0.24}, 0},
      {"gpu_assisted/1", {40, 39, 37}, {0, 0.08, 0.10}, 0},
      {"dma_batch/1024", {54, 53, 53}, {0, 0.005, 0.008}, 130},
      {"dma_batch/1024 (submit thread)", {53, 52, 52}, {0, 0.005, 0.008}, 0.05},
  };
}
}  // namespace

TEST_CASE("predict combines transfer, slowed compute and CPU time", "[cpu][choice]")
{
  transfer_option const o{"x", {50, 40, 25}, {0, 0.1, 0.5}, 10};
  auto const p = predict(o, {gpu_activity::decode, 1e9, 30, 1});
  CHECK(p.transfer_ms == Catch::Approx(40));
  CHECK(p.compute_ms == Catch::Approx(45));
  CHECK(p.cpu_ms == Catch::Approx(10.0 / 1.073741824));
  CHECK(p.makespan_ms == Catch::Approx(45 + 10.0 / 1.073741824));
  CHECK(predict(o, {gpu_activity::idle, 1e9, 0, 0}).makespan_ms == Catch::Approx(20));
}

TEST_CASE("the choice follows what the GPU is doing", "[cpu][choice]")
{
  auto const opts = options();
  // Idle GPU, engine thread busy: the fastest option that costs the engine no CPU.
  CHECK(opts[choose_transfer(opts, {gpu_activity::idle, 1 << 30, 0, 1})].name == "dma_batch/1024 (submit thread)");
  // Beside a decode that outlasts the load: the copy engine, whose interference is smallest.
  CHECK(opts[choose_transfer(opts, {gpu_activity::decode, 1 << 30, 100, 1})].name == "dma_batch/1024 (submit thread)");
  // When batched DMA collapses (small blocks), SM copies win beside a short prefill.
  auto small = opts;
  small[2].gbps[0] = small[2].gbps[1] = small[2].gbps[2] = 17;
  small[3].gbps[0] = small[3].gbps[1] = small[3].gbps[2] = 17;
  CHECK(small[choose_transfer(small, {gpu_activity::prefill, 1 << 30, 5, 1})].name == "gpu_assisted/2");
  // Beside a decode about as long as the load: 1 CTA (lower slowdown) beats 2 CTAs and slow DMA.
  CHECK(small[choose_transfer(small, {gpu_activity::decode, 1 << 30, 50, 1})].name == "gpu_assisted/1");
}

TEST_CASE("the choice rejects bad input", "[cpu][choice]")
{
  auto opts = options();
  STRATA_REQUIRE_THROWS(invalid_argument, "no options", (void)choose_transfer({}, {}));
  STRATA_REQUIRE_THROWS(invalid_argument, "must not be negative",
                        (void)choose_transfer(opts, {gpu_activity::idle, -1, 0, 1}));
  STRATA_REQUIRE_THROWS(invalid_argument, "must not be negative",
                        (void)choose_transfer(opts, {gpu_activity::idle, 1, -5, 1}));
  opts[1].gbps[2] = 0;
  STRATA_REQUIRE_THROWS(invalid_argument, "gpu_assisted/1 has no positive bandwidth",
                        (void)choose_transfer(opts, {gpu_activity::decode, 1, 0, 1}));
  opts[1].gbps[2] = 5;
  opts[1].slowdown[2] = -0.1;
  STRATA_REQUIRE_THROWS(invalid_argument, "negative slowdown",
                        (void)choose_transfer(opts, {gpu_activity::decode, 1, 0, 1}));
  STRATA_REQUIRE_THROWS(invalid_argument, "unknown gpu_activity",
                        (void)choose_transfer(opts, {static_cast<gpu_activity>(7), 1, 0, 1}));
}

TEST_CASE("the observed descriptor cost follows the enqueues and relaxes back without them", "[cpu][choice]")
{
  descriptor_cost c{0.5, 100};
  CHECK(c.us() == 0.5);
  c.observe(60, 120);  // a window not yet full changes nothing
  CHECK(c.us() == 0.5);
  c.observe(40, 80);  // 100 descriptors in 200 µs: 2 µs each, a quarter of the way
  CHECK(c.us() == Approx(0.5 + (2.0 - 0.5) / 4));
  for (int i = 0; i < 40; ++i) {  // a busy engine thread, window after window
    c.observe(100, 200);
  }
  CHECK(c.us() == Approx(2.0).epsilon(1e-3));
  for (int i = 0; i < 64; ++i) {  // other backends chosen meanwhile: back toward the configured figure
    c.relax();
  }
  CHECK(c.us() < 0.55);
  CHECK(c.us() > 0.5);
  c.observe(0, 5);  // nothing enqueued, or a bad time: ignored
  c.observe(10, -1);
  c.reset(0.8);
  CHECK(c.us() == 0.8);
  c.observe(99, 0);  // the window restarts after a reset
  CHECK(c.us() == 0.8);
  STRATA_REQUIRE_THROWS(invalid_argument, "must be positive", (descriptor_cost{0, 10}));
  STRATA_REQUIRE_THROWS(invalid_argument, "must be positive", (descriptor_cost{1, 0}));
}

TEST_CASE("the observed descriptor cost takes observations from several threads", "[cpu][choice]")
{
  descriptor_cost c{1.0, 64};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.observe(16, 48);  // 3 µs each
        if (i % 50 == 0) { c.relax(); }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(c.us() > 2.5);
  CHECK(c.us() <= 3.0);
}
