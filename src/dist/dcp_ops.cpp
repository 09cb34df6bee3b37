// SPDX-License-Identifier: Apache-2.0
// Collectives of a DCP group (mla/dcp.h, semantics §13): all-gather q over heads, attend the rank's
// shard for the group's W·h_q heads, exchange the partials of each rank's heads (all-to-all) and
// combine them (combine_attn_states). The dense decode reads the gathered q and writes its partials
// in place through strided views (the W rank blocks are its s_q axis), so it copies nothing; the
// sparse op reorders with strided row copies (one 2-D copy per rank block on CUDA).
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "mla/dcp.h"
#include "mla/ops.h"
#if MLA_WITH_CUDA
#include "runtime/device_api.h"
#endif

namespace mla {
namespace {

constexpr int64_t kQk = 576, kV = 512;

// Carves one caller-owned buffer into 256-byte aligned regions; with base == nullptr it only counts.
struct Carver {
  char* base = nullptr;
  std::size_t used = 0;
  char* take(std::size_t bytes) {
    used = (used + 255) / 256 * 256;
    char* p = base ? base + used : nullptr;
    used += bytes;
    return p;
  }
};

// The buffers of one call. q_recv: the all-gathered q, W rank blocks [t, h_q, 576]. The exchange
// buffers (send, recv) hold W blocks, one per rank: block j = the partial outputs of rank j's heads
// [t, h_q, 512] followed by their LSEs [t, h_q] fp32 (padded to 16 bytes), so one all-to-all moves both.
// The dense decode reads q_recv and writes send through strided views; only a `staged` call (sparse:
// its q is [T, h, 576], one head stride) also holds q_all [t, W·h_q, 576] (token-major) and the partials
// [t, W·h_q, 512] + LSEs [t, W·h_q] that are then copied into the send blocks.
struct Buffers {
  char *q_recv, *q_all = nullptr, *partial = nullptr, *send, *recv, *scratch, *table;
  float* partial_lse = nullptr;
  std::size_t out_bytes = 0, block_bytes = 0;  // one block's partial outputs; the whole block
  std::size_t scratch_bytes = 0, total = 0;
};

// dqk / dv: the widths of q and of the partial outputs (576 / 512 but for the sparse op's V4 form).
Buffers carve(char* base, int64_t t, int64_t h_q, int world, DType dtype, std::size_t scratch, std::size_t table,
              bool staged, int64_t dqk = kQk, int64_t dv = kV) {
  const auto es = static_cast<std::size_t>(dtype_size(dtype));
  const auto n = static_cast<std::size_t>(t * h_q * world);  // rows (token, head) of the whole group
  Carver c{base};
  Buffers b{};
  b.q_recv = c.take(n * static_cast<std::size_t>(dqk) * es);
  if (staged) {
    b.q_all = c.take(n * static_cast<std::size_t>(dqk) * es);
    b.partial = c.take(n * static_cast<std::size_t>(dv) * es);
    b.partial_lse = reinterpret_cast<float*>(c.take(n * 4));
  }
  const auto rows = static_cast<std::size_t>(t * h_q);  // (token, head) rows of one rank's heads
  b.out_bytes = (rows * static_cast<std::size_t>(dv) * es + 15) / 16 * 16;  // the LSEs stay 16-byte aligned
  b.block_bytes = b.out_bytes + (rows * 4 + 15) / 16 * 16;
  b.send = c.take(b.block_bytes * static_cast<std::size_t>(world));
  b.recv = c.take(b.block_bytes * static_cast<std::size_t>(world));
  b.table = c.take(table);
  b.scratch = c.take(scratch);
  b.scratch_bytes = scratch;
  b.total = c.used;
  return b;
}

// `rows` rows of `width` bytes: row i from src + i·spitch to dst + i·dpitch.
void copy_rows(char* dst, std::size_t dpitch, const char* src, std::size_t spitch, std::size_t width,
               std::size_t rows, Device dev, const Context& ctx) {
  if (rows == 0 || width == 0) return;
  if (dev.is_cpu()) {
    for (std::size_t i = 0; i < rows; ++i) std::memcpy(dst + i * dpitch, src + i * spitch, width);
    return;
  }
#if MLA_WITH_CUDA
  cuda_rt::memcpy2d_async(dst, dpitch, src, spitch, width, rows, ctx.stream, dev.index);
#else
  (void)ctx;
  throw Error("dcp: CUDA tensor given, but this build of mla has no CUDA backend");
#endif
}

// [W blocks of t rows of h_q·d] <-> [t, W·h_q, d] (token-major): block j (at j·block_stride bytes)
// holds heads [j·h_q, (j+1)·h_q) of `tokens`.
void blocks_to_tokens(char* tokens, const char* blocks, std::size_t block_stride, int64_t t, int64_t h_q, int world,
                      int64_t d, std::size_t es, Device dev, const Context& ctx) {
  const std::size_t row = static_cast<std::size_t>(h_q * d) * es;
  for (int j = 0; j < world; ++j)
    copy_rows(tokens + j * row, row * world, blocks + static_cast<std::size_t>(j) * block_stride, row, row,
              static_cast<std::size_t>(t), dev, ctx);
}
void tokens_to_blocks(char* blocks, std::size_t block_stride, const char* tokens, int64_t t, int64_t h_q, int world,
                      int64_t d, std::size_t es, Device dev, const Context& ctx) {
  const std::size_t row = static_cast<std::size_t>(h_q * d) * es;
  for (int j = 0; j < world; ++j)
    copy_rows(blocks + static_cast<std::size_t>(j) * block_stride, row, tokens + j * row, row * world, row,
              static_cast<std::size_t>(t), dev, ctx);
}

// d_qk: q's last dim (576; the V4 sparse op passes q's own).
void check_group_call(Communicator& comm, const TensorView& q, int q_ndim, const TensorView& out,
                      const TensorView& lse, const TensorView& workspace, std::size_t need, const char* op,
                      int64_t d_qk = kQk) {
  detail::check_ndim(q, q_ndim, op, q_ndim == 4 ? "q [b, s_q, h_q, 576]" : "q [T, h_q, d_qk]");
  MLA_CHECK(q.size(-1) == d_qk, "{}: q's last dim must be {}, got {}", op, d_qk, q.describe());
  for (const TensorView* v : {&q, &out, &lse}) {
    if (v == &lse && !lse.defined()) continue;  // lse is optional
    detail::check_defined(*v, op, "q / out");
    MLA_CHECK(v->is_contiguous(), "{}: q, out and lse must be contiguous, got {}", op, v->describe());
    MLA_CHECK(v->device == comm.device(), "{}: tensors must live on the communicator's device {}, got {}", op,
              to_string(comm.device()), v->describe());
  }
  MLA_CHECK(out.dtype == q.dtype, "{}: out must have q's dtype {}, got {}", op, to_string(q.dtype), out.describe());
  MLA_CHECK(!lse.defined() || lse.dtype == DType::f32, "{}: lse must be f32, got {}", op, lse.describe());
  detail::check_defined(workspace, op, "workspace");
  MLA_CHECK(workspace.dtype == DType::u8 && workspace.is_contiguous() && workspace.device == comm.device(),
            "{}: workspace must be a contiguous u8 buffer on {}, got {}", op, to_string(comm.device()),
            workspace.describe());
  MLA_CHECK(static_cast<std::size_t>(workspace.numel()) >= need,
            "{}: workspace holds {} bytes, the call needs {} (use the size query)", op, workspace.numel(), need);
}

// The send blocks as the partial outputs [t, W, h_q, 512] and LSEs [t, W, h_q] of every head of the
// group (index 1 = the rank whose heads they are). Strides in elements of each view's dtype (block_bytes
// is a multiple of 16, so of every element size).
TensorView send_out(const Buffers& b, int64_t t, int64_t h_q, int world, DType dtype, Device dev) {
  const int64_t shape[] = {t, world, h_q, kV},
                stride[] = {h_q * kV, static_cast<int64_t>(b.block_bytes / dtype_size(dtype)), kV, 1};
  return TensorView(b.send, dtype, shape, stride, dev);
}
TensorView send_lse(const Buffers& b, int64_t t, int64_t h_q, int world, Device dev) {
  const int64_t shape[] = {t, world, h_q}, stride[] = {h_q, static_cast<int64_t>(b.block_bytes / 4), 1};
  return TensorView(b.send + b.out_bytes, DType::f32, shape, stride, dev);
}

// Exchange and combine: the send blocks (this rank's partials of every rank's heads, packed as above)
// -> out / lse (nullptr: not wanted) of this rank's heads, t rows [t, h_q, dv] / [t, h_q] contiguous. sink
// [h_q] (optional): the rank's heads' attention sinks, folded in by the combine (once per head).
void exchange_and_combine(Communicator& comm, const Buffers& b, int64_t t, int64_t h_q, DType dtype, void* out,
                          float* lse, const Context& ctx, int64_t dv = kV, const TensorView& sink = {}) {
  const int w = comm.world_size();
  const Device dev = comm.device();
  const std::size_t es = dtype_size(dtype);
  const auto bytes = static_cast<int64_t>(b.block_bytes) * w;
  comm.all_to_all(TensorView(b.send, DType::u8, {bytes}, dev), TensorView(b.recv, DType::u8, {bytes}, dev), ctx);
  // Block i of recv: rank i's partials of this rank's heads. Strides in elements of each view's dtype
  // (block_bytes is a multiple of 16, so of both element sizes).
  const auto block = static_cast<int64_t>(b.block_bytes);
  const int64_t pshape[] = {w, t, h_q, dv}, pstride[] = {block / static_cast<int64_t>(es), h_q * dv, dv, 1};
  const int64_t lshape[] = {w, t, h_q}, lstride[] = {block / 4, h_q, 1};
  combine_attn_states(TensorView(out, dtype, {t, h_q, dv}, dev),
                      lse ? TensorView(lse, DType::f32, {t, h_q}, dev) : TensorView{},
                      TensorView(b.recv, dtype, pshape, pstride, dev),
                      TensorView(b.recv + b.out_bytes, DType::f32, lshape, lstride, dev), ctx, sink);
}

// All-gather q [t, h_q, d] of every rank into q_recv: W rank blocks [t, h_q, d] (d = q's last dim).
void gather_q(Communicator& comm, const TensorView& q, char* q_recv, int64_t t, int64_t h_q, const Context& ctx) {
  const int64_t n = t * h_q, d = q.size(-1);
  comm.all_gather(TensorView(q.data, q.dtype, {n, d}, q.device),
                  TensorView(q_recv, q.dtype, {int64_t(comm.world_size()) * n, d}, q.device), ctx);
}

// Split scratch of the dense decode's mqa_decode: t requests, the W rank blocks as s_q, h_q heads.
std::size_t decode_scratch_bytes(int64_t t, int64_t h_q, int world, int64_t max_len, Device dev, int num_splits) {
  return mqa_decode_workspace_bytes(t, world, h_q, std::max<int64_t>(1, max_len), dev, num_splits);
}

// The dense decode's buffers. q_recv as in Buffers. all_to_all: half[0] = the exchange blocks of all t
// rows; all_to_all_overlap (t >= 2): half[0] for rows [0, t0), half[1] for [t0, t). AG+RS: `parts`
// holds 2W − 1 blocks of W·t·h_q·512 (the rank's partials of every head at block W − 1, the others
// zero where a view reads them), the rank's LSEs [W, t, h_q], every rank's [W, W, t, h_q], the rescaled
// partials [W, t, h_q, 512] and the global LSEs [W, t, h_q].
struct DenseBuffers {
  char* q_recv = nullptr;
  int halves = 1;
  int64_t t0 = 0;  // rows of the first half
  Buffers half[2]{};
  char *parts = nullptr, *scaled = nullptr;
  std::size_t part_block = 0;
  float *lse_local = nullptr, *lse_all = nullptr, *lse_global = nullptr;
  char *table = nullptr, *scratch = nullptr;
  std::size_t scratch_bytes = 0, total = 0;
};

DenseBuffers carve_dense(char* base, int64_t t, int64_t h_q, int world, DType dtype, std::size_t scratch,
                         std::size_t table, DcpExchange ex) {
  const auto es = static_cast<std::size_t>(dtype_size(dtype));
  const auto w = static_cast<std::size_t>(world);
  Carver c{base};
  DenseBuffers b;
  b.q_recv = c.take(static_cast<std::size_t>(t * h_q) * w * kQk * es);
  auto exchange_blocks = [&](int64_t rows) {
    Buffers x{};
    const auto n = static_cast<std::size_t>(rows * h_q);
    x.out_bytes = n * kV * es;
    x.block_bytes = x.out_bytes + (n * 4 + 15) / 16 * 16;
    x.send = c.take(x.block_bytes * w);
    x.recv = c.take(x.block_bytes * w);
    return x;
  };
  if (ex == DcpExchange::allgather_reduce_scatter) {
    const auto rows = static_cast<std::size_t>(t * h_q) * w;  // (head block, row, head) of the group
    b.part_block = rows * kV * es;
    b.parts = c.take(b.part_block * (2 * w - 1));
    b.lse_local = reinterpret_cast<float*>(c.take(rows * 4));
    b.lse_all = reinterpret_cast<float*>(c.take(rows * w * 4));
    b.scaled = c.take(b.part_block);
    b.lse_global = reinterpret_cast<float*>(c.take(rows * 4));
  } else if (ex == DcpExchange::all_to_all_overlap && t >= 2) {
    b.halves = 2;
    b.t0 = t / 2;
    b.half[0] = exchange_blocks(b.t0);
    b.half[1] = exchange_blocks(t - b.t0);
  } else {
    b.t0 = t;
    b.half[0] = exchange_blocks(t);
  }
  b.table = c.take(table);
  b.scratch = c.take(scratch);
  b.scratch_bytes = scratch;
  b.total = c.used;
  return b;
}

// Scratch of the local decode: the largest of the row counts it runs with (a half may split more).
std::size_t dense_scratch_bytes(int64_t t, int64_t h_q, int world, int64_t max_len, Device dev, int num_splits,
                                DcpExchange ex) {
  std::size_t s = decode_scratch_bytes(t, h_q, world, max_len, dev, num_splits);
  if (ex == DcpExchange::all_to_all_overlap && t >= 2)
    for (int64_t rows : {t / 2, t - t / 2})
      s = std::max(s, decode_scratch_bytes(rows, h_q, world, max_len, dev, num_splits));
  return s;
}

void zero_bytes(char* p, std::size_t bytes, Device dev, const Context& ctx) {
  if (bytes == 0) return;
  if (dev.is_cpu()) {
    std::memset(p, 0, bytes);
    return;
  }
#if MLA_WITH_CUDA
  cuda_rt::memset_async(p, 0, bytes, ctx.stream, dev.index);
#else
  (void)ctx;
  throw Error("dcp: CUDA tensor given, but this build of mla has no CUDA backend");
#endif
}

// AG+RS after the local decode wrote the rank's partials (block W − 1 of b.parts) and LSEs: every
// rank's LSEs of every head gathered; the rank's partials rescaled to the global LSE by
// combine_attn_states over W parts of which only the rank's own is non-zero (part i of the view =
// block W − 1 − r + i: the rank's at i = r, zero blocks elsewhere); a reduce-scatter sums the rescaled
// partials of rank r's heads over the group into out.
void allgather_reduce_scatter(Communicator& comm, const DenseBuffers& b, int64_t t, int64_t h_q, DType dtype,
                              void* out, float* lse, const Context& ctx) {
  const int w = comm.world_size(), r = comm.rank();
  const Device dev = comm.device();
  const int64_t rows = t * h_q * w, es = static_cast<int64_t>(dtype_size(dtype));
  comm.all_gather(TensorView(b.lse_local, DType::f32, {rows}, dev), TensorView(b.lse_all, DType::f32, {rows * w}, dev),
                  ctx);
  // Zero the blocks the view reads besides the rank's: [W − 1 − r, W − 1) and [W, 2W − 1 − r).
  zero_bytes(b.parts + static_cast<std::size_t>(w - 1 - r) * b.part_block, static_cast<std::size_t>(r) * b.part_block,
             dev, ctx);
  zero_bytes(b.parts + static_cast<std::size_t>(w) * b.part_block,
             static_cast<std::size_t>(w - 1 - r) * b.part_block, dev, ctx);
  const int64_t pshape[] = {w, w * t, h_q, kV},
                pstride[] = {static_cast<int64_t>(b.part_block) / es, h_q * kV, kV, 1};
  combine_attn_states(TensorView(b.scaled, dtype, {w * t, h_q, kV}, dev),
                      TensorView(b.lse_global, DType::f32, {w * t, h_q}, dev),
                      TensorView(b.parts + static_cast<std::size_t>(w - 1 - r) * b.part_block, dtype, pshape, pstride,
                                 dev),
                      TensorView(b.lse_all, DType::f32, {w, w * t, h_q}, dev), ctx);
  comm.reduce_scatter(TensorView(b.scaled, dtype, {rows * kV}, dev), TensorView(out, dtype, {t * h_q * kV}, dev), ctx);
  if (lse)
    copy_rows(reinterpret_cast<char*>(lse), static_cast<std::size_t>(t * h_q) * 4,
              reinterpret_cast<const char*>(b.lse_global + r * t * h_q), static_cast<std::size_t>(t * h_q) * 4,
              static_cast<std::size_t>(t * h_q) * 4, 1, dev, ctx);
}

}  // namespace

const char* to_string(DcpExchange e) {
  switch (e) {
    case DcpExchange::all_to_all: return "all_to_all";
    case DcpExchange::allgather_reduce_scatter: return "allgather_reduce_scatter";
    case DcpExchange::all_to_all_overlap: return "all_to_all_overlap";
  }
  return "?";
}

std::size_t dcp_mqa_decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int64_t max_blocks,
                                           int64_t page_size, DType dtype, int world_size, Device device,
                                           int num_splits, DcpExchange exchange) {
  MLA_CHECK(b >= 0 && s_q >= 1 && h_q >= 1 && max_blocks >= 0 && page_size >= 1 && world_size >= 1,
            "dcp_mqa_decode_workspace_bytes: need b >= 0, s_q >= 1, h_q >= 1, max_blocks >= 0, page_size >= 1, "
            "world_size >= 1; got {}, {}, {}, {}, {}, {}",
            b, s_q, h_q, max_blocks, page_size, world_size);
  const int64_t t = b * s_q;
  const std::size_t scratch =
      dense_scratch_bytes(t, h_q, world_size, max_blocks * page_size, device, num_splits, exchange);
  const std::size_t table = s_q > 1 ? static_cast<std::size_t>(t * max_blocks) * 4 : 0;
  return carve_dense(nullptr, t, h_q, world_size, dtype, scratch, table, exchange).total;
}

void dcp_mqa_decode(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& block_table,
                    const TensorView& local_lens, const TensorView& out, const TensorView& lse, double softmax_scale,
                    const TensorView& workspace, const Context& ctx, int num_splits, DcpExchange exchange) {
  constexpr const char* op = "dcp_mqa_decode";
  detail::check_ndim(q, 4, op, "q [b, s_q, h_q, 576]");
  detail::check_ndim(block_table, 2, op, "block_table [b, max_blocks]");
  MLA_CHECK(exchange == DcpExchange::all_to_all || exchange == DcpExchange::allgather_reduce_scatter ||
                exchange == DcpExchange::all_to_all_overlap,
            "{}: unknown exchange {}", op, static_cast<int>(exchange));
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), t = b * s_q, mb = block_table.size(1);
  const int w = comm.world_size();
  const Device dev = comm.device();
  const std::size_t scratch = dense_scratch_bytes(t, h_q, w, mb * cache.data.size(1), dev, num_splits, exchange);
  const std::size_t table = s_q > 1 ? static_cast<std::size_t>(t * mb) * 4 : 0;
  const DenseBuffers need = carve_dense(nullptr, t, h_q, w, q.dtype, scratch, table, exchange);
  check_group_call(comm, q, 4, out, lse, workspace, need.total, op);
  MLA_CHECK(out.ndim == 4 && out.size(0) == b && out.size(1) == s_q && out.size(2) == h_q && out.size(3) == kV,
            "{}: out must be [{}, {}, {}, 512], got {}", op, b, s_q, h_q, out.describe());
  MLA_CHECK(!lse.defined() || (lse.ndim == 3 && lse.size(0) == b && lse.size(1) == s_q && lse.size(2) == h_q),
            "{}: lse must be [{}, {}, {}], got {}", op, b, s_q, h_q, lse.describe());
  MLA_CHECK(block_table.size(0) == b, "{}: block_table must have b = {} rows, got {}", op, b, block_table.describe());
  MLA_CHECK(local_lens.ndim == 1 && local_lens.size(0) == t, "{}: local_lens must be [b * s_q] = [{}], got {}", op, t,
            local_lens.describe());
  if (t == 0) return;
  const DenseBuffers buf = carve_dense(static_cast<char*>(workspace.data), t, h_q, w, q.dtype, scratch, table, exchange);
  const std::size_t es = dtype_size(q.dtype);
  // Rows (r, i) share request r's block-table row: repeat it s_q times when s_q > 1.
  TensorView rows_table = block_table;
  if (s_q > 1) {
    MLA_CHECK(block_table.dtype == DType::i32 && block_table.stride[1] == 1,
              "{}: block_table must be int32 with unit inner stride, got {}", op, block_table.describe());
    const std::size_t row = static_cast<std::size_t>(mb) * 4;
    for (int64_t i = 0; i < s_q; ++i)
      copy_rows(buf.table + i * row, row * s_q, static_cast<const char*>(block_table.data),
                static_cast<std::size_t>(block_table.stride[0]) * 4, row, static_cast<std::size_t>(b), dev, ctx);
    rows_table = TensorView(buf.table, DType::i32, {t, mb}, dev);
  }
  gather_q(comm, q, buf.q_recv, t, h_q, ctx);
  const TensorView scratch_view =
      buf.scratch_bytes ? TensorView(buf.scratch, DType::u8, {static_cast<int64_t>(buf.scratch_bytes)}, dev)
                        : TensorView{};
  auto* out_rows = static_cast<char*>(out.data);
  auto* lse_rows = lse.defined() ? static_cast<float*>(lse.data) : nullptr;
  // Rows [r0, r1) of the batch attend as requests whose W "queries" are the rank blocks of q_recv (no
  // causal mask: every block sees the row's local keys); partials into `pout` / `plse` (views [rows, W,
  // h_q, 512] / [rows, W, h_q]).
  auto attend = [&](int64_t r0, int64_t r1, const TensorView& pout, const TensorView& plse) {
    const int64_t qshape[] = {r1 - r0, w, h_q, kQk}, qstride[] = {h_q * kQk, t * h_q * kQk, kQk, 1};
    mqa_decode(TensorView(buf.q_recv + static_cast<std::size_t>(r0 * h_q * kQk) * es, q.dtype, qshape, qstride, dev),
               cache, rows_table.slice(0, r0, r1), local_lens.slice(0, r0, r1), pout, plse, softmax_scale,
               /*causal=*/false, scratch_view, ctx, num_splits);
  };
  if (exchange == DcpExchange::allgather_reduce_scatter) {
    const int64_t oshape[] = {t, w, h_q, kV}, ostride[] = {h_q * kV, t * h_q * kV, kV, 1};
    const int64_t lshape[] = {t, w, h_q}, lstride[] = {h_q, t * h_q, 1};
    attend(0, t, TensorView(buf.parts + static_cast<std::size_t>(w - 1) * buf.part_block, q.dtype, oshape, ostride, dev),
           TensorView(buf.lse_local, DType::f32, lshape, lstride, dev));
    allgather_reduce_scatter(comm, buf, t, h_q, q.dtype, out_rows, lse_rows, ctx);
    return;
  }
  if (buf.halves == 1) {
    attend(0, t, send_out(buf.half[0], t, h_q, w, q.dtype, dev), send_lse(buf.half[0], t, h_q, w, dev));
    exchange_and_combine(comm, buf.half[0], t, h_q, q.dtype, out_rows, lse_rows, ctx);
    return;
  }
  // Two halves: half 0's exchange on the side stream while half 1 attends on the caller's stream (the
  // CPU runs them in order). Both exchanges go to the side stream, in the same order on every rank.
  const int64_t rows[2] = {buf.t0, t - buf.t0}, first[2] = {0, buf.t0};
  Context side = ctx;
#if MLA_WITH_CUDA
  if (dev.is_cuda()) side.stream = cuda_rt::side_stream(dev.index);
#endif
  for (int k = 0; k < 2; ++k) {
    attend(first[k], first[k] + rows[k], send_out(buf.half[k], rows[k], h_q, w, q.dtype, dev),
           send_lse(buf.half[k], rows[k], h_q, w, dev));
#if MLA_WITH_CUDA
    if (dev.is_cuda()) cuda_rt::stream_wait(side.stream, ctx.stream, dev.index);
#endif
    exchange_and_combine(comm, buf.half[k], rows[k], h_q, q.dtype, out_rows + static_cast<std::size_t>(first[k] * h_q * kV) * es,
                         lse_rows ? lse_rows + first[k] * h_q : nullptr, side);
  }
#if MLA_WITH_CUDA
  if (dev.is_cuda()) cuda_rt::stream_wait(ctx.stream, side.stream, dev.index);
#endif
}

std::size_t dcp_sparse_mqa_workspace_bytes(int64_t t, int64_t h_q, DType dtype, int world_size, int64_t d_qk,
                                           int64_t d_v) {
  MLA_CHECK(t >= 0 && h_q >= 1 && world_size >= 1 && d_qk >= 1 && d_v >= 1,
            "dcp_sparse_mqa_workspace_bytes: need t >= 0, h_q >= 1, world_size >= 1, d_qk >= 1, d_v >= 1; got {}, {}, "
            "{}, {}, {}",
            t, h_q, world_size, d_qk, d_v);
  return carve(nullptr, t, h_q, world_size, dtype, 0, 0, /*staged=*/true, d_qk, d_v).total;
}

void dcp_sparse_mqa(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& indices,
                    const TensorView& topk_length, const TensorView& out, const TensorView& lse, double softmax_scale,
                    const TensorView& workspace, const Context& ctx) {
  detail::check_ndim(q, 3, "dcp_sparse_mqa", "q [T, h_q, 576]");
  MLA_CHECK(q.size(2) == kQk, "dcp_sparse_mqa: q's last dim must be 576, got {}", q.describe());
  MLA_CHECK(out.ndim == 3 && out.size(2) == kV, "dcp_sparse_mqa: out must be [T, h_q, 512], got {}", out.describe());
  dcp_sparse_mqa(comm, q, cache, indices, topk_length, out, lse, softmax_scale, SparseOptions{}, workspace, ctx);
}

// The rank attends its shard(s) for the group's W·h_q heads without the sink (sparse_mqa over the token-major
// gathered q); the combine of the rank's own heads folds their sinks in (once per head: §11.8's sink is a key
// of value 0, so it may join any one part of a disjoint split, here the combine's own).
void dcp_sparse_mqa(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& indices,
                    const TensorView& topk_length, const TensorView& out, const TensorView& lse, double softmax_scale,
                    const SparseOptions& opts, const TensorView& workspace, const Context& ctx) {
  constexpr const char* op = "dcp_sparse_mqa";
  detail::check_ndim(q, 3, op, "q [T, h_q, d_qk]");
  detail::check_ndim(out, 3, op, "out [T, h_q, d_v]");
  const int64_t t = q.size(0), h_q = q.size(1), dqk = q.size(2), dv = out.size(2);
  const int w = comm.world_size();
  const Buffers need = carve(nullptr, t, h_q, w, q.dtype, 0, 0, /*staged=*/true, dqk, dv);
  check_group_call(comm, q, 3, out, lse, workspace, need.total, op, dqk);
  MLA_CHECK(out.size(0) == t && out.size(1) == h_q && dv >= 1, "{}: out must be [{}, {}, d_v], got {}", op, t, h_q,
            out.describe());
  MLA_CHECK(!lse.defined() || (lse.ndim == 2 && lse.size(0) == t && lse.size(1) == h_q),
            "{}: lse must be [{}, {}], got {}", op, t, h_q, lse.describe());
  MLA_CHECK(!opts.out_rotation.defined(),
            "{}: out_rotation is not taken here (the combine rounds the output): rotate after the call (apply_rope)",
            op);
  const TensorView& sink = opts.attn_sink;
  if (sink.defined()) {  // checked before any collective: the combine would refuse it only after the exchange
    MLA_CHECK(sink.ndim == 1 && sink.size(0) == h_q && sink.dtype == DType::f32 && sink.device == comm.device(),
              "{}: attn_sink must be f32 [h_q = {}] (this rank's heads) on {}, got {}", op, h_q,
              to_string(comm.device()), sink.describe());
  }
  if (t == 0) return;
  const Buffers buf = carve(static_cast<char*>(workspace.data), t, h_q, w, q.dtype, 0, 0, /*staged=*/true, dqk, dv);
  const Device dev = comm.device();
  const std::size_t es = dtype_size(q.dtype);
  gather_q(comm, q, buf.q_recv, t, h_q, ctx);
  // sparse_mqa's q and out have one head stride: reorder the rank blocks into token-major order and back.
  blocks_to_tokens(buf.q_all, buf.q_recv, static_cast<std::size_t>(t * h_q * dqk) * es, t, h_q, w, dqk, es, dev, ctx);
  const int64_t hw = h_q * w;
  SparseOptions local = opts;
  local.attn_sink = {};  // the combine takes it
  sparse_mqa(TensorView(buf.q_all, q.dtype, {t, hw, dqk}, dev), cache, indices, topk_length,
             TensorView(buf.partial, q.dtype, {t, hw, dv}, dev), TensorView(buf.partial_lse, DType::f32, {t, hw}, dev),
             softmax_scale, local, ctx);
  tokens_to_blocks(buf.send, buf.block_bytes, buf.partial, t, h_q, w, dv, es, dev, ctx);
  tokens_to_blocks(buf.send + buf.out_bytes, buf.block_bytes, reinterpret_cast<const char*>(buf.partial_lse), t, h_q, w,
                   1, 4, dev, ctx);
  exchange_and_combine(comm, buf, t, h_q, q.dtype, out.data, lse.defined() ? static_cast<float*>(lse.data) : nullptr,
                       ctx, dv, sink);
}

}  // namespace mla
