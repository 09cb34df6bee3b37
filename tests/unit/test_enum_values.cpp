// SPDX-License-Identifier: Apache-2.0
// Out-of-range enum values (a cast integer, a corrupted struct, a binding passing a raw int) are refused
// with mla::Error at every public entry that takes them, before anything is written (issue 14): DType,
// Device type, Precision, CacheFormat, DsMlaScale, QueryLenSupport.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "mla/cache.h"
#include "mla/error.h"
#include "mla/layer.h"
#include "mla/ops.h"
#include "mla/plan.h"
#include "support/test_util.h"

namespace mla {
namespace {

template <class E>
E bad(int v) {
  E e;
  std::memcpy(&e, &v, sizeof(E));  // the low byte(s): 0x77... never a valid value of these enums
  return e;
}

// `call` throws mla::Error whose text contains `needle`, and the bytes of `outputs` do not change.
void expect_refused(const std::function<void()>& call, const std::vector<TensorView>& outputs, const char* needle,
                    const std::string& what) {
  std::vector<std::vector<uint8_t>> before;
  for (const TensorView& o : outputs) {
    const auto* p = static_cast<const uint8_t*>(o.data);
    before.emplace_back(p, p + o.span_bytes());
  }
  try {
    call();
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    if (std::getenv("MLA_TEST_VERBOSE")) std::printf("%s: %s\n", what.c_str(), e.what());
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(outputs[i].data);
    EXPECT_TRUE(std::equal(before[i].begin(), before[i].end(), p)) << what << ": output " << i << " written";
  }
}

TEST(EnumValues, TensorsRefuseBadDTypeAndDevice) {
  EXPECT_THROW(Tensor::empty({4}, bad<DType>(0x77)), Error);
  EXPECT_THROW(Tensor::zeros({4}, bad<DType>(0x77)), Error);
  EXPECT_THROW(Tensor::empty({4}, DType::f32, Device{bad<DeviceType>(0x77), 0}), Error);
  EXPECT_THROW(Tensor::zeros({4}, DType::f32, Device{bad<DeviceType>(7), 0}), Error);
  EXPECT_THROW(allocate_cache(CacheFormat::bf16, 2, 4, Device{bad<DeviceType>(7), 0}), Error);
}

TEST(EnumValues, OpsRefuseBadEnumsAndWriteNothing) {
  test::reseed(5);
  const int64_t page = 16;
  CacheBuffer cb = allocate_cache(CacheFormat::bf16, 4, page, Device::cpu());
  std::memset(cb.storage.data(), 0x3c, cb.storage.nbytes());
  Tensor kv = test::random_tensor({3, 512}, DType::bf16), pe = test::random_tensor({3, 64}, DType::bf16);
  Tensor slots = test::int64_tensor({1, 2, 3});
  const Context bad_precision{nullptr, bad<Precision>(0x77)};
  const std::vector<TensorView> cache_bytes = {cb.storage.view()};

  expect_refused([&] { write_cache(kv, pe, slots, cb.cache, DsMlaScale::amax, bad_precision); }, cache_bytes,
                 "Precision", "write_cache, bad Context::precision");
  expect_refused([&] { write_cache(kv, pe, slots, cb.cache, bad<DsMlaScale>(0x77)); }, cache_bytes, "DsMlaScale",
                 "write_cache, bad DsMlaScale");
  KVCache bad_format = cb.cache;
  bad_format.format = bad<CacheFormat>(0x77);
  expect_refused([&] { write_cache(kv, pe, slots, bad_format); }, cache_bytes, "CacheFormat",
                 "write_cache, bad CacheFormat");

  // Attention: q / out with a bad device type, and a bad precision.
  test::PagedBatch pb = test::paged_batch(CacheFormat::bf16, page, {5, 7}, 2);
  Tensor q = test::random_tensor({2, 1, 4, 576}, DType::bf16);
  Tensor out = Tensor::zeros({2, 1, 4, 512}, DType::f32), lse = Tensor::zeros({2, 1, 4}, DType::f32);
  const std::vector<TensorView> outs = {out.view(), lse.view()};
  expect_refused([&] { mqa_decode(q, pb.cb.cache, pb.block_table, pb.seq_lens, out, lse, 0.1, true, {}, bad_precision); },
                 outs, "Precision", "mqa_decode, bad precision");
  TensorView q_bad_dev = q.view();
  q_bad_dev.device = Device{bad<DeviceType>(7), 0};
  TensorView out_bad_dev = out.view();
  out_bad_dev.device = q_bad_dev.device;
  expect_refused([&] { mqa_decode(q_bad_dev, pb.cb.cache, pb.block_table, pb.seq_lens, out_bad_dev, {}, 0.1); }, outs,
                 "device", "mqa_decode, every view on a bad device type");
  TensorView q_bad_dtype = q.view();
  q_bad_dtype.dtype = bad<DType>(0x77);
  expect_refused([&] { mqa_decode(q_bad_dtype, pb.cb.cache, pb.block_table, pb.seq_lens, out, lse, 0.1); }, outs, "",
                 "mqa_decode, q with a bad dtype");

  Tensor a = test::random_tensor({4, 4}, DType::f32), c = Tensor::zeros({4, 4}, DType::f32);
  expect_refused([&] { gemm(a, a, c, 1.0f, 0.0f, bad_precision); }, {c.view()}, "Precision", "gemm, bad precision");
}

TEST(EnumValues, PlannerAndLayerRefuseBadEnums) {
  PlannerConfig cfg;
  cfg.cache_format = bad<CacheFormat>(0x77);
  EXPECT_THROW(cfg.validate(), Error);
  EXPECT_THROW(dense_decode_threshold(bad<QueryLenSupport>(0x77), 0, false, 1, false), Error);

  LayerOptions opt;
  opt.dtype = DType::f32;
  Tensor w = test::random_tensor({opt.dims.num_heads * (opt.dims.qk_nope_head_dim + opt.dims.v_head_dim),
                                  opt.dims.kv_lora_rank},
                                 DType::f32);
  for (int which = 0; which < 4; ++which) {
    LayerOptions o = opt;
    if (which == 0) o.cache_format = bad<CacheFormat>(0x77);
    if (which == 1) o.ds_scale = bad<DsMlaScale>(0x77);
    if (which == 2) o.dtype = bad<DType>(0x77);
    if (which == 3) o.device = Device{bad<DeviceType>(7), 0};
    EXPECT_THROW(MlaAttention(o, w), Error) << "LayerOptions field " << which;
  }
  // Issue 51: a DeviceType outside the enum is refused by the constructor, naming the device (it
  // used to construct a layer whose workspace_bytes then failed with a misleading message).
  for (int v : {0, 3, 7, 0x77}) {
    LayerOptions o = opt;
    o.device = Device{bad<DeviceType>(v), 0};
    try {
      MlaAttention layer(o, w);
      ADD_FAILURE() << "constructed on DeviceType " << int(v);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("options.device"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mla
