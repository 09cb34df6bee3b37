#pragma once
// Decode tiling (the MQA engine's, common/mqa_traits.cuh) and the split-KV policy.
#include <algorithm>
#include <cstdint>

#include "cuda/common/mqa_traits.cuh"

namespace mla::cuda::decode {

using Traits = mqa::Traits;

inline constexpr int kMaxSplits = 64;           // partials per request row (combine keeps their weights in smem)
inline constexpr int64_t kMinSplitKeys = 256;   // a split shorter than 8 tiles costs more than it saves
inline constexpr int kCombineThreads = 128;

inline int64_t m_tiles(int64_t s_q, int64_t h_q) { return (s_q * h_q + Traits::kBlockM - 1) / Traits::kBlockM; }

// KV splits per request. The attention kernel runs one CTA per SM (its shared memory), so a launch of
// `ctas` CTAs takes ceil(ctas / sms) waves; splitting each request's keys S ways makes the CTAs S times
// shorter. Pick the S that minimises waves / S (ties and gains under 5% keep the smaller S: every split
// adds a partial row to write and combine), never more splits than max_seq_len has kMinSplitKeys chunks.
inline int choose_splits(int64_t b, int64_t s_q, int64_t h_q, int64_t max_seq_len, int sms) {
  const int64_t ctas = b * m_tiles(s_q, h_q);
  if (ctas <= 0 || sms <= 0) return 1;
  const int64_t cap = std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, (max_seq_len + kMinSplitKeys - 1) / kMinSplitKeys));
  int best = 1;
  double best_t = static_cast<double>((ctas + sms - 1) / sms);
  for (int s = 2; s <= cap; ++s) {
    const double t = static_cast<double>((ctas * s + sms - 1) / sms) / s;
    if (t < 0.95 * best_t) {
      best = s;
      best_t = t;
    }
  }
  return best;
}

// Workspace layout for S splits: partial LSE [b, S, M] fp32, then (256-byte aligned) partial O
// [b, S, M, 512] fp32, M = s_q * h_q.
inline int64_t ws_lse_bytes(int64_t b, int64_t s_q, int64_t h_q, int splits) {
  return (b * splits * s_q * h_q * 4 + 255) / 256 * 256;
}
inline int64_t ws_bytes(int64_t b, int64_t s_q, int64_t h_q, int splits) {
  if (splits <= 1) return 0;
  return ws_lse_bytes(b, s_q, h_q, splits) + b * splits * s_q * h_q * Traits::kMaxDv * 4;
}

}  // namespace mla::cuda::decode
