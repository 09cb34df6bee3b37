// SPDX-License-Identifier: Apache-2.0
// The list of dispatch tables and the device compute-capability lookup (families.h).
#include "cuda/dispatch/families.h"

#include "runtime/device_api.h"

namespace mla::cuda::dispatch {

std::vector<Family*> all_families() {
  return {&mqa_decode_table(), &sparse_mqa_table(), &mha_prefill_table(), &indexer_logits_table()};
}

int device_cc(int device) {
  const cuda_rt::DeviceInfo& info = cuda_rt::device_info(device);  // the runtime's per-device cache
  return info.cc_major * 10 + info.cc_minor;
}

}  // namespace mla::cuda::dispatch
