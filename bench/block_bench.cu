// SPDX-License-Identifier: Apache-2.0
// The DeepSeek attention block on CUDA (DeepseekAttention::forward, docs/BLOCK.md): V3 shapes of one
// tensor-parallel rank of 8 (16 heads; hidden 7168, q_lora_rank 1536, kv_lora_rank 512), random fp8
// weights with 128 x 128 block scales, served two ways: dequantised to bf16 at load (cuBLAS bf16
// GEMMs) and w8a8 (1 x 128 activation quantisation + cuBLASLt block-scaled fp8 GEMMs). Steps:
//   prefill T    one fresh sequence of T new tokens (T = 4096; quick 512)
//   decode b     b = 128 requests of one new token after 4096 cached tokens (quick 32 / 1024)
// Rows:
//   block        the whole step: metadata upload + forward(). Then a line with the parts timed on their
//                own over the same shapes: the five projections (w8a8: with their activation
//                quantisation, except o_proj's, which the layer writes), MlaAttention::forward (cache
//                write, attention, the layer's own kv_b_proj / absorption GEMMs; w8a8: its fused fp8
//                group-128 output quantisation for o_proj), and the rest (RMSNorm, RoPE: block - both), each as a
//                share of the block; the projections' TFLOP/s against the cuBLAS bf16 ceiling.
//   block_gemm   each projection's GEMM alone (w8a8: the block-scaled GEMM without the quantisation),
//                TFLOP/s and % of the bf16 ceiling measured in the same run (issue 11: fp8 >= 70%).
// Counts (DESIGN §6):
//   projection FLOPs  2 * T * (H * q_lora + q_lora * h * 192 + H * 576 + h * 128 * H)
//   attention FLOPs   prefill h * (T^2 / 2) * 2 * (192 + 128) + kv_b_proj 2 * T * 512 * h * 256;
//                     decode 2 * h * b * (ctx + 1) * (576 + 512) + absorption 2 * b * h * 128 * 512 * 2
//   bytes             weights once (bf16 2 B / fp8 1 B per element) + hidden in + out (bf16) + cache
//                     rows read (1152 B each) and written
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "mla/block_ops.h"
#include "mla/cache.h"
#include "mla/deepseek.h"
#include "mla/error.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "mla/step.h"
#include "registry.h"

namespace mla::bench {
namespace {

constexpr int64_t kPage = 64;

DeepseekConfig rank_config() {
  DeepseekConfig c = DeepseekConfig::preset("v3");
  c.num_attention_heads = 16;  // one rank of tp = 8, served as tp = 1
  return c;
}

// Host weights of the published fp8 form: codes of a counter hash (finite e4m3, |x| <= 448), scale
// sqrt(3 / in) / 448 per block (unit-variance outputs); norm weights 1.
struct HostWeights {
  std::vector<Tensor> keep;
  DeepseekWeights w;
  explicit HostWeights(const DeepseekConfig& c) {
    uint64_t seed = 1;
    auto linear = [&](int64_t out, int64_t in) {
      Tensor codes = Tensor::empty({out, in}, DType::fp8_e4m3);
      auto* p = static_cast<uint8_t*>(codes.data());
      uint64_t x = 0x9e3779b97f4a7c15ull * ++seed;
      for (int64_t i = 0; i < out * in; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint8_t b = static_cast<uint8_t>(x >> 24);
        if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);
        p[i] = b;
      }
      Tensor s = Tensor::empty({(out + 127) / 128, (in + 127) / 128}, DType::f32);
      fill(s.view(), std::sqrt(3.0 / static_cast<double>(in)) / 448.0);
      keep.push_back(codes);
      keep.push_back(s);
      return DeepseekLinear{codes.view(), s.view()};
    };
    auto norm = [&](int64_t n) {
      Tensor t = Tensor::empty({n}, DType::f32);
      fill(t.view(), 1.0);
      keep.push_back(t);
      return t.view();
    };
    const int64_t H = c.hidden_size, h = c.num_attention_heads;
    w.q_a_proj = linear(c.q_lora_rank, H);
    w.q_a_layernorm = norm(c.q_lora_rank);
    w.q_b_proj = linear(h * 192, c.q_lora_rank);
    w.kv_a_proj_with_mqa = linear(576, H);
    w.kv_a_layernorm = norm(512);
    w.kv_b_proj = linear(h * 256, 512);
    w.o_proj = linear(H, h * 128);
  }
};

struct Shape {
  const char* name;
  int64_t in, out;
};
std::vector<Shape> projections(const DeepseekConfig& c) {
  const int64_t H = c.hidden_size, h = c.num_attention_heads;
  return {{"q_a_proj", H, c.q_lora_rank}, {"q_b_proj", c.q_lora_rank, h * 192}, {"kv_a_proj_with_mqa", H, 576},
          {"o_proj", h * 128, H}};
}

// The projections of T tokens alone (bench-local tensors of the block's shapes): bf16 GEMMs into f32
// (o_proj into bf16), or quantise + block-scaled fp8 GEMM. `quantize` false: the fp8 GEMM alone.
class ProjectionSet {
 public:
  ProjectionSet(BenchContext& ctx, const DeepseekConfig& c, int64_t T, bool w8a8) : T_(T), Tp_((T + 3) / 4 * 4), w8a8_(w8a8) {
    const Device dev = Device::cuda(ctx.device());
    for (const Shape& s : projections(c)) {
      P p;
      p.shape = s;
      p.x = Tensor::empty({T, s.in}, DType::bf16, dev);
      fill_uniform(p.x, -1, 1, 11, ctx.stream());
      p.y = Tensor::empty({Tp_, s.out}, std::string(s.name) == "o_proj" ? DType::bf16 : DType::f32, dev);
      if (w8a8) {
        const int64_t kb = s.in / 128, kb4 = (kb + 3) / 4 * 4;
        p.codes = Tensor::empty({s.out, s.in}, DType::fp8_e4m3, dev);
        fill_e4m3_codes(p.codes, 12, ctx.stream());
        p.scales = Tensor::empty({(s.out + 127) / 128, kb4}, DType::f32, dev);
        fill_uniform(p.scales, 1e-3, 1e-2, 13, ctx.stream());
        p.a = Tensor::empty({Tp_, s.in}, DType::fp8_e4m3, dev);
        p.a_scales = Tensor::empty({kb, Tp_}, DType::f32, dev);
      } else {
        p.w_t = Tensor::empty({s.in, s.out}, DType::bf16, dev);
        fill_uniform(p.w_t, -0.02, 0.02, 14, ctx.stream());
      }
      set_.push_back(std::move(p));
    }
    const Context op = ctx.op_context();
    for (auto& p : set_)
      if (w8a8_) quantize_fp8_groups(p.x.view(), p.a.view(), p.a_scales.view(), op);
  }
  std::size_t size() const { return set_.size(); }
  const Shape& shape(std::size_t i) const { return set_[i].shape; }
  double flops(std::size_t i) const { return 2.0 * static_cast<double>(T_) * set_[i].shape.in * set_[i].shape.out; }
  void run(std::size_t i, bool quantize, const Context& op) const {
    const P& p = set_[i];
    if (!w8a8_) {
      gemm(p.x.view(), p.w_t.view(), p.y.view().slice(0, 0, T_), 1.0f, 0.0f, op);
      return;
    }
    if (quantize) quantize_fp8_groups(p.x.view(), p.a.view(), p.a_scales.view(), op);
    const int64_t kb = p.shape.in / 128;
    const int64_t shape[2] = {p.scales.size(0), kb}, stride[2] = {p.scales.size(1), 1};
    const TensorView ws(const_cast<void*>(p.scales.data()), DType::f32, std::span<const int64_t>(shape, 2),
                        std::span<const int64_t>(stride, 2), p.scales.device());
    gemm_fp8_block(p.a.view(), p.a_scales.view(), p.codes.view(), ws, p.y.view(), op);
  }

 private:
  struct P {
    Shape shape;
    Tensor x, y, w_t, codes, scales, a, a_scales;
  };
  int64_t T_, Tp_;
  bool w8a8_;
  std::vector<P> set_;
};

struct Step {
  std::string label;
  int64_t b = 1, context = 0, query = 0;  // b requests of `query` new tokens after `context` cached ones
};

void run_block_step(BenchContext& ctx, const DeepseekAttention& blk, const Step& s, bool w8a8) {
  const Device dev = Device::cuda(ctx.device());
  const DeepseekConfig& c = blk.config();
  const int64_t h = c.num_attention_heads, H = c.hidden_size;
  PlannerConfig pc = blk.planner_config();  // the device's SM count and compute capability included
  pc.page_size = kPage;
  pc.max_model_len = 16384;
  pc.max_num_seqs = 256;
  pc.decode_threshold = 1;
  BatchDesc batch;
  batch.query_start_loc = {0};
  for (int64_t r = 0; r < s.b; ++r) {
    batch.query_start_loc.push_back(static_cast<int32_t>(batch.query_start_loc.back() + s.query));
    batch.seq_lens.push_back(static_cast<int32_t>(s.context + s.query));
  }
  const Plan plan = make_plan(batch, pc);
  const int64_t T = plan.num_tokens, nbr = (s.context + s.query + kPage - 1) / kPage;
  // Request r owns blocks [r * nbr, (r + 1) * nbr) (the layer benchmarks measure scattered tables).
  Tensor table_h = Tensor::empty({s.b, nbr}, DType::i32), pos_h = Tensor::empty({T}, DType::i64),
         slot_h = Tensor::empty({T}, DType::i64);
  for (int64_t r = 0, t = 0; r < s.b; ++r) {
    for (int64_t j = 0; j < nbr; ++j) static_cast<int32_t*>(table_h.data())[r * nbr + j] = static_cast<int32_t>(r * nbr + j);
    for (int64_t i = 0; i < s.query; ++i, ++t) {
      const int64_t p = s.context + i;
      static_cast<int64_t*>(pos_h.data())[t] = p;
      static_cast<int64_t*>(slot_h.data())[t] = (r * nbr + p / kPage) * kPage + p % kPage;
    }
  }
  std::vector<int32_t> seq(batch.seq_lens.begin(), batch.seq_lens.end());
  Tensor seq_h = Tensor::empty({s.b}, DType::i32);
  std::copy(seq.begin(), seq.end(), static_cast<int32_t*>(seq_h.data()));
  const Tensor table = table_h.to(dev), pos = pos_h.to(dev), slots = slot_h.to(dev), seq_lens = seq_h.to(dev);
  CacheBuffer cb = allocate_cache(pc.cache_format, s.b * nbr, kPage, dev);
  fill_cache(cb.cache, 21, ctx.stream());
  Tensor hidden = Tensor::empty({T, H}, DType::bf16, dev), out = Tensor::empty({T, H}, DType::bf16, dev);
  fill_uniform(hidden, -1, 1, 22, ctx.stream());
  Tensor ws = Tensor::empty({static_cast<int64_t>(blk.workspace_bytes(plan))}, DType::u8, dev);
  PinnedBuffer staging(plan.metadata.bytes());
  Tensor meta = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(staging.size(), 16))}, DType::u8, dev);
  DeepseekForwardArgs a;
  a.hidden = hidden;
  a.positions = pos;
  a.slot_mapping = slots;
  a.block_table = table;
  a.seq_lens = seq_lens;
  a.metadata = meta;
  a.out = out;
  const Context op = ctx.op_context();
  const double ms_block = ctx.time_ms([&] {
    upload_step_metadata(plan, staging.view(), meta, op);
    blk.forward(plan, a, cb.cache, ws.view(), op);
  });

  // The attention layer alone on the same step (its own q / kv_c / k_pe inputs and workspace), writing
  // its output in the format the block's layer was built for: a w8a8 o_proj's layer quantises it
  // (LayerOptions::out_quant fp8_group128) into codes and token scales of round_up(T, 4) rows, the
  // layout the block hands it.
  const OutputQuant out_quant = blk.attention().options().out_quant;
  Tensor q = Tensor::empty({T, h, 192}, DType::bf16, dev), kv_c = Tensor::empty({T, 512}, DType::bf16, dev),
         k_pe = Tensor::empty({T, 64}, DType::bf16, dev), attn, attn_scales;
  if (out_quant == OutputQuant::none) {
    attn = Tensor::empty({T, h * 128}, DType::bf16, dev);
  } else {
    if (out_quant != OutputQuant::fp8_group128)
      throw Error(std::string("block bench: the layer alone writes bf16 or fp8_group128 outputs (the block's "
                              "o_proj forms), got out_quant ") + to_string(out_quant));
    const int64_t Tp = (T + 3) / 4 * 4;
    attn = Tensor::empty({Tp, h * 128}, DType::fp8_e4m3, dev);
    attn_scales = Tensor::empty({h * 128 / 128, Tp}, DType::f32, dev);
  }
  fill_uniform(q, -1, 1, 23, ctx.stream());
  fill_uniform(kv_c, -1, 1, 24, ctx.stream());
  fill_uniform(k_pe, -1, 1, 25, ctx.stream());
  Tensor lws = Tensor::empty({static_cast<int64_t>(std::max<std::size_t>(blk.attention().workspace_bytes(plan), 1))},
                             DType::u8, dev);
  ForwardArgs fa;
  fa.q = q;
  fa.kv_c = kv_c;
  fa.k_pe = k_pe;
  fa.slot_mapping = slots;
  fa.block_table = table;
  fa.seq_lens = seq_lens;
  fa.metadata = meta;
  fa.out = attn;
  if (attn_scales.defined()) fa.out_scales = attn_scales;
  const double ms_attn = ctx.time_ms([&] {
    upload_step_metadata(plan, staging.view(), meta, op);
    blk.attention().forward(plan, fa, cb.cache, lws.view(), op);
  });

  // The projections alone, as the block runs them (w8a8: with the quantisation; kv_a_proj reuses
  // q_a_proj's quantised hidden states, and o_proj reads the codes the layer wrote, timed above).
  const ProjectionSet proj(ctx, c, T, w8a8);
  auto quantises = [&](const std::string& name) {
    return name != "kv_a_proj_with_mqa" && !(name == "o_proj" && out_quant != OutputQuant::none);
  };
  const double ms_proj = ctx.time_ms([&] {
    for (std::size_t i = 0; i < proj.size(); ++i) proj.run(i, quantises(proj.shape(i).name), op);
  });
  double proj_flops = 0, proj_bytes = 0;
  for (std::size_t i = 0; i < proj.size(); ++i) {
    proj_flops += proj.flops(i);
    proj_bytes += static_cast<double>(proj.shape(i).in * proj.shape(i).out) * (w8a8 ? 1.0 : 2.0);
  }
  const double ctx_tokens = static_cast<double>(s.b) * static_cast<double>(s.context);
  const double attn_flops =
      s.context == 0 ? h * (static_cast<double>(T) * T / 2) * 2.0 * (192 + 128) + 2.0 * T * 512 * h * 256
                     : 2.0 * h * static_cast<double>(s.b) * static_cast<double>(s.context + 1) * (576 + 512) +
                           2.0 * T * h * 128 * 512 * 2;
  const double bytes = proj_bytes + static_cast<double>(T) * H * 2 * 2 + (ctx_tokens + static_cast<double>(T)) * 1152;
  const std::string config = std::string(w8a8 ? "w8a8 " : "bf16 ") + s.label +
                             (blk.options().fp8_prefill ? " fp8-prefill " + std::string(to_string(pc.cache_format)) : "");
  ctx.report("block", config, ms_block, bytes, proj_flops + attn_flops,
             "V3 rank of tp 8 (h 16); FLOPs = projections + attention (+ the layer's kv_b_proj / absorption), bytes "
             "= weights + hidden + out + cache rows");
  const double gemm_tflops = proj_flops / (ms_proj * 1e9);
  std::printf("    projections %.4f ms (%.1f%%) %.1f TFLOP/s = %.1f%% of cuBLAS bf16 %.1f | attention %.4f ms (%.1f%%) "
              "| norm + rope + rest %.4f ms (%.1f%%)\n",
              ms_proj, 100 * ms_proj / ms_block, gemm_tflops, 100 * gemm_tflops / ctx.ceilings().gemm_tflops,
              ctx.ceilings().gemm_tflops, ms_attn, 100 * ms_attn / ms_block, ms_block - ms_proj - ms_attn,
              100 * (ms_block - ms_proj - ms_attn) / ms_block);
}

void bench_block(BenchContext& ctx) {
  const DeepseekConfig c = rank_config();
  const HostWeights hw(c);
  const int64_t T = ctx.quick() ? 512 : 4096, b = ctx.quick() ? 32 : 128, decode_ctx = ctx.quick() ? 1024 : 4096;
  const std::vector<Step> steps = {{"prefill T=" + std::to_string(T), 1, 0, T},
                                   {"decode b=" + std::to_string(b) + " ctx=" + std::to_string(decode_ctx), b,
                                    decode_ctx, 1}};
  for (const bool w8a8 : {false, true}) {
    DeepseekOptions o;
    o.device = Device::cuda(ctx.device());
    o.fp8_activations = w8a8;
    const DeepseekAttention blk(c, hw.w, o);
    for (const Step& s : steps) run_block_step(ctx, blk, s, w8a8);
  }
  // --fp8-prefill: the prefill step again with DeepseekOptions::fp8_prefill over an fp8_ds_mla cache (the layer's
  // prefill attention on e4m3 q, k, v and P; the decode step does not change).
  if (ctx.options().fp8_prefill)
    for (const bool w8a8 : {false, true}) {
      DeepseekOptions o;
      o.device = Device::cuda(ctx.device());
      o.fp8_activations = w8a8;
      o.cache_format = CacheFormat::fp8_ds_mla;
      o.fp8_prefill = true;
      const DeepseekAttention blk(c, hw.w, o);
      run_block_step(ctx, blk, steps[0], w8a8);
    }
  // Each projection's GEMM alone at the prefill's T and the decode's b tokens.
  for (const int64_t t : {T, b})
    for (const bool w8a8 : {false, true}) {
      const ProjectionSet proj(ctx, c, t, w8a8);
      for (std::size_t i = 0; i < proj.size(); ++i) {
        const Context op = ctx.op_context();
        const double ms = ctx.time_ms([&] { proj.run(i, false, op); });
        const Shape& s = proj.shape(i);
        const double bytes = static_cast<double>(s.in * s.out) * (w8a8 ? 1 : 2) +
                             static_cast<double>(t) * s.in * (w8a8 ? 1 : 2) + static_cast<double>(t) * s.out * 4;
        ctx.report("block_gemm",
                   std::string(w8a8 ? "fp8 " : "bf16 ") + s.name + " T=" + std::to_string(t) + " " +
                       std::to_string(s.in) + "->" + std::to_string(s.out),
                   ms, bytes, proj.flops(i),
                   "2 T in out FLOPs; bytes = weight + x + y; fp8: block-scaled cuBLASLt GEMM without the activation "
                   "quantisation, bf16: cuBLAS");
      }
    }
}

}  // namespace

void register_block(Registry& r) {
  r.add("block", "DeepseekAttention::forward, V3 rank shapes: bf16 and w8a8 GEMMs, GEMM vs attention share",
        bench_block);
}

}  // namespace mla::bench
