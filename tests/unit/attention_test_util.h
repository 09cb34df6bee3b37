// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the attention tests: caches with random rows in every format and NaN everywhere else
// (so a stray read shows), and a float64 softmax-attention oracle written directly from the formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cache_test_util.h"
#include "core/numeric.h"
#include "mla/cache.h"
#include "mla/ops.h"
#include "mla/tensor.h"
#include "support/test_util.h"

namespace mla::test {

// Every format of the plain row rule (mla/cache_format.h): sweeps cover a new format automatically. The
// block-scaled records (kRecordFormats) serve the V4 ops only and have their own tests.
inline constexpr CacheFormat kAllFormats[] = {
#define MLA_X(name, value) CacheFormat::name,
    MLA_DEVICE_CACHE_FORMATS(MLA_X) MLA_HOST_CACHE_FORMATS(MLA_X)
#undef MLA_X
};
// Their count: the plain formats are the enum values 0 .. kNumPlainFormats - 1.
inline constexpr int kNumPlainFormats = static_cast<int>(sizeof(kAllFormats) / sizeof(kAllFormats[0]));
inline constexpr CacheFormat kRecordFormats[] = {
#define MLA_X(name, value) CacheFormat::name,
    MLA_RECORD_CACHE_FORMATS(MLA_X)
#undef MLA_X
};
// The formats CUDA serves (GPU sweeps); the host-only ones (f64) are refused there.
inline constexpr CacheFormat kDeviceFormats[] = {
#define MLA_X(name, value) CacheFormat::name,
    MLA_DEVICE_CACHE_FORMATS(MLA_X)
#undef MLA_X
};

// Every byte 0xff: NaN in each format (bf16 0xffff, e4m3 0xff, fp32 scales 0xffffffff).
inline void poison_row(const KVCache& c, int64_t slot) {
  std::memset(const_cast<uint8_t*>(row_ptr(c, slot)), 0xff,
              static_cast<std::size_t>(cache_entry_bytes(c.format, c.d_qk)));
}

// A finite e4m3 code (never 0x7f / 0xff, the NaN codes).
inline uint8_t random_e4m3_code() {
  std::uniform_int_distribution<int> u(0, 253);
  int b = u(rng());
  if (b >= 0x7f) ++b;  // skip 0x7f
  return static_cast<uint8_t>(b);
}

// Random finite values in row `slot`, for any format (its traits): bf16 / f64 values in [-1, 1]; e4m3 codes
// of any finite magnitude (values up to 448 * scale); per-tile scales in [1e-3, 4e-3]. Drawn in row
// byte order (latent, scales, rope).
inline void randomize_row(const KVCache& c, int64_t slot) {
  auto* p = const_cast<uint8_t*>(row_ptr(c, slot));
  auto u = [](std::mt19937_64&) { return uniform(-1.0, 1.0); };
  auto us = [](std::mt19937_64&) { return uniform(1e-3, 4e-3); };
  dispatch_cache_format(c.format, [&](auto fmt) {
    using F = decltype(fmt);
    if constexpr (F::kRecord) {
      ADD_FAILURE() << "randomize_row fills plain rows; V4 records are written by write_cache";
      return;
    }
    auto fill = [&](uint8_t* q, DType dt, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        if (dt == DType::bf16) num::store(q + 2 * i, DType::bf16, u(rng()));
        else if (dt == DType::f64) num::store(q + 8 * i, DType::f64, u(rng()));
        else q[i] = random_e4m3_code();
      }
    };
    const int64_t latent = c.d_latent();
    fill(p, F::kLatentDType, latent);
    for (int64_t t = 0; t < F::num_tiles(latent); ++t) {
      const float s = static_cast<float>(us(rng()));
      std::memcpy(p + F::scale_offset(latent) + 4 * t, &s, 4);
    }
    fill(p + F::rope_offset(latent), F::kRopeDType, c.d_rope);
  });
}

// Multiplies the key / value of row `slot` by m where the format allows it per row: bf16 / f64 values, and
// fp8_ds_mla's per-tile scales with its bf16 rope. False for fp8 per-tensor (one scale for the whole cache, codes
// of any magnitude): the row is left as it was.
inline bool scale_row(const KVCache& c, int64_t slot, double m) {
  auto* p = const_cast<uint8_t*>(row_ptr(c, slot));
  bool ok = true;
  dispatch_cache_format(c.format, [&](auto fmt) {
    using F = decltype(fmt);
    if constexpr (F::kRecord) {
      ok = false;  // V4 records: not scaled per row here
      return;
    }
    auto scale = [&](uint8_t* v, DType dt, int64_t n) {
      const int64_t w = dtype_bytes(dt);
      for (int64_t i = 0; i < n; ++i) num::store(v + w * i, dt, num::load(v + w * i, dt) * m);
    };
    const int64_t latent = c.d_latent();
    const bool codes = F::kLatentDType == DType::fp8_e4m3;
    if (codes && F::num_tiles(latent) == 0) {
      ok = false;
      return;
    }
    if (codes) {
      for (int64_t t = 0; t < F::num_tiles(latent); ++t) {
        float s;
        std::memcpy(&s, p + F::scale_offset(latent) + 4 * t, 4);
        s = static_cast<float>(s * m);
        std::memcpy(p + F::scale_offset(latent) + 4 * t, &s, 4);
      }
    } else {
      scale(p, F::kLatentDType, latent);
    }
    scale(p + F::rope_offset(latent), F::kRopeDType, c.d_rope);
  });
  return ok;
}

// Key magnitudes per 64-key tile that make the logits' row maxima jump across tiles, for the kernels' lazy
// maximum (a row's reference maximum moves only when a tile's max exceeds it by more than tau = 8 in log2
// units, and O is rescaled only then). With q in [-3, 3] and keys in [-1, 1] times this, a tile's row max is
// ~6x it in log2 units at kScale 0.0722: tiles 4i + 1 raise it by ~10 (over tau: the rescale), 4i + 3 and 4i + 4
// by ~2 (under tau: P up to 2^8 against an unmoved reference), and tiles 4i + 2 hold small keys (no new max);
// per-row spreads mix the cases further as the magnitudes grow.
inline double logit_jump_scale(int64_t tile) {
  double base = 1.0;
  for (int64_t t = 1; t <= tile; ++t) base += t % 4 == 1 ? 1.6 : t % 4 == 2 ? 0.0 : 0.3;
  return tile % 4 == 2 ? 0.4 : base;
}

// A cache whose rows are all NaN; tests randomise the rows they mean to be read. fp8 scale 1/200 keeps
// dequantised values within +-2.24 (e4m3 max 448).
inline CacheBuffer nan_cache(CacheFormat format, int64_t num_blocks, int64_t page) {
  CacheBuffer cb = allocate_cache(format, num_blocks, page, Device::cpu(), format == CacheFormat::fp8 ? 0.005f : 1.0f);
  std::memset(cb.storage.data(), 0xff, cb.storage.nbytes());
  return cb;
}

// The bf16 upconvert of a host fp8_ds_mla cache, slot for slot (the CPU op, SEMANTICS §3.3:
// bf16(float(code) * scale)): what the sm90_seesaw kernel reads for an fp8_ds_mla row (docs/design/
// attention_sm90.md "2. What every kernel shares", exact codes), hence the cache its float64 oracle reads. An fp8
// (per-tensor) cache likewise, every column times KVCache::scale in fp32, rounded to bf16 (the sm90 kernels read
// fp8 per-tensor rows as exact codes, so their oracles keep the fp8 cache).
inline CacheBuffer upconverted_cache(const KVCache& c) {
  const int64_t nb = c.num_blocks(), page = c.page_size();
  CacheBuffer u = nan_cache(CacheFormat::bf16, nb, page);
  if (c.format == CacheFormat::fp8) {
    const auto* src = static_cast<const uint8_t*>(c.data.data);
    auto* dst = static_cast<uint16_t*>(u.storage.data());
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t r = 0; r < page; ++r)
        for (int64_t j = 0; j < c.d_qk; ++j) {
          const float v = num::e4m3_to_float(src[b * c.data.stride[0] + r * c.data.stride[1] + j]) * c.scale;
          dst[(b * page + r) * c.d_qk + j] = num::float_to_bf16(v);
        }
    return u;
  }
  std::vector<int32_t> blocks;
  for (int64_t b = 0; b < nb; ++b) blocks.push_back(static_cast<int32_t>(b));
  const Tensor table = int_tensor_2d({blocks});
  const TensorView dst(u.storage.data(), DType::bf16, {nb * page, 576});
  upconvert_ds_mla(c, dst, table, int_tensor({0}), {}, Context{nullptr, Precision::reference});
  return u;
}

// Paged layout of a decode batch: each request owns max_blocks distinct blocks in shuffled order; its
// rows below seq_len are random, every other row of the cache stays NaN.
struct PagedBatch {
  CacheBuffer cb;
  Tensor block_table;                       // [b, max_blocks] i32
  Tensor seq_lens;                          // [b] i32
  std::vector<std::vector<int64_t>> slots;  // slots[r][pos]
};
inline PagedBatch paged_batch(CacheFormat format, int64_t page, const std::vector<int32_t>& lens, int64_t max_blocks,
                              int64_t spare_blocks = 2) {
  const int64_t b = static_cast<int64_t>(lens.size());
  const int64_t num_blocks = b * max_blocks + spare_blocks;
  PagedBatch pb{nan_cache(format, num_blocks, page), {}, int_tensor(lens), {}};
  std::vector<int32_t> ids(static_cast<std::size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng());
  std::vector<std::vector<int32_t>> table(static_cast<std::size_t>(b));
  pb.slots.resize(static_cast<std::size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    // Entries past the request's last page are never read: odd requests mark them -1, even ones keep
    // (NaN-filled) blocks of the cache, so a read past seq_len shows as NaN or as an out-of-range id.
    const int64_t used = (lens[static_cast<std::size_t>(r)] + page - 1) / page;
    for (int64_t j = 0; j < max_blocks; ++j)
      table[r].push_back(j >= used && r % 2 ? -1 : ids[static_cast<std::size_t>(r * max_blocks + j)]);
    for (int64_t pos = 0; pos < lens[static_cast<std::size_t>(r)]; ++pos) {
      const int64_t slot = table[r][static_cast<std::size_t>(pos / page)] * page + pos % page;
      pb.slots[r].push_back(slot);
      randomize_row(pb.cb.cache, slot);
    }
  }
  pb.block_table = int_tensor_2d(table);
  return pb;
}

// Every request's key at position pos times logit_jump_scale(pos / 64) (scale_row); false where the format has no
// per-row scaling (fp8 per-tensor: its rows are left as they were).
inline bool scale_to_logit_jumps(const PagedBatch& pb) {
  bool scaled = true;
  for (const auto& slots : pb.slots)
    for (std::size_t pos = 0; pos < slots.size(); ++pos)
      scaled = scale_row(pb.cb.cache, slots[pos], logit_jump_scale(static_cast<int64_t>(pos) / 64)) && scaled;
  return scaled;
}

// Result of the oracle: out [rows, dv] and lse [rows] in float64.
struct OracleOut {
  std::vector<double> out, lse;
};

// Softmax attention of one query over explicit key / value rows (all float64), appended to `res`.
// No key -> zeros and -inf (the contract's empty-set rule). `sink`: an attention sink (SEMANTICS §11.8: a
// logit in the denominator only, -inf = none): m = max(max_j s_j, sink), l = sum_j exp(s_j - m) +
// exp(sink - m), out = sum_j exp(s_j - m) v_j / l, lse = m + ln l.
inline void oracle_attend(const double* q, const std::vector<const double*>& keys, int64_t d,
                          const std::vector<const double*>& vals, int64_t dv, double scale, OracleOut& res,
                          double sink = -std::numeric_limits<double>::infinity()) {
  const std::size_t n = keys.size();
  if (n == 0 && sink == -std::numeric_limits<double>::infinity()) {
    res.out.insert(res.out.end(), static_cast<std::size_t>(dv), 0.0);
    res.lse.push_back(-std::numeric_limits<double>::infinity());
    return;
  }
  std::vector<double> s(n);
  double mx = sink;
  for (std::size_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t x = 0; x < d; ++x) acc += q[x] * keys[j][x];
    s[j] = acc * scale;
    mx = std::max(mx, s[j]);
  }
  double sum = std::exp(sink - mx);  // 0 without a sink
  for (double& v : s) sum += (v = std::exp(v - mx));
  for (int64_t x = 0; x < dv; ++x) {
    double acc = 0;
    for (std::size_t j = 0; j < n; ++j) acc += s[j] * vals[j][x];
    res.out.push_back(acc / sum);
  }
  res.lse.push_back(mx + std::log(sum));
}

// lse values stored as fp32: compare with the f32 rule.
inline std::vector<double> as_f32(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

}  // namespace mla::test
