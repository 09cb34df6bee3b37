// SPDX-License-Identifier: Apache-2.0
// Fuzz target: checkpoint directories (issue 51; mla/safetensors.h Checkpoint, DeepseekConfig::
// from_file). Each execution builds a directory from the input: up to seven entries named from
// a small set (shards *.safetensors, the index, config.json, odd names), each a regular file (a
// well-formed shard, a cut or edited one, a JSON index naming any entries, a config), a FIFO, a
// directory, a Unix socket, or a symlink (to another entry, to itself, to a missing name, to ..,
// to /dev/zero or /dev/null). Then it opens the directory as a checkpoint, reads every tensor the
// weight map names, and reads config.json. Contract: each call returns or throws mla::Error —
// nothing else escapes (std::filesystem_error was one), no FIFO, device or socket is opened in a
// way that blocks (libFuzzer's -timeout reports a hang), no sanitizer report; a tensor that loads has
// the bytes its shape and dtype say.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "mla/safetensors.h"

using namespace mla;
using namespace mla::fuzz;
namespace fs = std::filesystem;

namespace {

const char* const kNames[] = {"a.safetensors", "b.safetensors", "model.safetensors.index.json", "config.json",
                              "c.safetensors", "sub",           ".safetensors",                 "d.SAFETENSORS"};

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

std::string shard(Input& in, const std::string& prefix) {
  const std::string header = "{\"" + prefix + ".w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"" +
                             prefix + ".s\":{\"dtype\":\"BF16\",\"shape\":[2,1],\"data_offsets\":[8,12]}}";
  std::string img = le64(header.size()) + header + std::string("\x00\x00\x80\x3f\x00\x00\x00\x40\x80\x3f\x00\x40", 12);
  const int edits = in.byte() % 4 == 0 ? static_cast<int>(in.range(1, 3)) : 0;
  for (int e = 0; e < edits && !img.empty(); ++e) {
    const std::size_t pos = static_cast<std::size_t>(in.range(0, static_cast<int64_t>(img.size()) - 1));
    if (in.flag()) img[pos] = static_cast<char>(in.byte());
    else img.resize(pos);
  }
  return img;
}

std::string index_json(Input& in) {
  std::string j = "{\"weight_map\":{";
  const int n = static_cast<int>(in.range(0, 4));
  for (int i = 0; i < n; ++i) {
    const std::string file = in.byte() % 8 == 0 ? std::string("../x.safetensors") : in.pick(kNames);
    j += (i ? "," : "") + std::string("\"t") + std::to_string(i) + "\":\"" + file + "\"";
  }
  j += "}}";
  if (in.byte() % 8 == 0) j.resize(static_cast<std::size_t>(in.range(0, static_cast<int64_t>(j.size()))));
  return j;
}

const char* kConfig =
    R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 16,)"
    R"( "qk_rope_head_dim": 64, "v_head_dim": 16, "rope_theta": 10000, "rms_norm_eps": 1e-06})";

void write(const fs::path& p, const std::string& bytes) {
  FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) return;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// A Unix socket bound at p (its descriptor closed: the file stays, nothing listens).
void make_socket(const fs::path& p) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string s = p.string();
  if (s.size() < sizeof a.sun_path) {
    std::memcpy(a.sun_path, s.c_str(), s.size());
    (void)::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  }
  ::close(fd);
}

// This process's scratch directory, removed when it exits.
const fs::path& scratch_dir() {
  struct Dir {
    fs::path p = fs::temp_directory_path() / ("mla_fuzz_checkpoint_" + std::to_string(::getpid()));
    ~Dir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  };
  static const Dir d;
  return d.p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  const fs::path dir = scratch_dir();
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  const int entries = static_cast<int>(in.range(1, 7));
  for (int e = 0; e < entries; ++e) {
    const std::string name = in.pick(kNames);
    const fs::path p = dir / name;
    if (fs::exists(fs::symlink_status(p, ec))) continue;
    switch (in.byte() % 10) {
      case 0: case 1: case 2: write(p, shard(in, "t" + std::to_string(in.range(0, 3)))); break;
      case 3: write(p, index_json(in)); break;
      case 4: write(p, kConfig); break;
      case 5: ::mkfifo(p.c_str(), 0600); break;
      case 6: fs::create_directory(p, ec); break;
      case 7: make_socket(p); break;
      default: {
        const std::string targets[] = {name, in.pick(kNames), "missing", "..", "/dev/zero", "/dev/null"};
        fs::create_symlink(targets[in.byte() % 6], p, ec);
        break;
      }
    }
  }
  std::unique_ptr<Checkpoint> c;
  if (!rejects([&] { c = std::make_unique<Checkpoint>(dir.string()); })) {
    for (const std::string& name : c->names()) {
      StTensorInfo info;
      if (rejects([&] { info = c->info(name); })) continue;
      Tensor t;
      if (rejects([&] { t = c->load(name, DType::f64); })) continue;
      FUZZ_REQUIRE(t.view().numel() == info.numel && info.nbytes() == static_cast<uint64_t>(info.numel) *
                                                                    static_cast<uint64_t>(st_dtype_bytes(info.dtype)),
                   "tensor %s loaded %lld elements, its shape says %lld", name.c_str(),
                   static_cast<long long>(t.view().numel()), static_cast<long long>(info.numel));
    }
  }
  (void)rejects([&] { (void)DeepseekConfig::from_file((dir / "config.json").string()); });
  (void)rejects([&] { (void)SafetensorsFile::open((dir / in.pick(kNames)).string()); });
  return 0;
}
