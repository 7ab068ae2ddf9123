from __future__ import annotations

from pathlib import Path

import pytest

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import ClusterSpec, Profile
from hypersack.grid.space import SearchSpace, load_space
from hypersack.sampler.profiles import load_profiles

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's output at the width it has in a pipe (cli/control.make_console), not at
    the width of the terminal the suite runs in: a test that wants one sets COLUMNS."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def estimates() -> list[Profile]:
    return load_profiles(EXAMPLES / "profiles-estimates.yaml")


@pytest.fixture(scope="session")
def sp1() -> SearchSpace:
    """SP1 packed with trials alone: what the paper measures and the interference model
    is calibrated on (fused groups: tests/unit/test_fusion.py)."""
    space = load_space(EXAMPLES / "sp1.yaml")
    settings = space.settings.model_copy(update={"fusion": "off"})
    return space.model_copy(update={"settings": settings})


@pytest.fixture()
def four_a100() -> ClusterSpec:
    return parse_shorthand("1x4xA100-80GB@88")
