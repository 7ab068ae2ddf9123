"""Domain errors. Drivers map them to exit codes (CLI) or status codes (gRPC)."""

from __future__ import annotations


class HyperSackError(Exception):
    """Base of every error HyperSack raises on purpose; the message is for people."""


class InvalidInput(HyperSackError):
    """A search space, cluster, profile file or option is malformed."""


class NotFound(HyperSackError):
    """A study, trial, node or profile that was asked for does not exist."""


class AlreadyExists(HyperSackError):
    """Something with that id or name exists already."""


class UnknownName(InvalidInput):
    """A registry was asked for a name it does not have; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")
        self.kind = kind
        self.name = name
        self.valid = sorted(valid)


class Unauthenticated(HyperSackError):
    """The caller did not prove who it is (no token, a revoked one, no certificate)."""


class PermissionDenied(HyperSackError):
    """The caller is known, and not allowed to do this."""


class Overloaded(HyperSackError):
    """A bounded resource (watches, agent sessions) is full; try again later."""


STORE_UNAVAILABLE = "the server's database is unavailable"  # how its message begins


class StoreUnavailable(HyperSackError):
    """The store cannot be written (a read-only file, a full disk, an I/O error): what was
    being done was undone whole, and can be tried again once the store works."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{STORE_UNAVAILABLE} ({detail}); nothing was "
                         "changed: try again once it works")
        self.detail = detail


class StaleEvent(HyperSackError):
    """An event names a trial or node that does not hold what the event claims.
    `expected`: the stale event is one the server's own doing brings (the exit of an
    attempt it stopped, a copy of a report sent again before its acknowledgement
    arrived), not a sign of anything wrong: logged for operators only at info."""

    def __init__(self, message: str = "", *, expected: bool = False) -> None:
        super().__init__(message)
        self.expected = expected
