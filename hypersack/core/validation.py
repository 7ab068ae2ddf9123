"""Turn pydantic's validation errors into one readable message with field paths."""

from __future__ import annotations

from pydantic import ValidationError


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if err["loc"]:
            lines.append(f"{source}: {path}: {msg}")
        else:
            lines.append(f"{source}: {msg}")
    # One line: the first problems, then how many more (a file may have thousands).
    shown = lines[:3]
    more = f" (and {len(lines) - len(shown)} more)" if len(lines) > len(shown) else ""
    return "; ".join(shown) + more
