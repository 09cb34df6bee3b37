// SPDX-License-Identifier: Apache-2.0
// MlaAttention's DCP mode on the CPU (LayerOptions::dcp_comm, PlannerConfig::dcp; semantics §13) with
// the in-process thread group, float64: layer_dcp_check.h says what is checked.
#include <gtest/gtest.h>

#include "layer_dcp_check.h"

namespace mla {
namespace {

using test::dcp_layer::GroupSetup;
using test::layer::Scenario;
using test::layer::StepData;

TEST(LayerDcp, DecodeStepsEqualOneLayerOverTheWholeCache) {
  for (CacheFormat f : test::kAllFormats)
    for (const Scenario& sc : test::dcp_layer::scenarios(f))
      for (auto [w, il] : {std::pair{2, 1}, std::pair{4, 16}, std::pair{3, 2}}) {
        SCOPED_TRACE(::testing::Message() << to_string(f) << " W " << w << " I " << il << " pad " << sc.pad_tokens);
        Scenario s = sc;
        s.h = 12;  // divisible by 2, 3 and 4
        const StepData d = test::layer::make_step(s);
        const test::layer::LayerRun ref = test::layer::run_layer(d, Device::cpu(), DType::f64, Precision::reference);
        auto group = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(make_local_group(w));
        GroupSetup g{[group](int r) { return std::move((*group)[r]); }, [](int) { return Device::cpu(); }};
        const std::vector<double> got = test::dcp_layer::run_group(d, ref, w, il, g);
        ASSERT_EQ(got.size(), static_cast<std::size_t>(d.t_act * s.h * s.V));
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], ref.out[i], 1e-5 * (1 + std::abs(ref.out[i]))) << "element " << i;
      }
}

TEST(LayerDcp, RefusesMismatchedPlansAndConfigs) {
  Scenario sc;
  PlannerConfig cfg = sc.config();
  cfg.dcp = {2, 2, 1};
  EXPECT_THROW(cfg.validate(), Error);
  cfg.dcp = {2, 0, 3};  // interleave must divide the page size (16)
  EXPECT_THROW(cfg.validate(), Error);
  // fp8_ds_mla sparse with 32 heads per rank would run prefills in the separate (upconvert) mode.
  cfg.dcp = {2, 0, 1};
  cfg.sparse = true;
  cfg.cache_format = CacheFormat::fp8_ds_mla;
  cfg.dims.index_topk = 8;
  cfg.dims.num_heads = 32;
  EXPECT_NO_THROW(cfg.validate());
  EXPECT_THROW(make_plan(BatchDesc{{0, 1, 5}, {11, 4}}, cfg), Error);
  cfg.dims.num_heads = 16;  // mixed-batch mode: accepted
  EXPECT_NO_THROW(make_plan(BatchDesc{{0, 1, 5}, {11, 4}}, cfg));

  // A DCP plan on a layer without a communicator, and the reverse: refused before anything is written.
  sc.reqs = {{10, 1}, {20, 1}};
  const StepData d = test::layer::make_step(sc);
  PlannerConfig c2 = sc.config();
  c2.dcp = {2, 1, 1};
  const Plan dcp_plan = make_plan(BatchDesc{d.plan.query_start_loc, d.plan.seq_lens}, c2);
  const MlaAttention plain(sc.options(Device::cpu(), DType::f32), d.weight);
  CacheBuffer cb = test::layer::make_cache(d, Device::cpu());
  test::layer::DeviceArgs a = test::layer::device_args(d, Device::cpu(), DType::f32);
  Tensor ws = Tensor::empty({1 << 20}, DType::u8);
  EXPECT_THROW(plain.forward(dcp_plan, a.args(), cb.cache, ws), Error);
  auto group = make_local_group(2);
  LayerOptions o = sc.options(Device::cpu(), DType::f32);
  o.dcp_comm = group[0].get();
  const MlaAttention with_comm(o, d.weight);
  EXPECT_THROW(with_comm.forward(d.plan, a.args(), cb.cache, ws), Error);   // plan without DCP
  EXPECT_THROW(with_comm.forward(dcp_plan, a.args(), cb.cache, ws), Error);  // plan for rank 1
  for (double v : test::to_doubles(a.out)) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace mla
