"""Users isolated from each other on a node: a node whose agent is not root runs one
owner's trials only (the server places no other's there, profile jobs included, and the
agent refuses them), `--user-map *=*` runs each owner as their own account, and
`--run-as` alone is said to pool everyone into one."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypersack.agent.accounts import TrialUsers
from hypersack.agent.agent import Agent
from hypersack.agent.app import one_owner
from hypersack.agent.devices import FakeBackend
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import HyperSackError, InvalidInput
from hypersack.orchestrator import NodeJoined, ProfileWorkload, StudySubmitted
from hypersack.testing.core import launches, make, study


def node(name: str, owner: str = "") -> object:
    spec = parse_shorthand("1x1xA100-80GB").nodes[0]
    return spec.model_copy(update={"name": name, "owner": owner})


def test_a_node_of_one_owner_gets_only_that_owners_trials() -> None:
    orch, _, _ = make()
    orch.handle(NodeJoined(node("alices", owner="alice")))  # type: ignore[arg-type]
    bob = launches(orch.handle(StudySubmitted(study("b", n=4), owner="bob")))
    assert bob == []  # nowhere to run: the only node is alice's
    alice = launches(orch.handle(StudySubmitted(study("a", n=4), owner="alice")))
    assert alice and {c.node for c in alice} == {"alices"}
    cmds = orch.handle(NodeJoined(node("shared")))  # type: ignore[arg-type]
    assert "bob" in {c.owner for c in launches(cmds)}  # bob's run on the node of anyone
    on_alices = [t for t in orch.trials() if t.node == "alices"]
    assert on_alices and all(t.study_id.startswith("a-") for t in on_alices)


def test_profile_jobs_go_only_where_their_owner_may_run() -> None:
    orch, _, _ = make(profiles=[])
    orch.handle(NodeJoined(node("alices", owner="alice")))  # type: ignore[arg-type]
    cmds = orch.handle(StudySubmitted(study("b", n=2), owner="bob"))
    assert not [c for c in cmds if isinstance(c, ProfileWorkload)]
    cmds = orch.handle(NodeJoined(node("open")))  # type: ignore[arg-type]
    (job,) = [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert job.node == "open" and job.owner == "bob"


def test_a_non_root_agent_on_a_secured_cluster_names_its_owner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(InvalidInput, match="give --owner NAME"):
        one_owner(None, TrialUsers(), secured=True)
    assert one_owner(None, TrialUsers(), secured=False) == ""  # loopback, no users
    assert one_owner("alice", TrialUsers(), secured=True) == "alice"
    assert one_owner("*", TrialUsers(), secured=True) == ""
    with pytest.raises(InvalidInput, match="a user name"):
        one_owner("a b", TrialUsers(), secured=True)


def test_an_agent_of_one_owner_refuses_anothers_trials(tmp_path: Path) -> None:
    from hypersack._proto.v1 import hypersack_pb2 as pb

    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "w", owner="alice")
    assert agent._register().register.owner == "alice"
    program = pb.Program(builtin="sleep")
    with pytest.raises(HyperSackError, match="runs the trials of alice only"):
        agent._job("t", "s-1", "s-1", 0, program, "{}", 1.0, owner="bob")
    agent._job("t", "s-1", "s-1", 0, program, "{}", 1.0, owner="alice")


def test_each_owner_as_their_own_account() -> None:
    users = TrialUsers.parse(None, ["*=*"], allow_root=False, euid=0)
    assert users.switches and not users.pooled
    account = users.account_for("nobody")
    assert account is not None and account.name == "nobody"
    with pytest.raises(HyperSackError, match="is root"):
        users.account_for("root")
    with pytest.raises(HyperSackError, match="no Unix user"):
        users.account_for("no-such-user-here")
    pooled = TrialUsers.parse("nobody", [], allow_root=False, euid=0)
    assert pooled.pooled
    with pytest.raises(InvalidInput, match=r"\* maps only to \*"):
        TrialUsers.parse(None, ["*=nobody"], allow_root=False, euid=0)
