"""Least privilege (the command guard: test_guard.py): clean trial environments, reserved
placeholders, work directories that stay inside their root, and a node that cannot
claim trials it was never given."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from hypersack.agent.guard import clean_env
from hypersack.agent.launcher import argv_for, job_dir
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput, StaleEvent
from hypersack.core.types import TrialState
from hypersack.grid.space import Program, parse_space
from hypersack.orchestrator import KillTrial, NodeJoined, RunningTrial, StudySubmitted, Tick
from hypersack.server.app import HyperSackServer
from hypersack.testing.core import launches, make, space
from hypersack.testing.server import SLEEP_SPACE, RawAgent


def test_a_clean_environment_keeps_only_what_is_declared() -> None:
    agent = {"PATH": "/bin", "HOME": "/root", "LANG": "C", "LC_ALL": "C",
             "CUDA_VISIBLE_DEVICES": "0", "AWS_SECRET_ACCESS_KEY": "s", "HYPERSACK_DB": "x",
             "LD_PRELOAD": "/evil.so", "PYTHONPATH": "/p", "NCCL_DEBUG": "INFO"}
    env = clean_env(agent, ["PYTHONPATH", "NCCL_*"])
    assert set(env) == {"PATH", "HOME", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "PYTHONPATH",
                        "NCCL_DEBUG"}


@pytest.mark.parametrize("name", ["python", "trial_id", "study_id", "workdir"])
def test_reserved_placeholders_are_no_hyperparameter_names(name: str) -> None:
    data = {"name": "r", "models": ["resnet18"],
            "hyperparameters": {"batch_size": [64], name: ["/tmp/evil"]},
            "program": {"command": "{python} t.py"}}
    with pytest.raises(InvalidInput, match=f"hyperparameters.{name}: a reserved name"):
        parse_space(data, source="s.yaml")


def test_the_agents_fields_win_over_parameters() -> None:
    argv = argv_for(Program(command="{python} t.py {workdir}"),
                    {"python": "/tmp/evil", "workdir": "/w"})
    assert argv == [sys.executable, "t.py", "/w"]


@pytest.mark.parametrize("group,job", [("..", ".."), ("../../etc", "x"), ("", "."),
                                       ("a/b", ".hidden")])
def test_work_directories_stay_inside_their_root(tmp_path: Path, group: str, job: str) -> None:
    d = job_dir(tmp_path, group, job)
    assert d.resolve().is_relative_to(tmp_path.resolve()) and d.parent.parent == tmp_path
    assert not d.name.startswith(".") and not d.parent.name.startswith(".")


def test_job_directories_are_private(tmp_path: Path) -> None:
    from hypersack.agent.launcher import Job

    job = Job("t", 0, tmp_path / "s" / "t", [sys.executable, "-c", "pass"], {}, base_env={})
    job.start()
    while job.poll() is None:
        pass
    assert stat.S_IMODE(job.workdir.stat().st_mode) == 0o700


def test_a_node_cannot_claim_trials_it_was_never_given() -> None:
    orch, _, _ = make(heartbeat_timeout_s=30.0)
    first = launches(orch.handle(StudySubmitted(space(n_lr=3))))
    assert first == []  # no node yet: every trial is pending
    ids = [t.id for t in orch.trials()]
    forged = parse_shorthand("1x1xA100-80GB").nodes[0].model_copy(update={"name": "evil"})
    cmds = orch.handle(NodeJoined(forged, tuple(RunningTrial(i, 0, attempt=1) for i in ids)))
    # Nothing adopted; what it claims to run is killed; the trials are placed as usual.
    assert {c.trial_id for c in cmds if isinstance(c, KillTrial)} == set(ids)
    placed = launches(cmds)
    assert all(orch.trial(c.trial_id).launches == 1 for c in placed)
    # A node that ran a trial once cannot report its exit after the trial moved on.
    honest = parse_shorthand("1x1xA100-80GB").nodes[0].model_copy(update={"name": "a"})
    orch2, _, clock2 = make(heartbeat_timeout_s=30.0)
    orch2.handle(NodeJoined(honest))
    (launch,) = launches(orch2.handle(StudySubmitted(space(n_lr=1))))
    clock2.advance(31)
    orch2.handle(Tick())  # a is lost: the trial waits, PENDING
    from hypersack.orchestrator import TrialFinished

    with pytest.raises(StaleEvent):
        orch2.handle(TrialFinished(launch.trial_id, "evil", {"loss": -1.0}, attempt=1))
    assert orch2.trial(launch.trial_id).state == TrialState.PENDING


def test_a_forged_register_over_grpc_adopts_nothing(server: HyperSackServer
                                                    ) -> None:
    import grpc

    from hypersack._proto.v1 import hypersack_pb2 as pb
    from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc

    stub = pb_grpc.SchedulerStub(grpc.insecure_channel(server.address))
    study = stub.SubmitStudy(pb.SubmitStudyRequest(space_yaml=SLEEP_SPACE, source="t"))
    ids = [t.id for t in stub.ListTrials(pb.ListTrialsRequest(study_id=study.id)).trials]
    agent = RawAgent(server.address)
    agent.register("forger", gpus=1, running=tuple(ids))
    kills = set()
    while len(kills) < len(ids):
        msg = agent.next()
        assert isinstance(msg, pb.ServerMessage)
        if msg.WhichOneof("body") == "kill":
            kills.add(msg.kill.trial_id)
    assert kills == set(ids)
    trials = stub.ListTrials(pb.ListTrialsRequest(study_id=study.id)).trials
    assert all(t.launches <= 1 for t in trials)  # placed by the server, not adopted
    agent.close()


@pytest.mark.parametrize("listen,ok", [("127.0.0.1:0", True), ("localhost:0", True),
                                       ("[::1]:0", True), ("0.0.0.0:0", False),
                                       ("[::]:0", False), ("head.example:50051", False)])
def test_a_non_loopback_listen_needs_insecure(tmp_path: Path, listen: str, ok: bool,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from hypersack.server.app import main
    from hypersack.wire.settings import is_loopback

    assert is_loopback(listen) is ok
    if ok:
        return
    assert main(["--listen", listen, "--db", str(tmp_path / "s.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused" in err and "--insecure" in err
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened


def test_insecure_listen_warns_at_start(tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    from hypersack.wire.settings import ServerSettings

    s = HyperSackServer(ServerSettings(listen="0.0.0.0:0", insecure=True, db=tmp_path / "s.db"))
    s.start()
    try:
        assert any("WITHOUT TLS or authentication" in r.getMessage() for r in caplog.records)
    finally:
        s.stop(0)


@pytest.mark.parametrize("node", ["../../x", "a/b", "", "x" * 200])
def test_an_agent_refuses_a_node_name_it_could_not_register(
        tmp_path: Path, node: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hypersack.agent.app import main

    rc = main(["--node", node, "--server", "127.0.0.1:1", "--backend", "fake",
               "--inventory", "1xA100-80GB@8", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "node" in err
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------- trial users
def test_a_root_agent_needs_an_unprivileged_user_for_its_trials() -> None:
    from hypersack.agent.accounts import TrialUsers

    with pytest.raises(InvalidInput, match="--run-as"):
        TrialUsers.parse(None, [], allow_root=False, euid=0)
    assert not TrialUsers.parse(None, [], allow_root=True, euid=0).switches
    assert TrialUsers.parse(None, [], allow_root=False, euid=1000).account_for("x") is None
    with pytest.raises(InvalidInput, match="root"):
        TrialUsers.parse("root", [], allow_root=False, euid=0)
    with pytest.raises(InvalidInput, match="root"):
        TrialUsers.parse("0", [], allow_root=False, euid=0)
    with pytest.raises(InvalidInput, match="no Unix user"):
        TrialUsers.parse("no-such-user-here", [], allow_root=False, euid=0)
    with pytest.raises(InvalidInput, match="OWNER=UNIXUSER"):
        TrialUsers.parse(None, ["alice"], allow_root=False, euid=0)
    with pytest.raises(InvalidInput, match="started as root"):
        TrialUsers.parse("nobody", [], allow_root=False, euid=1000)


def test_owners_map_to_their_accounts_and_others_are_refused() -> None:
    import pwd

    from hypersack.agent.accounts import TrialUsers
    from hypersack.core.errors import HyperSackError

    nobody = pwd.getpwnam("nobody")
    users = TrialUsers.parse(None, ["alice=nobody"], allow_root=False, euid=0)
    account = users.account_for("alice")
    assert account is not None and account.uid == nobody.pw_uid and 0 not in account.groups
    assert account.env()["USER"] == "nobody"
    with pytest.raises(HyperSackError, match="'bob'"):
        users.account_for("bob")
    fallback = TrialUsers.parse("nobody", ["alice=nobody"], allow_root=False, euid=0)
    assert fallback.account_for("bob") == account


def test_the_agent_never_follows_a_link_a_trial_left_in_its_directory(tmp_path: Path) -> None:
    from hypersack.agent.launcher import Job

    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    job = Job("t1", 0, tmp_path / "w", [sys.executable, "-c", "pass"], {})
    job.workdir.mkdir()
    (job.workdir / "log.txt").symlink_to(secret)
    (job.workdir / "metrics.jsonl").symlink_to(secret)
    (job.workdir / "profile.json").symlink_to(secret)
    assert "secret" not in job.log_tail()
    assert not job.new_metrics()
    assert job.profile_result() is None
    import os
    os.mkfifo(job.workdir / "log.1.txt")  # nor a FIFO: it would block the agent
    assert job.log_tail() == ""
    assert secret.read_text() == "root's secret\n"
