# SPDX-License-Identifier: Apache-2.0
"""`python -m mla.bench` without a usable CUDA device says what is missing and exits 2 (no traceback)."""
import os
import subprocess
import sys

import pytest

import mla

torch = pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")


@pytest.mark.skipif(mla.built_with_cuda() and torch.cuda.is_available(), reason="a CUDA device is present: "
                    "the benchmark would run (scripts/py_gpu_check.sh bench runs it)")
def test_bench_without_cuda_says_what_is_missing():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(mla.__file__))) + os.pathsep + \
        env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "mla.bench", "--only", "merge"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    want = "built without CUDA" if not mla.built_with_cuda() else "sees no CUDA device"
    assert want in r.stderr, r.stderr
