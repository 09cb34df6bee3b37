# SPDX-License-Identifier: Apache-2.0
"""mla: DeepSeek Multi-head Latent Attention for Python (docs/PYTHON.md).

The C++ library's public API (include/mla/*.h) under the same names: cache allocation and formats,
the functional ops, the planner and step plan, MlaAttention, kernel variants. Tensors are taken
zero-copy through DLPack from torch, NumPy (CPU) or any object with ``__dlpack__``; CUDA work runs on
the ``stream=`` given, else on torch's current stream. ``mla.Error``-style failures raise ValueError
(bad values, shapes, dtypes) or TypeError (arguments that are not tensors / devices), with the
library's message; nothing is written when an op raises.

Submodules: ``mla.ops`` (torch custom ops, import needs torch), ``mla.compat.flash_mla`` and
``mla.compat.vllm`` (drop-in entry points with the upstream signatures).
"""
from ._mla import *  # noqa: E402,F401,F403  (the binding's names are the package's API)
from ._mla import __doc__ as _binding_doc  # noqa: E402,F401
from ._mla import __version__  # noqa: E402,F401  (CMake's project version, compiled into the extension)


def oracle_layer_options(dims, cache_format=None, sparse=False):
    """LayerOptions of the float64 oracle layer (CPU, f64 weights and activations); run its forward
    with ``precision=mla.Precision.reference``."""
    opt = LayerOptions(dims=dims, sparse=sparse, device="cpu", dtype="f64")  # noqa: F405
    if cache_format is not None:
        opt.cache_format = cache_format
    return opt
