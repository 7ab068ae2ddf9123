from __future__ import annotations

from pathlib import Path

import pytest

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import ClusterSpec, Profile
from hypersack.grid.space import SearchSpace, load_space
from hypersack.sampler.profiles import load_profiles

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def estimates() -> list[Profile]:
    return load_profiles(EXAMPLES / "profiles-estimates.yaml")


@pytest.fixture(scope="session")
def sp1() -> SearchSpace:
    return load_space(EXAMPLES / "sp1.yaml")


@pytest.fixture()
def four_a100() -> ClusterSpec:
    return parse_shorthand("1x4xA100-80GB@88")
