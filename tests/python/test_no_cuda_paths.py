# SPDX-License-Identifier: Apache-2.0
"""What a machine without a CUDA device says (issue 52): every CUDA path ends in one sentence naming what
is missing and what runs instead, never a traceback from deep inside torch or the CUDA runtime."""
import os
import subprocess
import sys

import pytest

import mla

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
no_device = pytest.mark.skipif(mla.cuda_device_count() > 0, reason="a CUDA device is present")


def _torch_without_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device")
    return torch


def _run(args):
    return subprocess.run([sys.executable] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300, env=dict(os.environ))


@no_device
def test_empty_on_cuda_without_a_device():
    with pytest.raises(ValueError) as e:
        mla.empty([4], mla.DType.bf16, "cuda")
    msg = str(e.value)
    if mla.built_with_cuda():
        assert "no CUDA device" in msg and "cuda:0" in msg, msg
        assert "driver version is insufficient" not in msg, msg
    else:
        assert "no CUDA backend" in msg, msg


@no_device
def test_empty_on_a_missing_device_index():
    with pytest.raises(ValueError, match="cuda:3" if mla.built_with_cuda() else "no CUDA backend"):
        mla.empty([4], mla.DType.f32, "cuda:3")


def test_bench_module_says_what_runs_instead():
    """test_bench_cli.py checks the exit and the missing piece; here, the pointer to what runs without a GPU."""
    _torch_without_cuda()
    if not mla.built_with_cuda():
        pytest.skip("an mla built without CUDA stops at that first")
    r = _run(["-m", "mla.bench", "--iters", "1"])
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "no CUDA device" in r.stderr and "mla run --backend cpu" in r.stderr, r.stderr


def test_flash_mla_script_cuda_without_cuda():
    _torch_without_cuda()
    r = _run([os.path.join(ROOT, "examples", "flash_mla_api_script.py"), "--device", "cuda", "--quick"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "--device cuda" in r.stderr and "no CUDA device" in r.stderr and "--device cpu" in r.stderr, r.stderr
