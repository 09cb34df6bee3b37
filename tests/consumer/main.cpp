// SPDX-License-Identifier: Apache-2.0
// One CPU decode through the installed public API: four cached tokens whose 576-wide rows are all 1 give
// an output of exactly 1 in every latent column and an LSE of ln 4 + the (equal) scaled scores.
#include <mla/ops.h>
#include <mla/version.h>

#include <cmath>
#include <cstdio>
#include <cstdint>

int main() {
  using namespace mla;
  CacheBuffer kv = allocate_cache(CacheFormat::bf16, /*blocks=*/1, /*page=*/4, Device::cpu());
  fill(kv.cache.data, 1.0);
  Tensor q = Tensor::empty({1, 1, 2, 576}, DType::f32), out = Tensor::empty({1, 1, 2, 512}, DType::f32);
  Tensor lse = Tensor::empty({1, 1, 2}, DType::f32);
  Tensor table = Tensor::zeros({1, 1}, DType::i32), lens = Tensor::empty({1}, DType::i32);
  fill(q.view(), 0.5);
  fill(lens.view(), 4);
  const double scale = 0.1;
  mqa_decode(q.view(), kv.cache, table.view(), lens.view(), out.view(), lse.view(), scale);
  const float* o = out.view().data_as<float>();
  const double want_lse = std::log(4.0) + 0.5 * 576 * scale;
  bool ok = std::fabs(lse.view().data_as<float>()[1] - want_lse) < 1e-4;
  for (int i = 0; i < 2 * 512; ++i) ok = ok && o[i] == 1.0f;
  std::printf("mla %s consumer: out[0] %g, lse %g (want 1, %g): %s\n", MLA_VERSION_STRING, o[0],
              lse.view().data_as<float>()[1], want_lse, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
