// SPDX-License-Identifier: Apache-2.0
/**
 * @file strata.hpp
 * @brief Umbrella header: every public host-only part of strata (device parts are in `.cuh`
 *        headers: `strata/cache/gpu_policies.cuh` for the GPU engine loop). A test checks that it
 *        lists every public `.hpp` (tests/headers/check_layers.cmake).
 *
 * The entry point is `strata::cache_controller` (`strata/cache/controller.hpp`).
 */
#pragma once

#include <strata/cache/controller.hpp>
#include <strata/cache/executor.hpp>
#include <strata/cache/policies.hpp>
#include <strata/cache/remote_tier.hpp>
#include <strata/cache/requests.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/index/hiradix_types.hpp>
#include <strata/index/page_key.hpp>
#include <strata/layout/engine.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/layout/layout.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/presets/h200.hpp>
#include <strata/sched/baselines.hpp>
#include <strata/sched/cost_model.hpp>
#include <strata/sched/scheduler.hpp>
#include <strata/sched/strata_scheduler.hpp>
#include <strata/sched/toolkit.hpp>
#include <strata/sim/engine.hpp>
#include <strata/sim/shared_remote.hpp>
#include <strata/sim/virtual_executor.hpp>
#include <strata/sim/workload.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/device_pool.hpp>
#include <strata/tier/drive_rates.hpp>
#include <strata/tier/file_store.hpp>
#include <strata/tier/host_pool.hpp>
#include <strata/tier/io_backend.hpp>
#include <strata/tier/keyed_file_store.hpp>
#include <strata/tier/keyed_store.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/tier/tier_stack.hpp>
#include <strata/transfer/choice.hpp>
#include <strata/transfer/copy_plan.hpp>
#include <strata/transfer/host_copy.hpp>
#include <strata/types.hpp>
