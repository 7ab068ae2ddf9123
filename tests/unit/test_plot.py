"""hypersack plot (issue 36, 6): the learning curves, the real Gantt and occupancy drawn
from a study's recorded history; the SVG's elements are checked by their ids, the PNG
by its pixels."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.plot import lanes, occupancy, plot_study
from hypersack.core.errors import InvalidInput


def study_data() -> tuple[pb.Study, list[pb.Trial], pb.History]:
    study = pb.Study(id="s-1", state="COMPLETED", objective_metric="loss",
                     objective_mode="min")
    states = {"t0": "COMPLETED", "t1": "PRUNED", "t2": "COMPLETED", "t3": "FAILED"}
    trials = [pb.Trial(id=k, state=v, params_json=json.dumps({"lr": i / 10}),
                       has_objective=v == "COMPLETED", objective=0.1 * (i + 1))
              for i, (k, v) in enumerate(states.items())]
    history = pb.History()
    for trial, last in (("t0", 5), ("t1", 2), ("t2", 5)):
        for step in range(1, last + 1):
            history.steps.add(trial_id=trial, step=step, at=100.0 + step,
                              metrics={"loss": 1.0 / step, "acc": step / 5})
    # t0 and t1 share GPU 0 at once; t2 follows on it; t3 fails on GPU 1, twice.
    for trial, attempt, gpu, start, end, group in (
            ("t0", 1, 0, 100.0, 110.0, "g1"), ("t1", 1, 0, 100.0, 103.0, "g1"),
            ("t2", 1, 0, 110.0, 118.0, ""), ("t3", 1, 1, 101.0, 102.0, ""),
            ("t3", 2, 1, 104.0, 105.0, "")):
        history.spans.add(trial_id=trial, attempt=attempt, node="n0", gpu_index=gpu,
                          start=start, end=end, group=group)
    return study, trials, history


def ids(svg: Path) -> set[str]:
    return {e.get("id", "") for e in ET.parse(svg).iter()}


def test_the_svg_holds_every_curve_span_and_gpu(tmp_path: Path) -> None:
    study, trials, history = study_data()
    out = tmp_path / "s.svg"
    drawn = plot_study(study, trials, history, out)
    assert drawn == {"curves": 3, "pruned": 1, "spans": 5, "gpus": 2}
    found = ids(out)
    assert {i for i in found if i.startswith("curve:")} == {"curve:t0", "curve:t1", "curve:t2"}
    assert {i for i in found if i.startswith("pruned:")} == {"pruned:t1"}
    assert {i for i in found if i.startswith("span:")} == {
        "span:t0:1", "span:t1:1", "span:t2:1", "span:t3:1", "span:t3:2"}
    assert {i for i in found if i.startswith("occupancy:")} == {"occupancy:n0:0",
                                                               "occupancy:n0:1"}
    text = out.read_text()
    assert "learning curves: 3 trials, 1 pruned" in text and "n0:1" in text
    assert "best: t0" in text  # the best completed trial (min loss) is named


def test_the_png_is_a_picture_with_its_three_panels(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    study, trials, history = study_data()
    out = tmp_path / "s.png"
    plot_study(study, trials, history, out)
    image = mpimg.imread(out)
    height, width = image.shape[:2]
    assert width > 1000 and height > 1000
    # Ink in each third of the picture (curves, Gantt, occupancy), not a blank page.
    for third in range(3):
        band = image[third * height // 3:(third + 1) * height // 3, :, :3]
        assert (band < 0.5).mean() > 0.005, third


def test_overlapping_spans_get_their_own_lanes_and_occupancy_counts_them() -> None:
    _, _, history = study_data()
    per_gpu = lanes(list(history.spans))
    gpu0 = {(s.trial_id, s.attempt): lane for s, lane in per_gpu[("n0", 0)]}
    assert gpu0[("t0", 1)] != gpu0[("t1", 1)]  # at once on one GPU: stacked
    assert gpu0[("t2", 1)] == 0  # after them: the first lane again
    xs, ys = occupancy(per_gpu[("n0", 0)], 100.0)
    assert max(ys) == 2 and ys[-1] == 0
    assert [y for x, y in zip(xs, ys, strict=True) if x == 10.0] == [1]  # one ends, one starts


def test_a_bad_suffix_is_refused_before_drawing(tmp_path: Path) -> None:
    study, trials, history = study_data()
    with pytest.raises(InvalidInput, match="suffix"):
        plot_study(study, trials, history, tmp_path / "s.pdf")
