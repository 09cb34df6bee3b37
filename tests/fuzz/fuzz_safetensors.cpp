// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the checkpoint reader (mla/safetensors.h, docs/BLOCK.md "Checkpoints") and DeepSeek's
// config.json. The input is either a raw file image or edits (byte flips, header-length lies, cuts,
// insertions of JSON punctuation and numbers near the integer limits) of a well-formed two-tensor
// file. Contract: SafetensorsFile::from_bytes throws mla::Error, or every tensor's bytes lie inside
// the image's data buffer, the tensors tile that buffer in offset order (no overlap, no hole), each
// tensor's byte count is its element count times its element size, and load() into its own dtype
// (when mla has one) either copies exactly those bytes or throws mla::Error. The same text parsed as
// config.json either throws mla::Error or gives positive dimensions.
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "mla/safetensors.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

std::string image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

const std::string& seed_file() {
  static const std::string s = image(
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("s":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[12,16]}})",
      std::string("\x00\x3f\x80\x3f\x00\x40\x40\x40\x80\x40\xa0\x40\x38\x40\x48\x7e", 16));
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  std::string img;
  if (in.flag()) {  // a raw image: the rest of the input
    while (in.left() > 0) img.push_back(static_cast<char>(in.byte()));
  } else {          // edits of the well-formed file
    img = seed_file();
    const int edits = static_cast<int>(in.range(1, 6));
    static const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "0", "1e30", "18446744073709551615",
                                    "9223372036854775808", "\"F64\"", "\"U64\"", "\"__metadata__\"", "null", " "};
    for (int e = 0; e < edits && !img.empty(); ++e) {
      const std::size_t pos = static_cast<std::size_t>(in.range(0, static_cast<int64_t>(img.size()) - 1));
      switch (in.byte() % 5) {
        case 0: img[pos] = static_cast<char>(in.byte()); break;
        case 1: img.insert(pos, in.pick(kTokens)); break;
        case 2: img.erase(pos, static_cast<std::size_t>(in.range(1, 8))); break;
        case 3: {  // the header length lies
          const uint64_t n = static_cast<uint64_t>(in.hostile(0, 200));
          for (int i = 0; i < 8 && i < static_cast<int>(img.size()); ++i) img[i] = static_cast<char>((n >> (8 * i)) & 0xff);
          break;
        }
        default: img.resize(pos); break;  // truncation
      }
    }
  }
  const auto* base = reinterpret_cast<const std::byte*>(img.data());
  std::optional<SafetensorsFile> f;
  const bool refused = rejects([&] { f.emplace(SafetensorsFile::from_bytes({base, img.size()}, "fuzz")); });
  if (!refused) {
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(img[static_cast<std::size_t>(i)]);
    FUZZ_REQUIRE(img.size() >= 8 && header <= img.size() - 8, "accepted a header length %llu past a %zu-byte file",
                 static_cast<unsigned long long>(header), img.size());
    const std::byte* data = base + 8 + header;
    const uint64_t data_size = img.size() - 8 - header;
    uint64_t pos = 0;
    for (const StTensorInfo& t : f->tensors()) {
      FUZZ_REQUIRE(t.begin == pos && t.end >= t.begin && t.end <= data_size,
                   "tensor '%s' [%llu, %llu) does not continue the tiling at %llu of %llu", t.name.c_str(),
                   static_cast<unsigned long long>(t.begin), static_cast<unsigned long long>(t.end),
                   static_cast<unsigned long long>(pos), static_cast<unsigned long long>(data_size));
      FUZZ_REQUIRE(static_cast<unsigned __int128>(t.numel) * static_cast<unsigned>(st_dtype_bytes(t.dtype)) == t.nbytes(),
                   "tensor '%s': %lld elements of %s in %llu bytes", t.name.c_str(), static_cast<long long>(t.numel),
                   to_string(t.dtype), static_cast<unsigned long long>(t.nbytes()));
      const auto b = f->bytes(t);
      FUZZ_REQUIRE(b.data() == data + t.begin && b.size() == t.nbytes(), "bytes() of '%s' is not its range",
                   t.name.c_str());
      pos = t.end;
      if (const auto dt = to_mla_dtype(t.dtype); dt && t.nbytes() <= (1u << 16)) {
        std::optional<Tensor> copy;
        if (!rejects([&] { copy.emplace(f->load(t.name, *dt)); })) {
          FUZZ_REQUIRE(copy->nbytes() == t.nbytes() && (t.nbytes() == 0 || std::memcmp(copy->data(), b.data(), b.size()) == 0),
                       "load('%s') is not a copy of its bytes", t.name.c_str());
        }
      }
    }
    FUZZ_REQUIRE(pos == data_size, "the tensors cover %llu of %llu data bytes", static_cast<unsigned long long>(pos),
                 static_cast<unsigned long long>(data_size));
  }
  // The same bytes as a config.json.
  std::optional<DeepseekConfig> c;
  if (!rejects([&] { c.emplace(DeepseekConfig::from_json(img, "fuzz config")); })) {
    FUZZ_REQUIRE(c->hidden_size > 0 && c->num_attention_heads > 0 && c->kv_lora_rank > 0 && c->qk_rope_head_dim > 0 &&
                     c->qk_rope_head_dim % 2 == 0 && c->qk_nope_head_dim > 0 && c->v_head_dim > 0 &&
                     c->q_lora_rank >= 0,
                 "config accepted with a non-positive dimension");
  }
  // And as a DeepSeek-V4 config.json.
  std::optional<DeepseekV4Config> v4;
  if (!rejects([&] { v4.emplace(DeepseekV4Config::from_json(img, "fuzz v4 config")); })) {
    FUZZ_REQUIRE(v4->hidden_size > 0 && v4->num_attention_heads % v4->o_groups == 0 && v4->qk_rope_head_dim > 0 &&
                     v4->qk_rope_head_dim % 2 == 0 && v4->qk_rope_head_dim < v4->head_dim,
                 "v4 config accepted with inconsistent dimensions");
    for (const int r : v4->compress_ratios) FUZZ_REQUIRE(r >= 0, "v4 config accepted with a negative ratio");
  }
  return 0;
}
