// SPDX-License-Identifier: Apache-2.0
// A consumer of the installed remote tier: strata::redis brings hiredis' headers and library.
#include <strata/tier/redis_store.hpp>

#include <cstdio>

int main()
{
  static_assert(strata::async_keyed_page_store<strata::redis_store>);
  strata::redis_store_options o;  // no server here: a bad address is refused before any connection
  o.nodes = {"not-an-address"};
  o.space = {"m", "bf16", "page_first", {2, 4, 2, 64, 2, 2}, 0, 1};
  try {
    strata::redis_store s{o};
  } catch (strata::invalid_argument const& e) {
    std::printf("refused as expected: %s\n", e.what());
    return 0;
  }
  return 1;
}
