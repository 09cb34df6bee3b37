# SPDX-License-Identifier: Apache-2.0
"""The PEP 517 build backend of the `mla` wheel (pyproject.toml: build-backend "mla_build", backend-path
"pep517"). Standard library only, so that `pip wheel .` and `pip install .` work offline, with or
without build isolation: nothing is downloaded, CMake and the compilers come from the system.

build_wheel configures the checkout with CMake (Release, no tests, the Python extension for the
interpreter running the backend), builds the target mla_python (the extension with the whole library
linked in statically), and zips the package: python/mla/ (pure-Python files and stubs, from the source
tree), the extension from the build tree, and mla-<version>.dist-info (METADATA, WHEEL, RECORD with
sha256 hashes, LICENSE). The version is project(mla VERSION ...) of CMakeLists.txt, the one source.

Settings, as pip --config-settings KEY=VALUE (or the environment variable):
  cmake.args   (MLA_CMAKE_ARGS)       extra CMake configure arguments, shell-quoted, e.g.
                                      "-DMLA_WITH_CUDA=OFF" or "-DMLA_CUDA_ARCHS=90a" (the wheel's
                                      default is MLA_CUDA_ARCHS=fat: sm_80 ... sm_120, sm_90a, PTX)
  build-dir    (MLA_WHEEL_BUILD_DIR)  the CMake build directory (default: build-wheel/ in the checkout,
                                      kept between builds). A directory that is already configured is
                                      built as it is (no configure unless cmake.args are given): the
                                      wheel then packs that build's extension, which must be for this
                                      interpreter (its file name says so; checked).
"""
import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "mla"
SUMMARY = ("DeepSeek Multi-head Latent Attention (dense and sparse MLA) for LLM serving: C++20/CUDA kernels "
           "with a float64 CPU oracle, Python bindings over DLPack, torch custom ops")


def _log(msg):
    print(f"[mla_build] {msg}", file=sys.stderr, flush=True)


def _version():
    text = open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(\s*mla\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", text)
    if not m:
        raise RuntimeError("mla_build: no `project(mla VERSION x.y.z ...)` line in CMakeLists.txt")
    return m.group(1)


def _setting(config_settings, key, env):
    value = (config_settings or {}).get(key)
    if value is None:
        value = os.environ.get(env)
    return value


def _cmake_args(config_settings):
    value = _setting(config_settings, "cmake.args", "MLA_CMAKE_ARGS")
    if value is None:
        return []
    if isinstance(value, (list, tuple)):  # a setting given several times
        return [a for v in value for a in shlex.split(v)]
    return shlex.split(value)


def _tag():
    """The wheel tag of the running interpreter: the extension is built for exactly this one."""
    if sys.implementation.name != "cpython":
        raise RuntimeError(f"mla_build: CPython is needed (the pybind11 extension), not {sys.implementation.name}")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{py}{sys.abiflags}-{plat}"


def _dist_info_name():
    return f"{NAME}-{_version()}.dist-info"


def _metadata():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        f"Summary: {SUMMARY}",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        "Classifier: License :: OSI Approved :: Apache Software License",
        "Classifier: Programming Language :: C++",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Environment :: GPU :: NVIDIA CUDA",
        "Description-Content-Type: text/markdown",
    ]
    return "\n".join(lines) + "\n\n" + readme


def _wheel_file():
    return (f"Wheel-Version: 1.0\nGenerator: mla_build {_version()}\nRoot-Is-Purelib: false\n"
            f"Tag: {_tag()}\n")


def _write_dist_info(directory):
    info = os.path.join(directory, _dist_info_name())
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file())
    shutil.copyfile(os.path.join(ROOT, "LICENSE"), os.path.join(info, "LICENSE"))
    return os.path.basename(info)


def _run(cmd):
    _log(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def _build_extension(config_settings):
    """Configures (when needed) and builds mla_python; returns the path of the built extension."""
    build_dir = _setting(config_settings, "build-dir", "MLA_WHEEL_BUILD_DIR") or os.path.join(ROOT, "build-wheel")
    build_dir = os.path.abspath(build_dir)
    args = _cmake_args(config_settings)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("mla_build: cmake not found on PATH (Debian: apt-get install cmake; scripts/setup.sh)")
    configured = os.path.exists(os.path.join(build_dir, "CMakeCache.txt"))
    if not configured or args:
        cmd = [cmake, "-S", ROOT, "-B", build_dir]
        if not configured:
            if shutil.which("ninja"):
                cmd += ["-G", "Ninja"]
            cmd += ["-DCMAKE_BUILD_TYPE=Release", "-DMLA_BUILD_TESTS=OFF", "-DMLA_WITH_PYTHON=ON",
                    f"-DPython3_EXECUTABLE={sys.executable}"]
            if not any(a.startswith("-DMLA_CUDA_ARCHS") for a in args):
                cmd.append("-DMLA_CUDA_ARCHS=fat")  # a wheel runs on any GPU from sm_80 (CMakeLists.txt)
        _run(cmd + args)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run([cmake, "--build", build_dir, "--target", "mla_python", "-j", jobs])
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    ext = os.path.join(build_dir, "python", NAME, "_mla" + suffix)
    if not os.path.exists(ext):
        found = [f for f in os.listdir(os.path.join(build_dir, "python", NAME)) if f.startswith("_mla.")] \
            if os.path.isdir(os.path.join(build_dir, "python", NAME)) else []
        raise RuntimeError(f"mla_build: the build in {build_dir} made no extension _mla{suffix} for this "
                           f"interpreter ({sys.executable}); it has {found or 'none'} (Python package off? "
                           "another interpreter? use a fresh build-dir)")
    return ext


def _package_files():
    """(path in the wheel, source path) of the pure-Python package: every file of python/mla/ but caches."""
    src = os.path.join(ROOT, "python", NAME)
    out = []
    for d, dirs, files in os.walk(src):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".pyc", ".pyo")) or (f.startswith("_mla.") and f != "_mla.pyi"):  # the stub ships
                continue
            full = os.path.join(d, f)
            out.append((os.path.relpath(full, os.path.join(ROOT, "python")).replace(os.sep, "/"), full))
    return out


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _zip_write(zf, arcname, data, mode=0o644):
    zi = zipfile.ZipInfo(arcname, date_time=time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6])
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.external_attr = (0o100000 | mode) << 16
    zf.writestr(zi, data)


# ---- PEP 517 hooks ---------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []  # CMake, a C++ compiler, pybind11 and the libraries come from the system (scripts/setup.sh)


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    ext = _build_extension(config_settings)
    files = _package_files() + [(f"{NAME}/{os.path.basename(ext)}", ext)]
    with tempfile.TemporaryDirectory() as tmp:
        info = _write_dist_info(tmp)
        for f in ("METADATA", "WHEEL", "LICENSE"):
            files.append((f"{info}/{f}", os.path.join(tmp, info, f)))
        name = f"{NAME}-{_version()}-{_tag()}.whl"
        path = os.path.join(wheel_directory, name)
        record = []
        with zipfile.ZipFile(path, "w") as zf:
            for arcname, src in files:
                data = open(src, "rb").read()
                _zip_write(zf, arcname, data, 0o755 if arcname.endswith(".so") else 0o644)
                record.append(_record_line(arcname, data))
            record.append(f"{info}/RECORD,,")
            _zip_write(zf, f"{info}/RECORD", ("\n".join(record) + "\n").encode())
    _log(f"wrote {path}")
    return name


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of the checkout (git ls-files) plus PKG-INFO, as mla-<version>.tar.gz."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, stdout=subprocess.PIPE).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"mla_build: an sdist is made from a git checkout (git ls-files failed: {e})")
    base = f"{NAME}-{_version()}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for rel in sorted(p for p in listed.decode().split("\0") if p):
            if os.path.isfile(os.path.join(ROOT, rel)):
                tf.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}", recursive=False)
        with tempfile.NamedTemporaryFile("w", delete=False, encoding="utf-8") as f:
            f.write(_metadata())
        try:
            tf.add(f.name, arcname=f"{base}/PKG-INFO")
        finally:
            os.unlink(f.name)
    return name
