"""Turn pydantic's validation errors into one readable message with field paths."""

from __future__ import annotations

import re

from pydantic import ValidationError

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _one_line(text: str) -> str:
    """User text inside a message: control and direction characters escaped, so a key
    or value can neither break the line nor reorder it."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    source = _one_line(source)
    for err in exc.errors():
        path = ".".join(_one_line(str(p)[:80]) for p in err["loc"]) or "(top level)"
        msg = _one_line(err["msg"])
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
