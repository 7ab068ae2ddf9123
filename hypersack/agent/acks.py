"""What the agent's stream sends and hears acknowledged: its messages, less any too
large to send (`_sized`); its exit and profile reports, kept until the server
acknowledges them (`_send`, `_send_unacked`, `_acked`); and the acknowledgements of its
heartbeats, which renew the fence lease as they arrive (`_heard`). A mixin of
`agent.Agent`, which holds the state named below; split out of agent.py, which keeps
the stream, the heartbeats and the server's commands.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.fields import AgentFields
from hypersack.agent.ledger import MAX_UNACKED, Beats, Unacked
from hypersack.wire.convert import HEARTBEAT_ACK, ack_id

log = logging.getLogger("hypersack.agent.agent")

MAX_ACKS = 2 * MAX_UNACKED  # acknowledgements read from one server message
MAX_SEND_BYTES = 3 << 20  # below the server's 4 MiB limit on one message


# A report's acknowledgement may wait for the server's next message to the agent, at the
# latest its next heartbeat's (Register.held_acks): a report is sent again only once it
# has waited this many heartbeat intervals (at most HELD_ACK_MAX_S: with heartbeats an
# hour apart, a report a failed store never took is not left an hour), and the agent's
# own resend interval.
HELD_ACK_BEATS = 2.0
HELD_ACK_MAX_S = 60.0
MAX_MORE = 4096  # messages read from one batch (ServerMessage.more); the rest are dropped


def unbatched(msg: pb.ServerMessage) -> list[pb.ServerMessage]:
    """The messages the server wrote as one (ServerMessage.more), in order, each as if
    it had come alone; one in `more` that has `more` of its own is not read further."""
    if not msg.more:
        return [msg]
    rest = list(msg.more[:MAX_MORE])
    if len(msg.more) > MAX_MORE:
        log.error("read %d of the %d messages written as one", MAX_MORE, len(msg.more))
    msg.ClearField("more")
    for m in rest:
        m.ClearField("more")
    return [msg, *rest]


class StreamReports(AgentFields):
    """The stream's reports and acknowledgements (see the module)."""

    # More of the agent's state these read and change (set in Agent.__init__).
    fence_s: float
    heartbeat_interval_s: float
    _unacked: Unacked
    _beats: Beats

    def _sized(self, outbox: queue.Queue[pb.AgentMessage | None]) -> Iterator[pb.AgentMessage]:
        """What the stream sends: the outbox, less any message over MAX_SEND_BYTES. The
        server would refuse it and end the stream, and it would be sent again after each
        reconnection; it is dropped once, with a log line, and never sent again."""
        for msg in iter(outbox.get, None):
            size = msg.ByteSize()
            if size <= MAX_SEND_BYTES:
                yield msg
                continue
            ack = ack_id(msg)
            if ack is not None:
                self._unacked.forget(ack)
            log.error("dropped a %s message of %d bytes (at most %d are sent)%s",
                      msg.WhichOneof("body"), size, MAX_SEND_BYTES,
                      f": {ack}" if ack else "")

    def _send(self, outbox: queue.Queue[pb.AgentMessage | None], msg: pb.AgentMessage,
              gpu_index: int) -> None:
        """Send an exit or profile report, kept to be sent again until the server
        acknowledges it (see `_unacked`)."""
        self._unacked.keep(msg, gpu_index)
        outbox.put(msg)

    def _send_unacked(self, outbox: queue.Queue[pb.AgentMessage | None], older_s: float
                      ) -> None:
        """Send again the reports not acknowledged and last sent more than `older_s` ago
        (and, unless 0: at least HELD_ACK_BEATS heartbeat intervals ago, up to
        HELD_ACK_MAX_S)."""
        if older_s > 0:
            older_s = max(older_s, min(HELD_ACK_BEATS * self.heartbeat_interval_s,
                                       HELD_ACK_MAX_S))
        for m in self._unacked.due(older_s):
            outbox.put(m)

    def _heard(self, msg: pb.ServerMessage) -> None:
        """On the stream's reader thread, as each message arrives: the heartbeats it
        acknowledges renew the fence lease from when each was sent. Not on the thread
        that runs commands: a command that takes seconds there (a launch used to wait
        for its warm process: 7 s on an H200 node) would hold the renewal back, the
        lease lapse, and the keeper fence a node the server still hears."""
        acks = [*msg.acks[:MAX_ACKS], *([msg.acked.id] if msg.HasField("acked") else [])]
        for ack in acks:
            if ack.startswith(HEARTBEAT_ACK):
                sent = self._beats.acknowledged(ack.removeprefix(HEARTBEAT_ACK))
                if sent is not None:
                    self.lease.renew(sent + self.fence_s)

    def _acked(self, ack: str) -> None:
        """The server committed a report: it is not sent again. (A heartbeat's
        acknowledgement was taken as it arrived, by `_heard`.)"""
        if not ack.startswith(HEARTBEAT_ACK):
            self._unacked.forget(ack)
