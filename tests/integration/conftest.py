"""Fixtures of the tests with real processes on loopback (the cluster itself lives in
`hypersack.testing.cluster`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hypersack.testing.cluster import Cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here runs real processes: mark them slow (`-m "not slow"` skips them)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
