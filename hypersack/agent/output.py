"""What the agent reads of a trial's output: its metrics file (each step's metrics, its
iteration timing, a fused member's end) and its log (kept under its cap, its tail for
the exit), both bounded whatever the trial writes, and opened only as regular files in
its directory. A mixin of `launcher.Job`, which holds the fields named below.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hypersack.core.bounds import iteration_timing
from hypersack.wire.convert import MAX_METRIC_NAME, MAX_METRICS

log = logging.getLogger("hypersack.agent.launcher")

METRICS_READ_BYTES = 1 << 20  # of a trial's metrics file, read at most per poll
METRICS_LINE_BYTES = 64 << 10  # a longer metrics line is dropped
_TOO_LONG = f"metrics lines over {METRICS_LINE_BYTES >> 10} KiB"
METRICS_FINAL_BYTES = 64 << 20  # read at most at a trial's end
MAX_UNSENT_STEPS = 256  # steps of a learning curve kept between two sends (the latest)

_MODES = {"rb": os.O_RDONLY, "r+b": os.O_RDWR, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
          "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND}


def open_regular(path: Path, mode: str) -> IO[bytes]:
    """Open a file in a trial's directory, which the trial may own: never through a
    symbolic link (the agent may be root), never a FIFO or device. Raises OSError."""
    fd = os.open(path, _MODES[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


class JobOutput:
    """A job's output as the agent reads it (see the module)."""

    # The job's fields these read and change (launcher.Job's).
    id: str
    log_max_bytes: int
    metrics: dict[str, float]
    step: int
    unsent: dict[int, dict[str, float]]
    iter_time_s: float
    iter_window_s: float
    ended: str
    dropped: dict[str, int]
    _skip_line: bool
    _metrics_pos: int

    if TYPE_CHECKING:  # where its files lie (launcher.Job's properties)
        @property
        def log_path(self) -> Path: ...

        @property
        def kept_log_path(self) -> Path: ...

        @property
        def metrics_path(self) -> Path: ...

        @property
        def profile_path(self) -> Path: ...

    def new_metrics(self) -> bool:
        """Read lines the trial appended since the last call; True if any. What the agent
        keeps of a trial's metrics is bounded (METRICS_READ_BYTES a call, lines up to
        METRICS_LINE_BYTES, MAX_METRICS names of up to MAX_METRIC_NAME characters): what
        the trial writes beyond is dropped and counted (`dropped`, shown in its exit)."""
        try:
            with open_regular(self.metrics_path, "rb") as f:
                f.seek(self._metrics_pos)
                data = f.read(METRICS_READ_BYTES)
        except OSError:
            return False
        end = data.rfind(b"\n") + 1  # a line still being written waits
        if end == 0 and len(data) > METRICS_LINE_BYTES:
            self._skip_line = True  # one line longer than a read: dropped as it comes
            self._metrics_pos += len(data)
            return False
        self._metrics_pos += end
        changed = False
        for line in data[:end].split(b"\n")[:-1]:
            if self._skip_line:  # the rest of a line too long to read
                self._skip_line = False
                self._drop(_TOO_LONG)
                continue
            if len(line) > METRICS_LINE_BYTES:
                self._drop(_TOO_LONG)
                continue
            try:
                rec = json.loads(line)
                if rec.get("end"):
                    self.ended = str(rec["end"])[:32]
                values = rec.get("metrics", {})
                if rec.get("step") is not None:
                    self.step = int(rec["step"])
                timing = iteration_timing(rec.get("iter_s"), rec.get("iter_window_s"))
                if timing is not None:
                    self.iter_time_s, self.iter_window_s = timing
                at_step = self.unsent.setdefault(self.step, {})
                for k, v in values.items():
                    name = str(k)
                    if len(name) > MAX_METRIC_NAME:
                        self._drop(f"metric names over {MAX_METRIC_NAME} characters")
                    elif name not in self.metrics and len(self.metrics) >= MAX_METRICS:
                        self._drop(f"metric names beyond the first {MAX_METRICS}")
                    else:
                        self.metrics[name] = at_step[name] = float(v)
                while len(self.unsent) > MAX_UNSENT_STEPS:
                    del self.unsent[next(iter(self.unsent))]
                changed = True
            except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
                self._drop("malformed metrics lines")
        return changed

    def take_steps(self) -> dict[int, dict[str, float]]:
        """The steps not yet sent, with their metrics (then forgotten here)."""
        steps = {k: v for k, v in self.unsent.items() if v}
        self.unsent = {}
        return steps

    def take_timing(self) -> tuple[float, float]:
        """Seconds per iteration and their window, if reported since the last call."""
        timing = self.iter_time_s, self.iter_window_s
        self.iter_time_s = self.iter_window_s = 0.0
        return timing

    def last_metrics(self) -> None:
        """At the trial's end: read what is left of its metrics file, up to
        METRICS_FINAL_BYTES (what lies beyond is dropped and counted)."""
        start = self._metrics_pos
        while self._metrics_pos - start < METRICS_FINAL_BYTES:
            before = self._metrics_pos
            self.new_metrics()
            if self._metrics_pos == before:
                return
        try:
            left = self.metrics_path.stat().st_size - self._metrics_pos
        except OSError:
            return
        if left > 0:
            self._drop(f"bytes of metrics past the {METRICS_FINAL_BYTES >> 20} MiB read at "
                       "its end", left)

    def _drop(self, what: str, count: int = 1) -> None:
        if what not in self.dropped:
            log.warning("%s: dropped %s (counted in its exit)", self.id, what)
        self.dropped[what] = self.dropped.get(what, 0) + count

    def exit_tail(self, chars: int) -> str:
        """The log tail an exit carries, after a line counting what the agent dropped
        of the trial's output; `chars` at most in all."""
        if not self.dropped:
            return self.log_tail(chars)
        note = ("[hypersack: the agent dropped " + ", ".join(
            f"{n} {what}" for what, n in sorted(self.dropped.items())) + "]\n")[:chars // 2]
        return note + self.log_tail(chars - len(note))

    def cap_log(self) -> bool:
        """Keep the log under its cap: once log.txt passes half of it, its last quarter
        goes to log.1.txt (replacing the tail kept before) and log.txt starts again. The
        trial appends (O_APPEND), so its writes land at the new end; what it writes
        between the copy and the truncation is lost, as with `copytruncate`. Disk use
        stays under the cap plus what is written between two checks. True if rotated."""
        half = max(1, self.log_max_bytes // 2)
        try:
            size = self.log_path.stat().st_size
            if size <= half:
                return False
            keep = max(1, self.log_max_bytes // 4)
            with open_regular(self.log_path, "r+b") as f:
                f.seek(max(0, size - keep))
                tail = f.read(keep)
                f.truncate(0)
            dropped = size - len(tail)
            with open_regular(self.kept_log_path, "wb") as out:
                out.write(f"[hypersack: the log passed {half} bytes; {dropped} earlier bytes "
                          f"were dropped]\n".encode())
                out.write(tail)
        except FileNotFoundError:  # not started yet (held), or removed: nothing to cap
            return False
        except OSError as exc:
            log.warning("%s: could not cap its log: %s", self.id, exc)
            return False
        return True

    def log_tail(self, chars: int = 4000) -> str:
        """The last characters of the output: of log.txt, after the kept tail if short."""
        out = b""
        for path in (self.log_path, self.kept_log_path):
            try:
                with open_regular(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - (chars - len(out))))
                    out = f.read() + out
            except OSError:
                continue
            if len(out) >= chars:
                break
        return out.decode(errors="replace")

    def profile_result(self) -> dict[str, Any] | None:
        try:
            with open_regular(self.profile_path, "rb") as f:
                data = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
