// SPDX-License-Identifier: Apache-2.0
// cuda_rt::copy_rows_async (runtime/device_api.h): the [n][h] grid of rows the layer copies with one kernel (q_pe
// beside the absorbed query). Every access width (16 / 8 / 4 / 2 / 1 bytes, chosen from width, strides and
// addresses), a broadcast source (head stride 0), negative strides, PDL on and off, and a chain of dependent copies
// (each reads what the one before wrote): the rows land, every byte around them keeps its poison.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/device_api.h"
#include "support/test_util.h"

namespace mla {
namespace {

struct Case {
  int64_t n, h, width;
  int64_t dst_s0, dst_s1, src_s0, src_s1;  // bytes
  int64_t dst_off, src_off;                // bytes from the buffers' (256-byte aligned) starts
};

// The host model: the bytes the copy writes into `dst`.
void model(std::vector<uint8_t>& dst, const std::vector<uint8_t>& src, const Case& c) {
  for (int64_t t = 0; t < c.n; ++t)
    for (int64_t j = 0; j < c.h; ++j)
      std::memcpy(dst.data() + c.dst_off + t * c.dst_s0 + j * c.dst_s1, src.data() + c.src_off + t * c.src_s0 + j * c.src_s1,
                  static_cast<std::size_t>(c.width));
}

void run_case(const Case& c, bool pdl) {
  constexpr std::size_t kBytes = 1 << 16;
  std::vector<uint8_t> src(kBytes), dst(kBytes, 0xab);
  std::mt19937 rng(static_cast<unsigned>(c.width * 131 + c.n * 7 + c.h));
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  void* d_src = cuda_rt::malloc(kBytes, 0);
  void* d_dst = cuda_rt::malloc(kBytes, 0);
  cuda_rt::memcpy(d_src, Device::cuda(0), src.data(), Device::cpu(), kBytes);
  cuda_rt::memcpy(d_dst, Device::cuda(0), dst.data(), Device::cpu(), kBytes);
  cuda_rt::synchronize(0);
  cuda_rt::copy_rows_async(static_cast<uint8_t*>(d_dst) + c.dst_off, c.dst_s0, c.dst_s1,
                           static_cast<const uint8_t*>(d_src) + c.src_off, c.src_s0, c.src_s1, c.n, c.h, c.width,
                           cuda_rt::side_stream(0), 0, pdl);
  cuda_rt::synchronize(0);
  std::vector<uint8_t> got(kBytes);
  cuda_rt::memcpy(got.data(), Device::cpu(), d_dst, Device::cuda(0), kBytes);
  cuda_rt::free(d_src, 0);
  cuda_rt::free(d_dst, 0);
  model(dst, src, c);
  for (std::size_t i = 0; i < kBytes; ++i)
    ASSERT_EQ(got[i], dst[i]) << "byte " << i << " (n " << c.n << " h " << c.h << " width " << c.width << ", pdl "
                              << pdl << ")";
}

TEST(CopyRowsGpu, EveryAccessWidthLandsTheRowsAndNothingElse) {
  MLA_SKIP_WITHOUT_GPU();
  const Case cases[] = {
      {3, 16, 128, 16 * 1152, 1152, 16 * 384, 384, 1024, 256},  // q_pe beside the query: 16-byte accesses
      {2, 5, 24, 5 * 40, 40, 5 * 24, 24, 8, 16},                 // 8-byte
      {4, 3, 12, 100, 36, 3 * 12, 12, 4, 0},                     // 4-byte
      {2, 7, 6, 7 * 10, 10, 7 * 6, 6, 2, 2},                     // 2-byte
      {3, 2, 5, 23, 11, 17, 5, 1, 3},                            // 1-byte
      {5, 16, 128, 16 * 128, 128, 384, 0, 0, 64},                // a broadcast source (head stride 0)
      {4, 1, 64, -256, 0, 64, 0, 4096, 0},                       // a negative token stride
      {1, 300, 32, 0, 48, 0, 32, 0, 0},                          // many rows, one token
      {0, 4, 16, 64, 16, 64, 16, 0, 0},                          // nothing
  };
  for (bool pdl : {true, false})
    for (const Case& c : cases) ASSERT_NO_FATAL_FAILURE(run_case(c, pdl));
}

TEST(CopyRowsGpu, DependentCopiesReadWhatTheOneBeforeWrote) {
  MLA_SKIP_WITHOUT_GPU();
  // A chain a -> b -> c -> a ... of whole-buffer copies launched back to back with PDL: each must see its
  // predecessor's writes (the kernel waits for the previous grid before it reads).
  constexpr int64_t kRows = 4096, kWidth = 256, kBytes = kRows * kWidth;
  std::vector<uint8_t> init(kBytes);
  std::mt19937 rng(7);
  for (auto& b : init) b = static_cast<uint8_t>(rng());
  void* buf[3];
  for (auto& p : buf) p = cuda_rt::malloc(kBytes, 0);
  cuda_rt::memcpy(buf[0], Device::cuda(0), init.data(), Device::cpu(), kBytes);
  cuda_rt::memset(buf[1], 0, 0, kBytes);
  cuda_rt::memset(buf[2], 0, 0, kBytes);
  cuda_rt::synchronize(0);
  void* stream = cuda_rt::side_stream(0);
  for (int k = 0; k < 30; ++k)
    cuda_rt::copy_rows_async(buf[(k + 1) % 3], kWidth, 0, buf[k % 3], kWidth, 0, kRows, 1, kWidth, stream, 0, true);
  cuda_rt::synchronize(0);
  std::vector<uint8_t> got(kBytes);
  cuda_rt::memcpy(got.data(), Device::cpu(), buf[30 % 3], Device::cuda(0), kBytes);
  for (auto& p : buf) cuda_rt::free(p, 0);
  EXPECT_EQ(got, init);
}

}  // namespace
}  // namespace mla
