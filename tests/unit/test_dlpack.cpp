// SPDX-License-Identifier: Apache-2.0
// DLPack import/export (include/mla/dlpack.h): views round-trip without copies, the exported wrapper
// keeps its owner alive until the consumer's deleter runs, and unsupported tensors are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "mla/dlpack.h"
#include "mla/error.h"
#include "support/test_util.h"

namespace mla {
namespace {

TEST(DLPack, StridedViewRoundTrips) {
  Tensor t = test::random_tensor({4, 6, 8}, DType::bf16);
  const TensorView v = t.view().slice(1, 2, 5).transpose(0, 2);  // [8, 3, 4], non-contiguous
  DLManagedTensor* m = to_dlpack(v);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dl_tensor.ndim, 3);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  const TensorView back = from_dlpack(*m);
  EXPECT_EQ(back.data, v.data);
  EXPECT_EQ(back.dtype, v.dtype);
  EXPECT_EQ(back.shape_str(), v.shape_str());
  for (int d = 0; d < 3; ++d) EXPECT_EQ(back.stride[d], v.stride[d]) << d;
  EXPECT_EQ(test::to_doubles(back), test::to_doubles(v));
  m->deleter(m);
}

TEST(DLPack, EveryDtypeMapsBothWays) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::fp8_e4m3, DType::u8, DType::i32,
                   DType::i64}) {
    Tensor t = Tensor::zeros({3}, dt);
    DLManagedTensor* m = to_dlpack(t.view());
    EXPECT_EQ(from_dlpack(*m).dtype, dt) << to_string(dt);
    m->deleter(m);
  }
}

TEST(DLPack, ExportKeepsOwnerAliveUntilDeleter) {
  auto owner = std::make_shared<int>(7);
  std::weak_ptr<int> watch = owner;
  Tensor t = Tensor::zeros({2, 2}, DType::f32);
  DLManagedTensor* m = to_dlpack(t.view(), owner);
  owner.reset();
  EXPECT_FALSE(watch.expired());  // the consumer still holds the tensor
  m->deleter(m);
  EXPECT_TRUE(watch.expired());
}

TEST(DLPack, ImportHonoursNullStridesAndByteOffset) {
  float buf[12];
  for (int i = 0; i < 12; ++i) buf[i] = static_cast<float>(i);
  int64_t shape[2] = {2, 3};
  DLTensor t{};
  t.data = buf;
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = nullptr;  // contiguous by the DLPack spec
  t.byte_offset = 6 * sizeof(float);
  const TensorView v = from_dlpack(t);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(test::to_doubles(v), (std::vector<double>{6, 7, 8, 9, 10, 11}));
}

// A 1-D CPU f32 header over `buf` with `shape` (the fields a test then breaks one at a time).
DLTensor cpu_f32(float* buf, int64_t* shape) {
  DLTensor t{};
  t.data = buf;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.shape = shape;
  t.dtype = {kDLFloat, 32, 1};
  return t;
}

TEST(DLPack, RefusesWhatItCannotRepresent) {
  float buf[4] = {};
  int64_t shape[1] = {4};
  DLTensor t = cpu_f32(buf, shape);
  t.dtype = {kDLComplex, 64, 1};
  EXPECT_THROW(from_dlpack(t), Error);
  t.dtype = {kDLFloat, 32, 4};  // vector lanes
  EXPECT_THROW(from_dlpack(t), Error);
  t.dtype = {kDLFloat, 32, 1};
  t.device = {kDLOpenCL, 0};
  EXPECT_THROW(from_dlpack(t), Error);
  t.device = {kDLCPU, 0};
  t.ndim = 0;
  EXPECT_THROW(from_dlpack(t), Error);
  EXPECT_THROW(to_dlpack(TensorView{}), Error);
}


// Hostile headers (issue 14): each was accepted (or crashed) at a955383.
TEST(DLPack, RefusesMalformedHeaders) {
  float buf[4] = {};
  int64_t shape[1] = {4};
  const DLTensor t = cpu_f32(buf, shape);
  EXPECT_NO_THROW(from_dlpack(t));
  DLTensor u = t;
  u.shape = nullptr;  // was dereferenced
  EXPECT_THROW(from_dlpack(u), Error);
  u = t;
  u.data = nullptr;  // null data + offset: a later op read address 0x40
  u.byte_offset = 64;
  EXPECT_THROW(from_dlpack(u), Error);
  u.byte_offset = 0;  // null data for 4 elements
  EXPECT_THROW(from_dlpack(u), Error);
  int64_t empty_shape[1] = {0};
  u.shape = empty_shape;  // null data for 0 elements is a valid empty tensor
  EXPECT_NO_THROW(from_dlpack(u));
  u = t;
  u.byte_offset = ~uint64_t(0) - 8;  // wraps
  EXPECT_THROW(from_dlpack(u), Error);
  u.byte_offset = uint64_t(1) << 63;
  EXPECT_THROW(from_dlpack(u), Error);
  int64_t huge[3] = {int64_t(1) << 40, int64_t(1) << 40, 4};  // extents whose product overflows
  u = t;
  u.ndim = 3;
  u.shape = huge;
  EXPECT_THROW(from_dlpack(u), Error);
  int64_t shape2[2] = {2, 2}, strides2[2] = {int64_t(1) << 62, 1};  // farthest element past int64 bytes
  u = t;
  u.ndim = 2;
  u.shape = shape2;
  u.strides = strides2;
  EXPECT_THROW(from_dlpack(u), Error);
  u = t;
  const int32_t bad_type = 12345;  // not a DLDeviceType value: read as an integer, refused
  std::memcpy(&u.device.device_type, &bad_type, sizeof(bad_type));
  EXPECT_THROW(from_dlpack(u), Error);
  u = t;
  u.device = {kDLCUDA, -1};
  EXPECT_THROW(from_dlpack(u), Error);
  // Found by fuzz_dlpack: a pointer a few bytes below 2^64 whose 16 bytes wrap the address space, and
  // one whose negative strides reach below address 0.
  u = t;
  u.data = reinterpret_cast<void*>(~uintptr_t(0) - 7);
  EXPECT_THROW(from_dlpack(u), Error);
  u.data = reinterpret_cast<void*>(~uintptr_t(0) - 15);  // the last 16 bytes: fits
  EXPECT_NO_THROW(from_dlpack(u));
  int64_t backwards[1] = {-1};
  u = t;
  u.data = reinterpret_cast<void*>(uintptr_t(8));
  u.strides = backwards;  // elements at 8, 4, 0, -4
  EXPECT_THROW(from_dlpack(u), Error);
  // Strides of both signs, each reach representable, the whole span past 2^63 bytes.
  int64_t shape3[2] = {2, 2}, strides3[2] = {int64_t(1) << 60, -(int64_t(1) << 60)};
  u = t;
  u.ndim = 2;
  u.shape = shape3;
  u.strides = strides3;
  u.data = reinterpret_cast<void*>(uintptr_t(1) << 63);
  EXPECT_THROW(from_dlpack(u), Error);
}

}  // namespace
}  // namespace mla
