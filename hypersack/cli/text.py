"""Strings from users, trials and the network, made safe for a terminal.

A node name, a hyperparameter value or a trial's log is not ours: rich must not read it
as markup (`[/]` would stop the CLI), and a terminal must not receive its escape
sequences. Every such string passes through `safe` (one line, markup escaped) or
`safe_log` (lines kept, control characters dropped) before it is printed.

`print_table`: a table, or, on a terminal too narrow for it, one line of
`column: value` per row (rich would cut every value to a letter and an ellipsis).
"""

from __future__ import annotations

import json
import re

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

# C0 controls but newline and tab, DEL, and C1 controls (an 8-bit CSI starts sequences too).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")


def safe_log(text: str) -> str:
    """A log for a terminal: escape sequences and other control characters removed
    (newlines and tabs kept; a carriage return becomes a newline)."""
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def escaped(text: str) -> str:
    """A string for a file format a terminal may show (CSV): every control character
    written as a visible escape (`\x1b`, `\n`), so nothing a trial chose reaches the
    terminal as a control sequence and a row stays one line."""
    return _ANY_CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"),
                            text)


def json_text(data: object) -> str:
    """JSON whose strings carry no raw control character: json escapes C0 and (ASCII
    only) C1 itself; DEL, the one left, is escaped too. The data is unchanged."""
    return json.dumps(data, indent=2, ensure_ascii=True).replace("\x7f", "\\u007f")


def safe(value: object) -> str:
    """One value for a rich table or line: no control characters, no markup."""
    text = _CONTROL.sub("", _ANSI.sub("", str(value))).replace("\n", " ").replace("\t", " ")
    return escape(text)


def print_table(console: Console, table: Table) -> None:
    """The table where it fits the console's width with no word cut (its columns may
    wrap between words); else each row as `column: value, ...` (empty cells left out;
    a row whose first cell is empty, the next GPU of a node, indented under the row
    before), every value whole."""
    wide = console.options.update_width(1_000_000)
    if Measurement.get(console, wide, table).minimum <= console.width:
        console.print(table)
        return
    if table.title:
        console.print(table.title)
    columns = [(str(c.header), [str(cell) for cell in c.cells]) for c in table.columns]
    for i in range(table.row_count):
        row = [(header, values[i]) for header, values in columns if i < len(values)]
        first = row[0][1] if row else ""
        parts = [f"{escape(header)}: {value}" for header, value in row[1:] if value.strip()]
        line = ", ".join(parts)
        console.print(f"[bold]{first}[/]: {line}" if first.strip() else f"  {line}")
