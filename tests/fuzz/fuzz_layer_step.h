// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small CPU layers and their steps for the fuzz targets that drive MlaAttention::forward
// (fuzz_layer: hostile arguments; fuzz_step: hostile plans and metadata): one layer per shape, a
// step per scenario drawn from the input (decodes, extends, prefills in make_plan's order), both
// built once and kept (a bounded memo), since building them is a large part of an execution.
#include <map>
#include <memory>
#include <tuple>

#include "fuzz/fuzz_util.h"
#include "unit/attention_test_util.h"
#include "unit/layer_test_util.h"

namespace mla::fuzz {

using test::layer::DeviceArgs;
using test::layer::kL;
using test::layer::Req;
using test::layer::Scenario;
using test::layer::StepData;

inline const MlaAttention& layer_for(const StepData& d) {
  static std::map<std::tuple<int, bool, int, int, int>, std::unique_ptr<MlaAttention>> layers;
  const Scenario& sc = d.sc;
  auto& slot = layers[{static_cast<int>(sc.format), sc.sparse, sc.h, sc.P, sc.topk}];
  if (!slot) {
    test::reseed(11);
    const Tensor w = test::random_tensor({int64_t{sc.h} * (sc.P + sc.V), kL}, DType::bf16, Device::cpu(), -0.05, 0.05);
    slot = std::make_unique<MlaAttention>(sc.options(Device::cpu(), DType::f32), w);
  }
  return *slot;
}

inline Scenario scenario(Input& in) {
  Scenario sc;
  sc.format = static_cast<CacheFormat>(in.byte() % test::kNumPlainFormats);
  sc.sparse = in.flag();
  sc.h = 2;
  sc.P = sc.V = 16;
  if (sc.sparse && sc.format == CacheFormat::fp8_ds_mla && in.byte() % 4 == 0) {
    sc.h = 32;  // separate mode: prefills through the upconverted workspace
    sc.P = sc.V = 8;
  }
  sc.topk = in.pick({8, 16});
  sc.page_size = in.pick({int64_t{4}, int64_t{16}});
  sc.max_model_len = 64;
  sc.max_num_seqs = 4;
  sc.decode_threshold = in.range(1, 2);
  sc.context_workspace_rows = in.pick({int64_t{0}, int64_t{16}, int64_t{64}});
  sc.sparse_workspace_rows = in.pick({int64_t{0}, int64_t{64}});
  sc.pad_tokens = in.range(0, 2);
  sc.num_sms = 0;
  sc.seed = 1;
  sc.draw_weight = sc.draw_context = false;  // one layer per shape (layer_for); the cache is filled here
  const int64_t nr = in.range(1, 4);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t region = r * 3 / nr;  // decodes, extends, prefills: the order make_plan wants
    const int32_t q = static_cast<int32_t>(region == 0 ? in.range(0, sc.decode_threshold) : in.range(0, 6));
    const int32_t ctx = static_cast<int32_t>(region == 2 ? 0 : in.range(0, 40));
    sc.reqs.push_back({ctx, q});
  }
  return sc;
}

inline std::vector<int64_t> int64s(const Tensor& t) {
  std::vector<int64_t> v(static_cast<std::size_t>(t.view().numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = num::load_index(t.view().ptr_at({static_cast<int64_t>(i)}), t.dtype());
  return v;
}

// A scenario's step: make_step and the conversion of its activations (a third of an execution when
// built every time) are deterministic in the scenario, so each is built once and kept (a bounded
// memo; libFuzzer's mutations of the edit bytes reuse it). The layer must not write its inputs: their
// bytes as built are compared after every forward.
struct Step {
  StepData d;
  DeviceArgs a;
  std::vector<uint8_t> inputs;  // q, kv_c, k_pe as built
};
inline std::vector<uint8_t> input_bytes(const DeviceArgs& a) {
  std::vector<uint8_t> v;
  for (const Tensor* t : {&a.q, &a.kv_c, &a.k_pe}) {
    const std::vector<uint8_t> b = bytes_of(*t);
    v.insert(v.end(), b.begin(), b.end());
  }
  return v;
}
// nullptr when make_plan refuses the scenario (fuzz_planner's business).
inline const Step* step_for(const Scenario& sc) {
  static std::map<std::vector<int64_t>, std::unique_ptr<Step>> memo;
  std::vector<int64_t> key = {static_cast<int64_t>(sc.format), sc.sparse, sc.h, sc.P, sc.V, sc.topk, sc.page_size,
                              sc.max_model_len, sc.max_num_seqs, sc.decode_threshold, sc.context_workspace_rows,
                              sc.sparse_workspace_rows, sc.pad_tokens};
  for (const Req& r : sc.reqs) key.insert(key.end(), {r.context, r.query});
  if (const auto it = memo.find(key); it != memo.end()) return it->second.get();
  if (memo.size() >= 512) memo.clear();
  std::unique_ptr<Step>& st = memo[key];
  StepData d;
  if (rejects([&] { d = make_step(sc); })) return nullptr;
  d.weight = d.ctx_kv_c = d.ctx_k_pe = Tensor{};  // layer_for holds the weight; the cache is filled here
  st = std::make_unique<Step>();
  st->a = device_args(d, Device::cpu(), DType::f32);
  st->a.metadata = Tensor{};  // the CPU layer reads the plan's copy unless a test below hands one over
  // Padding rows are NaN in make_step; a hostile slot may write them into the cache: keep every input
  // finite so that "accepted => finite output" holds.
  mla::fill(st->a.kv_c.view().slice(0, d.t_act, d.T), 0.5);
  mla::fill(st->a.k_pe.view().slice(0, d.t_act, d.T), 0.5);
  st->inputs = input_bytes(st->a);
  st->d = std::move(d);
  return st.get();
}

}  // namespace mla::fuzz
