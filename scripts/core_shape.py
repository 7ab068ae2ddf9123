"""The shape of the core, as issue reports ask for it: lines per module of
hypersack/orchestrator, methods per class, functions over 80 lines, and which modules of
the package each module imports.

    python scripts/core_shape.py [ROOT]     (ROOT: a checkout; default this one)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LONG = 80


def imported(tree: ast.AST) -> set[str]:
    """The modules of hypersack.orchestrator a module imports, either form."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.ImportFrom) or not n.module:
            continue
        if n.module.startswith("hypersack.orchestrator."):
            out.add(n.module.rsplit(".", 1)[1])
        elif n.module == "hypersack.orchestrator":
            out.update(a.name for a in n.names)
    return out


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    package = root / "hypersack" / "orchestrator"
    total = 0
    print(f"{'module':<22} {'lines':>6}  classes (methods)  imports inside orchestrator/")
    long_ones: list[str] = []
    for path in sorted(package.glob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        total += lines
        tree = ast.parse(text)
        classes = [f"{c.name}({sum(isinstance(b, ast.FunctionDef) for b in c.body)})"
                   for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        inside = sorted(imported(tree))
        for f in ast.walk(tree):
            if isinstance(f, ast.FunctionDef) and f.end_lineno is not None \
                    and f.end_lineno - f.lineno + 1 > LONG:
                long_ones.append(f"{path.name}:{f.lineno} {f.name} "
                                 f"({f.end_lineno - f.lineno + 1} lines)")
        print(f"{path.name:<22} {lines:>6}  {' '.join(c for c in classes if c)}  "
              f"-> {', '.join(inside) or '-'}")
    print(f"{'total':<22} {total:>6}")
    print(f"functions over {LONG} lines: {', '.join(long_ones) or 'none'}")


if __name__ == "__main__":
    main()
