"""The server's threads named in the operating system, as they are in Python: `top -H`,
`ps -L -o tid,comm,time` and `/proc/PID/task/*/comm` then tell the event worker from
the gRPC loop and from gRPC's own threads (`event_engine`), and
`scripts/bench_control_plane.py` splits the server's CPU by them. Python names its
threads for itself only; every one is `python` to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

PR_SET_NAME = 15
MAX_NAME_BYTES = 15  # the kernel's limit (16 with the terminating NUL)

_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        _libc = None


def os_name(name: str) -> bytes:
    """A thread's name as the kernel keeps it: at most 15 bytes, the `hypersack-` prefix
    dropped first (`hypersack-events` is `events`), no NUL."""
    short = name.removeprefix("hypersack-").replace("\0", "")
    return short.encode(errors="replace")[:MAX_NAME_BYTES]


def name_os_thread() -> bool:
    """Name the calling thread in the operating system as it is named in Python. True
    where the system took it; a system without the call keeps the old name."""
    if _libc is None:
        return False
    raw = os_name(threading.current_thread().name)
    try:
        return int(_libc.prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)) == 0
    except (AttributeError, OSError):
        return False
