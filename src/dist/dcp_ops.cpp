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

Buffers carve(char* base, int64_t t, int64_t h_q, int world, DType dtype, std::size_t scratch, std::size_t table,
              bool staged) {
  const auto es = static_cast<std::size_t>(dtype_size(dtype));
  const auto n = static_cast<std::size_t>(t * h_q * world);  // rows (token, head) of the whole group
  Carver c{base};
  Buffers b{};
  b.q_recv = c.take(n * kQk * es);
  if (staged) {
    b.q_all = c.take(n * kQk * es);
    b.partial = c.take(n * kV * es);
    b.partial_lse = reinterpret_cast<float*>(c.take(n * 4));
  }
  const auto rows = static_cast<std::size_t>(t * h_q);  // (token, head) rows of one rank's heads
  b.out_bytes = rows * kV * es;
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
  cuda_rt::memcpy2d_async(dst, dpitch, src, spitch, width, rows, ctx.stream);
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

void check_group_call(Communicator& comm, const TensorView& q, int q_ndim, const TensorView& out,
                      const TensorView& lse, const TensorView& workspace, std::size_t need, const char* op) {
  detail::check_ndim(q, q_ndim, op, q_ndim == 4 ? "q [b, s_q, h_q, 576]" : "q [T, h_q, 576]");
  MLA_CHECK(q.size(-1) == kQk, "{}: q's last dim must be 576, got {}", op, q.describe());
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
// -> out / lse of this rank's heads.
void exchange_and_combine(Communicator& comm, const Buffers& b, int64_t t, int64_t h_q, DType dtype,
                          const TensorView& out, const TensorView& lse, const Context& ctx) {
  const int w = comm.world_size();
  const Device dev = comm.device();
  const std::size_t es = dtype_size(dtype);
  const auto bytes = static_cast<int64_t>(b.block_bytes) * w;
  comm.all_to_all(TensorView(b.send, DType::u8, {bytes}, dev), TensorView(b.recv, DType::u8, {bytes}, dev), ctx);
  // Block i of recv: rank i's partials of this rank's heads. Strides in elements of each view's dtype
  // (block_bytes is a multiple of 16, so of both element sizes).
  const auto block = static_cast<int64_t>(b.block_bytes);
  const int64_t pshape[] = {w, t, h_q, kV}, pstride[] = {block / static_cast<int64_t>(es), h_q * kV, kV, 1};
  const int64_t lshape[] = {w, t, h_q}, lstride[] = {block / 4, h_q, 1};
  combine_attn_states(TensorView(out.data, dtype, {t, h_q, kV}, dev),
                      lse.defined() ? TensorView(lse.data, DType::f32, {t, h_q}, dev) : TensorView{},
                      TensorView(b.recv, dtype, pshape, pstride, dev),
                      TensorView(b.recv + b.out_bytes, DType::f32, lshape, lstride, dev), ctx);
}

// All-gather q [t, h_q, 576] of every rank into q_recv: W rank blocks [t, h_q, 576].
void gather_q(Communicator& comm, const TensorView& q, const Buffers& b, int64_t t, int64_t h_q, const Context& ctx) {
  const int64_t n = t * h_q;
  comm.all_gather(TensorView(q.data, q.dtype, {n, kQk}, q.device),
                  TensorView(b.q_recv, q.dtype, {int64_t(comm.world_size()) * n, kQk}, q.device), ctx);
}

// Split scratch of the dense decode's mqa_decode: t requests, the W rank blocks as s_q, h_q heads.
std::size_t decode_scratch_bytes(int64_t t, int64_t h_q, int world, int64_t max_len, Device dev, int num_splits) {
  return mqa_decode_workspace_bytes(t, world, h_q, std::max<int64_t>(1, max_len), dev, num_splits);
}

}  // namespace

std::size_t dcp_mqa_decode_workspace_bytes(int64_t b, int64_t s_q, int64_t h_q, int64_t max_blocks,
                                           int64_t page_size, DType dtype, int world_size, Device device,
                                           int num_splits) {
  MLA_CHECK(b >= 0 && s_q >= 1 && h_q >= 1 && max_blocks >= 0 && page_size >= 1 && world_size >= 1,
            "dcp_mqa_decode_workspace_bytes: need b >= 0, s_q >= 1, h_q >= 1, max_blocks >= 0, page_size >= 1, "
            "world_size >= 1; got {}, {}, {}, {}, {}, {}",
            b, s_q, h_q, max_blocks, page_size, world_size);
  const int64_t t = b * s_q;
  const std::size_t scratch = decode_scratch_bytes(t, h_q, world_size, max_blocks * page_size, device, num_splits);
  const std::size_t table = s_q > 1 ? static_cast<std::size_t>(t * max_blocks) * 4 : 0;
  return carve(nullptr, t, h_q, world_size, dtype, scratch, table, /*staged=*/false).total;
}

void dcp_mqa_decode(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& block_table,
                    const TensorView& local_lens, const TensorView& out, const TensorView& lse, double softmax_scale,
                    const TensorView& workspace, const Context& ctx, int num_splits) {
  constexpr const char* op = "dcp_mqa_decode";
  detail::check_ndim(q, 4, op, "q [b, s_q, h_q, 576]");
  detail::check_ndim(block_table, 2, op, "block_table [b, max_blocks]");
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2), t = b * s_q, mb = block_table.size(1);
  const int w = comm.world_size();
  const std::size_t scratch = decode_scratch_bytes(t, h_q, w, mb * cache.data.size(1), comm.device(), num_splits);
  const std::size_t table = s_q > 1 ? static_cast<std::size_t>(t * mb) * 4 : 0;
  const Buffers need = carve(nullptr, t, h_q, w, q.dtype, scratch, table, /*staged=*/false);
  check_group_call(comm, q, 4, out, lse, workspace, need.total, op);
  MLA_CHECK(out.ndim == 4 && out.size(0) == b && out.size(1) == s_q && out.size(2) == h_q && out.size(3) == kV,
            "{}: out must be [{}, {}, {}, 512], got {}", op, b, s_q, h_q, out.describe());
  MLA_CHECK(!lse.defined() || (lse.ndim == 3 && lse.size(0) == b && lse.size(1) == s_q && lse.size(2) == h_q),
            "{}: lse must be [{}, {}, {}], got {}", op, b, s_q, h_q, lse.describe());
  MLA_CHECK(block_table.size(0) == b, "{}: block_table must have b = {} rows, got {}", op, b, block_table.describe());
  MLA_CHECK(local_lens.ndim == 1 && local_lens.size(0) == t, "{}: local_lens must be [b * s_q] = [{}], got {}", op, t,
            local_lens.describe());
  if (t == 0) return;
  const Buffers buf = carve(static_cast<char*>(workspace.data), t, h_q, w, q.dtype, scratch, table, false);
  const Device dev = comm.device();
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
  gather_q(comm, q, buf, t, h_q, ctx);
  // Row r of the batch attends as one request whose W "queries" are the rank blocks of q_recv (no
  // causal mask: every block sees the row's local keys); its partials land in the send blocks.
  const int64_t qshape[] = {t, w, h_q, kQk}, qstride[] = {h_q * kQk, t * h_q * kQk, kQk, 1};
  mqa_decode(TensorView(buf.q_recv, q.dtype, qshape, qstride, dev), cache, rows_table, local_lens,
             send_out(buf, t, h_q, w, q.dtype, dev), send_lse(buf, t, h_q, w, dev), softmax_scale, /*causal=*/false,
             buf.scratch_bytes ? TensorView(buf.scratch, DType::u8, {static_cast<int64_t>(buf.scratch_bytes)}, dev)
                               : TensorView{},
             ctx, num_splits);
  exchange_and_combine(comm, buf, t, h_q, q.dtype, out, lse, ctx);
}

std::size_t dcp_sparse_mqa_workspace_bytes(int64_t t, int64_t h_q, DType dtype, int world_size) {
  MLA_CHECK(t >= 0 && h_q >= 1 && world_size >= 1,
            "dcp_sparse_mqa_workspace_bytes: need t >= 0, h_q >= 1, world_size >= 1; got {}, {}, {}", t, h_q,
            world_size);
  return carve(nullptr, t, h_q, world_size, dtype, 0, 0, /*staged=*/true).total;
}

void dcp_sparse_mqa(Communicator& comm, const TensorView& q, const KVCache& cache, const TensorView& indices,
                    const TensorView& topk_length, const TensorView& out, const TensorView& lse, double softmax_scale,
                    const TensorView& workspace, const Context& ctx) {
  constexpr const char* op = "dcp_sparse_mqa";
  detail::check_ndim(q, 3, op, "q [T, h_q, 576]");
  const int64_t t = q.size(0), h_q = q.size(1);
  const int w = comm.world_size();
  const Buffers need = carve(nullptr, t, h_q, w, q.dtype, 0, 0, /*staged=*/true);
  check_group_call(comm, q, 3, out, lse, workspace, need.total, op);
  MLA_CHECK(out.ndim == 3 && out.size(0) == t && out.size(1) == h_q && out.size(2) == kV,
            "{}: out must be [{}, {}, 512], got {}", op, t, h_q, out.describe());
  MLA_CHECK(!lse.defined() || (lse.ndim == 2 && lse.size(0) == t && lse.size(1) == h_q),
            "{}: lse must be [{}, {}], got {}", op, t, h_q, lse.describe());
  if (t == 0) return;
  const Buffers buf = carve(static_cast<char*>(workspace.data), t, h_q, w, q.dtype, 0, 0, /*staged=*/true);
  const Device dev = comm.device();
  const std::size_t es = dtype_size(q.dtype);
  gather_q(comm, q, buf, t, h_q, ctx);
  // sparse_mqa's q and out have one head stride: reorder the rank blocks into token-major order and back.
  blocks_to_tokens(buf.q_all, buf.q_recv, static_cast<std::size_t>(t * h_q * kQk) * es, t, h_q, w, kQk, es, dev, ctx);
  const int64_t hw = h_q * w;
  sparse_mqa(TensorView(buf.q_all, q.dtype, {t, hw, kQk}, dev), cache, indices, topk_length,
             TensorView(buf.partial, q.dtype, {t, hw, kV}, dev), TensorView(buf.partial_lse, DType::f32, {t, hw}, dev),
             softmax_scale, ctx);
  tokens_to_blocks(buf.send, buf.block_bytes, buf.partial, t, h_q, w, kV, es, dev, ctx);
  tokens_to_blocks(buf.send + buf.out_bytes, buf.block_bytes, reinterpret_cast<const char*>(buf.partial_lse), t, h_q, w,
                   1, 4, dev, ctx);
  exchange_and_combine(comm, buf, t, h_q, q.dtype, out, lse, ctx);
}

}  // namespace mla
