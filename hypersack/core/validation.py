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
    return "\n".join(lines)
