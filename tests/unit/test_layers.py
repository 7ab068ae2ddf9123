"""The layers of the design, checked on every import in the package (function-level
imports too): cli -> server | agent | sim -> orchestrator -> sampler, policies, grid,
store -> core, where the server may also use sim (its foresight); `wire` beside server
and agent; `runner` a leaf only trial processes import. Nothing imports upward or
sideways."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hypersack"

_BASE = {"core"}
_MIDDLE = _BASE | {"grid", "policies", "sampler", "store"}
_ORCH = _MIDDLE | {"orchestrator"}
# Which packages each package may import (besides itself and the generated protocol).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "grid": _BASE,
    "policies": _BASE,
    "sampler": _BASE,
    "store": _BASE,
    "orchestrator": _MIDDLE,
    "wire": _MIDDLE | {"_proto"},
    # The server runs the simulator as its foresight (the default policy, `predict`).
    "server": _ORCH | {"wire", "sim", "_proto"},
    "agent": _MIDDLE | {"wire", "_proto"},
    "sim": _ORCH,
    "cli": _ORCH | {"wire", "server", "agent", "sim", "_proto"},
    "runner": _BASE,
    # What tests and plug-in authors build on (as optuna.testing): stores that fail on
    # demand, builders, servers and clusters to drive, and the contract suites. At the
    # top, like cli (and beside the trial runtime, whose fused groups its helpers
    # compare with separate runs): nothing imports it but tests.
    "testing": _ORCH | {"wire", "server", "agent", "sim", "cli", "runner", "_proto"},
    "_proto": set(),
}


def _imports(path: Path, *, top_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported package under hypersack) for every import in a module (only the
    module-level ones with `top_only`), in line order."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in (tree.body if top_only else ast.walk(tree)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "hypersack":
                names = [f"hypersack.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "hypersack" and len(parts) > 1 and parts[1] != "__version__":
                out.append((node.lineno, parts[1]))
    return sorted(out)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts)


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(ALLOWED), "add the new package to ALLOWED and to the design"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_goes_up_or_sideways(path: Path) -> None:
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1:
        # The top-level package imports nothing of its own eagerly.
        assert _imports(path, top_only=True) == [], rel
        return
    package = rel.parts[0]
    bad = [f"{rel}:{line} imports hypersack.{pkg}" for line, pkg in _imports(path)
           if pkg != package and pkg not in ALLOWED[package]]
    assert bad == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    # The walker finds function-level imports and `from hypersack import x`.
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from hypersack.server import app\n"
                 "from hypersack import runner\n")
    assert [pkg for _, pkg in _imports(f)] == ["server", "runner"]


# Inside the core, each module imports only those before it: the runtime on top, the
# modules over the one state below it, the state, and the plain parts under everything.
CORE_ORDER = ["events", "commands", "journal", "config", "fits", "sharing", "levels", "outcomes",
              "retries", "fusion", "shares", "cycle", "cluster", "state", "foresight",
              "learned", "book", "curves", "pruning", "profiling", "searches", "membership",
              "decide", "preempt", "explain", "trials", "studies", "queries", "orchestrator",
              "__init__"]


def _core_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("hypersack.orchestrator."):
                out.add(node.module.split(".")[2])
            elif node.module == "hypersack.orchestrator":
                out.update(a.name for a in node.names)
    return out


def test_the_core_imports_point_one_way() -> None:
    core = PACKAGE / "orchestrator"
    assert sorted(p.stem for p in core.glob("*.py")) == sorted(CORE_ORDER), \
        "place the new module in CORE_ORDER"
    bad = [f"{name} imports {dep}" for name in CORE_ORDER
           for dep in _core_imports(core / f"{name}.py")
           if CORE_ORDER.index(dep) >= CORE_ORDER.index(name)]
    assert bad == []


TESTS = PACKAGE.parent / "tests"


@pytest.mark.parametrize("path", sorted(TESTS.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_module_imports_another(path: Path) -> None:
    """Shared helpers live in hypersack.testing and fixtures in conftest.py files: a test
    module imports nothing of another (the repository's paths in tests/conftest.py
    aside)."""
    tree = ast.parse(path.read_text(), str(path))
    found = [f"{path.name}:{node.lineno} imports {node.module}" for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module
             and node.module.startswith("tests") and node.module != "tests.conftest"]
    assert found == []
