# SPDX-License-Identifier: Apache-2.0
"""python/mla/_mla.pyi, the type stub of the native extension mla._mla, against the module itself: every
public name of the module is in the stub and every name of the stub in the module; functions and methods
have the module's parameter names in the module's order (pybind11 writes them into each docstring); every
function and class of the stub has a docstring, and those of the functional ops name shapes.

The stub is generated from the module: after changing the binding, run
    PYTHONPATH=build/python python3 tests/python/test_stub.py --write
and review the diff (docstrings come from the binding; parameter types are the binding's, tensors as
``TensorLike``)."""
import ast
import inspect
import os
import re
import sys

import pytest

import mla
from mla import _mla

STUB = os.path.join(os.path.dirname(__file__), "..", "..", "python", "mla", "_mla.pyi")
SIG = re.compile(r"^(?:\d+\. )?(\w+)\((.*)\)(?: -> (.+))?$")
PROP = re.compile(r"^\(.*\) -> (.+)$")
# The functional ops and the DCP ops: their docstrings give every tensor's shape.
SHAPED = ["write_cache", "gather_cache", "cp_gather_cache", "upconvert_ds_mla", "merge_attn_states",
          "convert_topk_indices", "mqa_decode", "mha_prefill", "sparse_mqa", "gemm", "bmm", "dcp_mqa_decode",
          "dcp_sparse_mqa", "dcp_compact_topk"]


def _public(obj):
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def _split_params(text):
    """Top-level comma split of a pybind11 parameter list (types hold brackets and commas)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(<{":
            depth += 1
        elif ch in "])>}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def signatures(fn):
    """[(params, returns)] of a pybind11 function or method from its docstring (one per overload);
    params are (name, type, default) with '*' for the keyword-only marker; [] when not introspectable."""
    doc = getattr(fn, "__doc__", None) or ""
    name = getattr(fn, "__name__", "")
    sigs = []
    for line in doc.splitlines():
        m = SIG.match(line.strip())
        if not m or m.group(1) != name or m.group(2) == "*args, **kwargs":
            continue
        params = []
        for p in _split_params(m.group(2)):
            if p == "*":
                params.append(("*", None, None))
                continue
            head, _, default = p.partition(" = ")
            pname, _, ptype = head.partition(": ")
            params.append((pname.strip(), ptype.strip(), default or None))
        sigs.append((params, m.group(3)))
    return sigs


def _doc_body(fn):
    """The docstring without pybind11's signature lines."""
    doc = getattr(fn, "__doc__", None) or ""
    lines = [ln for ln in doc.splitlines()
             if not SIG.match(ln.strip()) and ln.strip() not in ("Overloaded function.",)]
    return "\n".join(lines).strip()


# ---- the generator -----------------------------------------------------------------------------------

def _type(t):
    if not t:
        return "Any"
    # "Tensor" alone is the binding's argument caster (any DLPack object); "mla._mla.Tensor" the class.
    t = re.sub(r"(?<![\w.])Tensor\b", "TensorLike", t).replace("mla._mla.", "")
    t = t.replace("numpy.ndarray", "Any").replace("capsule", "Any").replace("object", "Any")
    t = t.replace("handle", "Any").replace("kwargs", "Any").replace("args", "Any")
    if "::" in t or "<" in t:
        return "Any"
    return t


def _params(params, method):
    out = []
    for i, (n, t, d) in enumerate(params):
        if n == "*":
            out.append("*")
        elif method and i == 0 and n == "self":
            out.append("self")
        elif n.startswith("**"):
            out.append(f"{n}: Any")
        elif n.startswith("*"):
            out.append(f"{n}: Any")
        else:
            out.append(f"{n}: {_type(t)}" + (" = ..." if d is not None else ""))
    return ", ".join(out)


def _docstring(body, indent):
    if not body:
        return ""
    body = body.replace('"""', "'''").replace("\\", "\\\\")
    lines = body.splitlines()
    pad = " " * indent
    return pad + '"""' + ("\n" + pad).join(lines) + '"""\n'


def _function(fn, indent, method=False, name=None):
    pad = " " * indent
    name = name or fn.__name__
    sigs = signatures(fn)
    out = ""
    if not sigs:
        return f"{pad}def {name}(*args: Any, **kwargs: Any) -> Any:\n{_docstring(_doc_body(fn), indent + 4) or pad + '    ...'}\n"
    for params, ret in sigs:
        if len(sigs) > 1:
            out += f"{pad}@overload\n"
        body = _docstring(_doc_body(fn), indent + 4) or f"{pad}    ...\n"
        out += f"{pad}def {name}({_params(params, method)}) -> {_type(ret) if ret else 'None'}:\n{body}"
    return out


def _is_enum(cls):
    return hasattr(cls, "__members__") and hasattr(cls, "value")


def _class(name, cls):
    out = f"class {name}:\n"
    out += _docstring(inspect.cleandoc(cls.__doc__ or ""), 4)
    if _is_enum(cls):
        for member in cls.__members__:
            out += f"    {member}: ClassVar[{name}]\n"
        out += "    def __init__(self, value: int) -> None: ...\n    def __int__(self) -> int: ...\n"
        out += "    @property\n    def value(self) -> int: ...\n    @property\n    def name(self) -> str: ...\n"
        return out
    for attr in ["__init__"] + _public(cls):
        obj = cls.__dict__.get(attr)
        if obj is None:
            continue
        if isinstance(obj, property):
            # pybind11 writes a property's getter signature without a name: "(self: X) -> T".
            lines = (obj.fget.__doc__ or "").splitlines() if obj.fget else []
            ret = next((m.group(1) for m in (PROP.match(x.strip()) for x in lines) if m), None)
            body = "\n".join(x for x in lines if not PROP.match(x.strip())).strip()
            out += f"    @property\n    def {attr}(self) -> {_type(ret)}:\n"
            out += _docstring(body, 8) or "        ...\n"
            if obj.fset is not None:
                out += f"    @{attr}.setter\n    def {attr}(self, value: {_type(ret)}) -> None: ...\n"
        elif callable(obj) and hasattr(obj, "__doc__"):
            if type(obj).__name__ == "staticmethod" or isinstance(obj, staticmethod):
                out += "    @staticmethod\n" + _function(obj.__func__, 4, False, attr)
            else:
                out += _function(obj, 4, True, attr)
        else:
            out += f"    {attr}: Any\n"
    return out


def generate():
    out = ['# SPDX-License-Identifier: Apache-2.0',
           '"""Type stub of mla._mla, the native extension behind the `mla` package (docs/PYTHON.md).',
           '',
           'Generated from the module by `PYTHONPATH=build/python python3 tests/python/test_stub.py --write`;',
           'tests/python/test_stub.py checks it against the module. TensorLike: a torch.Tensor, NumPy array (CPU),',
           'mla.Tensor or any object with __dlpack__ (zero copy)."""',
           "from typing import Any, ClassVar, Dict, List, Optional, Tuple, overload",
           "",
           "TensorLike = Any",
           ""]
    for name in _public(_mla):
        obj = getattr(_mla, name)
        if inspect.isclass(obj):
            out.append(_class(name, obj))
        elif callable(obj):
            out.append(_function(obj, 0))
        else:
            out.append(f"{name}: {type(obj).__name__}\n")
    return "\n".join(out)


# ---- the checks ---------------------------------------------------------------------------------------

def _stub_tree():
    with open(STUB) as f:
        return ast.parse(f.read())


def _stub_names(tree):
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.setdefault(node.target.id, []).append(node)
    return names


def _stub_params(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _module_params(params):
    return [n for n, _, _ in params]


def test_every_module_name_is_in_the_stub_and_back():
    stub = {n for n in _stub_names(_stub_tree()) if not n.startswith("_") and n != "TensorLike"}
    assert stub == set(_public(_mla)), (sorted(set(_public(_mla)) - stub), sorted(stub - set(_public(_mla))))


def _check_function(stub_defs, fn, where):
    sigs = signatures(fn)
    if not sigs:
        return
    got = [_stub_params(d) for d in stub_defs]
    want = [_module_params(p) for p, _ in sigs]
    assert got == want, f"{where}: stub {got} != module {want}"


def test_parameter_names_match():
    names = _stub_names(_stub_tree())
    for name in _public(_mla):
        obj = getattr(_mla, name)
        defs = names[name]
        if inspect.isclass(obj):
            members = {}
            for node in defs[0].body:
                if isinstance(node, ast.FunctionDef):
                    members.setdefault(node.name, []).append(node)
            for attr in ["__init__"] + _public(obj):
                m = obj.__dict__.get(attr)
                if m is None or isinstance(m, property) or not callable(m):
                    continue
                assert attr in members, f"{name}.{attr} missing from the stub"
                fn = m.__func__ if isinstance(m, staticmethod) else m
                _check_function(members[attr], fn, f"{name}.{attr}")
            for attr, nodes in members.items():
                assert attr.startswith("_") and attr in ("__init__", "__int__") or hasattr(obj, attr), \
                    f"stub has {name}.{attr}, the module does not"
        elif callable(obj):
            _check_function(defs, obj, name)


def test_every_stub_entry_has_a_docstring():
    """Functions, methods and classes (properties are struct fields: their class says what they are)."""
    missing = []
    for node in ast.walk(_stub_tree()):
        if isinstance(node, ast.ClassDef) and not ast.get_docstring(node):
            missing.append("class " + node.name)
        if isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and not f.name.startswith("_") and not f.decorator_list and \
                        not ast.get_docstring(f):
                    missing.append(node.name + "." + f.name)
    for node in _stub_tree().body:
        if isinstance(node, ast.FunctionDef) and not ast.get_docstring(node):
            missing.append(node.name)
    assert not missing, f"stub entries without a docstring: {missing}"


@pytest.mark.parametrize("name", SHAPED)
def test_op_docstrings_name_shapes_and_dtypes(name):
    doc = _doc_body(getattr(_mla, name))
    assert re.search(r"\[[^\]]+\]", doc), f"{name}: no shape in {doc!r}"
    assert re.search(r"int32|fp32|bf16|u8", doc), f"{name}: no dtype in {doc!r}"


def test_python_modules_document_their_public_names():
    """Every public function and class defined in the package's Python modules has a docstring (mla.bench is a
    program: python -m mla.bench --help)."""
    import importlib  # noqa: PLC0415
    names = ["mla"]
    try:
        import torch  # noqa: F401,PLC0415
        names += ["mla.ops", "mla.dist", "mla.compat.flash_mla", "mla.compat.vllm"]
    except ImportError:
        pass
    missing = []
    for name in names:
        m = importlib.import_module(name)
        for n, o in vars(m).items():
            if n.startswith("_") or not (inspect.isfunction(o) or inspect.isclass(o)) or o.__module__ != name:
                continue
            if len(inspect.getdoc(o) or "") < 40:
                missing.append(f"{name}.{n}")
    assert not missing, f"no (or a one-phrase) docstring: {missing}"


def test_stub_is_installed_with_the_package():
    assert os.path.exists(os.path.join(os.path.dirname(mla.__file__), "_mla.pyi"))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        with open(STUB, "w") as f:
            f.write(generate())
        print("wrote", os.path.normpath(STUB))
    else:
        sys.exit(pytest.main([__file__, "-q"]))
