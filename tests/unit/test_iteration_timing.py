"""A trial's seconds per iteration, from the SDK through the agent to the server's event:
what the learned sharing level samples (every hop checks what it is given)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent import launcher
from hypersack.agent.reports import metrics_message
from hypersack.core.bounds import iteration_timing
from hypersack.runner import sdk
from hypersack.server.reports import progress_event


def test_reports_carry_the_median_seconds_per_iteration_since_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(sdk.ENV_METRICS, str(out))
    monkeypatch.delenv(sdk.ENV_METRICS_FD, raising=False)
    monkeypatch.delenv(sdk.ENV_PROFILE, raising=False)
    monkeypatch.setattr(sdk, "_timing", sdk._Timing())
    now = iter([10.0, 11.0, 12.0, 14.0, 15.0, 15.5, 16.5])
    monkeypatch.setattr(sdk.time, "perf_counter", lambda: next(now))
    for _ in range(5):
        sdk.iteration()
    sdk.report(step=1, loss=0.5)
    sdk.report(step=2, loss=0.4)  # no iteration since: nothing timed
    for _ in range(2):
        sdk.iteration()
    sdk.report(step=3, loss=0.3)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert (lines[0]["iter_s"], lines[0]["iter_window_s"]) == (1.0, 5.0)  # 1, 1, 2, 1
    assert "iter_s" not in lines[1]
    # The next window starts at the last mark of the one before (15.0): 0.5 and 1.0.
    assert (lines[2]["iter_s"], lines[2]["iter_window_s"]) == (0.75, 1.5)


@pytest.mark.parametrize("iter_s,window_s", [
    ("1", 2.0), (True, 2.0), (1.0, None), (0.0, 2.0), (-1.0, 2.0), (math.nan, 2.0),
    (math.inf, 2.0), (1e6, 2.0), (10**400, 2.0), (1.0, -2.0), ([1.0], 2.0)])
def test_the_agent_drops_timings_that_are_not_measurements(iter_s: object,
                                                           window_s: object) -> None:
    assert iteration_timing(iter_s, window_s) is None


def test_the_agent_reads_a_timing_from_the_metrics_line_and_sends_it_once(
        tmp_path: Path) -> None:
    job = launcher.Job("s-1-t00000", 0, tmp_path / "t", [sys.executable, "-c", "pass"], {},
                       base_env={})
    job.workdir.mkdir(parents=True)
    job.channel_dir.mkdir()
    job.metrics_path.write_text(
        json.dumps({"step": 1, "metrics": {"loss": 1.0}, "iter_s": 0.2,
                    "iter_window_s": 3.0}) + "\n"
        + json.dumps({"step": 2, "metrics": {"loss": 0.9}, "iter_s": "fast"}) + "\n")
    assert job.new_metrics()
    sent = metrics_message(job).metrics
    assert (sent.iter_time_s, sent.iter_window_s) == (0.2, 3.0) and sent.step == 2
    again = metrics_message(job).metrics  # sent once
    assert (again.iter_time_s, again.iter_window_s) == (0.0, 0.0)


def test_the_server_keeps_only_plausible_timings() -> None:
    def event(iter_s: float, window_s: float) -> tuple[float, float]:
        e = progress_event("n1", pb.TrialMetrics(trial_id="t", step=1, iter_time_s=iter_s,
                                                 iter_window_s=window_s))
        return e.iter_time_s, e.iter_window_s

    assert event(0.2, 3.0) == (0.2, 3.0)
    for bad in ((math.nan, 3.0), (-0.2, 3.0), (0.2, math.inf), (1e9, 3.0), (0.2, 0.0)):
        assert event(*bad) == (0.0, 0.0)
