// SPDX-License-Identifier: Apache-2.0
#pragma once
// Backend dispatch for the op front ends: validated arguments go to mla::cpu:: or mla::cuda::.
#include "core/check.h"
#include "cpu/cpu_ops.h"
#if MLA_WITH_CUDA
#include "cuda/cuda_ops.h"
#define MLA_DISPATCH(device, fn, ...)                            \
  do {                                                           \
    ::mla::detail::check_contexts(#fn, __VA_ARGS__);             \
    if ((device).is_cuda()) ::mla::cuda::fn(__VA_ARGS__);        \
    else ::mla::cpu::fn(__VA_ARGS__);                            \
  } while (0)
#else
#define MLA_DISPATCH(device, fn, ...)                                                              \
  do {                                                                                             \
    ::mla::detail::check_contexts(#fn, __VA_ARGS__);                                               \
    if ((device).is_cuda()) throw ::mla::Error(#fn ": CUDA tensor given, but this build of mla has no CUDA backend"); \
    ::mla::cpu::fn(__VA_ARGS__);                                                                   \
  } while (0)
#endif
