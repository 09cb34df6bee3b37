# SPDX-License-Identifier: Apache-2.0
"""Drop-in entry points with the upstream signatures (need torch):
``mla.compat.flash_mla`` (FlashMLA's Python API) and ``mla.compat.vllm`` (vLLM's MLA cache, merge and
index ops). Import the submodule you need, e.g. ``import mla.compat.flash_mla as flash_mla``."""
