/**
 * @file strata.hpp
 * @brief Umbrella header: every host-only part of strata (device parts are in `.cuh` headers).
 */
#pragma once

#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/layout/engine.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/layout/layout.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/transfer/choice.hpp>
#include <strata/transfer/copy_plan.hpp>
#include <strata/transfer/host_copy.hpp>
#include <strata/types.hpp>
