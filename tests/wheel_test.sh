#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest python.wheel: `pip wheel` of the checkout (the in-tree backend, pep517/mla_build.py),
# installed into a fresh virtual environment (--system-site-packages: Debian's numpy, pytest and torch
# stay visible), then `import mla` and the Python test suite against the installed package, with no
# PYTHONPATH into the build tree.
# Usage: tests/wheel_test.sh SOURCE_DIR BUILD_DIR WORK PYTHON
#   BUILD_DIR: the configured build whose extension the wheel packs (the backend's build-dir setting:
#   it builds the target mla_python there, which ctest finds up to date, instead of a second build).
set -euo pipefail
src=$1 build=$2 work=$3 python=$4
rm -rf "$work"
mkdir -p "$work"
unset PYTHONPATH
export PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
"$python" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
t0=$(date +%s)
"$py" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" --config-settings "build-dir=$build" "$src" \
  >"$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; exit 1; }
wheel=$(ls "$work"/dist/mla-*.whl)
echo "built $(basename "$wheel") in $(($(date +%s) - t0)) s"
"$py" -m pip install --no-deps "$wheel" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
# The package must come from the environment, not from the checkout or the build tree.
cd "$work"
"$py" -c "import mla, sys; print('mla', mla.__version__, 'from', mla.__file__); assert mla.__file__.startswith(sys.prefix), mla.__file__"
# pip's output captured first: `pip show | grep -q` fails under pipefail when grep exits before pip has written.
show=$("$py" -m pip show mla)
grep -q "^Version: $("$py" -c 'import mla; print(mla.__version__)')$" <<<"$show"
"$py" -m pytest -q -p no:cacheprovider "$src/tests/python"
