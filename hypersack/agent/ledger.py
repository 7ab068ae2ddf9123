"""What the agent told the server and waits to hear back on: its exit and profile
reports, sent again until the server acknowledges them as committed (`Unacked`), and its
heartbeats, whose acknowledgement renews the fence lease from when each was sent
(`Beats`). Neither sends anything: the agent's stream does."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.wire.convert import ack_id

log = logging.getLogger(__name__)

MAX_UNACKED = 10_000  # reports kept for the server's acknowledgement; the oldest go past it
MAX_REPORT_TRIES = 100  # sends of one report (every resend interval) before it is dropped
BEATS_KEPT = 64  # heartbeats whose send time is kept for their acknowledgement


class Unacked:
    """Exit and profile reports the server has not yet acknowledged, by their ack id:
    (the message, the device it was about, when it was last sent, how many times it was
    sent). Sent again at each (re)connection and every resend interval until
    acknowledged, so no exit is lost to a broken stream or to a server whose store
    failed. Guarded by the agent's jobs lock: its heartbeats list the trials whose exits
    wait here as running."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._reports: dict[str, tuple[pb.AgentMessage, int, float, int]] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._reports))

    def __len__(self) -> int:
        return len(self._reports)

    def keep(self, msg: pb.AgentMessage, gpu_index: int) -> None:
        """A report about to be sent the first time (one without an ack id is not kept)."""
        ack = ack_id(msg)
        if ack is None:
            return
        with self._lock:
            self._reports.pop(ack, None)
            self._reports[ack] = (msg, gpu_index, time.monotonic(), 1)
            while len(self._reports) > MAX_UNACKED:
                dropped = next(iter(self._reports))
                del self._reports[dropped]
                log.error("dropped the unacknowledged report %s: more than %d wait",
                          dropped, MAX_UNACKED)

    def forget(self, ack: str) -> None:
        """The server committed it, or it can never be sent: it is not sent again."""
        with self._lock:
            self._reports.pop(ack, None)

    def due(self, older_s: float) -> list[pb.AgentMessage]:
        """The reports last sent more than `older_s` ago, to send again now; one sent
        MAX_REPORT_TRIES times is dropped instead (the server never takes it: it
        refuses it, or cannot read it; the heartbeats settle the trial)."""
        now = time.monotonic()
        out = []
        with self._lock:
            due = [(ack, m, gpu, tries) for ack, (m, gpu, at, tries) in self._reports.items()
                   if now - at >= older_s]
            for ack, m, gpu, tries in due:
                if tries >= MAX_REPORT_TRIES:
                    del self._reports[ack]
                    log.error("dropped the report %s: the server did not acknowledge it "
                              "after %d tries", ack, tries)
                    continue
                self._reports[ack] = (m, gpu, now, tries + 1)
                out.append(m)
        return out

    def exits(self) -> list[tuple[pb.TrialExited, int]]:
        """The exits waiting, with their devices. The caller holds the lock."""
        return [(m.exited, gpu) for m, gpu, _, _ in self._reports.values()
                if m.WhichOneof("body") == "exited"]


class Beats:
    """The heartbeats sent on this agent's streams, numbered, and when each went: the
    server's acknowledgement of one renews the fence lease from its send time (not from
    when the acknowledgement arrived, which a slow link delays)."""

    def __init__(self) -> None:
        self.count = 0
        self._sent: dict[int, float] = {}
        # Sent from the heartbeat thread, acknowledged on the stream's reader thread.
        self._lock = threading.Lock()

    def sent(self, at: float) -> int:
        """A heartbeat goes now (`at`): its number."""
        with self._lock:
            self.count += 1
            self._sent[self.count] = at
            for old in [n for n in self._sent if n <= self.count - BEATS_KEPT]:
                del self._sent[old]
            return self.count

    def sent_at(self, number: int) -> float | None:
        with self._lock:
            return self._sent.get(number)

    def acknowledged(self, number: str) -> float | None:
        """The send time of the heartbeat the server acknowledged by `number` (text from
        the wire), once; None for one unknown, acknowledged already, or malformed."""
        if not (number.isdigit() and len(number) < 20):
            return None
        with self._lock:
            return self._sent.pop(int(number), None)
