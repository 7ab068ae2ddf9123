"""A node that joins again gets the profile jobs meant for it: a job sent while its
agent was away (or lost with a restart) is planned again, not left in flight for ever."""

from __future__ import annotations

from hypersack.core.cluster import parse_shorthand
from hypersack.orchestrator import NodeJoined, ProfileMeasured, ProfileWorkload, StudySubmitted
from hypersack.testing.core import launches, make, prof, study


def test_a_rejoining_node_gets_its_profile_job_again() -> None:
    orch, _, _ = make(profiles=[])
    node = parse_shorthand("1x1xA100-80GB").nodes[0]
    orch.handle(NodeJoined(node))
    (first,) = [c for c in orch.handle(StudySubmitted(study("s", n=2)))
                if isinstance(c, ProfileWorkload)]
    # The job never reached the agent; it registers again, running nothing.
    again = [c for c in orch.handle(NodeJoined(node)) if isinstance(c, ProfileWorkload)]
    assert [(c.key, c.arch, c.node) for c in again] == [(first.key, first.arch, first.node)]
    assert launches(orch.handle(ProfileMeasured(prof("resnet18", 64), node.name)))
