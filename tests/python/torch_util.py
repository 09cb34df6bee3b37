# SPDX-License-Identifier: Apache-2.0
"""Helpers of the torch-based tests: the devices to run on, and float64 torch references over the
dequantised cache (FlashMLA's tests/ref.py formulation: gather rows, softmax in float64)."""
import numpy as np
import pytest
import torch

import mla
from conftest import cache_rows

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and mla.cuda_device_count() > 0 else [])
needs_cuda = pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA device (or mla built without CUDA)")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def rows_of(cache_tensor, fmt, scale=1.0):
    """Dequantised [num_slots, 576] float64 rows of a torch cache tensor (any device)."""
    t = cache_tensor.detach().cpu()
    if t.dim() == 4:
        t = t.squeeze(2)
    if fmt == mla.CacheFormat.bf16:
        return t.reshape(-1, t.size(-1)).double()
    if t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    c = mla.KVCache(t, fmt, scale, 576, 64)
    return torch.from_numpy(cache_rows(c))


def kernel_rows(rows, fmt, device, family):
    """The key rows the op that just ran read, as float64: the dequantised rows themselves (exact codes), or,
    where the kernel that ran reads fp8_ds_mla records as their bf16 upconvert (the CUDA sm90_seesaw and sm90_convert
    variants: docs/SEMANTICS.md §14.9), those rows rounded once to bf16. `family`: "mqa_decode" or "sparse_mqa"."""
    if device == "cuda" and fmt == mla.CacheFormat.fp8_ds_mla and mla.last_variant(family) in ("sm90_seesaw", "sm90_convert"):
        return rows.float().bfloat16().double()
    return rows


def ref_attention(q, k, v, scale, valid):
    """q [T, h, d] float64, k [T, m, d], v [T, m, dv], valid [T, m] bool -> out [T, h, dv], lse [T, h]
    (out 0 and lse -inf where no key is valid)."""
    s = torch.einsum("thd,tmd->thm", q, k) * scale
    s = s.masked_fill(~valid.unsqueeze(1), -np.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return torch.einsum("thm,tmv->thv", p, v), lse


def assert_bf16_close(out, ref, what="out"):
    """FlashMLA's tolerance for bf16 outputs: elementwise within 8e-3 abs / 2.01e-2 rel of float64."""
    diff = (out.double().cpu() - ref.cpu()).abs()
    bound = 8e-3 + 2.01e-2 * ref.cpu().abs()
    assert bool((diff <= bound).all()), f"{what}: max diff {diff.max().item():.3g}"
