# SPDX-License-Identifier: Apache-2.0
"""One version source: mla.__version__ is the project(mla VERSION ...) of CMakeLists.txt, compiled into
the extension (mla/version.h), not a second copy in the Python files."""
import os
import re

import mla

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_version_is_the_cmake_project_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    want = re.search(r"project\(\s*mla\s+VERSION\s+([0-9.]+)", text).group(1)
    assert mla.__version__ == want
    assert mla._mla.__version__ == want  # the extension carries it; the package re-exports it


def test_no_python_file_spells_the_version():
    pkg = os.path.join(ROOT, "python", "mla")
    for d, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                src = open(os.path.join(d, f)).read()
                assert not re.search(r"__version__\s*=\s*['\"]", src), f"{f} hard-codes __version__"
