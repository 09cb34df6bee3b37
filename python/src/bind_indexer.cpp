// SPDX-License-Identifier: Apache-2.0
// The lightning indexer of mla/indexer.h (DeepSeek V3.2), argument for argument: the indexer K cache
// descriptor and its allocation, the writer, the prefill gather, the q / k preparation, the fp8 MQA logits
// and the top-k.
// Each op takes keyword-only `stream` and `precision` (the Context); the GIL is released while it runs.
#include "bindings.h"
#include "mla/indexer.h"

namespace mlapy {

namespace {

// mla.IndexerKCache (K): the descriptor plus the Python object that owns (or exported) its memory.
struct K {
  mla::IndexerKCache cache;
  py::object keep;
  py::object source;
};
using A = TensorArg;

}  // namespace

void bind_indexer(py::module_& m) {
  using mla::Precision;
  const auto stream = py::arg("stream") = py::none(), precision = py::arg("precision") = Precision::fast;

  m.attr("INDEXER_HEAD_DIM") = mla::kIndexerHeadDim;
  m.attr("INDEXER_ENTRY_BYTES") = mla::kIndexerEntryBytes;
  m.attr("INDEXER_HEADS") = mla::kIndexerHeads;
  m.attr("INDEXER_TOPK") = mla::kIndexerTopk;
  py::enum_<mla::IndexerScale>(m, "IndexerScale", "How indexer_write_k picks a token's scale (mla/indexer.h)")
      .value("ue8m0", mla::IndexerScale::ue8m0)
      .value("amax", mla::IndexerScale::amax);

  py::class_<K>(m, "IndexerKCache", "Indexer K cache u8 [num_blocks, page_size, 132] (SoA per block); holds it alive.")
      .def(py::init([](const A& data) { return K{{data.view}, data.keep, data.source}; }), py::arg("data"))
      .def_property_readonly("num_blocks", [](const K& c) { return c.cache.num_blocks(); })
      .def_property_readonly("page_size", [](const K& c) { return c.cache.page_size(); })
      .def_property_readonly("num_slots", [](const K& c) { return c.cache.num_slots(); })
      .def_property_readonly("data", [](const K& c) { return c.source; }, "The tensor the descriptor was made from.")
      .def("validate", [](const K& c) { mla::validate_indexer_cache(c.cache); }, "Check the descriptor against its tensor; raises ValueError.");
  m.def("allocate_indexer_cache", [](int64_t num_blocks, int64_t page_size, py::handle device) {
    mla::IndexerCacheBuffer b = mla::allocate_indexer_cache(num_blocks, page_size, to_device(device));
    py::object t = wrap(b.storage);
    return K{b.cache, t, t};
  }, py::arg("num_blocks"), py::arg("page_size"), py::arg("device") = "cpu",
     "Allocate an indexer K cache (contents undefined); .data is the mla.Tensor holding it.");

  m.def("indexer_write_k", [](const A& k, const A& slot_mapping, const K& cache, mla::IndexerScale scale, py::handle s,
                              Precision p) {
    const mla::Context ctx = to_context(k.view, s, p);
    without_gil([&] { mla::indexer_write_k(k.view, slot_mapping.view, cache.cache, scale, ctx); });
  }, py::arg("k"), py::arg("slot_mapping"), py::arg("cache"), py::arg("scale") = mla::IndexerScale::ue8m0,
     py::kw_only(), stream, precision, "Quantise k [T, 128] per token into the indexer cache at slot_mapping.");
  m.def("indexer_gather_k", [](const K& cache, const A& dst_k, const A& dst_scale, const A& block_table,
                               const A& cu_seq_lens, py::handle s, Precision p) {
    const mla::Context ctx = to_context(dst_k.view, s, p);
    without_gil([&] {
      mla::indexer_gather_k(cache.cache, dst_k.view, dst_scale.view, block_table.view, cu_seq_lens.view, ctx);
    });
  }, py::arg("cache"), py::arg("dst_k"), py::arg("dst_scale"), py::arg("block_table"), py::arg("cu_seq_lens"),
     py::kw_only(), stream, precision, "Gather each request's first positions into dst_k [TOT, 128] / dst_scale [TOT].");
  m.def("indexer_logits_prefill", [](const A& q, const A& weights, const A& k, const A& k_scale, const A& row_starts,
                                     const A& row_ends, const A& logits, py::handle s, Precision p) {
    const mla::Context ctx = to_context(q.view, s, p);
    without_gil([&] {
      mla::indexer_logits_prefill(q.view, weights.view, k.view, k_scale.view, row_starts.view, row_ends.view,
                                  logits.view, ctx);
    });
  }, py::arg("q"), py::arg("weights"), py::arg("k"), py::arg("k_scale"), py::arg("row_starts"), py::arg("row_ends"),
     py::arg("logits"), py::kw_only(), stream, precision,
     "logits[t, j] = sum_h w[t, h] relu(q[t, h] . k[j] * k_scale[j]) for j in [row_starts[t], row_ends[t]), else -inf.");
  m.def("indexer_logits_decode", [](const A& q, const A& weights, const K& cache, const A& block_table,
                                    const A& seq_lens, int64_t s_q, const A& logits, py::handle s, Precision p) {
    const mla::Context ctx = to_context(q.view, s, p);
    without_gil([&] {
      mla::indexer_logits_decode(q.view, weights.view, cache.cache, block_table.view, seq_lens.view, s_q, logits.view,
                                 ctx);
    });
  }, py::arg("q"), py::arg("weights"), py::arg("cache"), py::arg("block_table"), py::arg("seq_lens"), py::arg("s_q"),
     py::arg("logits"), py::kw_only(), stream, precision,
     "Decode logits [b * s_q, N] over each request's causal positions in the paged indexer cache.");
  m.def("indexer_prepare", [](const A& q, const A& k, const A& weights_raw, const A& positions, const A& cos_sin,
                              const A& k_norm_weight, const A& k_norm_bias, const A& q_codes, const A& weights,
                              const A& k_out, double eps, bool hadamard, py::handle s, Precision p) {
    const mla::Context ctx = to_context(q.view, s, p);
    without_gil([&] {
      mla::indexer_prepare(q.view, k.view, weights_raw.view, positions.view, cos_sin.view, k_norm_weight.view,
                           k_norm_bias.view, q_codes.view, weights.view, k_out.view, eps, hadamard, ctx);
    });
  }, py::arg("q"), py::arg("k"), py::arg("weights_raw"), py::arg("positions"), py::arg("cos_sin"),
     py::arg("k_norm_weight"), py::arg("k_norm_bias"), py::arg("q_codes"), py::arg("weights"), py::arg("k_out"),
     py::arg("eps") = 1e-6, py::arg("hadamard") = true, py::kw_only(), stream, precision,
     "The indexer's q / k preparation after its projections (k LayerNorm, non-interleaved rope on dims < 64,\n"
     "Hadamard, per-head ue8m0 fp8 q with its scale folded into weights): q_codes [T, h, 128] u8/e4m3,\n"
     "weights [T, h] f32, k_out [T, 128] (write it with indexer_write_k).");
  m.def("indexer_topk", [](const A& logits, const A& row_starts, const A& row_ends, const A& out, py::handle s,
                           Precision p) {
    const mla::Context ctx = to_context(logits.view, s, p);
    without_gil([&] { mla::indexer_topk(logits.view, row_starts.view, row_ends.view, out.view, ctx); });
  }, py::arg("logits"), py::arg("row_starts"), py::arg("row_ends"), py::arg("out"), py::kw_only(), stream, precision,
     "Positions of each row's k largest logits in [start, end) (ascending, -1 padded) into out [T, k] int32.");
  m.def("indexer_topk_decode", [](const A& logits, const A& seq_lens, int64_t s_q, const A& out, py::handle s,
                                  Precision p) {
    const mla::Context ctx = to_context(logits.view, s, p);
    without_gil([&] { mla::indexer_topk_decode(logits.view, seq_lens.view, s_q, out.view, ctx); });
  }, py::arg("logits"), py::arg("seq_lens"), py::arg("s_q"), py::arg("out"), py::kw_only(), stream, precision,
     "indexer_topk over the decode rows' causal lengths (seq_lens [T / s_q]).");
}

}  // namespace mlapy
