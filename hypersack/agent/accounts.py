"""Which Unix user a trial runs as. An agent started as root never runs a trial as root:
it runs each trial as the user the operator maps its study's owner to, or as one fixed
unprivileged user (`--run-as`), and refuses to start with neither (`--allow-root-trials`
is the explicit way out, on a single-user machine)."""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hypersack.core.errors import HyperSackError, InvalidInput

MAX_MAPPINGS = 4096


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def env(self) -> dict[str, str]:
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home}

    def own(self, workdir: Path) -> None:
        """The trial's directory becomes this user's (0700); the directories above it
        (the agent's) stay the agent's, and only let it pass (0711)."""
        os.chown(workdir, self.uid, self.gid, follow_symlinks=False)
        os.chmod(workdir, 0o700, follow_symlinks=False)


def lookup(name: str) -> Account:
    """An account by name (or number); root (uid 0) is refused."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError, OverflowError):
        raise InvalidInput(f"no Unix user {name[:64]!r} on this node") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise InvalidInput(f"Unix user {entry.pw_name!r} is root (uid or gid 0): trials "
                           "never run as root; name an unprivileged account")
    try:
        groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != 0)
    except OSError:
        groups = (entry.pw_gid,)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class TrialUsers:
    """The account for each trial, by its study's owner."""

    def __init__(self, default: Account | None = None,
                 by_owner: dict[str, Account] | None = None, same_named: bool = False) -> None:
        self.default = default
        self.by_owner = dict(by_owner or {})
        self.same_named = same_named  # `*=*`: each owner as the account of their name

    @property
    def switches(self) -> bool:
        return self.default is not None or bool(self.by_owner) or self.same_named

    @property
    def pooled(self) -> bool:
        """Whether owners share one account (`--run-as` for those not mapped): then
        their trials are not isolated from each other."""
        return self.default is not None

    @classmethod
    def parse(cls, run_as: str | None, user_map: Iterable[str], *, allow_root: bool,
              euid: int | None = None) -> TrialUsers:
        euid = os.geteuid() if euid is None else euid
        pairs = [p.strip() for item in user_map for p in item.split(",") if p.strip()]
        if len(pairs) > MAX_MAPPINGS:
            raise InvalidInput(f"--user-map: at most {MAX_MAPPINGS} entries")
        by_owner: dict[str, Account] = {}
        same_named = False
        for pair in pairs:
            owner, sep, unix = pair.partition("=")
            if not sep or not owner or not unix:
                raise InvalidInput(f"--user-map {pair[:80]!r}: expected OWNER=UNIXUSER, or "
                                   "*=* (each owner as the Unix user of the same name)")
            if (owner == "*") != (unix == "*"):
                raise InvalidInput(f"--user-map {pair[:80]!r}: * maps only to *")
            if owner == "*":
                same_named = True
                continue
            by_owner[owner] = lookup(unix)
        default = lookup(run_as) if run_as else None
        users = cls(default, by_owner, same_named)
        if users.switches and euid != 0:
            raise InvalidInput("--run-as and --user-map switch users, which needs an agent "
                               "started as root; without them trials run as the agent's user")
        if euid == 0 and not users.switches and not allow_root:
            raise InvalidInput(
                "this agent runs as root, and trials must not: give --run-as USER (an "
                "unprivileged account, e.g. a dedicated 'hypersack' user), or --user-map "
                "OWNER=USER to run each study owner's trials as their own account "
                "(--allow-root-trials only on a single-user machine)")
        return users

    def account_for(self, owner: str) -> Account | None:
        """The account a trial of this owner runs as; None: the agent's own user."""
        if not self.switches:
            return None
        account = self.by_owner.get(owner)
        if account is None and self.same_named and owner:
            try:
                account = lookup(owner)
            except InvalidInput as exc:
                if self.default is None:
                    raise HyperSackError(f"study owner {owner[:64]!r}: {exc} (--user-map "
                                         "*=* runs each owner as the Unix user of their "
                                         "name)") from None
        account = account or self.default
        if account is None:
            raise HyperSackError(f"this agent maps no Unix user for study owner "
                                 f"{owner or '(none)'!r} and has no --run-as: not run")
        return account

    def describe(self) -> str:
        if not self.switches:
            return "as the agent's user"
        parts = [f"{o}->{a.name}" for o, a in sorted(self.by_owner.items())]
        if self.same_named:
            parts.append("each other owner as the Unix user of their name")
        if self.default:
            parts.append(f"others as {self.default.name} (group "
                         f"{_group_name(self.default.gid)})")
        return "; ".join(parts)
