// SPDX-License-Identifier: Apache-2.0
// safetensors reader, checkpoint directories and config.json (mla/safetensors.h): well-formed files
// read back exactly; every malformed file (truncated, lying or overlapping headers, bad JSON, dtype,
// shape, offsets) gives an mla::Error naming the problem, and random corruptions never crash.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <random>

#include "core/numeric.h"
#include "mla/error.h"
#include "mla/safetensors.h"
#include "unit/safetensors_test_util.h"
#include "support/test_util.h"

namespace mla {
namespace {

using test::as_bytes;
using test::bytes_of;
using test::st_build;
using test::st_image;

std::string good_file() {
  std::vector<uint16_t> bf = {num::float_to_bf16(1.5f), num::float_to_bf16(-2.0f), num::float_to_bf16(0.25f),
                              num::float_to_bf16(3.0f), num::float_to_bf16(-0.5f), num::float_to_bf16(8.0f)};
  std::vector<float> f32 = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<uint8_t> e4 = {num::float_to_e4m3(448.0f), num::float_to_e4m3(-1.0f)};
  std::vector<int64_t> i64 = {7, -9};
  return st_build({{"a.weight", "BF16", {2, 3}, bytes_of(bf)},
                   {"b", "F32", {4}, bytes_of(f32)},
                   {"c", "F8_E4M3", {2}, bytes_of(e4)},
                   {"d", "I64", {2}, bytes_of(i64)}},
                  R"({"format":"pt"})");
}

// Parses an image; returns the error message ("" when it parsed).
std::string parse_error(const std::string& image) {
  try {
    SafetensorsFile::from_bytes(as_bytes(image), "t.safetensors");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

#define EXPECT_REFUSED(image, text)                                                     \
  do {                                                                                  \
    const std::string msg_ = parse_error(image);                                        \
    EXPECT_NE(msg_.find(text), std::string::npos) << "expected '" << (text) << "', got '" << msg_ << "'"; \
  } while (0)

TEST(Safetensors, ReadsBackEveryTensor) {
  const std::string img = good_file();
  const auto f = SafetensorsFile::from_bytes(as_bytes(img), "t");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto& a = f.info("a.weight");
  EXPECT_EQ(a.dtype, StDType::BF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  const TensorView v = f.view("a.weight");
  EXPECT_EQ(v.dtype, DType::bf16);
  EXPECT_EQ(v.shape_str(), "[2, 3]");
  EXPECT_EQ(test::to_doubles(v), (std::vector<double>{1.5, -2.0, 0.25, 3.0, -0.5, 8.0}));
  EXPECT_EQ(test::to_doubles(f.load("a.weight", DType::f64)), (std::vector<double>{1.5, -2.0, 0.25, 3.0, -0.5, 8.0}));
  EXPECT_EQ(test::to_doubles(f.load("b", DType::bf16)), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(test::to_doubles(f.load("c", DType::f32)), (std::vector<double>{448.0, -1.0}));
  EXPECT_EQ(test::to_doubles(f.load("d", DType::i32)), (std::vector<double>{7, -9}));
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_THROW(f.info("missing"), Error);
  EXPECT_THROW(f.load("d", DType::f32), Error);  // integer -> float refused
  EXPECT_THROW(f.load("b", DType::i32), Error);  // float -> integer refused
}

TEST(Safetensors, EmptyAndScalarTensors) {
  const std::string img = st_build({{"empty", "F32", {0, 4}, ""}, {"s", "F64", {}, bytes_of(std::vector<double>{2.5})}});
  const auto f = SafetensorsFile::from_bytes(as_bytes(img), "t");
  EXPECT_EQ(f.info("empty").numel, 0);
  EXPECT_EQ(test::to_doubles(f.load("s", DType::f64)), (std::vector<double>{2.5}));
  EXPECT_EQ(parse_error(st_image("{}", "")), "");  // no tensors at all
}

TEST(Safetensors, MisalignedDataIsCopiedNotViewed) {
  // Header of odd length: the F32 data starts at an odd address.
  std::string h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if ((h.size() + 8) % 4 == 0) h += " ";
  std::vector<float> v = {1.25f, -3.0f};
  const std::string img = st_image(h, bytes_of(v));
  const auto f = SafetensorsFile::from_bytes(as_bytes(img), "t");
  EXPECT_THROW(f.view("x"), Error);
  EXPECT_EQ(test::to_doubles(f.load("x", DType::f32)), (std::vector<double>{1.25, -3.0}));
}

TEST(Safetensors, TruncatedFiles) {
  const std::string img = good_file();
  EXPECT_REFUSED(img.substr(0, 5), "too short");
  // Every proper prefix is refused (header length past the end, or data not covered), never read past.
  for (std::size_t n = 0; n < img.size(); ++n) EXPECT_NE(parse_error(img.substr(0, n)), "") << "prefix " << n;
  EXPECT_REFUSED(img.substr(0, img.size() - 1), "data_offsets");
}

TEST(Safetensors, LyingHeaderLength) {
  const std::string img = good_file();
  std::string big = img;
  big[0] = static_cast<char>(0xff);
  big[1] = static_cast<char>(0xff);  // ~64 KB: past the end of this file
  EXPECT_REFUSED(big, "runs past the end");
  std::string huge = img;
  huge[7] = 0x01;  // 2^56 bytes
  EXPECT_REFUSED(huge, "100 MB");
  EXPECT_REFUSED(st_image("{", ""), "too small");
  // A header length shorter than the JSON: the JSON is cut (past the padding spaces) and the rest counts as data.
  std::string shorter = img;
  shorter[0] = static_cast<char>(static_cast<uint8_t>(shorter[0]) - 10);
  EXPECT_REFUSED(shorter, "invalid JSON");
  // Longer than the JSON: data bytes become trailing garbage after the object.
  std::string longer = img;
  longer[0] = static_cast<char>(static_cast<uint8_t>(longer[0]) + 2);
  EXPECT_NE(parse_error(longer), "");
}

TEST(Safetensors, BadJson) {
  EXPECT_REFUSED(st_image("[1,2]   ", ""), "does not start with '{'");
  EXPECT_REFUSED(st_image("{\"a\":}  ", ""), "invalid JSON");
  EXPECT_REFUSED(st_image("{\"a\":1} /* c */", ""), "invalid JSON");
  EXPECT_REFUSED(st_image("{\"a\":{\"b\":{\"c\":[[1]]}}}", ""), "nested deeper");
  EXPECT_REFUSED(st_image(std::string(1, '{') + std::string(100000, '['), ""), "nested deeper");
  EXPECT_REFUSED(st_image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                          "ab"), "appears twice");
  EXPECT_REFUSED(st_image("{\"x\":\"\xff\xfe\"}", ""), "invalid JSON");  // not UTF-8
  EXPECT_REFUSED(st_image(R"({"__metadata__":{"k":1}})", ""), "not a string");
  EXPECT_REFUSED(st_image(R"({"x":5})", ""), "must be an object");
}

std::string one(const std::string& entry, const std::string& data) { return st_image("{\"x\":" + entry + "}", data); }

TEST(Safetensors, BadDtypeShapeOffsets) {
  EXPECT_REFUSED(one(R"({"dtype":"Q7","shape":[1],"data_offsets":[0,1]})", "a"), "unsupported dtype 'Q7'");
  EXPECT_REFUSED(one(R"({"dtype":"F4","shape":[2],"data_offsets":[0,1]})", "a"), "unsupported dtype");
  EXPECT_REFUSED(one(R"({"dtype":3,"shape":[1],"data_offsets":[0,1]})", "a"), "\"dtype\" must be a string");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,1]})", "a"), "non-negative integers");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})", "a"), "non-negative integers");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":1,"data_offsets":[0,1]})", "a"), "must be an array");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]})", "a"), "overflows");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", "a"), "two non-negative");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1],"data_offsets":[1,0]})", "a"), "end before begin");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1})", "a"), "unknown field");
  EXPECT_REFUSED(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})", "abcd"), "needs 8 bytes");
  EXPECT_REFUSED(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})", "ab"), "run past");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]})", "a"), "end before");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1],"data_offsets":[1,2]})", "ab"), "belong to no tensor");
  EXPECT_REFUSED(one(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})", "ab"), "tensors cover 1");
}

TEST(Safetensors, OverlappingTensors) {
  EXPECT_REFUSED(st_image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                          "abc"), "overlap");
  // Same range twice under two names.
  EXPECT_REFUSED(st_image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}})",
                          "ab"), "overlap");
  // One inside another.
  EXPECT_REFUSED(st_image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
                          "abcd"), "overlap");
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  // Each mutation either parses (then every tensor reads within bounds) or throws mla::Error.
  const std::string img = good_file();
  std::mt19937_64 g(11);
  int parsed = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string m = img;
    const int edits = 1 + static_cast<int>(g() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = g() % std::min<std::size_t>(m.size(), 8 + 200);  // mostly the header
      switch (g() % 4) {
        case 0: m[pos] = static_cast<char>(g()); break;
        case 1: m[pos] = "0123456789[]{},:\"-."[g() % 19]; break;
        case 2: m.erase(pos, 1); break;
        default: m.insert(pos, 1, static_cast<char>(g())); break;
      }
    }
    try {
      const auto f = SafetensorsFile::from_bytes(as_bytes(m), "fuzz");
      for (const auto& t : f.tensors()) {
        const auto b = f.bytes(t);
        ASSERT_GE(b.data(), reinterpret_cast<const std::byte*>(m.data()));
        ASSERT_LE(b.data() + b.size(), reinterpret_cast<const std::byte*>(m.data() + m.size()));
      }
      ++parsed;
    } catch (const Error&) {
    }
  }
  EXPECT_LT(parsed, 3000);
}

TEST(Safetensors, OpensMappedFiles) {
  test::TempDir dir("st");
  test::write_file(dir.path / "m.safetensors", good_file());
  const auto f = SafetensorsFile::open((dir.path / "m.safetensors").string());
  EXPECT_EQ(test::to_doubles(f.load("b", DType::f64)), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_THROW(SafetensorsFile::open((dir.path / "nope.safetensors").string()), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.path.string()), Error);  // a directory
  test::write_file(dir.path / "empty.safetensors", "");
  EXPECT_THROW(SafetensorsFile::open((dir.path / "empty.safetensors").string()), Error);
}

TEST(Checkpoint, ShardedThroughIndex) {
  test::TempDir dir("ckpt");
  std::vector<float> a = {1, 2}, b = {3};
  test::write_file(dir.path / "s1.safetensors", st_build({{"w.a", "F32", {2}, bytes_of(a)}}));
  test::write_file(dir.path / "s2.safetensors", st_build({{"w.b", "F32", {1}, bytes_of(b)}}));
  test::write_file(dir.path / "model.safetensors.index.json",
                   R"({"metadata":{"total_size":12},"weight_map":{"w.a":"s1.safetensors","w.b":"s2.safetensors"}})");
  const Checkpoint c(dir.path.string());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"w.a", "w.b"}));
  EXPECT_EQ(test::to_doubles(c.load("w.b", DType::f64)), (std::vector<double>{3}));
  EXPECT_EQ(c.info("w.a").shape, (std::vector<int64_t>{2}));
  EXPECT_THROW(c.info("w.c"), Error);
}

TEST(Checkpoint, BadIndexOrShards) {
  test::TempDir dir("ckpt_bad");
  std::vector<float> a = {1, 2};
  test::write_file(dir.path / "s1.safetensors", st_build({{"w.a", "F32", {2}, bytes_of(a)}}));
  const auto index = dir.path / "model.safetensors.index.json";
  test::write_file(index, R"({"weight_map":{"w.a":"s1.safetensors","w.z":"s1.safetensors","w.m":"missing.safetensors"}})");
  const Checkpoint c(dir.path.string());
  EXPECT_THROW(c.info("w.z"), Error);  // the shard does not hold it
  EXPECT_THROW(c.info("w.m"), Error);  // the shard does not exist
  test::write_file(index, R"({"weight_map":{"w.a":"../s1.safetensors"}})");
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);
  test::write_file(index, R"({"weight_map":["s1.safetensors"]})");
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);
  std::filesystem::remove(index);
  test::write_file(dir.path / "s2.safetensors", st_build({{"w.a", "F32", {2}, bytes_of(a)}}));
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);  // w.a in two files
  EXPECT_THROW(Checkpoint{(dir.path / "none").string()}, Error);
}

// Issue 51: a FIFO named as a shard (or as the index or config.json) must be refused, not block the
// loader in open(); entries named *.safetensors that are symlink loops, dangling links, FIFOs or
// directories are refused by name with mla::Error (a loop escaped as std::filesystem_error).
bool throws_error_in_time(const std::function<void()>& f, const std::filesystem::path& fifo) {
  auto done = std::async(std::launch::async, [&] {
    try {
      f();
    } catch (const Error&) {
      return true;
    } catch (...) {
      return false;
    }
    return false;
  });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return done.get();
  // Blocked in open(): a writer end releases it, so that the test can report and go on.
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
  done.wait();
  return false;
}

TEST(Checkpoint, SpecialFilesAndSymlinkLoopsAreRefused) {
  test::TempDir dir("ckpt_special");
  std::vector<float> a = {1, 2};
  test::write_file(dir.path / "s1.safetensors", st_build({{"w.a", "F32", {2}, bytes_of(a)}}));
  const auto fifo = dir.path / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto index = dir.path / "model.safetensors.index.json";
  test::write_file(index, R"({"weight_map":{"w.a":"s1.safetensors","w.p":"pipe.safetensors"}})");
  {
    const Checkpoint c(dir.path.string());
    EXPECT_TRUE(throws_error_in_time([&] { (void)c.info("w.p"); }, fifo)) << "a FIFO shard";
    EXPECT_EQ(test::to_doubles(c.load("w.a", DType::f64)), (std::vector<double>{1, 2}));
  }
  EXPECT_TRUE(throws_error_in_time([&] { (void)SafetensorsFile::open(fifo.string()); }, fifo)) << "SafetensorsFile";
  const auto cfg = dir.path / "config.json";
  ASSERT_EQ(::mkfifo(cfg.c_str(), 0600), 0);
  EXPECT_TRUE(throws_error_in_time([&] { (void)DeepseekConfig::from_file(cfg.string()); }, cfg)) << "config.json";
  std::filesystem::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_TRUE(throws_error_in_time([&] { Checkpoint{dir.path.string()}; }, index)) << "a FIFO index";
  std::filesystem::remove(index);
  // Without an index, every *.safetensors entry: the FIFO, then loops, dangling links, directories.
  EXPECT_TRUE(throws_error_in_time([&] { Checkpoint{dir.path.string()}; }, fifo)) << "a FIFO in the listing";
  std::filesystem::remove(fifo);
  const auto loop = dir.path / "loop.safetensors";
  std::filesystem::create_symlink(loop.filename(), loop);
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);
  std::filesystem::remove(loop);
  std::filesystem::create_symlink("missing", loop);
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);
  std::filesystem::remove(loop);
  std::filesystem::create_directory(loop);
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);
  std::filesystem::remove(loop);
  std::filesystem::create_symlink(index.filename(), index);  // an index that is a symlink loop
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);
  std::filesystem::remove(index);
  std::filesystem::create_symlink("s1.safetensors", dir.path / "link.safetensors");  // a link to a shard is fine
  EXPECT_THROW(Checkpoint{dir.path.string()}, Error);  // ... but w.a is now in two files
  std::filesystem::remove(dir.path / "link.safetensors");
  EXPECT_EQ(Checkpoint(dir.path.string()).names(), (std::vector<std::string>{"w.a"}));
}

constexpr const char* kV3Config = R"({
  "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536,
  "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "rope_theta": 10000, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}})";

TEST(DeepseekConfig, V3AndV2Lite) {
  const auto c = DeepseekConfig::from_json(kV3Config);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_TRUE(c.has_yarn);
  EXPECT_EQ(c.yarn_factor, 40.0);
  EXPECT_TRUE(c.fp8_weights);
  EXPECT_EQ(c.weight_block_rows, 128);
  // The preset's scale: 1/sqrt(192) * (0.1 ln 40 + 1)^2.
  EXPECT_DOUBLE_EQ(c.dims(8).softmax_scale, ModelDims::deepseek_v3(8).softmax_scale);
  EXPECT_EQ(c.dims(8).num_heads, 16);
  EXPECT_THROW(c.dims(3), Error);
  const auto l = DeepseekConfig::from_json(R"({"hidden_size": 2048, "num_attention_heads": 16, "q_lora_rank": null,
      "kv_lora_rank": 512, "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
      "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}})");
  EXPECT_EQ(l.q_lora_rank, 0);
  EXPECT_FALSE(l.fp8_weights);
  EXPECT_DOUBLE_EQ(l.softmax_scale(), ModelDims::deepseek_v2_lite().softmax_scale);
}

TEST(DeepseekConfig, PresetsMatchTheModelDims) {
  for (const char* name : {"v3", "r1", "v3.2", "v2-lite"}) {
    const ModelDims a = DeepseekConfig::preset(name).dims(2), b = ModelDims::preset(name, 2);
    EXPECT_EQ(a.num_heads, b.num_heads) << name;
    EXPECT_DOUBLE_EQ(a.softmax_scale, b.softmax_scale) << name;
    EXPECT_EQ(a.index_topk, b.index_topk) << name;
  }
  EXPECT_EQ(DeepseekConfig::preset("v2-lite").q_lora_rank, 0);
  EXPECT_TRUE(DeepseekConfig::preset("v3").fp8_weights);
  EXPECT_THROW(DeepseekConfig::preset("v4"), Error);
}

TEST(DeepseekConfig, RefusesBadFields) {
  auto bad = [](const std::string& j) {
    try {
      DeepseekConfig::from_json(j);
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(bad(R"({"num_attention_heads": 16})").find("hidden_size"), std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": -5, "num_attention_heads": 16})").find("hidden_size"), std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": 64, "num_attention_heads": "x"})").find("num_attention_heads"), std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": 64, "num_attention_heads": 2, "qk_rope_head_dim": 63})").find("even"),
            std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": 64, "num_attention_heads": 2, "rope_scaling": {"type": "longrope"}})").find("longrope"),
            std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": 64, "num_attention_heads": 2, "quantization_config": {"quant_method": "awq"}})")
                .find("fp8"), std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": 64, "num_attention_heads": 2, "quantization_config": {"quant_method": "fp8",
                "weight_block_size": [0, 128]}})").find("weight_block_size"), std::string::npos);
  EXPECT_NE(bad(R"({"hidden_size": 64, "hidden_size": 65, "num_attention_heads": 2})").find("twice"), std::string::npos);
}

}  // namespace
}  // namespace mla
