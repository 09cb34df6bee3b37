// SPDX-License-Identifier: Apache-2.0
// Fuzz target: from_dlpack on arbitrary DLTensor fields (rank, null or hostile shape / strides, data
// pointers that are null, misaligned or arbitrary, byte offsets up to 2^64, any dtype code / bits /
// lanes, device types outside the enum). Contract: either mla::Error, or a view whose rank, extents,
// strides and device are the producer's, whose element count and byte span are representable and do
// not wrap the address space, and which survives a to_dlpack / from_dlpack round trip unchanged.
// from_dlpack never dereferences `data` (a bogus pointer is only carried).
#include <array>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "mla/dlpack.h"

using namespace mla;
using namespace mla::fuzz;

namespace {

// Lowest and one-past-highest byte the view addresses, relative to its data pointer (exact integers).
struct Span {
  __int128 lo = 0, hi = 0;
};
Span byte_span(const TensorView& v) {
  Span s;
  for (int d = 0; d < v.ndim; ++d) {
    const __int128 reach = static_cast<__int128>(v.shape[d] - 1) * v.stride[d];
    (reach < 0 ? s.lo : s.hi) += reach;
  }
  const __int128 e = static_cast<__int128>(dtype_size(v.dtype));
  s.lo *= e;
  s.hi = (s.hi + 1) * e;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, std::size_t size) {
  Input in(bytes, size);
  alignas(64) static std::array<uint8_t, 512> buffer{};
  // More slots than kMaxDims; a larger (raw) rank must be refused before the arrays are read.
  constexpr int kSlots = 16;
  std::array<int64_t, kSlots> shape{}, strides{};
  for (int i = 0; i < kSlots; ++i) {
    shape[i] = in.hostile(0, 6);
    strides[i] = in.hostile(-12, 24);
  }
  DLTensor t{};
  t.ndim = in.flag() ? static_cast<int32_t>(in.range(-1, kSlots)) : in.raw<int32_t>();
  t.shape = in.byte() % 16 == 0 ? nullptr : shape.data();
  t.strides = in.flag() ? nullptr : strides.data();
  switch (in.byte() % 5) {
    case 0: t.data = nullptr; break;
    case 1: t.data = buffer.data(); break;
    case 2: t.data = buffer.data() + in.range(1, 63); break;
    case 3: t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(in.raw<uint64_t>())); break;
    default: t.data = reinterpret_cast<void*>(~uintptr_t{0} - static_cast<uintptr_t>(in.range(0, 4096))); break;
  }
  t.byte_offset = in.flag() ? static_cast<uint64_t>(in.hostile(0, 64)) : in.raw<uint64_t>();
  t.dtype.code = in.byte();
  t.dtype.bits = in.pick({uint8_t{8}, uint8_t{16}, uint8_t{32}, uint8_t{64}, in.byte()});
  t.dtype.lanes = in.flag() ? 1 : in.raw<uint16_t>();
  const int32_t device_type = in.flag() ? static_cast<int32_t>(in.range(0, 3)) : in.raw<int32_t>();
  std::memcpy(&t.device.device_type, &device_type, sizeof(device_type));  // values outside the enum too
  t.device.device_id = static_cast<int32_t>(in.hostile(0, 3));

  TensorView v;
  if (rejects([&] { v = from_dlpack(t); })) return 0;

  FUZZ_REQUIRE(t.ndim >= 1 && t.ndim <= kMaxDims && t.shape != nullptr, "accepted rank %d, shape %p", t.ndim,
               static_cast<const void*>(t.shape));
  FUZZ_REQUIRE(v.ndim == t.ndim, "rank %d became %d", t.ndim, v.ndim);
  int64_t elems = 1;
  for (int d = 0; d < v.ndim; ++d) {
    FUZZ_REQUIRE(v.shape[d] == t.shape[d] && v.shape[d] >= 0, "extent %d: %lld became %lld", d,
                 static_cast<long long>(t.shape[d]), static_cast<long long>(v.shape[d]));
    if (t.strides != nullptr)
      FUZZ_REQUIRE(v.shape[d] <= 1 || v.stride[d] == t.strides[d], "stride %d: %lld became %lld", d,
                   static_cast<long long>(t.strides[d]), static_cast<long long>(v.stride[d]));
    FUZZ_REQUIRE(!__builtin_mul_overflow(elems, v.shape[d], &elems), "element count overflows int64");
  }
  FUZZ_REQUIRE(v.numel() == elems, "numel %lld, extents give %lld", static_cast<long long>(v.numel()),
               static_cast<long long>(elems));
  FUZZ_REQUIRE(v.data != nullptr || elems == 0, "null data with %lld elements", static_cast<long long>(elems));
  FUZZ_REQUIRE(v.device.is_cpu() || (v.device.is_cuda() && v.device.index >= 0), "device %s",
               to_string(v.device).c_str());
  if (elems > 0) {
    const Span s = byte_span(v);
    const __int128 base = static_cast<__int128>(reinterpret_cast<uintptr_t>(v.data));
    FUZZ_REQUIRE(s.hi - s.lo <= std::numeric_limits<int64_t>::max(), "byte span past int64");
    FUZZ_REQUIRE(base + s.lo >= 0 && base + s.hi <= static_cast<__int128>(~uintptr_t{0}) + 1,
                 "the view's bytes wrap the address space (data %p, %s)", v.data, v.describe().c_str());
  }
  static_cast<void>(v.describe());
  static_cast<void>(v.is_contiguous());
  DLManagedTensor* m = to_dlpack(v);
  const TensorView w = from_dlpack(*m);
  FUZZ_REQUIRE(w.data == v.data && w.ndim == v.ndim && w.dtype == v.dtype && w.device == v.device,
               "round trip changed %s into %s", v.describe().c_str(), w.describe().c_str());
  for (int d = 0; d < v.ndim; ++d)
    FUZZ_REQUIRE(w.shape[d] == v.shape[d] && (v.shape[d] <= 1 || w.stride[d] == v.stride[d]),
                 "round trip changed %s into %s", v.describe().c_str(), w.describe().c_str());
  m->deleter(m);
  return 0;
}
