// SPDX-License-Identifier: Apache-2.0
// DeepseekV4Attention (mla/deepseek_v4.h) against transformers' DeepseekV4Attention on the fixture of
// scripts/gen_v4_fixture.py (tests/fixtures/block_v4: a tiny config with the real head shapes, one
// layer of each kind, one sequence): the compressors' outputs and the indexer's picks of the fixture are
// the block's inputs, the sequence is served in several step splits, and the output must be within the
// bf16 rule (rel-L2 1e-2) in bf16 and within 1e-5 in f64 / f32 with the f64 caches. Skipped while the
// fixture is absent (it is generated on a machine with torch and transformers, docs/DEVELOPING.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "mla/deepseek_v4.h"
#include "mla/safetensors.h"
#include "support/test_util.h"
#include "unit/safetensors_test_util.h"
#include "unit/v4_block_test_util.h"

namespace mla {
namespace {

std::string v4_fixture_dir() {
  const char* env = std::getenv("MLA_FIXTURE_DIR");
  return std::string(env && *env ? env : MLA_FIXTURE_DIR) + "/block_v4";
}

// The fixture's one sequence (positions 0..T-1) through `blk` in steps of the given lengths. Entry e of
// the extra cache is written in the step holding position (e + 1) * ratio - 1 (where the compressor
// closes its window); token p attends the entries of its row of `topk`.
std::vector<double> serve(const DeepseekV4Attention& blk, const Tensor& hidden, const std::vector<double>& comp,
                          int64_t n_comp, const std::vector<int32_t>& topk, int64_t K, const std::vector<int>& steps,
                          Precision precision) {
  const int64_t T = hidden.size(0), H = hidden.size(1), D = blk.config().head_dim, page = 4, epage = 2;
  const int ratio = blk.compress_ratio();
  const DType dt = blk.options().dtype;
  const int64_t nb = (T + page - 1) / page, enb = std::max<int64_t>(1, (n_comp + epage - 1) / epage);
  CacheBuffer main = allocate_cache(blk.options().cache_format, nb, page, Device::cpu(), 1.0f, 512, 64);
  CacheBuffer extra = allocate_cache(blk.options().extra_cache_format, enb, epage, Device::cpu(), 1.0f, 512, 64);
  std::memset(main.storage.data(), 0xff, main.storage.nbytes());
  std::memset(extra.storage.data(), 0xff, extra.storage.nbytes());
  std::vector<int32_t> table(static_cast<std::size_t>(nb)), etable(static_cast<std::size_t>(enb));
  for (int32_t i = 0; i < nb; ++i) table[static_cast<std::size_t>(i)] = static_cast<int32_t>(nb - 1 - i);
  for (int32_t i = 0; i < enb; ++i) etable[static_cast<std::size_t>(i)] = static_cast<int32_t>(enb - 1 - i);
  const Tensor bt = test::int_tensor_2d({table}), ebt = test::int_tensor_2d({etable});
  std::vector<double> out;
  int64_t done = 0;
  for (const int q : steps) {
    Tensor x = Tensor::empty({q, H}, dt), y = test::poisoned({q, H}, dt);
    std::vector<int64_t> pos, slots, eslots;
    std::vector<int32_t> rid;
    std::vector<std::vector<int32_t>> rows;
    std::vector<double> ekv;
    for (int64_t i = 0; i < q; ++i) {
      const int64_t p = done + i;
      pos.push_back(p);
      rid.push_back(0);
      slots.push_back(int64_t{table[static_cast<std::size_t>(p / page)]} * page + p % page);
      for (int64_t j = 0; j < H; ++j) num::store(x.view().ptr_at({i, j}), dt, num::load(hidden.view().ptr_at({p, j}), hidden.dtype()));
      if (ratio > 0) {
        rows.emplace_back(topk.begin() + p * K, topk.begin() + (p + 1) * K);
        if ((p + 1) % ratio == 0 && (p + 1) / ratio - 1 < n_comp) {
          const int64_t e = (p + 1) / ratio - 1;
          ekv.insert(ekv.end(), comp.begin() + e * D, comp.begin() + (e + 1) * D);
          eslots.push_back(int64_t{etable[static_cast<std::size_t>(e / epage)]} * epage + e % epage);
        }
      }
    }
    test::v4::Step st{x, test::int64_tensor(pos), test::int_tensor(rid), bt, test::int64_tensor(slots)};
    st.out = y;
    if (ratio > 0) {
      st.extra_topk = test::int_tensor_2d(rows);
      st.extra_block_table = ebt;
      if (!eslots.empty()) {
        st.extra_kv = Tensor::empty({static_cast<int64_t>(eslots.size()), D}, DType::f64);
        std::copy(ekv.begin(), ekv.end(), static_cast<double*>(st.extra_kv.data()));
        st.extra_slots = test::int64_tensor(eslots);
      }
    }
    const std::vector<double> o = st.run(blk, main.cache, extra.cache, precision);
    out.insert(out.end(), o.begin(), o.end());
    done += q;
  }
  EXPECT_EQ(done, T);
  return out;
}

// Every layer of the fixture in `dir`, every mode, every split.
void check_fixture(const std::string& dir) {
  const DeepseekV4Config cfg = DeepseekV4Config::from_file(dir + "/checkpoint/config.json");
  const Checkpoint ck(dir + "/checkpoint");
  const SafetensorsFile io = SafetensorsFile::open(dir + "/io.safetensors");
  const Tensor hidden = io.load("hidden", DType::bf16);
  const int64_t T = hidden.size(0);
  ASSERT_GE(T, 24);
  ASSERT_EQ(cfg.head_dim, 512);
  std::vector<int> decodes = {static_cast<int>(T - 8)};
  decodes.insert(decodes.end(), 8, 1);
  const std::vector<std::vector<int>> splits = {{static_cast<int>(T)}, {10, 10, static_cast<int>(T - 20)}, decodes};
  int layers_checked = 0;
  for (int layer = 0; layer < static_cast<int>(cfg.compress_ratios.size()); ++layer) {
    const std::string sfx = "_" + std::to_string(layer);
    if (!io.find("out_ref" + sfx)) continue;
    const std::vector<double> ref = test::to_doubles(io.load("out_ref" + sfx, DType::f64).view());
    std::vector<double> comp;
    std::vector<int32_t> topk;
    int64_t n_comp = 0, K = 0;
    if (cfg.compress_ratio(layer) > 0) {
      const Tensor c = io.load("compressed" + sfx, DType::f64), k = io.load("topk" + sfx, DType::i32);
      n_comp = c.size(0);
      K = k.size(1);
      comp = test::to_doubles(c.view());
      topk = test::to_ints(k.view());
    }
    using test::v4::Mode;
    for (const Mode m : {Mode{DType::f64, Precision::reference, CacheFormat::f64, 1e-5},
                         Mode{DType::f32, Precision::fast, CacheFormat::f64, 1e-5},
                         Mode{DType::bf16, Precision::fast, CacheFormat::bf16, 1e-2}}) {
      DeepseekV4Options o;
      o.dtype = m.dt;
      o.cache_format = o.extra_cache_format = m.cache;
      const DeepseekV4Attention blk = DeepseekV4Attention::load(ck, cfg, layer, o);
      for (std::size_t s = 0; s < splits.size(); ++s) {
        const double e = test::rel_l2(serve(blk, hidden, comp, n_comp, topk, K, splits[s], m.precision), ref);
        std::printf("  layer %d (ratio %d) %s, %s cache, split %zu: rel-L2 %.3e\n", layer, cfg.compress_ratio(layer),
                    to_string(m.dt), to_string(m.cache), s, e);
        EXPECT_LE(e, m.bound) << "layer " << layer << " " << to_string(m.dt) << " split " << s;
      }
    }
    ++layers_checked;
  }
  EXPECT_EQ(layers_checked, static_cast<int>(cfg.compress_ratios.size())) << "a layer of the fixture has no out_ref";
}

TEST(V4BlockFixture, MatchesTransformersEverySplit) {
  const std::string dir = v4_fixture_dir();
  if (!std::filesystem::exists(dir + "/io.safetensors"))
    GTEST_SKIP() << "the DeepSeek-V4 fixture " << dir << "/io.safetensors is absent: generate it with "
                 << "`python3 scripts/gen_v4_fixture.py tests/fixtures/block_v4` on a machine with torch and "
                 << "transformers' deepseek_v4 (docs/DEVELOPING.md)";
  check_fixture(dir);
}

// The fixture's layout and reader on a fixture made here: transformers' config names, the checkpoint
// under transformers' tensor names, outputs from the naive float64 formulation (unit/v4_block_test_util.h)
// of one sequence of 24 tokens. Passes only if the config, the names, the io tensors and the serving
// agree with what the generator writes; a wrong reference must fail it.
TEST(V4BlockFixture, SelfMadeFixtureRoundTrip) {
  test::TempDir tmp("v4fixture");
  const std::filesystem::path dir = tmp.path, ck = dir / "checkpoint";
  std::filesystem::create_directories(ck);
  test::write_file(ck / "config.json", R"({"model_type": "deepseek_v4", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
    "sliding_window": 8, "index_topk": 3, "rms_norm_eps": 1e-06, "partial_rotary_factor": 0.125,
    "num_hidden_layers": 3, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
      "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                   "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0, "partial_rotary_factor": 0.125}}})");
  const DeepseekV4Config cfg = DeepseekV4Config::from_file((ck / "config.json").string());
  const DeepseekV4Config small = test::v4::small_config();
  ASSERT_EQ(cfg.compress_ratios, small.compress_ratios);
  ASSERT_EQ(cfg.yarn_factor, small.yarn_factor);
  const test::v4::Weights w(cfg);
  auto bytes = [](const TensorView& v) {
    return std::string(static_cast<const char*>(v.data), static_cast<std::size_t>(v.numel() * v.element_size()));
  };
  std::vector<test::StEntry> ckpt;
  for (int layer = 0; layer < 3; ++layer) {
    const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
    for (const auto& [name, view] : {std::pair{"q_a_proj.weight", w.w.q_a_proj.weight}, {"q_b_proj.weight", w.w.q_b_proj.weight},
                                     {"kv_proj.weight", w.w.kv_proj.weight}, {"o_a_proj.weight", w.w.o_a_proj.weight},
                                     {"o_b_proj.weight", w.w.o_b_proj.weight}, {"q_a_norm.weight", w.w.q_a_norm},
                                     {"kv_norm.weight", w.w.kv_norm}, {"sinks", w.w.sinks}})
      ckpt.push_back({pre + name, "BF16", std::vector<int64_t>(view.shape.begin(), view.shape.begin() + view.ndim),
                      bytes(view)});
  }
  test::write_file(ck / "model.safetensors", test::st_build(ckpt));
  // One sequence; compressed rows and picks as the generator stores them.
  const int64_t T = 24, H = cfg.hidden_size, D = cfg.head_dim;
  test::reseed(99);
  test::v4::Request req;
  std::vector<uint16_t> hid;
  for (int64_t p = 0; p < T; ++p) {
    std::vector<double> x(static_cast<std::size_t>(H));
    for (double& v : x) {
      v = test::v4::bf16_uniform(-1, 1);
      hid.push_back(num::float_to_bf16(static_cast<float>(v)));
    }
    req.hidden.push_back(x);
  }
  std::vector<test::StEntry> io = {{"hidden", "BF16", {T, H}, test::bytes_of(hid)}};
  for (int layer = 0; layer < 3; ++layer) {
    const int ratio = cfg.compress_ratio(layer);
    const int64_t n = ratio ? T / ratio : 0, K = 3;
    req.compressed.clear();
    std::vector<double> comp;
    for (int64_t e = 0; e < n; ++e) {
      std::vector<double> x(static_cast<std::size_t>(D));
      for (double& v : x) v = test::uniform(-1.5, 1.5);
      comp.insert(comp.end(), x.begin(), x.end());
      req.compressed.push_back(x);
    }
    std::vector<int32_t> topk;
    std::vector<double> ref;
    for (int64_t p = 0; p < T; ++p) {
      std::vector<int32_t> row;
      for (int32_t e = 0; ratio && e < (p + 1) / ratio; ++e) row.push_back(e);
      if (ratio == 4) std::shuffle(row.begin(), row.end(), test::rng());
      row.resize(static_cast<std::size_t>(K), -1);
      topk.insert(topk.end(), row.begin(), row.end());
      const std::vector<double> y = test::v4::naive_token(cfg, ratio, w, req, p, ratio ? row : std::vector<int32_t>{});
      ref.insert(ref.end(), y.begin(), y.end());
    }
    const std::string sfx = "_" + std::to_string(layer);
    io.push_back({"out_ref" + sfx, "F64", {T, H}, test::bytes_of(ref)});
    if (ratio) {
      io.push_back({"compressed" + sfx, "F64", {n, D}, test::bytes_of(comp)});
      io.push_back({"topk" + sfx, "I32", {T, K}, test::bytes_of(topk)});
    }
  }
  test::write_file(dir / "io.safetensors", test::st_build(io));
  check_fixture(dir.string());
}

}  // namespace
}  // namespace mla
