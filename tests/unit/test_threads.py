"""The server's threads carry their names into the operating system, where `top -H`,
`ps -L` and the benchmark's CPU split read them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from hypersack.server.threads import MAX_NAME_BYTES, name_os_thread, os_name
from hypersack.testing.server import make_server, wait

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="names threads through prctl and reads /proc")


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_os_name_drops_the_prefix_and_fits_the_kernels_limit() -> None:
    assert os_name("hypersack-events") == b"events"
    assert os_name("hypersack-rpc_12") == b"rpc_12"
    assert os_name("x" * 40) == b"x" * MAX_NAME_BYTES
    assert os_name("a\0b") == b"ab"
    assert len(os_name("é" * 20)) == MAX_NAME_BYTES  # cut in bytes, not characters


@linux_only
def test_a_thread_names_itself() -> None:
    seen: list[tuple[bool, str]] = []

    def run() -> None:
        seen.append((name_os_thread(), _comm(threading.get_native_id())))

    t = threading.Thread(target=run, name="hypersack-probe")
    t.start()
    t.join()
    assert seen == [(True, "probe")]


@linux_only
def test_the_servers_threads_are_named_in_the_system(tmp_path: Path) -> None:
    server = make_server(tmp_path)

    def names() -> set[str]:
        out = set()
        for t in threading.enumerate():
            if t.native_id is not None and t.is_alive():
                try:
                    out.add(_comm(t.native_id))
                except OSError:
                    pass  # it ended meanwhile
        return out

    try:
        # Each thread names itself as it starts running: on a loaded machine, a moment
        # after the server is up.
        wait(lambda: {"events", "ticker", "grpc"} <= names(), timeout_s=60)
    except AssertionError:
        raise AssertionError(f"threads named {sorted(names())}") from None
    finally:
        server.stop()
