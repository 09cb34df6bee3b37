# SPDX-License-Identifier: Apache-2.0
"""examples/flash_mla_api_script.py: a script written against FlashMLA's Python API, run unchanged with
``import mla.compat.flash_mla as flash_mla``, checks itself against float64 references (exit 0 = all match).
Here it runs its small case list (--quick) on each device; scripts/py_gpu_check.sh runs the full list on
cuda. Also: our compat signatures are
FlashMLA's (argument names, order, defaults)."""
import inspect
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")
import mla.compat.flash_mla as flash_mla  # noqa: E402
from torch_util import DEVICES  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "flash_mla_api_script.py")
E = inspect.Parameter.empty

# deepseek-ai/FlashMLA flash_mla/flash_mla_interface.py (2026-04 head): (name, default) in order.
FLASH_MLA_SIGNATURES = {
    "get_mla_metadata": [("args", E), ("kwargs", E)],
    "flash_mla_with_kvcache": [
        ("q", E), ("k_cache", E), ("block_table", E), ("cache_seqlens", E), ("head_dim_v", E),
        ("tile_scheduler_metadata", E), ("num_splits", None), ("softmax_scale", None), ("causal", False),
        ("is_fp8_kvcache", False), ("indices", None), ("attn_sink", None), ("extra_k_cache", None),
        ("extra_indices_in_kvcache", None), ("topk_length", None), ("extra_topk_length", None)],
    "flash_mla_sparse_fwd": [("q", E), ("kv", E), ("indices", E), ("sm_scale", E), ("d_v", 512),
                             ("attn_sink", None), ("topk_length", None)],
}


@pytest.mark.parametrize("name", sorted(FLASH_MLA_SIGNATURES))
def test_signature_is_flash_mla(name):
    params = inspect.signature(getattr(flash_mla, name)).parameters.values()
    assert [(p.name, p.default) for p in params] == FLASH_MLA_SIGNATURES[name]


def test_sched_meta_fields():
    meta, none = flash_mla.get_mla_metadata(torch.ones(2, dtype=torch.int32), 16, 1)
    assert none is None and not meta.have_initialized and meta.config is None
    assert [f.name for f in flash_mla.FlashMLASchedMeta.Config.__dataclass_fields__.values()] == [
        "b", "s_q", "h_q", "page_block_size", "h_k", "causal", "is_fp8_kvcache", "topk", "extra_page_block_size",
        "extra_topk"]


@pytest.mark.parametrize("device", DEVICES)
def test_flash_mla_api_script(device):
    args = [sys.executable, SCRIPT, "--device", device, "--quick"]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:]
    assert " 0 failed" in r.stdout
