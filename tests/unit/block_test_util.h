// SPDX-License-Identifier: Apache-2.0
#pragma once
// The DeepSeek block fixture (tests/fixtures/block, scripts/gen_block_fixture.py, docs/BLOCK.md) and
// a driver that serves its sequence through DeepseekAttention in a given split of steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "mla/deepseek.h"
#include "mla/safetensors.h"
#include "mla/step.h"
#include "support/test_util.h"
#include "unit/safetensors_test_util.h"

namespace mla::test::block {

// The source tree's fixtures, or $MLA_FIXTURE_DIR's where set: a test binary built on one machine and run from
// another checkout (scripts/ab_refs.sh pack / unpack) finds them there.
inline std::string fixture_dir() {
  const char* env = std::getenv("MLA_FIXTURE_DIR");
  return std::string(env && *env ? env : MLA_FIXTURE_DIR) + "/block";
}
inline constexpr int kLayer = 1;

struct Fixture {
  std::string name;  // "v3_fp8", "v2lite_bf16"
  DeepseekConfig config;
  SafetensorsFile io;
  Tensor hidden;                // [T, hidden] bf16
  std::vector<double> out_ref;  // [T * hidden]
  int64_t T = 0;
};

inline Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.name = name;
  const std::string dir = fixture_dir();
  f.config = DeepseekConfig::from_file(dir + "/" + name + "/config.json");
  f.io = SafetensorsFile::open(dir + "/" + name + "_io.safetensors");
  f.hidden = f.io.load("hidden", DType::bf16);
  f.out_ref = to_doubles(f.io.load("out_ref", DType::f64));
  f.T = f.hidden.size(0);
  return f;
}

// The fixture's checkpoint in the other published form, written under `dir`: an fp8 checkpoint's
// weights dequantised to bf16 (exact: the generator's codes times power-of-two scales fit bf16), or a
// bf16 checkpoint quantised with scale = block amax / 448 (exact: every block's amax is 448 times
// its power-of-two scale). Asserts exactness. Returns the config of the converted checkpoint.
inline DeepseekConfig convert_checkpoint(const Fixture& f, const std::string& dir) {
  const Checkpoint src(fixture_dir() + "/" + f.name);
  DeepseekConfig cfg = f.config;
  const bool to_fp8 = !cfg.fp8_weights;
  const int br = 128, bc = 128;
  std::vector<StEntry> entries;
  for (const std::string& name : src.names()) {
    const bool is_scale = name.ends_with(".weight_scale_inv");
    if (is_scale) continue;
    const StTensorInfo& info = src.info(name);
    const bool is_norm = name.find("layernorm") != std::string::npos;
    if (is_norm) {
      entries.push_back({name, "BF16", info.shape, std::string(reinterpret_cast<const char*>(
                                                       src.file_of(name).bytes(info).data()), info.nbytes())});
      continue;
    }
    DeepseekLinear l;
    const Tensor w = src.load(name, to_mla_dtype(info.dtype).value());
    Tensor s;
    l.weight = w.view();
    if (!to_fp8) {
      s = src.load(name + "_scale_inv", DType::f32);
      l.weight_scale_inv = s.view();
    }
    const int64_t rows = info.shape[0], cols = info.shape[1];
    const Tensor exact = dequantize_block_fp8(l, br, bc, 0, rows, 0, cols, DType::f64, name);
    const auto* e = static_cast<const double*>(exact.data());
    if (!to_fp8) {
      std::vector<uint16_t> bits(static_cast<std::size_t>(rows * cols));
      for (std::size_t i = 0; i < bits.size(); ++i) {
        bits[i] = num::float_to_bf16(static_cast<float>(e[i]));
        EXPECT_EQ(num::bf16_to_float(bits[i]), e[i]) << name << " element " << i << " is not exact in bf16";
      }
      entries.push_back({name, "BF16", info.shape, bytes_of(bits)});
      continue;
    }
    const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    std::vector<float> scale(static_cast<std::size_t>(nbr * nbc));
    std::vector<uint8_t> codes(static_cast<std::size_t>(rows * cols));
    for (int64_t bi = 0; bi < nbr; ++bi)
      for (int64_t bj = 0; bj < nbc; ++bj) {
        double amax = 0;
        for (int64_t i = bi * br; i < std::min(rows, (bi + 1) * br); ++i)
          for (int64_t j = bj * bc; j < std::min(cols, (bj + 1) * bc); ++j) amax = std::max(amax, std::abs(e[i * cols + j]));
        const float sc = static_cast<float>(amax / 448.0);
        scale[static_cast<std::size_t>(bi * nbc + bj)] = sc;
        for (int64_t i = bi * br; i < std::min(rows, (bi + 1) * br); ++i)
          for (int64_t j = bj * bc; j < std::min(cols, (bj + 1) * bc); ++j) {
            const uint8_t q = num::float_to_e4m3(static_cast<float>(e[i * cols + j] / sc));
            codes[static_cast<std::size_t>(i * cols + j)] = q;
            EXPECT_EQ(static_cast<double>(num::e4m3_to_float(q)) * sc, e[i * cols + j]) << name << " not exact in fp8";
          }
      }
    entries.push_back({name, "F8_E4M3", info.shape, bytes_of(codes)});
    entries.push_back({name + "_scale_inv", "F32", {nbr, nbc}, bytes_of(scale)});
  }
  write_file(std::filesystem::path(dir) / "model.safetensors", st_build(entries));
  cfg.fp8_weights = to_fp8;
  return cfg;
}

// The step splits the block tests serve the fixture's sequence in: one prefill, chunked prefill,
// prefill then 16 decodes, and (with_odd) chunks of sizes that are not multiples of 4 (w8a8 pads).
struct Split {
  const char* name;
  std::vector<int> steps;
};
inline std::vector<Split> splits(int64_t T, bool with_odd = false) {
  const int t = static_cast<int>(T);
  std::vector<int> decodes = {t - 16};
  for (int i = 0; i < 16; ++i) decodes.push_back(1);
  std::vector<Split> s = {{"one_prefill", {t}}, {"chunked_prefill", {100, 100, t - 200}}, {"prefill_then_decodes", decodes}};
  if (with_odd) s.push_back({"odd_chunks", {37, 64, 91, 1, 1, 1, t - 195}});
  return s;
}

// A fixture checkpoint as published, or converted to the other form (fp8 <-> bf16).
struct Form {
  std::string fixture;
  bool convert;
};

// The checkpoint directory of `form` (the converted one is written under `tmp`); `cfg` gets its config.
inline std::string form_dir(const Fixture& f, const Form& form, const std::string& tmp, DeepseekConfig& cfg) {
  cfg = f.config;
  if (!form.convert) return fixture_dir() + "/" + f.name;
  cfg = convert_checkpoint(f, tmp);
  return tmp;
}

// Every byte 0xff (NaN in every float format) on the tensor's device.
inline void poison_bytes(const Tensor& t) {
  Tensor h = Tensor::empty(std::span<const int64_t>(t.view().shape.data(), t.view().ndim), t.dtype());
  std::memset(h.data(), 0xff, h.nbytes());
  if (t.numel() > 0) copy(t.view(), h.view());
}

// Serves the fixture's one sequence (positions 0..T-1) through `blk` in steps of the given query
// lengths (summing to T): each step is planned (dense, decode threshold 1), its new tokens' hidden
// rows go in, the outputs are collected. Runs on the block's device (CUDA: inputs, cache, workspace
// and the uploaded step metadata there; scratch and cache NaN-poisoned). Returns [T * hidden] in row
// order.
inline std::vector<double> serve(const DeepseekAttention& blk, const Tensor& hidden, const std::vector<int>& steps,
                                 Precision precision, int64_t page = 64, uint64_t seed = 5) {
  const int64_t T = hidden.size(0), H = hidden.size(1);
  const DType dt = blk.options().dtype;
  PlannerConfig pc = blk.planner_config();
  pc.page_size = page;
  pc.max_model_len = 4096;
  pc.max_num_seqs = 4;
  if (pc.sparse) pc.require_uniform = true;  // FlashMLA-sparse: uniform decodes
  const int64_t nb = (T + page - 1) / page;
  std::vector<int32_t> table(static_cast<std::size_t>(nb + 1));  // one spare block, never used
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 g(seed);
  std::shuffle(table.begin(), table.end(), g);
  table.pop_back();
  const Device dev = blk.options().device;
  CacheBuffer cb = allocate_cache(pc.cache_format, nb + 1, page, dev);
  poison_bytes(cb.storage);  // NaN everywhere
  const Tensor bt = int_tensor_2d({table}, dev);
  std::vector<double> out(static_cast<std::size_t>(T * H), std::nan(""));
  int64_t done = 0;
  for (int q : steps) {
    const Plan plan = make_plan(BatchDesc{{0, q}, {static_cast<int32_t>(done + q)}}, pc);
    Tensor x = Tensor::empty({q, H}, dt), y = poisoned({q, H}, dt, dev);
    std::vector<int64_t> pos(static_cast<std::size_t>(q)), slots(static_cast<std::size_t>(q));
    for (int64_t i = 0; i < q; ++i) {
      const int64_t p = done + i;
      pos[static_cast<std::size_t>(i)] = p;
      slots[static_cast<std::size_t>(i)] = int64_t{table[static_cast<std::size_t>(p / page)]} * page + p % page;
      for (int64_t c = 0; c < H; ++c)
        num::store(x.view().ptr_at({i, c}), dt, num::load(hidden.view().ptr_at({p, c}), hidden.dtype()));
    }
    if (dev.is_cuda()) x = x.to(dev);
    const Tensor positions = int64_tensor(pos, dev), slot_t = int64_tensor(slots, dev),
                 seq = int_tensor({static_cast<int32_t>(done + q)}, dev);
    // Sparse blocks: every token's top-k row is its whole causal prefix (positions 0..p, -1 padded),
    // so the sparse block computes the dense attention.
    Tensor topk;
    if (blk.options().sparse) {
      const int64_t k = blk.config().index_topk;
      std::vector<std::vector<int32_t>> rows(static_cast<std::size_t>(q), std::vector<int32_t>(static_cast<std::size_t>(k), -1));
      for (int64_t i = 0; i < q; ++i)
        for (int64_t j = 0; j <= done + i && j < k; ++j) rows[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = static_cast<int32_t>(j);
      topk = int_tensor_2d(rows, dev);
    }
    Tensor ws = Tensor::empty({static_cast<int64_t>(blk.workspace_bytes(plan))}, DType::u8, dev);
    poison_bytes(ws);  // NaN scratch: a read of an unwritten row shows
    const TensorView wsv = ws.view();
    PinnedBuffer staging;
    Tensor metadata;
    DeepseekForwardArgs a;
    if (dev.is_cuda()) {
      staging = PinnedBuffer(plan.metadata.bytes());
      metadata = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(staging.size()), 16)}, DType::u8, dev);
      upload_step_metadata(plan, staging.view(), metadata);
      a.metadata = metadata;
    }
    a.hidden = x;
    a.positions = positions;
    a.slot_mapping = slot_t;
    a.block_table = bt;
    a.seq_lens = seq;
    a.out = y;
    if (topk.defined()) a.topk_indices = topk;
    blk.forward(plan, a, cb.cache, wsv, Context{nullptr, precision});
    const std::vector<double> o = to_doubles(y);
    std::copy(o.begin(), o.end(), out.begin() + done * H);
    done += q;
  }
  EXPECT_EQ(done, T) << "the steps must cover the sequence";
  return out;
}

}  // namespace mla::test::block
