"""How the CLI reaches a server: its address, TLS, and the caller's token."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hypersack.cli.client import Client
from hypersack.core.errors import InvalidInput
from hypersack.wire.tls import channel_credentials, read_pem

DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_TOKEN_FILE = Path("~/.config/hypersack/token")
MAX_TOKEN_CHARS = 200


def add_server_flag(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--server", default=env("HYPERSACK_SERVER", DEFAULT_SERVER),
                   help=f"server address (default $HYPERSACK_SERVER or {DEFAULT_SERVER})")
    p.add_argument("--token-file", type=Path,
                   help="file holding your token (default: $HYPERSACK_TOKEN, then "
                   f"$HYPERSACK_TOKEN_FILE, then {DEFAULT_TOKEN_FILE} if it exists)")
    p.add_argument("--tls-ca", type=Path, default=env("HYPERSACK_TLS_CA"),
                   help="the cluster CA certificate: talk TLS to the server "
                   "(default $HYPERSACK_TLS_CA; none: plain, for a loopback server)")
    p.add_argument("--tls-cert", type=Path, default=env("HYPERSACK_TLS_CERT"),
                   help="a client certificate (hypersack certs issue --client NAME), for "
                   "the server's mutual-TLS port, instead of a token")
    p.add_argument("--tls-key", type=Path, default=env("HYPERSACK_TLS_KEY"),
                   help="the client certificate's key")
    p.add_argument("--tls-server-name", default=env("HYPERSACK_TLS_SERVER_NAME"),
                   help="the name in the server's certificate, if not the --server host")


def read_token_file(path: Path) -> str:
    """A token from a file that only its owner can read (like ssh's keys)."""
    path = path.expanduser()
    try:
        if path.stat().st_mode & 0o077:
            raise InvalidInput(f"{path}: a token readable by others; chmod 600 it")
        text = read_pem(path).decode(errors="replace").strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    if not text or len(text) > MAX_TOKEN_CHARS or any(c.isspace() for c in text):
        raise InvalidInput(f"{path}: expected one token (hsk_...) and nothing else")
    return text


def env_token() -> str | None:
    """The token the environment gives: $HYPERSACK_TOKEN, else the file
    $HYPERSACK_TOKEN_FILE names."""
    env = os.environ.get("HYPERSACK_TOKEN", "").strip()
    if env:
        return env
    path = os.environ.get("HYPERSACK_TOKEN_FILE")
    return read_token_file(Path(path)) if path else None


def token_from(args: argparse.Namespace) -> str | None:
    if getattr(args, "token_file", None) is not None:
        return read_token_file(args.token_file)
    token = env_token()
    if token is not None:
        return token
    default = DEFAULT_TOKEN_FILE.expanduser()
    return read_token_file(default) if default.is_file() else None


def connect(args: argparse.Namespace) -> Client:
    credentials = None
    if args.tls_ca is not None:
        credentials = channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    elif args.tls_cert is not None or args.tls_key is not None:
        raise InvalidInput("--tls-cert needs --tls-ca (the cluster CA) too")
    # A server without TLS authenticates nobody: a token would only cross the network
    # in clear text, so it goes only over TLS.
    token = token_from(args) if credentials is not None else None
    return Client(args.server, token=token, credentials=credentials,
                  server_name=args.tls_server_name)
