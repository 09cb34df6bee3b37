// SPDX-License-Identifier: Apache-2.0
// merge_attn_states and convert_topk_indices benchmarks.
//   merge: prefill context merges (D = 128 per head, 32768 tokens x 128 heads) and latent-space
//          merges (D = 512, 8192 x 128); bf16 and fp8 outputs. bytes = pairs * (2 D * 2 read +
//          D * out_size written + 3 * 4 lse)
//   convert_topk: 65536 tokens x topk 2048 (DSA decode/prefill rows), page 64.
//          bytes = T * topk * 4 * 2 (indices read, rows written) + T * 4 * 2 (req_id, valid counts)
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "mla/ops.h"
#include "registry.h"

namespace mla::bench {
namespace {

void bench_merge(BenchContext& ctx) {
  const Device dev = Device::cuda(ctx.device());
  const Context op = ctx.op_context();
  const int64_t q = ctx.quick() ? 8 : 1;
  struct Shape {
    int64_t T, H, D;
  };
  for (const Shape s : {Shape{32768 / q, 128, 128}, Shape{8192 / q, 128, 512}}) {
    Tensor pre = Tensor::empty({s.T, s.H, s.D}, DType::bf16, dev), suf = Tensor::empty({s.T, s.H, s.D}, DType::bf16, dev);
    Tensor pl = Tensor::empty({s.H, s.T}, DType::f32, dev), sl = Tensor::empty({s.H, s.T}, DType::f32, dev);
    Tensor olse = Tensor::empty({s.H, s.T}, DType::f32, dev);
    fill_uniform(pre, -2, 2, 41, ctx.stream());
    fill_uniform(suf, -2, 2, 42, ctx.stream());
    fill_uniform(pl, -5, 5, 43, ctx.stream());
    fill_uniform(sl, -5, 5, 44, ctx.stream());
    const double pairs = static_cast<double>(s.T * s.H);
    const std::string shape = "T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) + " D=" + std::to_string(s.D);
    for (bool fp8 : {false, true}) {
      Tensor out = Tensor::empty({s.T, s.H, s.D}, fp8 ? DType::fp8_e4m3 : DType::bf16, dev);
      const double ms =
          ctx.time_ms([&] { merge_attn_states(out, olse, pre, pl, suf, sl, -1, fp8 ? 0.05f : 0.0f, op); });
      const double bytes = pairs * (4.0 * s.D + (fp8 ? 1.0 : 2.0) * s.D + 12.0);
      ctx.report("merge_attn_states", shape + (fp8 ? " -> fp8" : " -> bf16"), ms, bytes, 0,
                 "bytes = T*H*(2*D*2 read + D*out written + 3*4 lse)");
    }
  }
}

void bench_topk(BenchContext& ctx) {
  const Device dev = Device::cuda(ctx.device());
  const int64_t T = ctx.quick() ? 4096 : 65536, K = 2048, page = 64, R = 256, width = 2048;
  std::mt19937_64 g(51);
  std::uniform_int_distribution<int32_t> req(0, static_cast<int32_t>(R - 1)), pos(0, static_cast<int32_t>(width * page - 1));
  Tensor req_h = Tensor::empty({T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) static_cast<int32_t*>(req_h.data())[t] = req(g);
  Tensor bt_h = Tensor::empty({R, width}, DType::i32);
  const std::vector<int32_t> perm = random_permutation(R * width, 52);
  std::copy(perm.begin(), perm.end(), static_cast<int32_t*>(bt_h.data()));
  // Indices: a random position per (token, k), -1 for about 1 in 20 (padding).
  Tensor idx = Tensor::empty({T, K}, DType::i32, dev);
  Tensor idx_h = Tensor::empty({T, K}, DType::i32);
  auto* ip = static_cast<int32_t*>(idx_h.data());
  for (int64_t i = 0; i < T * K; ++i) ip[i] = g() % 20 == 0 ? -1 : pos(g);
  copy(idx, idx_h);
  Tensor req_d = req_h.to(dev), bt_d = bt_h.to(dev), out = Tensor::empty({T, K}, DType::i32, dev);
  Tensor valid = Tensor::empty({T}, DType::i32, dev);
  const Context op = ctx.op_context();
  const double ms = ctx.time_ms([&] { convert_topk_indices(req_d, bt_d, idx, out, page, 0, {}, {}, valid, {}, op); });
  const double bytes = static_cast<double>(T) * K * 8.0 + static_cast<double>(T) * 8.0;
  ctx.report("convert_topk_indices", "T=" + std::to_string(T) + " topk=2048 page 64 + valid counts", ms, bytes, 0,
             "bytes = T*topk*4*2 + T*4*2");
}

}  // namespace

void register_merge(Registry& r) {
  r.add("merge", "merge_attn_states (prefill D=128 and latent D=512, bf16 / fp8 out)", bench_merge);
  r.add("convert_topk", "convert_topk_indices (topk 2048)", bench_topk);
}

}  // namespace mla::bench
