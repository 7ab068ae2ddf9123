"""The CLI as a user runs it: real files, real output, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypersack.cli.main import main
from tests.conftest import EXAMPLES

PROFILES = str(EXAMPLES / "profiles-estimates.yaml")


def run_json(capsys: Any, *argv: str) -> Any:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_places_reports_pending_and_compares(capsys: Any) -> None:
    out = run_json(capsys, "plan", str(EXAMPLES / "sp3.yaml"), "--cluster", "1x4xA100-80GB@88",
                   "--profiles", PROFILES, "--policy", "wfd", "--compare", "optimal")
    assert out["trials"] == 96 and out["placed"] + out["pending"] == 96
    assert out["placed"] == len(out["placements"]) > 0
    assert {p["node"] for p in out["placements"]} == {"node0"}
    for g in out["gpus"]:
        assert g["compute_pct"] <= g["capacity_pct"] == 300
    assert all(p["reason"] for p in out["pending_trials"])
    assert all(p["demands"]["A100"]["compute_pct"] > 0 for p in out["pending_trials"])
    cmp = out["compare"]
    assert cmp["status"] == "OPTIMAL" and 0 <= cmp["gap_to_optimal"] < 0.1
    assert cmp["objective_pct"] >= cmp["ours_pct"]


def test_plan_reports_workloads_without_profiles(capsys: Any, tmp_path: Path) -> None:
    out = run_json(capsys, "plan", str(EXAMPLES / "sp1.yaml"), "--cluster", "1x2xV100-32GB",
                   "--profiles", PROFILES)
    assert out["placed"] == 0 and len(out["profiles_needed"]) == 24
    assert len(out["profile_jobs_started"]) == 2  # one per idle GPU
    assert {p["state"] for p in out["pending_trials"]} == {"PROFILING"}


def test_simulate_json_and_gantt(capsys: Any, tmp_path: Path) -> None:
    svg = tmp_path / "g.svg"
    # Trials alone: one bar each (fused groups: tests/unit/test_fusion.py).
    out = run_json(capsys, "simulate", str(EXAMPLES / "sp1.yaml"), "--cluster",
                   "1x4xA100-80GB@88", "--profiles", PROFILES, "--gantt", str(svg),
                   "--no-fusion")
    assert out["completed"] == 96 and out["speedup"] > 1.5
    assert out["baseline_makespan_s"] > out["makespan_s"]
    assert len(out["gpus"]) == 4 and sum(g["trials"] for g in out["gpus"]) == 96
    assert (out["idle_fit_s"], out["idle_fit_events"]) == (0.0, 0)  # work-conserving
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<rect") > 96
    # The picture says what it shows: ticks on the time axis, trial labels where they
    # fit, the occupancy over time, the makespan and the one-trial-per-GPU baseline.
    assert text.count('class="tick"') >= 5 and text.count('class="label"') >= 48
    assert text.count('class="occupancy"') == 1
    assert f"one trial per GPU {out['baseline_makespan_s']:.0f} s" in text
    assert f"makespan {out['makespan_s']:.0f} s" in text
    # Rendered as a person sees it: the baseline's red and the occupancy's blue are there.
    try:
        import cairosvg
        from PIL import Image
    except (ImportError, OSError) as exc:  # cairosvg needs the system's libcairo
        pytest.skip(f"no SVG renderer here: {exc}")
    png = tmp_path / "g.png"
    cairosvg.svg2png(bytestring=text.encode(), write_to=str(png))
    image = Image.open(png).convert("RGB")
    assert image.size[0] == 1100 and image.size[1] > 400
    colors = {c for _, c in image.getcolors(maxcolors=1 << 20) or []}
    def near(rgb: tuple[int, int, int]) -> bool:
        return any(sum(abs(a - b) for a, b in zip(c, rgb, strict=True)) < 40 for c in colors)

    assert near((0xD6, 0x27, 0x28)) and near((0x1F, 0x77, 0xB4)) and near((0x2C, 0xA0, 0x2C))


def test_simulate_sweep(capsys: Any) -> None:
    out = run_json(capsys, "simulate", str(EXAMPLES / "sp3.yaml"), "--cluster",
                   "1x4xA100-80GB@88", "--profiles", PROFILES, "--sweep", "1,3")
    assert [r["ratio"] for r in out["sweep"]] == [1.0, 3.0]
    assert out["sweep"][1]["speedup"] > out["sweep"][0]["speedup"] > 1.0


def test_bad_input_is_one_clear_line_and_exit_2(capsys: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodels: [resnet99]\nhyperparameters: {batch_size: [64]}\n")
    cases = [
        (["validate", str(bad)], "models.0: unknown model 'resnet99'"),
        (["plan", str(EXAMPLES / "sp1.yaml"), "--cluster", "4xA100", "--profiles", PROFILES],
         "is not NODESxGPUSxARCH-MEMGB"),
        (["plan", str(EXAMPLES / "sp1.yaml"), "--cluster", "4xA100-80GB", "--profiles",
          PROFILES, "--policy", "best"], "unknown policy 'best'"),
        (["simulate", str(EXAMPLES / "sp1.yaml"), "--cluster", "4xA100-80GB", "--profiles",
          PROFILES, "--ratio", "A100=-1"], "--ratio 'A100=-1'"),
        # Architectures are matched exactly: a second spelling would apply to no GPU.
        (["simulate", str(EXAMPLES / "sp1.yaml"), "--cluster", "4xA100-80GB", "--profiles",
          PROFILES, "--ratio", "a100=2"], "ratios for both 'A100' and 'a100'"),
        (["simulate", str(EXAMPLES / "sp1.yaml"), "--cluster", "4xA100-80GB", "--profiles",
          PROFILES, "--gantt", str(tmp_path / "no" / "g.svg")], "does not exist"),
        # Refused before the baseline is simulated and the sweep's header printed.
        (["simulate", str(EXAMPLES / "sp1.yaml"), "--cluster", "4xA100-80GB", "--profiles",
          PROFILES, "--sweep", "1,,nan"], "--sweep '1,,nan'"),
    ]
    for argv, fragment in cases:
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and fragment in err and "Traceback" not in err
        assert out == "", (argv, out)


def test_validate_and_console_script(capsys: Any, tmp_path: Path) -> None:
    assert main(["validate", str(EXAMPLES / "sp4.yaml")]) == 0
    assert "sp4: 384 trials (grid search)" in capsys.readouterr().out
    # What submission refuses, validate refuses too: options a NumPy model cannot take.
    bad = tmp_path / "numpy-clip.yaml"
    bad.write_text("name: s\nmodels: [digits_mlp]\nhyperparameters: {batch_size: [32], lr: [0.1]}\n"
                   "program: {builtin: train, options: {clip_grad_norm: 1.0}}\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "clip_grad_norm" in err and "NumPy" in err and "Traceback" not in err
    done = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "--help"],
                          capture_output=True, text=True, check=True)
    for command in ("validate", "plan", "simulate"):
        assert command in done.stdout
