// SPDX-License-Identifier: Apache-2.0
#pragma once
// Register arrays and global-memory moves of whole chunks. A "chunk" is a small fixed number of
// consecutive elements one thread moves; the memory-bound kernels of this library stream rows as
// chunks so that a warp's accesses are contiguous (coalesced) and each thread issues 16-byte
// loads/stores (LDG.128 / STG.128) when the addresses allow it.
//
// Every move comes in two flavours selected by a compile-time flag:
//   kVec = true   the chunk is whole and its address is aligned to the chunk's byte size (capped at
//                 16): moved with the widest vector instructions (callers check alignment on the host);
//   kVec = false  element by element, only the first `n` elements (partial chunks at the end of rows
//                 whose width is not a multiple of the chunk, or misaligned views).
#include <cstdint>

namespace mla::cuda::dev {

template <class T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Array {
  T v[N];
};

namespace detail {
// Widest power-of-two access (<= 16 bytes) that divides `bytes`.
template <int kBytes>
inline constexpr int kUnit = kBytes % 16 == 0 ? 16 : kBytes % 8 == 0 ? 8 : kBytes % 4 == 0 ? 4 : kBytes % 2 == 0 ? 2 : 1;

template <int kUnitBytes>
struct UnitType;
template <> struct UnitType<16> { using type = uint4; };
template <> struct UnitType<8> { using type = uint2; };
template <> struct UnitType<4> { using type = uint32_t; };
template <> struct UnitType<2> { using type = uint16_t; };
template <> struct UnitType<1> { using type = uint8_t; };
}  // namespace detail

// Read-only load of an aligned block of kBytes (through the non-coherent path: inputs are never
// written by the same kernel).
template <int kBytes>
__device__ __forceinline__ void load_bytes(void* dst, const void* src) {
  constexpr int kU = detail::kUnit<kBytes>;
  using U = typename detail::UnitType<kU>::type;
  auto* d = static_cast<U*>(dst);
  const auto* s = static_cast<const U*>(src);
#pragma unroll
  for (int i = 0; i < kBytes / kU; ++i) d[i] = __ldg(s + i);
}

template <int kBytes>
__device__ __forceinline__ void store_bytes(void* dst, const void* src) {
  constexpr int kU = detail::kUnit<kBytes>;
  using U = typename detail::UnitType<kU>::type;
  auto* d = static_cast<U*>(dst);
  const auto* s = static_cast<const U*>(src);
#pragma unroll
  for (int i = 0; i < kBytes / kU; ++i) d[i] = s[i];
}

// Loads a chunk of N elements starting at p (n <= N valid elements when !kVec).
template <bool kVec, class T, int N>
__device__ __forceinline__ void load_chunk(Array<T, N>& a, const T* p, int n) {
  if constexpr (kVec) {
    load_bytes<sizeof(T) * N>(a.v, p);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (i < n) a.v[i] = p[i];
  }
}

template <bool kVec, class T, int N>
__device__ __forceinline__ void store_chunk(T* p, const Array<T, N>& a, int n) {
  if constexpr (kVec) {
    store_bytes<sizeof(T) * N>(p, a.v);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (i < n) p[i] = a.v[i];
  }
}

// Byte-wise copy for addresses of unknown alignment (the !kVec paths of byte-addressed records).
__device__ __forceinline__ void copy_bytes(void* dst, const void* src, int n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (int i = 0; i < n; ++i) d[i] = s[i];
}

// True when `p` (a host-side address or byte offset) is a multiple of `align` bytes.
__host__ __device__ inline bool aligned_to(const void* p, int64_t align) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align) == 0;
}

}  // namespace mla::cuda::dev
