"""The simulation benchmarks refuse bad arguments with one usage line and exit 2, before
running anything (a traceback, or a run that places nothing, is not an answer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize(("script", "args", "said"), [
    ("sim_makespan.py", ["--seeds", "0"], "--seeds must be at least 1"),
    ("sim_makespan.py", ["--first-seed", "-1"], "--first-seed at least 0"),
    ("sim_makespan.py", ["--noise", "1.5"], "--noise must lie in [0, 0.9]"),
    ("sim_makespan.py", ["--policies", "eft,nope"], "--policies: unknown nope; valid:"),
    ("sim_makespan.py", ["--clusters", "../x"], "--clusters: unknown ../x; valid: paper"),
    ("sim_makespan.py", ["--kinds", "memory,"], "--kinds: unknown ; valid: compute"),
    ("sim_late_choice.py", ["--seeds", "0"], "--seeds must be at least 1"),
    ("sim_learned_ratio.py", ["--seeds", "0"], "--seeds must be at least 1"),
    ("sim_learned_ratio.py", ["--models", "sat-double,nope"], "unknown model(s) nope"),
    ("sim_learned_ratio.py", ["--studies", "sp1,../x"], "unknown stud(ies) ../x"),
    ("sim_learned_ratio.py", ["--sweep", "2,a"], "--sweep: up to 100 A100 ratios in (0, 1000]"),
    ("sim_learned_ratio.py", ["--sweep", "nan"], "--sweep: up to 100 A100 ratios in (0, 1000]"),
    ("bench_pack_heldout.py", ["--limit", "nan"], "--limit must lie in (0, 86400]"),
    ("bench_pack_heldout.py", ["--limit", "inf"], "--limit must lie in (0, 86400]"),
    ("bench_pack_heldout.py", ["--workers", "0"], "--workers in [1, 1024]"),
    ("bench_grpc_floor.py", ["--agents", "0"], "--agents must lie in [1, 1000000]"),
    ("bench_grpc_floor.py", ["--min-s", "nan"], "--min-s and --max-s: 0 < min <= max"),
    ("bench_grpc_floor.py", ["--ack-delay-ms", "-1"], "--ack-delay-ms must lie in"),
])
def test_a_bad_argument_is_one_usage_line(script: str, args: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_the_transport_floor_counts_every_exit_of_a_small_run() -> None:
    """bench_grpc_floor.py: the bare server launches every trial and hears every exit."""
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_grpc_floor.py"),
                           "--agents", "4", "--gpus", "2", "--trials", "40",
                           "--min-s", "0.05", "--max-s", "0.2", "--agent-procs", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = dict(line.strip().split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert got["exits"] == "40" and got["trials"] == "40"
    assert float(got["bare_server_cpu_ms_per_trial"]) > 0
