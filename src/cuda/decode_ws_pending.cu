// TEMPORARY: the CUDA decode family replaces this file with the real split-KV sizing (ops/attention_ws.h).
// Until then asking for a CUDA decode workspace fails loudly instead of returning a made-up size.
#include "mla/error.h"
#include "ops/attention_ws.h"

namespace mla::cuda {

std::size_t decode_workspace_bytes(int64_t, int64_t, int64_t, int64_t) {
  throw Error("mqa_decode_workspace_bytes: the CUDA decode backend does not implement workspace sizing yet");
}

}  // namespace mla::cuda
