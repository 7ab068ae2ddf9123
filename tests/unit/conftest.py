"""Fixtures of the unit tests (the helpers they use live in `hypersack.testing`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hypersack.server.app import HyperSackServer
from hypersack.testing.server import make_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HyperSackServer]:
    """A server on 127.0.0.1:0, stopped after the test."""
    s = make_server(tmp_path)
    try:
        yield s
    finally:
        s.stop(0)
