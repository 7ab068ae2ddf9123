"""Who is calling, and what they may do.

Clients prove who they are with a bearer token (kept in the store as its SHA-256 only)
or, on the mutual-TLS port, with a client certificate that names a user. Agents prove
their node with a node certificate on the mutual-TLS port. The rules:

- an `admin` may do everything: nodes, drain, profile import, users, any study;
- a `user` submits studies, and reads, watches, cancels and sees the logs of their own;
  with `share_results` they may read (never cancel, never see the logs of) others' studies;
- anyone authenticated may list nodes and profiles (what the cluster has and knows).

Without TLS (loopback only, or `--insecure`) nobody is authenticated and every caller
acts as the local admin: the server's whole security is then who can reach the port.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from hypersack.core.bounds import is_name
from hypersack.core.clock import Clock, SystemClock
from hypersack.core.errors import (
    AlreadyExists,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from hypersack.core.types import Role, StudyRecord, TokenRecord, UserRecord
from hypersack.store.base import Store
from hypersack.wire.tls import CLIENT, NODE, Identity

METADATA_KEY = "authorization"
TOKEN_PREFIX = "hsk_"  # noqa: S105 - a prefix, not a secret
_TOKEN = re.compile(r"hsk_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")
MAX_TOKENS_PER_USER = 64
MAX_USERS = 10_000
DEFAULT_TOKEN_TTL_S = 90 * 86400.0
MAX_TOKEN_TTL_S = 5 * 365 * 86400.0
# A client certificate is the user record's only if issued after the record was made;
# the slack covers clocks that differ between the CA's host and the server's.
CERT_CLOCK_SLACK_S = 120.0


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    via: str  # token, certificate, or local (authentication is off)
    expires_at: float = 0.0  # when the credential of the call ends (0: never)

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


LOCAL = Principal("local", Role.ADMIN, "local")


def token_sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token of an `authorization: Bearer TOKEN` header, if there is one."""
    for key, value in metadata:
        if key.lower() == METADATA_KEY:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class Authenticator:
    """Users, tokens and the rules. Thread-safe: RPC threads call it concurrently."""

    def __init__(self, store: Store, *, enabled: bool, share_results: bool = False,
                 clock: Clock | None = None) -> None:
        self.enabled = enabled
        self.share_results = share_results
        self._store = store
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._users = {u.name: u for u in store.list_users()}
        self._tokens = {t.id: t for t in store.list_tokens()}
        self._by_hash = {t.sha256: t.id for t in self._tokens.values()}

    # ------------------------------------------------------------- authentication
    def client(self, token: str | None, peer: Identity | None) -> Principal:
        """The caller of a client RPC, from its token or its client certificate."""
        if not self.enabled:
            return LOCAL
        if token is None and peer is not None:
            if peer.kind == NODE:
                raise PermissionDenied(
                    f"a node certificate ({peer.name}) makes an agent, not a user: give a "
                    "token (--token-file or HYPERSACK_TOKEN)")
            if peer.kind == CLIENT:
                with self._lock:
                    user = self._users.get(peer.name)
                if user is None:
                    raise Unauthenticated(f"the client certificate names {peer.name!r}, who "
                                          "is not a user of this server (hypersack users add)")
                if peer.issued_at and peer.issued_at < user.created_at - CERT_CLOCK_SLACK_S:
                    # Issued for an earlier user of that name (removed since): removing a
                    # user revokes their certificates too.
                    raise Unauthenticated(
                        f"the client certificate for {user.name} was issued "
                        f"{_when(peer.issued_at)}, before this user {user.name} was added "
                        f"({_when(user.created_at)}): it was issued for an earlier user of "
                        f"that name; issue a new one (hypersack certs issue --client "
                        f"{user.name})")
                return Principal(user.name, user.role, "certificate")
        if token is None:
            raise Unauthenticated("no token: this server needs one (--token-file, or the "
                                  "HYPERSACK_TOKEN variable); an admin creates it with "
                                  "`hypersack token create USER`")
        if not _TOKEN.fullmatch(token):
            raise Unauthenticated("not a HyperSack token (they look like hsk_0123abcd_...)")
        digest = token_sha256(token)
        with self._lock:
            token_id = self._by_hash.get(digest)
            record = self._tokens.get(token_id) if token_id else None
            user = self._users.get(record.user) if record else None
        if record is None or not hmac.compare_digest(record.sha256, digest):
            raise Unauthenticated("unknown token")
        if record.revoked_at:
            raise Unauthenticated(f"token {record.id} was revoked")
        if record.expires_at and self._clock.now() >= record.expires_at:
            raise Unauthenticated(f"token {record.id} expired {_when(record.expires_at)}; "
                                  "ask for a new one (hypersack token create, --ttl to "
                                  "choose how long it lasts)")
        if user is None:
            raise Unauthenticated(f"token {record.id} belongs to no user")
        return Principal(user.name, user.role, "token", record.expires_at)

    def agent(self, peer: Identity | None, node: str | None, *, tls: bool) -> None:
        """Raises unless the agent's certificate is a node's, and (once the agent said
        which node it is) names exactly that node."""
        if not tls:
            return
        if peer is None:
            raise Unauthenticated(
                "agents connect to the agent port (--agent-listen) with a node certificate "
                "(hypersack certs issue --node NAME, then --tls-cert/--tls-key)")
        if peer.kind != NODE:
            raise PermissionDenied(f"a {peer.kind} certificate ({peer.name}) does not make "
                                   "an agent; agents need a node certificate")
        if node is not None and peer.name != node:
            raise PermissionDenied(f"the certificate names node {peer.name!r}; it cannot "
                                   f"register as {node!r}")

    # ------------------------------------------------------------- authorization
    def require_admin(self, who: Principal, action: str) -> None:
        if not who.is_admin:
            raise PermissionDenied(f"{action}: only an admin may do this ({who.name} is a "
                                   f"{who.role.value})")

    def owns(self, who: Principal, study: StudyRecord) -> bool:
        return who.is_admin or (bool(study.owner) and study.owner == who.name)

    def may_read(self, who: Principal, study: StudyRecord) -> bool:
        return self.share_results or self.owns(who, study)

    def require_read(self, who: Principal, study: StudyRecord) -> None:
        if not self.may_read(who, study):
            # NOT_FOUND would hide that the study exists; a user may know ids of others'
            # studies from a shared terminal, and a clear denial helps more than a riddle.
            raise PermissionDenied(f"study {study.id} belongs to {study.owner or 'nobody'}; "
                                   f"{who.name} may read only their own studies")

    def require_owner(self, who: Principal, study: StudyRecord, action: str) -> None:
        if not self.owns(who, study):
            raise PermissionDenied(f"{action} {study.id}: it belongs to "
                                   f"{study.owner or 'nobody'}, not to {who.name}")

    # ------------------------------------------------------------- users and tokens
    def add_user(self, who: Principal, name: str, role: str) -> UserRecord:
        self.require_admin(who, "adding a user")
        if not is_name(name):
            raise InvalidInput(f"user name {name[:80]!r}: use letters, digits and _.:@+=-")
        try:
            parsed = Role(role)
        except ValueError:
            raise InvalidInput(f"unknown role {role[:40]!r}; valid: admin, user") from None
        with self._lock:
            if name in self._users:
                raise AlreadyExists(f"user {name!r} exists")
            if len(self._users) >= MAX_USERS:
                raise InvalidInput(f"this server has {MAX_USERS} users already")
            user = UserRecord(name=name, role=parsed, created_at=self._clock.now())
            with self._store.transaction():
                self._store.put_user(user)
            self._users[name] = user
        return user

    def remove_user(self, who: Principal, name: str) -> UserRecord:
        """The user goes, and every token of theirs with them; their studies stay (an
        admin still sees and cancels them)."""
        self.require_admin(who, "removing a user")
        if name == who.name:
            raise InvalidInput("an admin cannot remove themselves (another admin can)")
        with self._lock:
            user = self._users.get(name)
            if user is None:
                raise NotFound(f"no user {name[:80]!r}")
            now = self._clock.now()
            revoked = [t.model_copy(update={"revoked_at": now}) for t in self._tokens.values()
                       if t.user == name and not t.revoked_at]
            with self._store.transaction():
                for t in revoked:
                    self._store.put_token(t)
                self._store.remove_user(name)
            for t in revoked:
                self._tokens[t.id] = t
            del self._users[name]
        return user

    def users(self, who: Principal) -> list[UserRecord]:
        self.require_admin(who, "listing users")
        with self._lock:
            return sorted(self._users.values(), key=lambda u: u.name)

    def create_token(self, who: Principal, user: str, label: str = "", ttl_s: float = 0.0
                     ) -> tuple[TokenRecord, str]:
        """A new token for `user` (admins: anyone; a user: themselves); the secret is
        returned once and only its hash is kept. It expires after `ttl_s` (0: the
        default, 90 days; negative: never, for admins only)."""
        user = user or who.name
        if user != who.name:
            self.require_admin(who, f"creating a token for {user}")
        if not math.isfinite(ttl_s) or ttl_s > MAX_TOKEN_TTL_S:
            raise InvalidInput(f"a token lasts at most {MAX_TOKEN_TTL_S / 86400:.0f} days "
                               "(--ttl)")
        if ttl_s < 0:
            self.require_admin(who, "creating a token that never expires")
        now = self._clock.now()
        expires = 0.0 if ttl_s < 0 else now + (ttl_s or DEFAULT_TOKEN_TTL_S)
        if len(label) > 200 or any(not ch.isprintable() for ch in label):
            raise InvalidInput("a token label is at most 200 printable characters")
        with self._lock:
            if user not in self._users:
                raise NotFound(f"no user {user!r} (hypersack users add {user} --role user)")
            live = [t for t in self._tokens.values() if t.user == user and not t.revoked_at]
            if len(live) >= MAX_TOKENS_PER_USER:
                raise InvalidInput(f"{user} has {MAX_TOKENS_PER_USER} valid tokens; revoke "
                                   "some first")
            token_id = secrets.token_hex(4)
            while token_id in self._tokens:
                token_id = secrets.token_hex(4)
            secret = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
            record = TokenRecord(id=token_id, user=user, sha256=token_sha256(secret),
                                 created_at=now, label=label, expires_at=expires)
            with self._store.transaction():
                self._store.put_token(record)
            self._tokens[token_id] = record
            self._by_hash[record.sha256] = token_id
        return record, secret

    def tokens(self, who: Principal, user: str = "") -> list[TokenRecord]:
        """The caller's tokens; an admin may ask for one user's, or everyone's ("*")."""
        user = user or (who.name if not who.is_admin else "*")
        if user != who.name:
            self.require_admin(who, "listing others' tokens")
        with self._lock:
            return [t for t in sorted(self._tokens.values(), key=lambda t: t.id)
                    if user == "*" or t.user == user]

    def revoke_token(self, who: Principal, token_id: str) -> TokenRecord:
        with self._lock:
            record = self._tokens.get(token_id)
            if record is None:
                raise NotFound(f"no token {token_id[:40]!r}")
            if record.user != who.name and not who.is_admin:
                raise PermissionDenied(f"token {token_id} belongs to {record.user}, not to "
                                       f"{who.name}")
            if record.revoked_at:
                return record
            revoked = record.model_copy(update={"revoked_at": self._clock.now()})
            with self._store.transaction():
                self._store.put_token(revoked)
            self._tokens[token_id] = revoked
        return revoked


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
