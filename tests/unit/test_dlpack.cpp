// DLPack import/export (include/mla/dlpack.h): views round-trip without copies, the exported wrapper
// keeps its owner alive until the consumer's deleter runs, and unsupported tensors are refused.
#include <gtest/gtest.h>

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

TEST(DLPack, RefusesWhatItCannotRepresent) {
  float buf[4] = {};
  int64_t shape[1] = {4};
  DLTensor t{};
  t.data = buf;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.shape = shape;
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

}  // namespace
}  // namespace mla
