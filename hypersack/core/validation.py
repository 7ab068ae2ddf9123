"""Turn pydantic's validation errors into one readable message with field paths."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _one_line(text: str) -> str:
    """User text inside a message: control and direction characters escaped, so a key
    or value can neither break the line nor reorder it."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def format_validation_error(exc: ValidationError, source: str,
                            sections: Mapping[str, Collection[str]] | None = None) -> str:
    """`sections`: the keys each section takes ("" the top level), so that a key one
    section refuses is pointed to the section that takes it, or to a close spelling."""
    lines = []
    source = _one_line(source)
    for err in exc.errors():
        path = ".".join(_one_line(str(p)[:80]) for p in err["loc"]) or "(top level)"
        msg = _one_line(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if err["type"] == "extra_forbidden" and sections is not None:
            msg = "unknown key" + _elsewhere(err["loc"], sections)
        if err["loc"]:
            lines.append(f"{source}: {path}: {msg}")
        else:
            lines.append(f"{source}: {msg}")
    # One line: the first problems, then how many more (a file may have thousands).
    shown = lines[:3]
    more = f" (and {len(lines) - len(shown)} more)" if len(lines) > len(shown) else ""
    return "; ".join(shown) + more


def _elsewhere(loc: tuple[Any, ...], sections: Mapping[str, Collection[str]]) -> str:
    """Where a refused key belongs: another section that takes it, else a key of its
    own section spelled like it."""
    key = str(loc[-1])
    here = ".".join(str(p) for p in loc[:-1])
    homes = [name for name, keys in sections.items() if key in keys and name != here]
    if homes:
        return "; it belongs in " + " or ".join(
            f"{name}.{key}" if name else f"the top level ({key})" for name in homes)
    close = difflib.get_close_matches(key, list(sections.get(here, ())), n=1, cutoff=0.75)
    return f"; did you mean {_one_line(close[0])}?" if close else ""
