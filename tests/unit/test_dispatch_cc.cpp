// SPDX-License-Identifier: Apache-2.0
// The fat binary's run-time choice: for each compute capability the library is built for (8.0, 8.6, 8.9,
// 9.0, 10.0, 12.0, and a later one reached through PTX), the real dispatch table of every kernel family
// picks an sm_90a variant on 9.0 only and the portable engine everywhere else, for a DeepSeek-V3 problem
// each sm90 variant supports. Selection is host code (Table::select) and reads no device, so this runs on
// the CPU; it needs the CUDA build, which holds the tables. Below 8.0 nothing can run: an error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mla/variants.h"

#if MLA_WITH_CUDA
#include "core/prefill_fp8.h"
#include "cuda/dispatch/families.h"
#include "mla/cache.h"
#include "mla/tensor.h"

namespace mla {
namespace {

using namespace cuda::dispatch;

const std::vector<int> kCapabilities = {80, 86, 89, 90, 100, 120, 130};

// "sm90" when the variant is arch-specific code for 9.0 only, "portable" for the portable engine; the
// test then compares these classes, not the sm90 variants' names, which the tables may refine.
std::string kind(const Family& f, const std::string& name) {
  const VariantInfo v = f.info(name);
  if (v.min_cc == 90 && v.max_cc == 90) return "sm90";
  return name;
}
std::string expected(int cc) { return cc == 90 ? "sm90" : "portable"; }

template <class Args>
void expect_choices(Table<Args>& table, const Args& a) {
  ASSERT_EQ(table.forced(), "");
  for (int cc : kCapabilities) {
    EXPECT_EQ(kind(table, table.select(a, cc).info.name), expected(cc)) << table.name() << " on cc " << cc;
  }
  EXPECT_THROW(table.select(a, 75), Error) << table.name() << ": nothing runs below 8.0";
}

TEST(DispatchByCapability, MqaDecode) {
  CacheBuffer kv = allocate_cache(CacheFormat::bf16, 8, 64, Device::cpu());
  Tensor q = Tensor::empty({4, 1, 128, 576}, DType::bf16), out = Tensor::empty({4, 1, 128, 512}, DType::bf16);
  Tensor lse = Tensor::empty({4, 1, 128}, DType::f32), table = Tensor::zeros({4, 2}, DType::i32);
  Tensor lens = Tensor::empty({4}, DType::i32);
  const TensorView none{};
  const Context ctx{};
  expect_choices(mqa_decode_table(),
                 DecodeArgs{q.view(), kv.cache, table.view(), lens.view(), out.view(), lse.view(), 0.07, true, none, ctx, 1});
}

TEST(DispatchByCapability, SparseMqa) {
  CacheBuffer kv = allocate_cache(CacheFormat::fp8_ds_mla, 8, 64, Device::cpu());
  Tensor q = Tensor::empty({4, 128, 576}, DType::bf16), out = Tensor::empty({4, 128, 512}, DType::bf16);
  Tensor lse = Tensor::empty({4, 128}, DType::f32), idx = Tensor::zeros({4, 2048}, DType::i32);
  const TensorView none{};
  const SparseOptions opts{};
  const Context ctx{};
  expect_choices(sparse_mqa_table(),
                 SparseArgs{q.view(), kv.cache, idx.view(), none, out.view(), lse.view(), 0.07, opts, ctx});
}

TEST(DispatchByCapability, MhaPrefill) {
  const int64_t t = 64, h = 128;
  Tensor q = Tensor::empty({t, h, 192}, DType::bf16), k_nope = Tensor::empty({t, h, 128}, DType::bf16);
  Tensor k_pe = Tensor::empty({t, 1, 64}, DType::bf16), v = Tensor::empty({t, h, 128}, DType::bf16);
  Tensor out = Tensor::empty({t, h, 128}, DType::bf16), lse = Tensor::empty({h, t}, DType::f32);
  Tensor cu = Tensor::zeros({2}, DType::i32);
  const Context ctx{};
  const PrefillOptions bf16{};
  expect_choices(mha_prefill_table(), PrefillArgs{q.view(), k_nope.view(), k_pe.view(), v.view(), cu.view(), cu.view(),
                                                  t, t, out.view(), lse.view(), 0.07, true, bf16, ctx});
  // fp8 compute: sm90_fp8 on 9.0, no variant elsewhere (an Error naming each variant's reason).
  PrefillOptions fp8{};
  fp8.fp8 = true;
  // sm90_fp8 takes a launch only with its workspace (16-byte aligned, prefill_fp8::Layout's bytes for the shape).
  Tensor ws = Tensor::empty({prefill_fp8::Layout::of(t, t, h, 1).total}, DType::u8);
  fp8.workspace = ws.view();
  const PrefillArgs a{q.view(), k_nope.view(), k_pe.view(), v.view(), cu.view(), cu.view(),
                      t, t, out.view(), lse.view(), 0.07, true, fp8, ctx};
  EXPECT_EQ(mha_prefill_table().select(a, 90).info.name, "sm90_fp8");
  for (int cc : kCapabilities) {
    if (cc != 90) {
      EXPECT_THROW(mha_prefill_table().select(a, cc), Error) << "fp8 on cc " << cc;
    }
  }
}

TEST(DispatchByCapability, IndexerLogitsDecode) {
  const int64_t b = 4, h = 64;
  IndexerCacheBuffer cache = allocate_indexer_cache(8, 64, Device::cpu());
  Tensor q = Tensor::empty({b, h, 128}, DType::fp8_e4m3), w = Tensor::empty({b, h}, DType::f32);
  Tensor table = Tensor::zeros({b, 2}, DType::i32), lens = Tensor::empty({b}, DType::i32);
  Tensor logits = Tensor::empty({b, 128}, DType::f32);
  const TensorView none{};
  const Context ctx{};
  expect_choices(indexer_logits_table(), IndexerLogitsArgs{q.view(), w.view(), none, none, none, none, &cache.cache,
                                                           table.view(), lens.view(), 1, logits.view(), ctx});
}

TEST(DispatchByCapability, EveryFamilyIsCovered) {
  std::vector<std::string> names;
  for (const Family* f : all_families()) names.push_back(f->name());
  EXPECT_EQ(names, (std::vector<std::string>{"mqa_decode", "sparse_mqa", "mha_prefill", "indexer_logits"}))
      << "a new family needs its case above";
}

}  // namespace
}  // namespace mla
#endif  // MLA_WITH_CUDA
