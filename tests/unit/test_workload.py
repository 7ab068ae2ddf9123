"""Workload identity: a user's program is its own workload (named, or hashed from its
command), keyed by the hyperparameters that change its demand; its profiles never mix
with a zoo model's or another program's; a study may state its demand instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hypersack.cli.main import main
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput
from hypersack.core.types import Profile, TrialState, WorkloadKey
from hypersack.grid.expand import expand
from hypersack.grid.space import parse_space
from hypersack.orchestrator import NodeJoined, ProfileWorkload, StudySubmitted
from hypersack.sampler.profiles import load_profiles, profile_to_row
from hypersack.testing.core import launches, make
from hypersack.wire.convert import key_from_pb, key_to_pb, profile_from_pb, profile_to_pb


def own(**extra: Any) -> dict[str, Any]:
    space: dict[str, Any] = {
        "name": "mine",
        "hyperparameters": {"lr": [0.1, 0.01], "width": [64, 128]},
        "program": {"command": "{python} train.py --lr {lr} --width {width}"},
    }
    for k, v in extra.items():
        space[k] = {**space.get(k, {}), **v} if isinstance(v, dict) and k != "program" else v
    return space


def keys(space: dict[str, Any]) -> list[WorkloadKey]:
    return [t.key for t in expand(parse_space(space), "s-1")]


def test_a_command_program_needs_no_model_and_no_batch_size() -> None:
    ks = keys(own())
    assert len(ks) == 4 and len(set(ks)) == 1  # lr and width change no demand by default
    (key,) = set(ks)
    assert key.model.startswith("cmd-") and key.batch_size == 0 and key.params == ()
    # Another command is another workload; the same command the same one.
    other = own(program={"command": "{python} other.py --lr {lr} --width {width}"})
    assert set(keys(other)) != {key} and set(keys(own())) == {key}


def test_named_workloads_and_demand_keys() -> None:
    ks = keys(own(workload="my-mlp", settings={"demand_keys": ["width"]}))
    assert {k.model for k in ks} == {"my-mlp"}
    assert {k.params for k in ks} == {(("width", "64"),), (("width", "128"),)}
    # A program's key shows its demand keys only, none of a zoo model's fields.
    assert {k.label() for k in ks} == {"my-mlp/width=128", "my-mlp/width=64"}
    adam = WorkloadKey(model="alice:net", batch_size=32, optimizer="adam", fusion_width=2)
    assert adam.label() == "alice:net/b32/adam/k2"
    assert WorkloadKey(model="resnet18", batch_size=64).label() == "resnet18/b64/sgd/fp32/k1"
    # The models of a command program change its demand; its workload stays its own.
    with_models = keys(own(models=["resnet18", "resnet34"],
                           program={"command": "{python} t.py --arch {model} --lr {lr}"}))
    assert {k.params for k in with_models} == {(("model", "resnet18"),), (("model", "resnet34"),)}
    assert all(k.model.startswith("cmd-") for k in with_models)


@pytest.mark.parametrize("space,message", [
    ({"name": "z", "hyperparameters": {"batch_size": [64]}}, "models"),
    ({"name": "z", "models": ["resnet18"], "hyperparameters": {"lr": [0.1]}}, "batch_size"),
    ({"name": "z", "models": ["resnet18"], "workload": "x",
      "hyperparameters": {"batch_size": [64]}}, "only for command programs"),
    (own(program={"command": "./t {model}"}), "{model} needs models"),
    (own(settings={"demand_keys": ["depth"]}), "'depth' is not a hyperparameter"),
    (own(settings={"demand_keys": ["width", "width"]}), "given twice"),
    (own(settings={"demand": {f"A{i}": {"compute_pct": 1, "memory_mib": 1}
                              for i in range(65)}}), "demand"),
    (own(settings={"demand": {"compute_pct": 10}}), "memory_mib"),
    (own(settings={"demand": {"A100": {"compute_pct": -1, "memory_mib": 10}}}), "compute_pct"),
])
def test_what_a_space_must_say(space: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_space(space)


def test_a_stated_demand_skips_profiling_per_architecture() -> None:
    orch, store, _ = make(profiles=[])
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    space = parse_space(own(settings={"demand": {"A100": {"compute_pct": 50,
                                                          "memory_mib": 1000}}}))
    cmds = orch.handle(StudySubmitted(space))
    assert not [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert len(launches(cmds)) == 4  # 4 x 50 % on two GPUs at ratio 1
    (profile,) = store.list_profiles()
    assert profile.source.startswith("stated by study mine-1")
    assert profile.demand.compute_pct == 50 and profile.key.model.startswith("cmd-")
    # Without a stated demand the program is profiled, under its own identity.
    orch2, _, _ = make(profiles=[])
    orch2.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    jobs = [c for c in orch2.handle(StudySubmitted(parse_space(own())))
            if isinstance(c, ProfileWorkload)]
    assert [j.key.model.startswith("cmd-") for j in jobs] == [True]
    assert {t.state for t in orch2.trials()} == {TrialState.PROFILING}


def test_keys_with_demand_params_survive_files_protobuf_and_the_store(tmp_path: Path) -> None:
    key = WorkloadKey(model="my-mlp", batch_size=0, params=(("depth", "4"), ("width", "64")))
    assert key_from_pb(key_to_pb(key)) == key
    p = Profile.model_validate({"key": key.model_dump(), "arch": "A100",
                                "demand": {"compute_pct": 20, "memory_mib": 100, "cores": 1},
                                "iter_time_s": 0.1, "iters_per_epoch": 10})
    assert profile_from_pb(profile_to_pb(p), where="t") == p
    row = profile_to_row(p)
    assert row["params"] == "depth=4,width=64"
    path = tmp_path / "p.yaml"
    path.write_text("profiles:\n- " + json.dumps(row) + "\n")
    assert load_profiles(path) == [p]
    _, store, _ = make(profiles=[p])
    assert store.get_profile(key, "A100") == p
    assert store.get_profile(key.model_copy(update={"params": ()}), "A100") is None


NO_SDK = """
import sys, json, os
lr = float(sys.argv[1])
path = os.environ.get("HYPERSACK_METRICS_FILE")
if path:
    with open(path, "a") as f:
        f.write(json.dumps({"step": 1, "metrics": {"loss": abs(lr - 0.01)}}) + "\\n")
"""


def test_a_program_without_the_sdk_is_profiled_on_its_whole_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "plain.py"
    script.write_text(NO_SDK)
    space = tmp_path / "plain.yaml"
    space.write_text(f"name: plain\nhyperparameters: {{lr: [0.1, 0.01]}}\n"
                     f"program: {{command: '{{python}} {script} {{lr}}'}}\n")
    state = tmp_path / "st"
    assert main(["run", str(space), "--backend", "cpu", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "plain-1: COMPLETED, completed 2" in out and "1 new workload(s) measured" in out
    assert main(["profiles", "--db", str(state / "run.db"), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["key"]["model"].split(":")[-1].startswith("cmd-")
    assert "the whole run" in row["source"] and row["key"]["model"].startswith(row["owner"] + ":")
    assert row["demand"]["memory_mib"] >= 5  # at least an interpreter's resident size


def test_forgetting_a_workload_profiles_it_again() -> None:
    from hypersack.core.errors import NotFound
    from hypersack.orchestrator import ProfileFailed, ProfilesForgotten

    orch, store, _ = make(profiles=[])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    space = parse_space(own(workload="mlp"))
    cmds = orch.handle(StudySubmitted(space))
    while jobs := [c for c in cmds if isinstance(c, ProfileWorkload)]:  # each sample fails
        cmds = orch.handle(ProfileFailed(jobs[0].key, "A100", jobs[0].node, "Traceback: bug"))
        job = jobs[0]
    assert {t.state for t in orch.trials()} == {TrialState.FAILED}
    assert orch.known_slots("mlp") == [(job.key, "A100")]
    cmds = orch.handle(ProfilesForgotten("mlp"))
    assert orch.known_slots("mlp") == [] and store.list_profiles() == []
    assert not [c for c in cmds if isinstance(c, ProfileWorkload)]  # nothing waits for it
    with pytest.raises(NotFound):
        orch.handle(ProfilesForgotten("mlp"))


def test_profiles_forget_on_a_server_is_for_admins(tmp_path: Path) -> None:
    from hypersack.core.errors import NotFound, PermissionDenied
    from hypersack.testing.server import start

    s = start(tmp_path)
    try:
        with s.client("root") as root:
            root.import_profiles([profile_to_pb(Profile.model_validate({
                "key": {"model": "mlp", "batch_size": 0}, "arch": "A100",
                "demand": {"compute_pct": 20, "memory_mib": 100, "cores": 1},
                "iter_time_s": 0.1, "iters_per_epoch": 10}))], replace=False)
        with s.client("alice") as alice, pytest.raises(PermissionDenied):
            alice.forget_profiles("mlp")
        with s.client("root") as root:
            assert root.forget_profiles("mlp", "A100") == 1
            assert [p for p in root.profiles() if p.key.model == "mlp"] == []
            with pytest.raises(NotFound):
                root.forget_profiles("mlp")
    finally:
        s.server.stop(0)


def test_profile_files_are_written_to_a_database_only_without_its_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hypersack.testing.server import make_server

    est = str(Path(__file__).parents[2] / "examples" / "profiles-estimates.yaml")
    server = make_server(tmp_path)
    db = str(server.settings.db)
    try:
        assert main(["profiles", "import", est, "--db", db, "--replace"]) == 2
        assert "in use by hypersack-server" in capsys.readouterr().err
        assert main(["profiles", "forget", "resnet18", "--db", db]) == 2
    finally:
        server.stop(0)
    capsys.readouterr()
    assert main(["profiles", "forget", "resnet18", "--db", db, "--arch", "A100"]) == 0
    # Four batch sizes, each alone and fused 2, 4 and 8 wide.
    assert "forgot 16 profile(s)" in capsys.readouterr().out
    assert main(["profiles", "forget", "resnet18", "--db", db, "--arch", "A100"]) == 2
