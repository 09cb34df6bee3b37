// TEMPORARY: CUDA entry points not written yet. Each throws mla::Error so that a CUDA build links and
// the CPU backend works; the helper implementing an op deletes its function here. This file must be
// empty (deleted) before issue 3 is closed.
#include "cuda/cuda_ops.h"
#include "mla/error.h"

namespace mla::cuda {


}  // namespace mla::cuda
