# SPDX-License-Identifier: Apache-2.0
"""The 20-line decode example of docs/PYTHON.md runs as printed (CPU here, CUDA where present)."""
import os
import re

import pytest

pytest.importorskip("torch", reason="torch is not installed (MLA_SETUP_TORCH=0)")

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "PYTHON.md")


def test_decode_example_runs(capsys):
    text = open(DOC).read()
    section = text[text.index("## A decode step in 20 lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 20
    exec(compile(code, "docs/PYTHON.md", "exec"), {})
    norm = float(capsys.readouterr().out.strip().split("(")[-1].rstrip(")").split(",")[0])
    assert norm > 0 and norm == norm  # a finite, non-zero attention output
