# SPDX-License-Identifier: Apache-2.0
"""The binding's conversions: DLPack import from NumPy, torch, capsules and foreign __dlpack__
objects (zero copy, strides kept), mla.Tensor export, devices, enums and error mapping."""
import numpy as np
import pytest

import mla
from conftest import L, R, bf16_decode, bf16_round

try:
    import torch
except ImportError:  # CI without python3-torch: the torch cases skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class ForeignArray:
    """A producer that only speaks the DLPack protocol (as CuPy or JAX arrays do)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_gemm_zero_copy_from_numpy_views(rng):
    a = rng.standard_normal((7, 5))
    b_full = rng.standard_normal((9, 6))
    b = b_full[:5, ::2]  # strided view: column stride 2
    c = np.full((7, 3), np.nan)
    mla.gemm(a, b, c, precision=mla.Precision.reference)
    np.testing.assert_allclose(c, a @ b, rtol=1e-13, atol=1e-13)
    ct = np.full((3, 7), np.nan).T  # transposed output view: written in place through its strides
    mla.gemm(a, b, ct, precision=mla.Precision.reference)
    np.testing.assert_allclose(ct, a @ b, rtol=1e-13, atol=1e-13)


def test_foreign_dlpack_object_and_capsule(rng):
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    c = np.zeros((4, 2))
    mla.gemm(ForeignArray(a), b.__dlpack__(), ForeignArray(c), precision=mla.Precision.reference)
    np.testing.assert_allclose(c, a @ b, rtol=1e-13)


def test_mla_tensor_exports_zero_copy():
    t = mla.zeros([2, 3], mla.DType.f32)
    assert t.shape == (2, 3) and t.dtype == mla.DType.f32 and str(t.device) == "cpu"
    view = t.numpy()
    view[1, 2] = 5.0
    assert np.from_dlpack(t)[1, 2] == 5.0
    mla.fill(t, 2.0)
    assert (view == 2.0).all()
    assert mla.empty([4], "bf16").numpy().dtype == np.uint16


@needs_torch
def test_torch_tensors_bf16_and_export():
    a = torch.randn(6, 4, dtype=torch.float64)
    b = torch.randn(4, 5, dtype=torch.float64)
    c = torch.full((6, 5), float("nan"), dtype=torch.float64)
    mla.gemm(a, b, c, precision=mla.Precision.reference)
    torch.testing.assert_close(c, a @ b, rtol=1e-12, atol=1e-12)
    cache = mla.allocate_cache(mla.CacheFormat.bf16, 2, 4)
    kv = torch.randn(3, L, dtype=torch.bfloat16)
    pe = torch.randn(3, R, dtype=torch.bfloat16)
    mla.write_cache(kv, pe, torch.tensor([0, 5, 7]), cache)
    t = torch.from_dlpack(cache.data)  # the cache, seen by torch without a copy
    assert t.dtype == torch.bfloat16 and t.shape == (2, 4, 576)
    assert torch.equal(t.view(8, 576)[5, :L], kv[1]) and torch.equal(t.view(8, 576)[7, L:], pe[2])
    w = torch.randn(3, 3, requires_grad=True)  # autograd leaves are read through a detached view
    out = torch.zeros(3, 3)
    mla.gemm(w, w, out, precision=mla.Precision.reference)
    torch.testing.assert_close(out, (w @ w).detach())


def test_errors_map_to_value_and_type_error(rng):
    c = np.zeros((2, 2))
    with pytest.raises(TypeError, match="expected a tensor"):
        mla.gemm("a", c, c)
    with pytest.raises(TypeError, match="unsupported dtype"):
        mla.gemm(np.zeros((2, 2), np.int16), c, c)
    with pytest.raises(ValueError, match="gemm"):
        mla.gemm(np.zeros((2, 3)), np.zeros((2, 2)), c)
    with pytest.raises(TypeError, match="device"):
        mla.allocate_cache(mla.CacheFormat.bf16, 1, 1, device="tpu")
    with pytest.raises(TypeError, match="unexpected keyword"):
        mla.PlannerConfig(pages=3)


def test_bad_write_writes_nothing(rng):
    cache = mla.allocate_cache(mla.CacheFormat.bf16, 2, 4)
    mla.fill(cache.data, float("nan"))
    kv, pe = rng.standard_normal((3, L)), rng.standard_normal((3, R))
    with pytest.raises(ValueError, match="outside the cache"):
        mla.write_cache(kv, pe, np.array([0, 1, 8]), cache)
    assert np.isnan(bf16_decode(cache.data.numpy())).all()
    mla.write_cache(kv, pe, np.array([0, -1, 7]), cache)
    rows = bf16_decode(cache.data.numpy()).reshape(8, 576)
    np.testing.assert_array_equal(rows[0, :L], bf16_round(kv[0]))
    np.testing.assert_array_equal(rows[7, L:], bf16_round(pe[2]))
    assert np.isnan(rows[1:7]).all()


def test_devices_enums_and_sizes():
    assert mla.Device("cuda:3").index == 3 and mla.Device("cpu") == mla.Device("cpu")
    assert mla.cache_entry_bytes(mla.CacheFormat.fp8_ds_mla) == 656
    assert mla.cache_entry_bytes(mla.CacheFormat.bf16) == 1152
    assert mla.cache_dtype(mla.CacheFormat.fp8) == mla.DType.fp8_e4m3
    c = mla.allocate_cache(mla.CacheFormat.fp8_ds_mla, 3, 5)
    assert c.data.shape == (3, 5, 656) and c.num_slots == 15 and c.d_latent == 512
    c.validate()
    ext = mla.KVCache(np.zeros((2, 4, 576), np.uint8), mla.CacheFormat.fp8, scale=0.5)
    assert ext.page_size == 4 and ext.scale == 0.5
    with pytest.raises(ValueError):
        mla.KVCache(np.zeros((2, 4, 500), np.uint8), mla.CacheFormat.fp8_ds_mla).validate()
    assert isinstance(mla.built_with_cuda(), bool) and mla.cuda_device_count() >= 0
    for fam in mla.variant_families():
        assert [v.name for v in mla.list_variants(fam)]


def test_extension_exports_only_its_init():
    """_mla.so exports PyInit__mla alone (python/src/mla_python.map): no libstdc++ or library symbol of
    mla's can interpose on another extension's (the torch 2.11 import abort, docs/PYTHON.md)."""
    import shutil
    import subprocess
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    out = subprocess.run([nm, "-D", "--defined-only", mla._mla.__file__], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-2] in "TWVDBRiu"]
    assert names == ["PyInit__mla"], names[:20]
