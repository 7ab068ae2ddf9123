"""The CLI's tables on an 80-column terminal. `hypersack nodes` and `hypersack profiles`
cut every value to a letter and an ellipsis there ("gpu…", "815…"); now a table too wide
for the terminal prints one line of `column: value` per row, every value whole."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.control import print_nodes
from hypersack.cli.profiles import print_profiles
from hypersack.cli.text import print_table
from hypersack.core.types import Profile


def _nodes() -> list[pb.Node]:
    gpus = [pb.Gpu(index=i, arch="H100-80GB", memory_mib=81559, trials=3,
                   compute_share=0.75, utilization_pct=88, sharing="mps") for i in range(2)]
    return [pb.Node(name=f"gpu-node-01{k}", backend="nvml", connected=bool(k),
                    last_seen_s=1.2, gpus=gpus) for k in range(2)]


def _printed(width: int, nodes: list[pb.Node]) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    print_nodes(nodes, console)
    return console.export_text()


def test_nodes_on_an_80_column_terminal_show_every_value_whole() -> None:
    out = _printed(80, _nodes())
    assert "…" not in out
    for whole in ("gpu-node-010", "gpu-node-011", "disconnected", "81559 MiB", "H100-80GB",
                  "1.2 s ago", "75%", "88%", "mps"):
        assert whole in out, out
    lines = out.splitlines()
    assert lines[0].startswith("gpu-node-010: backend: nvml, state: disconnected")
    # The node's second GPU under it, not a node of its own.
    assert any(line.startswith("  GPU: 1, arch: H100-80GB") for line in lines)
    assert max(map(len, lines)) <= 80
    wide = _printed(200, _nodes())  # where it fits: the table
    assert "┃ node " in wide and "gpu-node-010 │ nvml" in wide


def test_profiles_on_an_80_column_terminal(estimates: list[Profile],
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rows = [p for p in estimates if p.key.model == "resnet18" and p.arch == "A100"][:2]
    monkeypatch.setenv("COLUMNS", "80")
    print_profiles(rows)
    out = capsys.readouterr().out
    assert "…" not in out and "2 profiles: demand" in out
    assert max(map(len, out.splitlines())) <= 80
    out = " ".join(out.split())  # the lines as wrapped, joined
    for p in rows:
        assert f"{p.key.label()}: arch: A100" in out
        assert f"memory MiB: {p.demand.memory_mib}," in out
        assert f"compute %: {p.demand.compute_pct:.1f}," in out
    monkeypatch.setenv("COLUMNS", "250")
    print_profiles(rows)
    assert "┃ workload" in capsys.readouterr().out


def test_a_table_that_fits_by_wrapping_stays_a_table() -> None:
    table = Table("trial", "parameters")
    table.add_row("s-t00001", "batch_size=64 lr=0.1 model=resnet18 momentum=0.9 " * 2)
    table.add_row("[red]s-t00002[/]", "")
    console = Console(width=50, record=True, file=io.StringIO())
    print_table(console, table)
    assert "┃ trial" in console.export_text()  # wrapped between words, nothing cut
    narrow = Console(width=20, record=True, file=io.StringIO())
    print_table(narrow, table)
    out = narrow.export_text()
    assert "s-t00001: parameters: batch_size=64" in " ".join(out.split())
    assert "s-t00002: " in out and "[red]" not in out  # markup rendered, empty cells left out
