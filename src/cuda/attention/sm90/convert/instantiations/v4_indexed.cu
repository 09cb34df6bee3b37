// SPDX-License-Identifier: Apache-2.0
// The converter kernel's DeepSeek-V4 path (sparse_mqa over record caches: a main and an extra list): the format pairs
// it is built for.
#include <string>

#include "cuda/attention/sm90/common/launch_util.cuh"
#include "cuda/attention/sm90/convert/kernel.cuh"
#include "cuda/attention/sm90/convert/n16.cuh"
#include "cuda/attention/sm90/convert/launch.h"
#include "cuda/common/ptx/tensor_map.h"

namespace mla::cuda::decode_sm90 {

namespace {
// Whether out's rows (kOutRows16: a 16-byte aligned base, strides multiples of 8 elements) also make TMA strides:
// positive and below 2^40 bytes over the dimensions stepped over (h_q and tokens; s_q is 1 in sparse_mqa).
bool out_rows_tma(const MqaRowParams& r) {
  auto ok = [](int64_t extent, int64_t stride) {
    return extent == 1 || (stride > 0 && stride * 2 < (int64_t(1) << 40));
  };
  return ok(r.h_q, r.out_stride_h) && ok(r.groups, r.out_stride_g);
}

// Q's boxes for v4_q_issue (convert/kernel.cuh): q as {512, h_q, tokens} bf16, box {64, rows, 1} (rows: the N 16
// tile's 16 or 64), 128-byte swizzle. A dimension of extent 1 is never stepped over, so its stride is taken as the
// contiguous one (the view's may be anything there); the others are the view's (supports_v4 in sparse_mqa.cu: a
// 16-byte aligned base, positive strides of a multiple of 16 bytes).
// of_out: out mapped the same way (the persistent kernel's TMA stores of O, when out_rows_tma).
CUtensorMap q_map_of(const DecodeSm90Params& p, int rows, const char* what, bool of_out = false) {
  const MqaRowParams& r = p.rows;
  ptx::TmaTensor t;
  t.base = of_out ? r.out : r.q;
  t.dtype = DType::bf16;
  t.rank = 3;
  t.dims[0] = 512;
  t.dims[1] = r.h_q;
  t.dims[2] = r.groups;
  t.strides[0] = 1;
  t.strides[1] = r.h_q > 1 ? (of_out ? r.out_stride_h : r.q_stride_h) : 512;
  t.strides[2] = r.groups > 1 ? (of_out ? r.out_stride_g : r.q_stride_g) : t.strides[1] * r.h_q;
  t.box[0] = 64;
  t.box[1] = rows;
  t.box[2] = 1;
  t.swizzle = ptx::TmaSwizzle::b128;
  return ptx::make_tensor_map(t, what);
}

template <CacheFormat FM, CacheFormat FE>
bool launch_pair(CacheFormat fm, CacheFormat fe, const DecodeSm90Params& p, unsigned grid, cudaStream_t stream,
                 const char* what) {
  if (fm != FM || fe != FE) return false;
  // Units of at most 16 query rows: the N 16 tile (convert/n16.cuh); else 64-row tiles. Under p.cluster_merge
  // either's split build in clusters of p.num_splits.
  const unsigned cluster = static_cast<unsigned>(p.num_splits);
  constexpr int smem = ConvertTraits::kSmemBytes;
  const bool n16 = convert_v4_n16(p);
  const CUtensorMap q_map = q_map_of(p, n16 ? convert::kN16 : Traits::kBlockM, what);
  // The persistent 64-row kernel stores bf16 out rows of 16-byte starts by TMA (v4_s_units): out mapped as q is.
  // An out whose strides are no TMA strides takes the fragment path's pair stores (the op's checks leave only strides
  // past 2^40 bytes: non-negative, non-aliasing outputs).
  DecodeSm90Params pp = p;
  const bool persistent = !n16 && !p.cluster_merge && convert_v4_persistent(FM);
  if (persistent && pp.out_pairs == kOutRows16 && !out_rows_tma(pp.rows)) pp.out_pairs = kOutPairs;
  const bool o_tma = persistent && pp.out_pairs == kOutRows16;
  const V4Maps maps{q_map, o_tma ? q_map_of(pp, Traits::kBlockM, what, true) : q_map};
  if (n16 && p.cluster_merge)
    launch_one_clustered(decode_sm90_convert_v4n16_kernel<FM, FE, true>, smem, grid, cluster, stream, q_map, pp, what);
  else if (n16)
    launch_one(decode_sm90_convert_v4n16_kernel<FM, FE, false>, smem, grid, stream, q_map, pp, what);
  else if (p.cluster_merge)
    launch_one_clustered(decode_sm90_convert_v4_kernel<FM, FE, true>, smem, grid, cluster, stream, maps, pp, what);
  else
    launch_one(decode_sm90_convert_v4_kernel<FM, FE, false>, smem, grid, stream, maps, pp, what);
  return true;
}
template <CacheFormat FM, CacheFormat FE>
bool max_clusters_pair(CacheFormat fm, CacheFormat fe, bool n16, int device, int splits, int& n) {
  if (fm != FM || fe != FE) return false;
  constexpr const char* what = "sparse_mqa (sm90, DeepSeek-V4): cluster split";
  n = n16 ? max_clusters_cached<decode_sm90_convert_v4n16_kernel<FM, FE, true>>(device, splits,
                                                                               ConvertTraits::kSmemBytes, what)
          : max_clusters_cached<decode_sm90_convert_v4_kernel<FM, FE, true>>(device, splits, ConvertTraits::kSmemBytes,
                                                                            what);
  return true;
}
}  // namespace

bool convert_v4_n16(const DecodeSm90Params& p) { return p.m_tiles == 1 && p.rows.s_q * p.rows.h_q <= convert::kN16; }

int convert_v4_max_clusters(CacheFormat main_format, CacheFormat extra_format, bool n16, int device, int splits) {
  using F = CacheFormat;
  int n = 0;
  if (max_clusters_pair<F::v4, F::v4>(main_format, extra_format, n16, device, splits, n) ||
      max_clusters_pair<F::v41, F::v41>(main_format, extra_format, n16, device, splits, n) ||
      max_clusters_pair<F::v41, F::v41_fp4>(main_format, extra_format, n16, device, splits, n) ||
      max_clusters_pair<F::v41_fp4, F::v41_fp4>(main_format, extra_format, n16, device, splits, n))
    return n;
  return 0;
}

bool convert_v4_supports(CacheFormat main_format, CacheFormat extra_format) {
  using F = CacheFormat;
  return (main_format == F::v4 && extra_format == F::v4) || (main_format == F::v41 && extra_format == F::v41) ||
         (main_format == F::v41 && extra_format == F::v41_fp4) ||
         (main_format == F::v41_fp4 && extra_format == F::v41_fp4);
}

void launch_convert_v4_indexed(CacheFormat main_format, CacheFormat extra_format, const DecodeSm90Params& p,
                               unsigned grid, cudaStream_t stream, const char* what) {
  using F = CacheFormat;
  if (launch_pair<F::v4, F::v4>(main_format, extra_format, p, grid, stream, what) ||
      launch_pair<F::v41, F::v41>(main_format, extra_format, p, grid, stream, what) ||
      launch_pair<F::v41, F::v41_fp4>(main_format, extra_format, p, grid, stream, what) ||
      launch_pair<F::v41_fp4, F::v41_fp4>(main_format, extra_format, p, grid, stream, what))
    return;
  throw Error(std::string(what) + ": no converter kernel for this pair of record formats (convert_v4_supports)");
}

}  // namespace mla::cuda::decode_sm90
