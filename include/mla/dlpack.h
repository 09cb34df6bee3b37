// SPDX-License-Identifier: Apache-2.0
#pragma once
// DLPack interoperability (import any DLPack producer's tensor as a view; export a view).
// Only this header and src/core/dlpack.cpp see DLPack types: kernels and other headers do not.
#include "mla/tensor.h"

// DLTensor is an anonymous-struct typedef in every DLPack version, so it cannot be forward-declared.
// MLA_DLPACK_HEADER (set by CMake) names PyTorch's copy by absolute path where Debian's is absent.
#ifdef MLA_DLPACK_HEADER
#include MLA_DLPACK_HEADER
#else
#include <dlpack/dlpack.h>
#endif

namespace mla {

// View of a DLPack tensor (no copy; lifetime stays with the producer). Throws mla::Error for dtypes
// or devices the library does not support. A null `strides` means contiguous, per the DLPack spec.
TensorView from_dlpack(const DLTensor& t);
TensorView from_dlpack(const DLManagedTensor& t);

// Export a view. The returned object does not own the memory: its deleter frees only the wrapper,
// so `owner` (optional) is kept alive until the consumer calls the deleter.
DLManagedTensor* to_dlpack(const TensorView& v, std::shared_ptr<void> owner = nullptr);

}  // namespace mla
