"""Securing a cluster: `hypersack certs`, `users`, `token` and `whoami`."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypersack.cli.connect import add_server_flag, connect
from hypersack.core.errors import InvalidInput
from hypersack.wire import tls

DEFAULT_CERTS_DIR = Path("hypersack-certs")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "certs", help="a certificate authority for the cluster, and certificates it signs",
        description="TLS for a cluster: `certs init` makes the CA and the server's "
                    "certificate; `certs issue --node NAME` one per agent (its name is the "
                    "node it may register as), `--client NAME` one per user who prefers a "
                    "certificate to a token. Keys are written 0600, the directory 0700.")
    csub = p.add_subparsers(dest="action", metavar="ACTION")
    csub.required = True
    q = csub.add_parser("init", help="a new CA and a server certificate")
    q.add_argument("--dir", type=Path, default=DEFAULT_CERTS_DIR,
                   help=f"where to write (default ./{DEFAULT_CERTS_DIR})")
    q.add_argument("--server-name", action="append", default=[], metavar="NAME",
                   help="a host name or address agents and clients dial the server by "
                   "(repeatable; localhost, 127.0.0.1 and this host's names are always in)")
    q.add_argument("--days", type=int, default=tls.LEAF_DAYS,
                   help=f"validity of the server certificate (default {tls.LEAF_DAYS})")
    q = csub.add_parser("issue", help="a key and certificate for a node, client or server")
    q.add_argument("--dir", type=Path, default=DEFAULT_CERTS_DIR,
                   help=f"the CA's directory (default ./{DEFAULT_CERTS_DIR})")
    who = q.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", help="an agent's node name (writes nodes/NAME.crt and .key)")
    who.add_argument("--client", help="a user name (writes clients/NAME.crt and .key)")
    who.add_argument("--server", dest="server_names", metavar="NAME[,NAME...]",
                     help="the server again, for these host names (replaces server.crt)")
    q.add_argument("--days", type=int, default=tls.LEAF_DAYS,
                   help=f"validity (default {tls.LEAF_DAYS})")

    p = sub.add_parser("users", help="users of the server and their roles (admins only)",
                       description="With --db (the server's database, server stopped) this "
                       "works on the file directly: that is how the first admin is made.")
    usub = p.add_subparsers(dest="action", metavar="ACTION")
    usub.required = True
    q = usub.add_parser("add", help="add a user; with --db also print a first token")
    q.add_argument("name")
    q.add_argument("--role", choices=["admin", "user"], required=True,
                   help="admin: nodes, drain, profile import, users, every study; user: "
                   "their own studies")
    q.add_argument("--db", type=Path, help="the server's database, while the server is "
                   "stopped (for the first admin)")
    q.add_argument("--out", type=Path,
                   help="with --db: write the first token here (0600) instead of printing it")
    add_server_flag(q)
    q = usub.add_parser("remove", help="remove a user and revoke their tokens (their "
                        "studies stay)")
    q.add_argument("name")
    q.add_argument("--db", type=Path, help="work on the database directly (server stopped)")
    add_server_flag(q)
    q = usub.add_parser("list", help="every user")
    q.add_argument("--db", type=Path, help="read the database directly (server stopped)")
    add_server_flag(q)

    p = sub.add_parser("token", help="bearer tokens: create, list, revoke",
                       description="A token is shown once; the server keeps only its "
                       "SHA-256. Give it to the CLI with --token-file FILE or HYPERSACK_TOKEN.")
    tsub = p.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    q = tsub.add_parser("create", help="a new token (admins: for anyone; users: their own)")
    q.add_argument("user", nargs="?", default="", help="whose (default: yours)")
    q.add_argument("--label", default="", help="a note to tell tokens apart")
    q.add_argument("--ttl", type=parse_ttl, default=0.0, metavar="DURATION",
                   help="how long it lasts: 90d (the default), 12h, 30m, 3600s, or never "
                   "(admins only)")
    q.add_argument("--out", type=Path, help="write the token to this file (0600)")
    q.add_argument("--db", type=Path, help="work on the database directly (server stopped)")
    add_server_flag(q)
    q = tsub.add_parser("list", help="tokens (yours; admins: everyone's or one user's)")
    q.add_argument("user", nargs="?", default="")
    q.add_argument("--db", type=Path, help="read the database directly (server stopped)")
    add_server_flag(q)
    q = tsub.add_parser("revoke", help="revoke a token by its id (from `token list`)")
    q.add_argument("id")
    q.add_argument("--db", type=Path, help="work on the database directly (server stopped)")
    add_server_flag(q)

    p = sub.add_parser("whoami", help="who the server takes you for (user, role, how)")
    add_server_flag(p)


def run_admin(args: argparse.Namespace) -> int:
    if args.command == "certs":
        return _certs(args)
    if args.command == "whoami":
        with connect(args) as client:
            me = client.whoami()
        ends = (f"; expires {_when(me.expires_at)}" if me.expires_at else
                "; never expires" if me.via == "token" else "")
        print(f"{me.name} ({me.role}, by {me.via}{ends})")
        return 0
    if getattr(args, "db", None) is not None:
        return _offline(args)
    with connect(args) as client:
        if args.command == "users":
            if args.action == "add":
                user = client.add_user(args.name, args.role)
                print(f"added {user.name} ({user.role}); give them a token: hypersack token "
                      f"create {user.name}")
            elif args.action == "remove":
                user = client.remove_user(args.name)
                print(f"removed {user.name}; their tokens are revoked")
            else:
                for u in client.users():
                    print(f"{u.name}\t{u.role}\t{_when(u.created_at)}")
            return 0
        if args.action == "create":
            reply = client.create_token(args.user, args.label, args.ttl)
            _give(reply.secret, reply.token.id, reply.token.user, args.out)
        elif args.action == "list":
            for t in client.tokens(args.user):
                _print_token(t.id, t.user, t.created_at, t.revoked_at, t.label,
                             t.expires_at)
        else:
            t = client.revoke_token(args.id)
            print(f"token {t.id} of {t.user}: revoked")
    return 0


def _certs(args: argparse.Namespace) -> int:
    if args.action == "init":
        tls.init_ca(args.dir)
        names = list(dict.fromkeys([*tls.default_server_names(), *args.server_name]))
        paths = tls.issue(args.dir, tls.SERVER, names[0], alt_names=names, days=args.days)
        print(f"CA: {args.dir / 'ca.crt'} (its key ca.key signs every certificate: keep it "
              "on the head node only)")
        print(f"server: {paths.cert} for {', '.join(names)}")
        print(f"start the server with: hypersack-server --tls-dir {args.dir} --listen "
              "0.0.0.0:50051 (agents dial port 50052)")
        print(f"then, for each GPU node: hypersack certs issue --dir {args.dir} --node NAME")
        return 0
    if args.node:
        paths = tls.issue(args.dir, tls.NODE, args.node, days=args.days)
        print(f"node {args.node}: {paths.cert}, {paths.key}")
        print(f"copy ca.crt and both files to that node, then: hypersack-agent --node "
              f"{args.node} --tls-ca ca.crt --tls-cert {paths.cert.name} --tls-key "
              f"{paths.key.name} --server HEAD:50052")
    elif args.client:
        paths = tls.issue(args.dir, tls.CLIENT, args.client, days=args.days)
        print(f"client {args.client}: {paths.cert}, {paths.key} (for the server's mutual-TLS "
              "port; the user must exist: hypersack users add)")
    else:
        names = [n.strip() for n in args.server_names.split(",") if n.strip()]
        if not names:
            raise InvalidInput("--server: give at least one host name")
        paths = tls.issue(args.dir, tls.SERVER, names[0], alt_names=names, days=args.days,
                          overwrite=True)
        print(f"server: {paths.cert} for {', '.join(names)} (restart the server)")
    return 0


@contextmanager
def _database(path: Path, *, create: bool = False) -> Iterator[Any]:
    """The authenticator on the database file itself, as the local admin; refused while
    a server holds the database (one writer). Only `users add` creates a new file: the
    first admin comes before the server's first start."""
    from hypersack.server.auth import Authenticator
    from hypersack.store.sqlite import locked_store

    if not path.exists():
        if not create:
            raise InvalidInput(f"{path}: no such database (give the server's --db path)")
        print(f"new database {path} (start the server with --db {path})", file=sys.stderr)
    with locked_store(path) as store:
        yield Authenticator(store, enabled=True)


def _offline(args: argparse.Namespace) -> int:
    from hypersack.server.auth import LOCAL

    adding = args.command == "users" and args.action == "add"
    with _database(args.db, create=adding) as auth:
        if args.command == "users":
            if args.action == "add":
                user = auth.add_user(LOCAL, args.name, args.role)
                record, secret = auth.create_token(LOCAL, user.name, "first token")
                print(f"added {user.name} ({user.role.value})", file=sys.stderr)
                _give(secret, record.id, user.name, args.out)
            elif args.action == "remove":
                user = auth.remove_user(LOCAL, args.name)
                print(f"removed {user.name}; their tokens are revoked")
            else:
                for u in auth.users(LOCAL):
                    print(f"{u.name}\t{u.role.value}\t{_when(u.created_at)}")
            return 0
        if args.action == "create":
            record, secret = auth.create_token(LOCAL, args.user, args.label, args.ttl)
            _give(secret, record.id, record.user, args.out)
        elif args.action == "list":
            for t in auth.tokens(LOCAL, args.user or "*"):
                _print_token(t.id, t.user, t.created_at, t.revoked_at, t.label,
                             t.expires_at)
        else:
            t = auth.revoke_token(LOCAL, args.id)
            print(f"token {t.id} of {t.user}: revoked")
    return 0


def _give(secret: str, token_id: str, user: str, out: Path | None) -> None:
    if out is None:
        print(f"token {token_id} for {user} (shown once; the server keeps only its hash):",
              file=sys.stderr)
        print(secret)
        return
    out = out.expanduser()
    try:
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tls.write_private(out, (secret + "\n").encode())
    except OSError as exc:
        raise InvalidInput(f"cannot write the token to {out}: {exc.strerror or exc}; it "
                           f"is {secret} (shown once)") from None
    print(f"token {token_id} for {user} written to {out} (0600); use it with --token-file "
          f"{out} or HYPERSACK_TOKEN_FILE={out}", file=sys.stderr)


def _print_token(token_id: str, user: str, created: float, revoked: float, label: str,
                 expires: float) -> None:
    state = (f"revoked {_when(revoked)}" if revoked else
             f"expired {_when(expires)}" if expires and expires <= time.time() else
             f"valid until {_when(expires)}" if expires else "valid, never expires")
    print(f"{token_id}\t{user}\t{_when(created)}\t{state}\t{label}")


def parse_ttl(text: str) -> float:
    """`90d`, `12h`, `30m`, `3600s` or `3600` -> seconds; `never` -> -1."""
    text = text.strip().lower()
    if text == "never":
        return -1.0
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1.0)
    try:
        value = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give a duration like 90d, 12h, "
                                         "30m or never") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a positive duration, or never")
    return value


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"
