// SPDX-License-Identifier: Apache-2.0
// Device tests of the element conversions whose rule lives once in src/core/numeric.h and is compiled for both
// the host and the device (constexpr, --expt-relaxed-constexpr): num::bf16_bits_rn (the integer bf16 rounding
// the cache writer stores byte by byte) and num::e2m1_bits (NVFP4's element, the output quantiser's) give
// on the device the bits they give on the host, for every bf16 upper half with the rounding-relevant low halves
// (NaNs, infinities, zeros and subnormals included). The hardware conversion the kernels use for bf16
// (dev::float_to_bf16, cvt.rn.bf16.f32) agrees with the rule on every non-NaN input; a NaN stays a NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "cuda/common/convert.cuh"
#include "ptx_test_util.cuh"

namespace mla {
namespace {

// The rules are constexpr: the same expressions the device runs, checked at compile time on the host.
static_assert(num::float_to_bf16(1.0f) == 0x3f80u);
static_assert(num::bf16_bits_rn(1.00390625f) == 0x3f80u);  // 1 + 2^-8, a tie: to the even neighbour
static_assert(num::bf16_bits_rn(1.01171875f) == 0x3f82u);  // 1 + 3 * 2^-8, a tie: up to the even one
static_assert(num::float_to_e2m1(-0.0f) == 0x8u && num::float_to_e2m1(5.0f) == 0x6u);
static_assert(num::float_to_e2m1(-7.0f) == 0xfu && num::float_to_e2m1(0.75f) == 0x2u);

// Every (sign, exponent, 7 mantissa bits) with the low halves that decide the rounding: exact, just above,
// just below the tie, the tie, just above it, the largest.
std::vector<uint32_t> convert_inputs() {
  static constexpr uint32_t kLow[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  std::vector<uint32_t> v;
  v.reserve(65536 * 6);
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (const uint32_t lo : kLow) v.push_back(hi << 16 | lo);
  return v;
}

__global__ void convert_kernel(const uint32_t* in, int n, uint32_t* rule, uint16_t* hw, uint8_t* e2m1) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float f = __uint_as_float(in[i]);
  rule[i] = num::bf16_bits_rn(f);
  hw[i] = cuda::dev::float_to_bf16(f);
  e2m1[i] = static_cast<uint8_t>(num::e2m1_bits(f));
}

TEST(PtxConvert, DeviceSharesTheHostRoundingRules) {
  MLA_SKIP_WITHOUT_GPU();
  const std::vector<uint32_t> in = convert_inputs();
  const int n = static_cast<int>(in.size());
  test::DevBuf<uint32_t> d_in(in), d_rule(in.size());
  test::DevBuf<uint16_t> d_hw(in.size());
  test::DevBuf<uint8_t> d_e2m1(in.size());
  convert_kernel<<<(n + 255) / 256, 256>>>(d_in.p, n, d_rule.p, d_hw.p, d_e2m1.p);
  MLA_CUDA_OK(cudaGetLastError());
  MLA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint32_t> rule = d_rule.download();
  const std::vector<uint16_t> hw = d_hw.download();
  const std::vector<uint8_t> e2m1 = d_e2m1.download();
  int bad_rule = 0, bad_hw = 0, bad_e2m1 = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    float f;
    std::memcpy(&f, &in[i], 4);
    const uint16_t want = num::float_to_bf16(f);
    if (rule[i] != want && ++bad_rule <= 4)
      ADD_FAILURE() << std::hex << "bits 0x" << in[i] << ": device rule 0x" << rule[i] << ", host 0x" << want;
    const bool hw_ok = std::isnan(f) ? std::isnan(num::bf16_to_float(hw[i])) : hw[i] == want;
    if (!hw_ok && ++bad_hw <= 4)
      ADD_FAILURE() << std::hex << "bits 0x" << in[i] << ": cvt.rn 0x" << hw[i] << ", rule 0x" << want;
    const uint8_t want4 = num::float_to_e2m1(f);
    if (e2m1[i] != want4 && ++bad_e2m1 <= 4)
      ADD_FAILURE() << std::hex << "bits 0x" << in[i] << ": device e2m1 0x" << int{e2m1[i]} << ", host 0x"
                    << int{want4};
  }
  EXPECT_EQ(bad_rule, 0);
  EXPECT_EQ(bad_hw, 0);
  EXPECT_EQ(bad_e2m1, 0);
}

}  // namespace
}  // namespace mla
