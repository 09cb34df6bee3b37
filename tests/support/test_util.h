// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared test helpers: seeded random tensors, NaN poisoning, host copies and the DESIGN.md §5
// tolerance rule. Used by tests/unit (CPU) and tests/gpu.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "mla/cache.h"
#include "mla/ops.h"
#include "mla/tensor.h"

namespace mla::test {

// Seeded generator; every test draws fresh inputs from its own seed.
std::mt19937_64& rng();
void reseed(uint64_t seed);
// Uniform double in [lo, hi) from one draw of rng() (53 random bits). std::uniform_real_distribution
// takes a long-double logarithm per value in libstdc++ 12, which dominated the fuzz targets' time.
inline double uniform(double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng()() >> 11) * 0x1.0p-53);
}

// Uniform(lo, hi) values in any float dtype (rounded to it), on the host, then copied to `device`.
Tensor random_tensor(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::cpu(),
                     double lo = -1.0, double hi = 1.0);
void fill_random(const TensorView& t, double lo = -1.0, double hi = 1.0);  // host or contiguous device view
Tensor int_tensor(const std::vector<int32_t>& values, Device device = Device::cpu());       // [n] i32
Tensor int_tensor_2d(const std::vector<std::vector<int32_t>>& rows, Device device = Device::cpu());  // [r, c] i32
Tensor int64_tensor(const std::vector<int64_t>& values, Device device = Device::cpu());     // [n] i64
std::vector<double> to_doubles(const TensorView& t);  // any device, any dtype, row-major order
std::vector<int32_t> to_ints(const TensorView& t);    // i32/i64 -> int32

// A varlen prefill batch of (s_q, s_k) requests: cu_seqlens_q / _k as host [b + 1] i32 tensors, the totals and the
// longest request on each side.
struct Varlen {
  Tensor cu_q, cu_k;
  int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;
};
Varlen varlen(const std::vector<std::pair<int32_t, int32_t>>& lens);

// A poisoned tensor (outputs before a kernel runs; unused cache pages): NaN, or an integer dtype's maximum.
Tensor poisoned(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::cpu());

// DESIGN.md §5: a result passes when |got - ref| <= 2 * |round_storage(ref) - ref| + quantum(ref)
// element-wise, where `ref` is the float64 oracle and round_storage rounds to `storage` (bf16: 8 bits
// of mantissa). ±inf and NaN positions must match exactly. Returns "" when all pass, else a
// description of the worst element. `extra_rel` widens the bound by extra_rel * max|ref|
// (for results that went through lower-precision intermediates, documented at each use).
std::string check_close(const std::vector<double>& got, const std::vector<double>& ref, DType storage,
                        double extra_rel = 0.0);
// Relative L2 error ‖got − ref‖ / ‖ref‖ over finite positions.
double rel_l2(const std::vector<double>& got, const std::vector<double>& ref);

// True when a CUDA device is usable; GPU tests call MLA_SKIP_WITHOUT_GPU() first.
bool have_gpu();
#define MLA_SKIP_WITHOUT_GPU() \
  do { if (!::mla::test::have_gpu()) GTEST_SKIP() << "no CUDA device present"; } while (0)

}  // namespace mla::test
