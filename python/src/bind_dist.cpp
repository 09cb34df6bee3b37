// SPDX-License-Identifier: Apache-2.0
// Decode context parallelism from Python (mla/comm.h, mla/dcp.h; docs/SCALE.md, docs/PYTHON.md):
// communicators (the in-process thread group, the socket group of one process per rank, NCCL, and the
// torchrun-style environment), the DCP group ops and the layout helpers. Every call that can wait for
// peers releases the GIL, so ranks may be Python threads of one process.
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "mla/comm.h"
#include "mla/dcp.h"

namespace mlapy {

namespace {

using A = TensorArg;
using K = PyKVCache;
using mla::Communicator;
using mla::Context;
using mla::Device;
using mla::DType;
using mla::Error;
using mla::TensorView;
using mla::to_string;

std::chrono::milliseconds millis(double seconds) {
  if (!(seconds > 0)) throw ArgError("timeout must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
}

std::shared_ptr<Communicator> shared(std::unique_ptr<Communicator> c) { return std::shared_ptr<Communicator>(std::move(c)); }

// A Communicator whose collectives are a Python object's methods (mla.dist.TorchCommunicator runs them
// with torch.distributed): impl.all_gather(input, output, stream), all_to_all, reduce_scatter and
// synchronize(stream) receive mla.Tensor views (valid during the call only; torch.from_dlpack shares their
// memory) and the CUDA stream as an int (0: the default stream, or a CPU group). Views are checked here
// as by every communicator before the call; a Python exception becomes mla::Error with its text. The
// calls take the GIL: the ranks of such a group are processes (or threads that release it, as the ops do).
class CallbackCommunicator final : public Communicator {
 public:
  CallbackCommunicator(py::object impl, int rank, int world, Device device, std::string backend)
      : impl_(std::move(impl)), rank_(rank), world_(world), device_(device), backend_(std::move(backend)) {}
  ~CallbackCommunicator() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device device() const override { return device_; }
  std::string backend() const override { return backend_; }

  void all_gather(const TensorView& in, const TensorView& out, const Context& ctx) override {
    check_views(in, out, in.numel() * world_, "all_gather");
    call("all_gather", in, out, ctx);
  }
  void all_to_all(const TensorView& in, const TensorView& out, const Context& ctx) override {
    check_views(in, out, in.numel(), "all_to_all");
    if (in.numel() % world_ != 0)
      throw Error(fmt_what("all_to_all", "input of " + std::to_string(in.numel()) + " elements is not " +
                                             std::to_string(world_) + " equal blocks"));
    call("all_to_all", in, out, ctx);
  }
  void reduce_scatter(const TensorView& in, const TensorView& out, const Context& ctx) override {
    check_views(in, out, out.numel() * world_, "reduce_scatter", true);
    if (in.dtype != DType::f32 && in.dtype != DType::bf16 && in.dtype != DType::f64)
      throw Error(fmt_what("reduce_scatter", std::string("dtype ") + to_string(in.dtype) + " (expected f32, bf16 or f64)"));
    call("reduce_scatter", in, out, ctx);
  }
  void synchronize(const Context& ctx) override {
    py::gil_scoped_acquire gil;
    try {
      impl_.attr("synchronize")(reinterpret_cast<uintptr_t>(ctx.stream));
    } catch (py::error_already_set& e) {
      throw Error(fmt_what("synchronize", e.what()));
    }
  }

 private:
  std::string fmt_what(const char* op, const std::string& why) const {
    return backend_ + " communicator, rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " + op +
           ": " + why;
  }
  // Contiguous views of one dtype on the group's device; `in` holds `in_elems` elements (out, for
  // reduce_scatter: in = W blocks of out's size).
  void check_views(const TensorView& in, const TensorView& out, int64_t want, const char* op,
                   bool in_is_whole = false) const {
    if (!in.is_contiguous() || !out.is_contiguous()) throw Error(fmt_what(op, "views must be contiguous"));
    if (in.dtype != out.dtype)
      throw Error(fmt_what(op, std::string("input is ") + to_string(in.dtype) + ", output " + to_string(out.dtype)));
    if (!(in.device == device_) || !(out.device == device_))
      throw Error(fmt_what(op, "views must be on the group's device " + to_string(device_)));
    const int64_t got = in_is_whole ? in.numel() : out.numel();
    if (got != want)
      throw Error(fmt_what(op, (in_is_whole ? "input has " : "output has ") + std::to_string(got) +
                                   " elements, expected " + std::to_string(want)));
  }
  void call(const char* op, const TensorView& in, const TensorView& out, const Context& ctx) {
    py::gil_scoped_acquire gil;
    try {
      impl_.attr(op)(wrap_view(in, nullptr), wrap_view(out, nullptr), reinterpret_cast<uintptr_t>(ctx.stream));
    } catch (py::error_already_set& e) {
      throw Error(fmt_what(op, e.what()));
    }
  }

  py::object impl_;
  int rank_, world_;
  Device device_;
  std::string backend_;
};

}  // namespace

void bind_dist(py::module_& m) {
  using namespace mla;
  const auto stream = py::arg("stream") = py::none();

  py::class_<Communicator, std::shared_ptr<Communicator>>(
      m, "Communicator",
      "One rank's handle on a DCP group (mla/comm.h). Every rank calls the same collectives in the same order; a "
      "rank that fails or stays away makes the others raise ValueError within the group's timeout.")
      .def_property_readonly("rank", &Communicator::rank, "This process's (or thread's) rank, 0 .. world_size - 1.")
      .def_property_readonly("world_size", &Communicator::world_size, "Ranks in the group.")
      .def_property_readonly("device", &Communicator::device, "The device of the tensors the collectives take.")
      .def_property_readonly("backend", &Communicator::backend,
                             "local, socket, nccl, nccl+peer, or torch:<backend> (mla.dist.torch_group).")
      .def("all_gather", [](Communicator& c, const A& in, const A& out, py::handle s) {
        const Context ctx = to_context(in.view, s, Precision::fast);
        without_gil([&] { c.all_gather(in.view, out.view, ctx); });
      }, py::arg("input"), py::arg("output"), py::kw_only(), stream,
         "output [W * n] = every rank's input [n] in rank order (contiguous, one dtype, the group's device).")
      .def("all_to_all", [](Communicator& c, const A& in, const A& out, py::handle s) {
        const Context ctx = to_context(in.view, s, Precision::fast);
        without_gil([&] { c.all_to_all(in.view, out.view, ctx); });
      }, py::arg("input"), py::arg("output"), py::kw_only(), stream,
         "input and output [W * n]: block j of rank i's input becomes block i of rank j's output.")
      .def("reduce_scatter", [](Communicator& c, const A& in, const A& out, py::handle s) {
        const Context ctx = to_context(in.view, s, Precision::fast);
        without_gil([&] { c.reduce_scatter(in.view, out.view, ctx); });
      }, py::arg("input"), py::arg("output"), py::kw_only(), stream,
         "output [n] = the sum over ranks of block `rank` of their input [W * n]; f32 or bf16 (CPU groups: f64 "
         "too).")
      .def("synchronize", [](Communicator& c, py::handle s) {
        const Context ctx = to_context(TensorView(nullptr, DType::u8, {0}, c.device()), s, Precision::fast);
        without_gil([&] { c.synchronize(ctx); });
      }, py::kw_only(), stream,
         "Wait until every collective this rank issued (CUDA: its stream work) completed, or raise ValueError "
         "after the group's timeout.");

  m.def("local_group", [](int world_size, double timeout) {
    std::vector<std::shared_ptr<Communicator>> out;
    for (auto& c : make_local_group(world_size, millis(timeout))) out.push_back(shared(std::move(c)));
    return out;
  }, py::arg("world_size"), py::arg("timeout") = 60.0,
     "W communicators of one in-process CPU group: hand communicator r to the Python thread that plays rank r.");
  m.def("socket_group", [](const std::string& path, int world_size, int rank, double timeout) {
    std::unique_ptr<Communicator> c;
    without_gil([&] { c = make_socket_communicator(path, world_size, rank, millis(timeout)); });
    return shared(std::move(c));
  }, py::arg("path"), py::arg("world_size"), py::arg("rank"), py::arg("timeout") = 60.0,
     "This process's rank of a CPU group across processes (rank 0 listens on the Unix socket `path`).");
  m.def("nccl_available", &nccl_available, "Whether this build has NCCL (CUDA groups).");
  m.def("nccl_make_id", [] { return nccl_id_to_hex(nccl_make_id()); },
        "A new NCCL unique id as 256 hex digits (hand the same string to every rank).");
  m.def("nccl_group", [](const std::string& id, int world_size, int rank, py::handle device, double timeout) {
    const Device dev = to_device(device);
    if (!dev.is_cuda()) throw ArgError("nccl_group: device must be a CUDA device");
    std::unique_ptr<Communicator> c;
    without_gil([&] { c = make_nccl_communicator(nccl_id_from_hex(id), world_size, rank, dev.index, millis(timeout)); });
    return shared(std::move(c));
  }, py::arg("id"), py::arg("world_size"), py::arg("rank"), py::arg("device"), py::arg("timeout") = 120.0,
     "This rank of an NCCL group on `device` (id from nccl_make_id, the same on every rank).");
  m.def("process_group", [](py::handle device, bool peer) {
    const ProcessGroupEnv env = process_group_env();
    Device dev = Device::cpu();
    if (!device.is_none()) {
      const bool bare_cuda = py::isinstance<py::str>(device) && device.cast<std::string>() == "cuda";
      dev = bare_cuda ? Device::cuda(env.local_rank) : to_device(device);
    }
    std::unique_ptr<Communicator> c;
    without_gil([&] {
      c = make_process_communicator(env, dev);
      if (peer) c = make_peer_communicator(std::move(c), env.timeout);
    });
    return shared(std::move(c));
  }, py::arg("device") = py::none(), py::kw_only(), py::arg("peer") = false,
     "This process's rank from the torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MLA_DCP_RENDEZVOUS or "
     "MLA_NCCL_ID, MLA_DCP_TIMEOUT_MS): device None = CPU (socket group), 'cuda' = cuda:LOCAL_RANK, or a device. "
     "peer=True (a collective call): small all_gathers / all_to_alls by direct stores into the other GPUs' memory "
     "(CUDA IPC; backend 'nccl+peer'), unchanged where the ranks cannot map each other's memory (CPU, other hosts).");
  m.def("callback_group", [](py::object impl, int rank, int world_size, py::handle device, const std::string& backend) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
      throw ArgError("callback_group: need 0 <= rank < world_size, got rank " + std::to_string(rank) + " of " +
                     std::to_string(world_size));
    for (const char* name : {"all_gather", "all_to_all", "reduce_scatter", "synchronize"})
      if (!py::hasattr(impl, name)) throw ArgError(std::string("callback_group: impl has no method '") + name + "'");
    return std::shared_ptr<Communicator>(
        std::make_shared<CallbackCommunicator>(std::move(impl), rank, world_size, to_device(device), backend));
  }, py::arg("impl"), py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("backend") = "python",
     "A communicator whose collectives call impl.all_gather(input, output, stream), impl.all_to_all(...), "
     "impl.reduce_scatter(...) and impl.synchronize(stream): input / output are mla.Tensor views valid during the "
     "call (torch.from_dlpack shares them), stream the CUDA stream as an int (0 on the CPU). mla.dist.torch_group "
     "builds one over a torch.distributed process group.");
  m.def("nccl_group_from", [](uintptr_t comm, py::handle device, double timeout) {
    const Device dev = to_device(device);
    if (!dev.is_cuda()) throw ArgError("nccl_group_from: device must be a CUDA device");
    std::unique_ptr<Communicator> c;
    without_gil([&] { c = make_nccl_communicator_from(reinterpret_cast<void*>(comm), dev.index, millis(timeout)); });
    return shared(std::move(c));
  }, py::arg("comm"), py::arg("device"), py::arg("timeout") = 120.0,
     "This rank of an NCCL communicator the caller owns: comm is the ncclComm_t as an int (it must outlive the "
     "result, which never destroys or aborts it); rank and size are the communicator's.");
  m.def("process_group_env", [] {
    if (!process_group_env_present()) return py::object(py::none());
    const ProcessGroupEnv e = process_group_env();
    py::dict d;
    d["rank"] = e.rank;
    d["world_size"] = e.world_size;
    d["local_rank"] = e.local_rank;
    d["rendezvous"] = e.rendezvous;
    d["master_addr"] = e.master_addr;
    d["master_port"] = e.master_port;
    d["timeout"] = static_cast<double>(e.timeout.count()) / 1000.0;
    return py::object(d);
  }, "RANK / WORLD_SIZE / LOCAL_RANK / MLA_DCP_RENDEZVOUS / timeout from the environment as a dict (None if unset).");

  py::enum_<DcpExchange>(m, "DcpExchange", "How dcp_mqa_decode combines the ranks' partial outputs (mla/dcp.h).")
      .value("all_to_all", DcpExchange::all_to_all)
      .value("allgather_reduce_scatter", DcpExchange::allgather_reduce_scatter)
      .value("all_to_all_overlap", DcpExchange::all_to_all_overlap);

  m.def("dcp_owner", [](int64_t p, int w, int rank, int interleave) { return dcp_owner(p, {w, rank, interleave}); },
        py::arg("position"), py::arg("world_size"), py::arg("rank") = 0, py::arg("interleave") = 1,
        "The rank holding cache position p: (p // interleave) % world_size.");
  m.def("dcp_local_position", [](int64_t p, int w, int rank, int interleave) {
    return dcp_local_position(p, {w, rank, interleave});
  }, py::arg("position"), py::arg("world_size"), py::arg("rank") = 0, py::arg("interleave") = 1,
     "Where position p lies in its owner's shard of the request.");
  m.def("dcp_local_length", [](int64_t n, int w, int rank, int interleave) {
    return dcp_local_length(n, {w, rank, interleave});
  }, py::arg("length"), py::arg("world_size"), py::arg("rank"), py::arg("interleave") = 1,
     "Positions of a request of `length` tokens that rank `rank` holds.");
  m.def("dcp_local_query_lengths", [](const std::vector<int32_t>& seq_lens, int64_t s_q, bool causal, int w, int rank,
                                      int interleave) {
    const DcpLayout l{w, rank, interleave};
    validate_dcp_layout(l);
    std::vector<int32_t> out(seq_lens.size() * static_cast<std::size_t>(s_q));
    dcp_local_query_lengths(seq_lens, s_q, causal, l, out);
    return out;
  }, py::arg("seq_lens"), py::arg("s_q"), py::arg("causal"), py::arg("world_size"), py::arg("rank"),
     py::arg("interleave") = 1, "Local key counts of a decode batch's rows (r, i) on this rank (mla/dcp.h).");

  m.def("dcp_mqa_decode_workspace_bytes", [](int64_t b, int64_t s_q, int64_t h_q, int64_t max_blocks, int64_t page_size,
                                             py::handle dtype, int world_size, py::handle device, int num_splits,
                                             DcpExchange exchange) {
    return dcp_mqa_decode_workspace_bytes(b, s_q, h_q, max_blocks, page_size, to_dtype(dtype), world_size,
                                          to_device(device), num_splits, exchange);
  }, py::arg("b"), py::arg("s_q"), py::arg("h_q"), py::arg("max_blocks"), py::arg("page_size"), py::arg("dtype"),
     py::arg("world_size"), py::arg("device"), py::arg("num_splits") = 0, py::arg("exchange") = DcpExchange::all_to_all,
     "Bytes of the u8 workspace dcp_mqa_decode needs for these sizes (the rank's h_q heads) and exchange.");
  m.def("dcp_mqa_decode", [](Communicator& c, const A& q, const K& cache, const A& block_table, const A& local_lens,
                             const A& out, const A& lse, double softmax_scale, const A& workspace, int num_splits,
                             DcpExchange exchange, py::handle s) {
    const Context ctx = to_context(q.view, s, Precision::fast);
    without_gil([&] {
      dcp_mqa_decode(c, q.view, cache.cache, block_table.view, local_lens.view, out.view, lse.view, softmax_scale,
                     workspace.view, ctx, num_splits, exchange);
    });
  }, py::arg("comm"), py::arg("q"), py::arg("cache"), py::arg("block_table"), py::arg("local_lens"), py::arg("out"),
     py::arg("lse"), py::arg("softmax_scale"), py::arg("workspace"), py::arg("num_splits") = 0,
     py::arg("exchange") = DcpExchange::all_to_all, py::kw_only(), stream,
     "This rank's step of a DCP decode (mla/dcp.h): q [b, s_q, h_q, 576] of its heads (bf16 on CUDA), its cache "
     "shard, block_table [b, max_blocks] int32 of the shard, local_lens [b * s_q] int32 (dcp_local_query_lengths); "
     "out [b, s_q, h_q, 512] / lse [b, s_q, h_q] fp32 of its heads over the whole context; workspace u8 "
     "[dcp_mqa_decode_workspace_bytes(...)].");
  m.def("dcp_sparse_mqa_workspace_bytes", [](int64_t t, int64_t h_q, py::handle dtype, int world_size, int64_t d_qk,
                                             int64_t d_v) {
    return dcp_sparse_mqa_workspace_bytes(t, h_q, to_dtype(dtype), world_size, d_qk, d_v);
  }, py::arg("t"), py::arg("h_q"), py::arg("dtype"), py::arg("world_size"), py::arg("d_qk") = 576, py::arg("d_v") = 512,
     "Bytes of the u8 workspace dcp_sparse_mqa needs for t tokens and the rank's h_q heads (q's and out's last dims "
     "d_qk / d_v: DeepSeek-V4 512 / 512).");
  m.def("dcp_sparse_mqa", [](Communicator& c, const A& q, const K& cache, const A& indices, const A& topk_length,
                             const A& out, const A& lse, double softmax_scale, const A& workspace, py::handle s,
                             const A& attn_sink, py::handle extra_kv, const A& extra_indices,
                             const A& extra_topk_length, bool values_include_rope, bool batch_invariant) {
    const Context ctx = to_context(q.view, s, Precision::fast);
    const mla::SparseOptions o =
        sparse_options(attn_sink, extra_kv, extra_indices, extra_topk_length, values_include_rope, batch_invariant);
    without_gil([&] {
      dcp_sparse_mqa(c, q.view, cache.cache, indices.view, topk_length.view, out.view, lse.view, softmax_scale, o,
                     workspace.view, ctx);
    });
  }, py::arg("comm"), py::arg("q"), py::arg("cache"), py::arg("indices"), py::arg("topk_length"), py::arg("out"),
     py::arg("lse"), py::arg("softmax_scale"), py::arg("workspace"), py::kw_only(), stream,
     py::arg("attn_sink") = py::none(), py::arg("extra_kv") = py::none(), py::arg("extra_indices") = py::none(),
     py::arg("extra_topk_length") = py::none(), py::arg("values_include_rope") = false,
     py::arg("batch_invariant") = false,
     "This rank's step of a DCP sparse attention: q [T, h_q, d_qk] of its heads, its cache shard, indices "
     "[T, topk] int32 rows of the shard (-1: a key another rank holds), topk_length [T] int32 or None; "
     "out [T, h_q, d_v] / lse [T, h_q] fp32 over every rank's keys; workspace u8 "
     "[dcp_sparse_mqa_workspace_bytes(...)]. DeepSeek-V4 inputs (as sparse_mqa's; mla/dcp.h): attn_sink [h_q] f32 "
     "of this rank's heads (folded in once, by the combine), extra_kv / extra_indices [T, k_e] / extra_topk_length "
     "[T] (this rank's shard of the compressed cache and its rows), values_include_rope, batch_invariant.");
  m.def("dcp_compact_topk", [](const A& req_id, const A& seq_lens, const A& indices, const A& topk_length,
                               const A& out, const A& valid_counts, int w, int rank, int interleave, py::handle s) {
    const Context ctx = to_context(indices.view, s, Precision::fast);
    without_gil([&] {
      dcp_compact_topk(req_id.view, seq_lens.view, indices.view, topk_length.view, out.view, valid_counts.view,
                       {w, rank, interleave}, ctx);
    });
  }, py::arg("req_id"), py::arg("seq_lens"), py::arg("indices"), py::arg("topk_length"), py::arg("out"),
     py::arg("valid_counts"), py::arg("world_size"), py::arg("rank"), py::arg("interleave") = 1, py::kw_only(),
     stream,
     "The localize step of the DeepSeek-V4 DCP step for one index list (mla/dcp.h): req_id [T] int32, seq_lens [R] "
     "int32 (positions per request in this list's cache), indices [T, topk] int32 request-local positions, "
     "topk_length [T] int32 or None; out [T, topk] int32 gets the entries this rank owns as local positions, "
     "packed at the front (-1 after them), valid_counts [T] int32 their count.");
}

}  // namespace mlapy
