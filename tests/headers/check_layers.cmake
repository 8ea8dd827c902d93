# SPDX-License-Identifier: Apache-2.0
# The layering of include/strata/ (docs/architecture.md, "Layers and folders"): a header includes
# only headers of its own layer or of layers below it; strata.hpp includes every public host-only
# header; and no header grows past 700 lines (a face is ~650 at most: its machinery goes to detail/). Run by ctest: cmake -DSTRATA_INCLUDE=<include dir> -P check_layers.cmake
#
# Layers, bottom to top; members of one layer are separated by commas. A path belongs to the layer
# of its longest matching prefix.
set(layers
  "config.hpp,error.hpp,types.hpp,detail/,cuda.cuh"  # 0: vocabulary, errors, CUDA owners
  "geometry.hpp"                                     # 1
  "layout/"                                          # 2
  "transfer/"                                        # 3
  "tier/"                                            # 4
  "index/"                                           # 5
  "sched/"                                           # 6
  "presets/"                                         # 7: measured machine figures, read by cache/ and sim/
  "cache/"                                           # 8: where the data plane and the control plane meet
  "sim/"                                             # 9: a client of cache/, like an engine
  "strata.hpp")                                      # 10: the umbrella

if(NOT STRATA_INCLUDE)
  message(FATAL_ERROR "check_layers: pass -DSTRATA_INCLUDE=<the include directory>")
endif()
set(root "${STRATA_INCLUDE}/strata")

function(layer_of path out)
  set(best -1)
  set(best_len 0)
  set(i 0)
  foreach(group IN LISTS layers)
    string(REPLACE "," ";" members "${group}")
    foreach(m IN LISTS members)
      string(LENGTH "${m}" len)
      string(FIND "${path}" "${m}" at)
      if(at EQUAL 0 AND len GREATER best_len)
        set(best ${i})
        set(best_len ${len})
      endif()
    endforeach()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} ${best} PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE "${root}" "${root}/*.hpp" "${root}/*.cuh" "${root}/*.inl")
set(errors 0)
foreach(h IN LISTS headers)
  layer_of("${h}" own)
  if(own LESS 0)
    message(SEND_ERROR "check_layers: ${h} is in no layer: add its folder to tests/headers/check_layers.cmake and docs/architecture.md")
    math(EXPR errors "${errors} + 1")
    continue()
  endif()
  file(READ "${root}/${h}" content)
  string(REGEX REPLACE "[^\n]" "" newlines "${content}")
  string(LENGTH "${newlines}" line_count)
  if(line_count GREATER 700)
    message(SEND_ERROR "check_layers: ${h} has ${line_count} lines (at most 700): split a face from its details")
    math(EXPR errors "${errors} + 1")
  endif()
  file(STRINGS "${root}/${h}" includes REGEX "^#include <strata/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include <strata/([^>]+)>.*$" "\\1" target "${line}")
    layer_of("${target}" theirs)
    if(theirs GREATER own)
      message(SEND_ERROR "check_layers: ${h} (layer ${own}) includes ${target} (layer ${theirs}), a layer above it")
      math(EXPR errors "${errors} + 1")
    endif()
  endforeach()
endforeach()

# The umbrella covers every public host-only header.
file(STRINGS "${root}/strata.hpp" umbrella REGEX "^#include <strata/")
foreach(h IN LISTS headers)
  # tier/redis_store.hpp needs hiredis (strata::redis): users include it themselves.
  if(NOT h MATCHES "\\.hpp$" OR h MATCHES "(^|/)detail/" OR h STREQUAL "strata.hpp" OR h STREQUAL "tier/redis_store.hpp")
    continue()
  endif()
  list(FIND umbrella "#include <strata/${h}>" found)
  if(found LESS 0)
    message(SEND_ERROR "check_layers: strata.hpp does not include the public host-only header ${h}")
    math(EXPR errors "${errors} + 1")
  endif()
endforeach()

list(LENGTH headers n)
if(errors GREATER 0)
  message(FATAL_ERROR "check_layers: ${errors} problem(s) in ${n} headers")
endif()
message(STATUS "check_layers: ${n} headers, each includes only its own layer or those below it")
