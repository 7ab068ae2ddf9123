"""Numbers survive every path a search space takes: a file, `{space_dir}` (the space is
sent as JSON), `Client.submit(dict)` and the server read floats the same way, by JSON's
and YAML 1.2's rules (issue 36: `1e-5` was refused once it travelled as JSON, which
writes `1e-05`, because YAML 1.1 reads that as a string)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hypersack.core.files import load_yaml
from hypersack.grid.params import LogUniform
from hypersack.grid.space import load_space, parse_space, read_space_file
from hypersack.server.app import HyperSackServer

FORMATS = ["{!r}", "{:e}", "{:E}", "{:.3e}", "{:.12g}", "{:+e}"]


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False),
       st.sampled_from(FORMATS), st.booleans())
def test_every_float_format_reads_as_that_float(x: float, fmt: str, negative: bool) -> None:
    text = fmt.format(-x if negative else x)
    assert load_yaml(f"v: {text}", "t")["v"] == float(text)
    assert load_yaml(json.dumps({"v": float(text)}), "t")["v"] == float(text)


def test_the_forms_people_write() -> None:
    data = load_yaml("a: 1e-5\nb: 1E-05\nc: .5\nd: 5.\ne: 1e+300\nf: -1e-5\ng: 10\n"
                     "h: '1e-5'\ni: 1e5x\nj: .5e-3\n", "t")
    assert data == {"a": 1e-5, "b": 1e-5, "c": 0.5, "d": 5.0, "e": 1e300, "f": -1e-5,
                    "g": 10, "h": "1e-5", "i": "1e5x", "j": 5e-4}
    assert isinstance(data["g"], int)


SPACE = """
name: decay
hyperparameters:
  weight_decay: {distribution: loguniform, low: 1e-5, high: 1E-2}
  lr: {distribution: loguniform, low: 1.0e-4, high: .5}
search: {type: random, samples: 3, seed: 1}
settings: {epochs: 1, demand: {compute_pct: 10, memory_mib: 100, cores: 1, epoch_s: 1}}
program: {command: "{python} {space_dir}/train.py --wd {weight_decay} --lr {lr}"}
"""


def test_a_space_with_1e5_survives_file_space_dir_dict_and_server(
        tmp_path: Path, server: HyperSackServer) -> None:
    import hypersack

    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    direct = load_space(path)
    sent = read_space_file(path)  # JSON, {space_dir} filled: what `submit` sends
    assert "1e-05" in sent
    via_json = parse_space(load_yaml(sent, "sent"), source="sent")
    as_dict = json.loads(sent)
    for space in (direct, via_json):
        wd = space.hyperparameters["weight_decay"]
        assert isinstance(wd, LogUniform) and (wd.low, wd.high) == (1e-5, 1e-2)
    with hypersack.Client(server.address) as hs:
        for study in (hs.submit(path), hs.submit(as_dict)):
            stored = json.loads(study.space_json) if hasattr(study, "space_json") else None
            trials = hs.trials(study.id)
            assert len(trials) == 3
            assert all(1e-5 <= t.params["weight_decay"] <= 1e-2 for t in trials)
            assert all(not math.isnan(t.params["lr"]) for t in trials)
            assert stored is None or stored["hyperparameters"]["weight_decay"]["low"] == 1e-5
