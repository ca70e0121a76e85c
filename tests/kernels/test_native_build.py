"""The native extension as built: warnings as errors on both paths, the portable build's
reason, the stub and the call sites held to the C signatures, and empty batches."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest
import tomllib
import torch

from interlock.kernels import REGISTRY
from interlock.kernels import native as native_package
from interlock.kernels.native import unavailable

NATIVE = Path(native_package.__file__).parent
ROOT = NATIVE.parents[1]
WHY_NOT = unavailable("cpu")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
needs_native = pytest.mark.skipif(WHY_NOT is not None, reason=f"native kernels: {WHY_NOT}")


def sources() -> list[Path]:
    """The module's C files, as pyproject.toml lists them for the install."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [module] = [m for m in config["tool"]["setuptools"]["ext-modules"]
                if m["name"] == "interlock.kernels.native._cpu"]
    return [ROOT / s for s in module["sources"]]


def test_the_install_compiles_every_c_file_of_the_kernels() -> None:
    """A .c file left out of pyproject.toml's list would build in `make native-check` (which
    takes every file) and be missing from the installed module."""
    assert sorted(sources()) == sorted(NATIVE.glob("*.c"))


def build(tmp_path: Path, *defines: str) -> Path:
    """The module compiled as CI compiles it: every warning an error."""
    out = tmp_path / "_cpu.so"
    include = sysconfig.get_paths()["include"]
    cmd = ["cc", "-shared", "-fPIC", "-O1", "-ffp-contract=off", "-Wall", "-Wextra",
           "-Werror", f"-I{include}", *defines, *map(str, sources()), "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out


def load(path: Path) -> ModuleType:
    """The build at ``path``, leaving sys.modules as it was (loading a single-phase
    extension module enters it there)."""
    name = "interlock.kernels.native._cpu"
    previous = sys.modules.get(name)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if previous is not None:
        sys.modules[name] = previous
    return module


@needs_cc
def test_the_x86_build_has_no_warnings(tmp_path: Path) -> None:
    build(tmp_path)


@needs_cc
def test_the_portable_build_compiles_and_torch_serves_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off x86-64 (here: the x86 path compiled out) the module still builds, says why, and
    the registry picks torch with that reason rather than losing the kernels silently."""
    module = load(build(tmp_path, "-DINTERLOCK_NATIVE_PORTABLE"))
    assert module.UNSUPPORTED is not None
    assert module.UNSUPPORTED.startswith("not built for this CPU (")
    monkeypatch.setitem(sys.modules, "interlock.kernels.native._cpu", module)
    unavailable.cache_clear()
    try:
        choice = REGISTRY.select("linear", "cpu", "float32")
        assert choice.impl.backend == "torch"
        assert "native: not built for this CPU (" in choice.reason, choice.reason
        # the portable ops still run (rotary is plain C): the module is whole, not a shell
        assert set(module.SIGNATURES) == set(_real_module().SIGNATURES)
    finally:
        unavailable.cache_clear()


def _real_module() -> ModuleType:
    from interlock.kernels.native import _cpu

    return _cpu


def _call_sites() -> list[tuple[str, int, int]]:
    """(op code name, argument count, line) for every op call in ops.py."""
    tree = ast.parse((NATIVE / "ops.py").read_text(), filename="ops.py")
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Attribute) and first.attr.startswith("OP_")):
            continue
        func = node.func
        # ``run``: a helper's parameter standing for ``_run`` or ``_untaped`` (same signature).
        if isinstance(func, ast.Name) and func.id in ("_run", "run"):
            packed = node.args[1]
            assert isinstance(packed, ast.Tuple), f"ops.py:{node.lineno}: pass a literal tuple"
            args = packed.elts
        elif isinstance(func, ast.Attribute) and func.attr in ("call", "record"):
            args = node.args[1:]
        else:
            continue
        assert not any(isinstance(a, ast.Starred) for a in args), (
            f"ops.py:{node.lineno}: spell every argument out, so that it can be counted")
        sites.append((first.attr, len(args), node.lineno))
    return sites


@needs_native
def test_every_call_site_passes_the_signature_the_c_side_declares() -> None:
    _cpu = _real_module()
    sites = _call_sites()
    assert {code for code, _, _ in sites} == {f"OP_{name.upper()}" for name in _cpu.SIGNATURES}
    for code, count, line in sites:
        kinds = _cpu.SIGNATURES[code[3:].lower()]
        assert count == len(kinds), f"ops.py:{line}: {code} takes {len(kinds)}, given {count}"


@needs_native
def test_the_stub_declares_exactly_what_the_module_has() -> None:
    _cpu = _real_module()
    stub = ast.parse((NATIVE / "_cpu.pyi").read_text())
    declared = {n.target.id for n in stub.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    declared |= {n.name for n in stub.body if isinstance(n, ast.FunctionDef)}
    public = {name for name in dir(_cpu) if not name.startswith("_")}
    assert declared == public
    codes = {getattr(_cpu, f"OP_{name.upper()}") for name in _cpu.SIGNATURES}
    assert codes == set(range(1, len(_cpu.SIGNATURES) + 1)), "op codes are 1..N, distinct"


@needs_native
def test_empty_batches_touch_no_memory() -> None:
    """Zero tokens give empty outputs: every copy or clear of zero bytes is skipped, so
    an empty tensor's NULL address is never handed to memset/memcpy (UBSan under
    `make sanitize` catches a regression)."""
    def both(op: str, *args: object) -> None:
        got = REGISTRY.select(op, "cpu", "float32", force="native").fn(*args)
        want = REGISTRY.select(op, "cpu", "float32", force="torch").fn(*args)
        if isinstance(want, torch.Tensor):
            assert got.shape == want.shape and got.numel() == 0

    heads, kv_heads, dim = 2, 1, 16
    k_cache, v_cache = torch.zeros(4, 4, kv_heads, dim), torch.zeros(4, 4, kv_heads, dim)
    tables = torch.zeros(0, 2, dtype=torch.int32)
    lens = torch.zeros(0, dtype=torch.int32)
    q = torch.empty(0, heads, dim)
    both("paged_attention", q, k_cache, v_cache, tables, lens,
         torch.zeros(1, dtype=torch.int32), dim**-0.5, None)
    both("paged_decode_attention", q, k_cache, v_cache, tables, lens, dim**-0.5, None)
    both("store_kv_cache", torch.empty(0, kv_heads, dim), torch.empty(0, kv_heads, dim),
         k_cache, v_cache, torch.empty(0, dtype=torch.int64))
    both("embedding", torch.empty(0, dtype=torch.int64), torch.zeros(8, dim))
    both("select_rows", torch.zeros(3, dim), torch.empty(0, dtype=torch.int64))
    both("silu_and_mul", torch.empty(0, 2 * dim))
    both("rms_norm", torch.empty(0, dim), torch.ones(dim), 1e-6)
