// SPDX-License-Identifier: Apache-2.0
// check_group_ranks (collective_check.h): one rank-order check for every wrapper of a whole group.
#include "dist/collective_check.h"

namespace mla::dist {

void check_group_ranks(const std::vector<std::unique_ptr<Communicator>>& comms, const char* what) {
  const int w = static_cast<int>(comms.size());
  MLA_CHECK(w >= 1, "{}: expected at least one communicator, got none", what);
  for (int r = 0; r < w; ++r) {
    const Communicator* c = comms[static_cast<std::size_t>(r)].get();
    MLA_CHECK(c != nullptr, "{}: communicator {} is null, expected rank {} of {}", what, r, r, w);
    MLA_CHECK(c->world_size() == w && c->rank() == r,
              "{}: communicator {} must be rank {} of a group of {}, got rank {} of {}", what, r, r, w, c->rank(),
              c->world_size());
  }
}

}  // namespace mla::dist
