// SPDX-License-Identifier: Apache-2.0
// MlaAttention's DCP mode on CUDA over NCCL: one thread, GPU and NCCL rank per rank of the group (W =
// every GPU of the machine, up to 4; skipped on one GPU). The group's decode step against the float64
// one-layer oracle at the bf16 rule, with the slack of one more bf16 rounding (the partials travel in
// bf16 before the combine): max error <= 3 x the bf16 CPU layer's + 2 quanta, rel-L2 < 1e-2; new
// tokens bit-exact in their owner's shard (layer_dcp_check.h).
#include <gtest/gtest.h>

#include <algorithm>

#include "gpu_test_util.h"
#include "layer_gpu_util.h"
#include "unit/layer_dcp_check.h"

namespace mla {
namespace {

using test::dcp_layer::GroupSetup;
using test::layer::Scenario;
using test::layer::StepData;

TEST(LayerDcpGpu, NcclDecodeStepsMatchTheOracle) {
  MLA_SKIP_WITHOUT_GPU();
  const int w = std::min(cuda_device_count(), 4);
  if (w < 2) GTEST_SKIP() << "needs 2 or more GPUs (nvidia-h200-x2 / x4)";
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  for (CacheFormat f : test::kDeviceFormats)
    for (Scenario sc : test::dcp_layer::scenarios(f)) {
      SCOPED_TRACE(::testing::Message() << to_string(f) << " W " << w << " pad " << sc.pad_tokens);
      sc.h = 16;  // 4 .. 8 heads per rank
      sc.P = sc.V = 128;
      sc.page_size = 64;
      // The mixed and sparse scenarios' small context workspace (several chunks) in pages of 64: it must
      // hold one page per prefill with context (two), else plan_context_chunks refuses the step.
      if (sc.context_workspace_rows > 0) sc.context_workspace_rows = 2 * sc.page_size;
      const StepData d = test::layer::make_step(sc);
      const test::layer::LayerRun oracle =
          test::layer::run_layer(d, Device::cpu(), DType::f64, Precision::reference);
      const test::layer::LayerRun cpu = test::layer::run_layer(d, Device::cpu(), DType::bf16, Precision::fast);
      const NcclId id = nccl_make_id();
      GroupSetup g{[&](int r) { return make_nccl_communicator(id, w, r, r, std::chrono::seconds(60)); },
                   [](int r) { return Device::cuda(r); }, DType::bf16, Precision::fast};
      const std::vector<double> got = test::dcp_layer::run_group(d, oracle, w, 64, g);
      ASSERT_EQ(got.size(), static_cast<std::size_t>(d.t_act * sc.h * sc.V));
      double mag = 0, err = 0, err_cpu = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
        mag = std::max(mag, std::fabs(oracle.out[i]));
        err = std::max(err, std::fabs(got[i] - oracle.out[i]));
        err_cpu = std::max(err_cpu, std::fabs(cpu.out[i] - oracle.out[i]));
      }
      EXPECT_LE(err, 3 * err_cpu + 2 * test::layer::bf16_quantum(mag)) << "CPU bf16 error " << err_cpu;
      const std::vector<double> ref(oracle.out.begin(), oracle.out.begin() + static_cast<int64_t>(got.size()));
      EXPECT_LT(test::rel_l2(got, ref), 1e-2);
    }
}

}  // namespace
}  // namespace mla
