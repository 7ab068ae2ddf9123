"""Authentication and authorization over real TLS connections on loopback: an in-process
server with the cluster's certificates, agents with and without node certificates,
clients with and without tokens. Each refusal of the security issue is proven here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client
from hypersack.cli.main import main as cli_main
from hypersack.core.errors import InvalidInput, PermissionDenied, Unauthenticated
from hypersack.server.app import HyperSackServer
from hypersack.server.auth import LOCAL, Authenticator
from hypersack.testing.server import SLEEP_SPACE, RawAgent, Secured, make_certs, start
from hypersack.wire import tls
from hypersack.wire.settings import ServerSettings


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    s = start(tmp_path)
    try:
        yield s
    finally:
        s.server.stop(0)


def _refused(agent: RawAgent) -> grpc.RpcError:
    msg = agent.next()
    assert isinstance(msg, grpc.RpcError), msg
    return msg


# ----------------------------------------------------------------- agents
def test_an_agent_with_its_node_certificate_registers(secured: Secured) -> None:
    agent = secured.agent(tls.NODE, "n1")
    agent.register("n1")
    msg = agent.next()
    assert isinstance(msg, pb.ServerMessage) and msg.WhichOneof("body") == "registered"
    with secured.client("root") as c:
        assert [n.name for n in c.nodes()] == ["n1"]
    agent.close()


def test_an_agent_without_a_certificate_is_refused(secured: Secured) -> None:
    # On the agent port the TLS handshake itself fails: no certificate, no connection.
    agent = RawAgent(secured.server.agent_address, secured.creds())
    agent.register("n1")
    assert _refused(agent).code() == grpc.StatusCode.UNAVAILABLE
    # On the client port (TLS, no client certificate) the stream is refused by name.
    agent = RawAgent(secured.server.address, secured.creds())
    agent.register("n1")
    err = _refused(agent)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "node certificate" in err.details()
    # And with no TLS at all, nothing gets through.
    agent = RawAgent(secured.server.agent_address)
    agent.register("n1")
    assert _refused(agent).code() == grpc.StatusCode.UNAVAILABLE
    with secured.client("root") as c:
        assert c.nodes() == []


def test_a_stream_without_a_node_certificate_is_closed_before_it_says_anything(
        secured: Secured) -> None:
    silent = RawAgent(secured.server.address, secured.creds())  # sends nothing at all
    assert _refused(silent).code() == grpc.StatusCode.UNAUTHENTICATED


def test_an_agent_whose_certificate_names_another_node_is_refused(secured: Secured) -> None:
    agent = secured.agent(tls.NODE, "n2")
    agent.register("n1")
    err = _refused(agent)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'n2'" in err.details() and "'n1'" in err.details()
    with secured.client("root") as c:
        assert c.nodes() == []


def test_a_client_certificate_never_makes_an_agent(secured: Secured) -> None:
    agent = secured.agent(tls.CLIENT, "alice")
    agent.register("alice")
    err = _refused(agent)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "client certificate" in err.details()


def test_a_certificate_from_another_ca_is_refused(secured: Secured, tmp_path: Path) -> None:
    other = tmp_path / "other"
    tls.init_ca(other)
    paths = tls.issue(other, tls.NODE, "n1")
    # It trusts our server (our CA), and presents a certificate our CA never signed (with
    # gRPC itself: our own helper refuses to build such credentials).
    with pytest.raises(InvalidInput, match="not signed by the CA"):
        tls.channel_credentials(secured.certs / "ca.crt", paths.cert, paths.key)
    creds = grpc.ssl_channel_credentials((secured.certs / "ca.crt").read_bytes(),
                                         paths.key.read_bytes(), paths.cert.read_bytes())
    agent = RawAgent(secured.server.agent_address, creds)
    agent.register("n1")
    assert _refused(agent).code() == grpc.StatusCode.UNAVAILABLE


def test_a_node_registers_only_the_trials_it_was_given(secured: Secured) -> None:
    with secured.client("alice") as c:
        study = c.submit(SLEEP_SPACE, "tiny.yaml")
        ids = [t.id for t in c.trials(study.id)]
    forger = secured.agent(tls.NODE, "evil")  # a real node certificate, another node
    forger.register("evil", running=tuple(ids))
    kills = set()
    while len(kills) < len(ids):
        msg = forger.next()
        assert isinstance(msg, pb.ServerMessage), msg
        if msg.WhichOneof("body") == "kill":
            kills.add(msg.kill.trial_id)
    assert kills == set(ids)  # none adopted: each is killed, then placed by the server
    forger.close()


# ----------------------------------------------------------------- clients
def test_a_client_without_a_valid_token_is_refused(secured: Secured) -> None:
    for token in ("", "not-a-token", "hsk_00000000_" + "A" * 43):
        with secured.client(token=token) as c, pytest.raises(Unauthenticated) as err:
            c.studies()
        assert "token" in str(err.value)
    # Plain text to a TLS port gets nowhere either.
    with Client(secured.server.address, timeout_s=5) as c, pytest.raises(Exception):  # noqa: B017
        c.studies()


def test_a_revoked_token_is_refused_at_once(secured: Secured) -> None:
    with secured.client("alice") as c:
        reply = c.create_token(label="laptop")
        assert reply.token.user == "alice"
    with secured.client(token=reply.secret) as c:
        assert c.whoami().name == "alice"
        c.revoke_token(reply.token.id)
        with pytest.raises(Unauthenticated, match="revoked"):
            c.studies()
    with secured.client("alice") as c:  # her other token still works
        assert c.whoami().via == "token"


def test_tokens_are_stored_hashed(secured: Secured) -> None:
    with secured.client("root") as c:
        secret = c.create_token("bob").secret
    secured.server.stop(0)
    data = b"".join(p.read_bytes() for p in secured.server.settings.db.parent.glob("s.db*"))
    random_part = secret[len("hsk_01234567_"):]  # it may hold "_" itself
    assert len(random_part) == 43
    assert secret.encode() not in data and random_part.encode() not in data


def test_users_act_on_their_own_studies_only(secured: Secured) -> None:
    with secured.client("alice") as alice:
        study = alice.submit(SLEEP_SPACE, "tiny.yaml")
        assert study.owner == "alice"
        trial = alice.trials(study.id)[0].id
    with secured.client("bob") as bob:
        assert [s.id for s in bob.studies()] == []  # not even listed
        for call in (lambda: bob.study(study.id), lambda: bob.trials(study.id),
                     lambda: bob.trial(trial), lambda: bob.cancel(study.id),
                     lambda: list(bob.watch(study.id))):
            with pytest.raises(PermissionDenied, match="alice"):
                call()
        with pytest.raises(PermissionDenied, match="admin"):
            bob.drain("n1")
        with pytest.raises(PermissionDenied, match="admin"):
            bob.undrain("n1")
        with pytest.raises(PermissionDenied, match="admin"):
            bob.import_profiles([], replace=False)
        with pytest.raises(PermissionDenied, match="admin"):
            bob.add_user("mallory", "admin")
        with pytest.raises(PermissionDenied):
            bob.create_token("alice")
        assert bob.nodes() == []  # what the cluster has is no secret
    with secured.client("root") as root:
        assert root.study(study.id).owner == "alice"  # an admin sees every study
    with secured.client("alice") as alice:
        assert alice.cancel(study.id).state == "CANCELLED"


def test_shared_results_never_share_logs_or_control(tmp_path: Path) -> None:
    s = start(tmp_path, share_results=True)
    try:
        with s.client("alice") as alice:
            study = alice.submit(SLEEP_SPACE, "tiny.yaml")
        agent = s.agent(tls.NODE, "n1")
        agent.register("n1", gpus=1)
        launch = agent.launches(1)[0]
        agent.send(pb.AgentMessage(started=pb.TrialStarted(trial_id=launch.trial_id,
                                                           attempt=launch.attempt)))
        agent.send(pb.AgentMessage(exited=pb.TrialExited(
            trial_id=launch.trial_id, exit_code=0, log_tail="alice's secret path",
            metrics={"loss": 0.5}, attempt=launch.attempt)))
        with s.client("alice") as alice:
            import time
            deadline = time.monotonic() + 10
            while alice.trial(launch.trial_id).state != "COMPLETED":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert "secret" in alice.trial(launch.trial_id).log_tail
        with s.client("bob") as bob:
            assert [x.id for x in bob.studies()] == [study.id]
            seen = bob.trial(launch.trial_id)
            assert seen.state == "COMPLETED" and seen.metrics["loss"] == 0.5
            assert seen.log_tail == "" and all(t.log_tail == "" for t in bob.trials(study.id))
            with pytest.raises(PermissionDenied):
                bob.cancel(study.id)
        agent.close()
    finally:
        s.server.stop(0)


def test_certificates_identify_users_on_the_mutual_tls_port(secured: Secured) -> None:
    creds = secured.creds(tls.CLIENT, "alice")
    with Client(secured.server.agent_address, credentials=creds) as c:
        me = c.whoami()
        assert (me.name, me.role, me.via) == ("alice", "user", "certificate")
    creds = secured.creds(tls.CLIENT, "stranger")  # signed, but no such user
    with Client(secured.server.agent_address, credentials=creds) as c, \
            pytest.raises(Unauthenticated, match="stranger"):
        c.whoami()
    creds = secured.creds(tls.NODE, "n1")  # an agent's certificate is not a user
    with Client(secured.server.agent_address, credentials=creds) as c, \
            pytest.raises(PermissionDenied, match="node certificate"):
        c.studies()


def test_user_and_token_management(secured: Secured) -> None:
    with secured.client("root") as root:
        assert root.add_user("carol", "user").role == "user"
        with pytest.raises(Exception, match="exists"):
            root.add_user("carol", "admin")
        with pytest.raises(InvalidInput, match="role"):
            root.add_user("dave", "superuser")
        with pytest.raises(InvalidInput, match="user name"):
            root.add_user("../x", "user")
        token = root.create_token("carol", "ci").secret
        assert {u.name for u in root.users()} == {"root", "alice", "bob", "carol"}
        ids = {t.id for t in root.tokens("carol")}
    with secured.client(token=token) as carol:
        assert carol.whoami().name == "carol"
        assert {t.id for t in carol.tokens()} == ids
        with pytest.raises(PermissionDenied):
            carol.tokens("alice")
    with secured.client("bob") as bob:
        with pytest.raises(PermissionDenied, match="carol"):
            bob.revoke_token(next(iter(ids)))
        with pytest.raises(PermissionDenied, match="admin"):
            bob.remove_user("carol")
    with secured.client("root") as root:
        root.remove_user("carol")
        with pytest.raises(InvalidInput, match="themselves"):
            root.remove_user("root")
        assert all(t.revoked_at for t in root.tokens("carol"))
    with secured.client(token=token) as carol, pytest.raises(Unauthenticated):
        carol.whoami()


# ----------------------------------------------------------------- set-up
def test_a_non_loopback_listen_is_allowed_with_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    server = HyperSackServer(ServerSettings(listen="0.0.0.0:0", agent_listen="0.0.0.0:0",
                                            db=tmp_path / "s.db", tls_dir=certs))
    try:
        server.start()
        assert server.auth.enabled
    finally:
        server.stop(0)


def test_broken_tls_settings_are_refused_before_anything_starts(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    (certs / "server.key").chmod(0o644)
    with pytest.raises(InvalidInput, match="chmod 600"):
        HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                       tls_dir=certs))
    with pytest.raises(InvalidInput, match="--tls-ca"):
        HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                       tls_cert=certs / "server.crt"))
    (tmp_path / "bad.crt").write_text("garbage\n")
    with pytest.raises(InvalidInput, match="not a PEM certificate"):
        HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                       tls_dir=certs, tls_cert=tmp_path / "bad.crt"))
    node = tls.issue(certs, tls.NODE, "n1")
    with pytest.raises(InvalidInput, match="is not the key of"):
        HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                       tls_dir=certs, tls_key=node.key))
    with pytest.raises(InvalidInput, match="mutual-TLS"):
        HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                       agent_listen="127.0.0.1:0"))
    assert not (tmp_path / "s.db").exists()


def test_certs_cli_writes_private_keys_and_names_identities(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    d = tmp_path / "c"
    assert cli_main(["certs", "init", "--dir", str(d), "--server-name", "head.example"]) == 0
    assert cli_main(["certs", "issue", "--dir", str(d), "--node", "gpu01"]) == 0
    assert cli_main(["certs", "issue", "--dir", str(d), "--client", "alice"]) == 0
    assert cli_main(["certs", "init", "--dir", str(d)]) == 2  # never over an existing CA
    assert cli_main(["certs", "issue", "--dir", str(d), "--node", "a/b"]) == 2
    assert d.stat().st_mode & 0o777 == 0o700
    for key in (d / "ca.key", d / "server.key", d / "nodes/gpu01.key", d / "clients/alice.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
    assert tls.certificate_identity(d / "nodes/gpu01.crt") == tls.Identity("node", "gpu01")
    assert tls.certificate_identity(d / "clients/alice.crt") == tls.Identity("client", "alice")
    assert "head.example" in capsys.readouterr().out


def test_users_cli_bootstraps_an_admin_and_tokens_reach_the_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    certs = make_certs(tmp_path)
    db = tmp_path / "s.db"
    tok = tmp_path / "admin.tok"
    assert cli_main(["users", "add", "ops", "--role", "admin", "--db", str(db),
                     "--out", str(tok)]) == 0
    assert tok.stat().st_mode & 0o777 == 0o600
    server = HyperSackServer(ServerSettings(listen="127.0.0.1:0", agent_listen="127.0.0.1:0",
                                            db=db, tls_dir=certs))
    server.start()
    try:
        flags = ["--server", server.address, "--tls-ca", str(certs / "ca.crt")]
        for var in ("HYPERSACK_TOKEN", "HYPERSACK_TOKEN_FILE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/hypersack/token
        capsys.readouterr()
        assert cli_main(["whoami", *flags]) == 2
        assert "no token" in capsys.readouterr().err
        assert cli_main(["whoami", *flags, "--token-file", str(tok)]) == 0
        assert capsys.readouterr().out.strip().startswith("ops (admin, by token; expires 20")
        assert cli_main(["users", "add", "eve", "--role", "user", *flags,
                         "--token-file", str(tok)]) == 0
        capsys.readouterr()
        assert cli_main(["token", "create", "eve", *flags, "--token-file", str(tok)]) == 0
        eve = capsys.readouterr().out.strip()
        monkeypatch.setenv("HYPERSACK_TOKEN", eve)
        assert cli_main(["whoami", *flags]) == 0
        assert capsys.readouterr().out.strip().startswith("eve (user, by token; expires ")
        assert cli_main(["drain", "n1", *flags]) == 2
        assert "permission denied" in capsys.readouterr().err
        tok.chmod(0o644)
        monkeypatch.delenv("HYPERSACK_TOKEN")
        assert cli_main(["whoami", *flags, "--token-file", str(tok)]) == 2
        assert "chmod 600" in capsys.readouterr().err
    finally:
        server.stop(0)


def test_study_owner_survives_a_restart(tmp_path: Path) -> None:
    s = start(tmp_path)
    with s.client("alice") as c:
        study = c.submit(SLEEP_SPACE, "tiny.yaml")
    s.server.stop(0)
    server = HyperSackServer(s.server.settings)
    server.start()
    try:
        with Client(server.address, credentials=s.creds(), token=s.tokens["bob"]) as bob:
            with pytest.raises(PermissionDenied):
                bob.study(study.id)
        with Client(server.address, credentials=s.creds(), token=s.tokens["alice"]) as c:
            assert c.study(study.id).owner == "alice"
            assert json.loads(c.study(study.id).space_json)["name"] == "tiny"
    finally:
        server.stop(0)


# ----------------------------------------------------------------- hostile bytes
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hypersack.server.auth import bearer  # noqa: E402
from hypersack.store.memory import MemoryStore  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["authorization", "Authorization", "x"]),
                          st.one_of(st.text(max_size=120), st.binary(max_size=120))),
                max_size=4))
def test_no_header_authenticates_without_a_real_token(headers: list[tuple[str, object]]) -> None:
    store = MemoryStore()
    auth = Authenticator(store, enabled=True)
    auth.add_user(LOCAL, "alice", "user")
    auth.create_token(LOCAL, "alice")
    token = bearer(headers)  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated):
        auth.client(token, None)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_hostile_certificate_files_are_refused_in_one_line(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "x.crt"
    path.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + data if data[:1] == b"\x00" else data)
    assert tls.identity_of(path.read_bytes()) is None
    with pytest.raises(InvalidInput) as err:
        tls.checked((path, None, None))
    assert "\n" not in str(err.value)


def test_tokens_expire_and_whoami_says_when() -> None:
    from hypersack.core.clock import ManualClock
    from hypersack.server.auth import DEFAULT_TOKEN_TTL_S

    clock = ManualClock(1_000_000.0)
    auth = Authenticator(MemoryStore(), enabled=True, clock=clock)
    auth.add_user(LOCAL, "ada", "user")
    auth.add_user(LOCAL, "ops", "admin")
    ada = auth.client(None, tls.Identity("client", "ada"))
    _, default = auth.create_token(ada, "ada")
    record, hour = auth.create_token(ada, "ada", ttl_s=3600)
    assert record.expires_at == 1_000_000.0 + 3600
    assert auth.client(hour, None).expires_at == record.expires_at
    with pytest.raises(PermissionDenied, match="never expires: only an admin"):
        auth.create_token(ada, "ada", ttl_s=-1)
    with pytest.raises(InvalidInput, match="at most"):
        auth.create_token(ada, "ada", ttl_s=1e12)
    ops = auth.client(None, tls.Identity("client", "ops"))
    _, forever = auth.create_token(ops, "ops", ttl_s=-1)
    clock.advance(3599)
    auth.client(hour, None)
    clock.advance(1)
    with pytest.raises(Unauthenticated, match=r"token [0-9a-f]{8} expired"):
        auth.client(hour, None)
    clock.advance(DEFAULT_TOKEN_TTL_S - 3600)
    with pytest.raises(Unauthenticated, match="expired"):
        auth.client(default, None)
    assert auth.client(forever, None).expires_at == 0.0


def test_removing_a_user_revokes_their_client_certificates() -> None:
    from hypersack.core.clock import ManualClock

    clock = ManualClock(1_000_000.0)
    auth = Authenticator(MemoryStore(), enabled=True, clock=clock)
    auth.add_user(LOCAL, "ada", "admin")
    clock.advance(60)
    cert = tls.Identity("client", "ada", issued_at=clock.now())
    assert auth.client(None, cert).role.value == "admin"
    old = tls.Identity("client", "ada", issued_at=1_000_000.0 - 3600)  # before ada was added
    with pytest.raises(Unauthenticated, match="issued for an earlier user of that name"):
        auth.client(None, old)
    auth.add_user(LOCAL, "ops", "admin")
    ops = auth.client(None, tls.Identity("client", "ops", issued_at=clock.now()))
    auth.remove_user(ops, "ada")
    with pytest.raises(Unauthenticated, match="not a user"):
        auth.client(None, cert)
    clock.advance(3600)
    auth.add_user(ops, "ada", "user")  # a new ada, with the name of the old
    with pytest.raises(Unauthenticated, match="earlier user"):
        auth.client(None, cert)
    fresh = tls.Identity("client", "ada", issued_at=clock.now() + 1)
    assert auth.client(None, fresh).role.value == "user"


def test_a_certificates_issue_time_is_read_from_it(tmp_path: Path) -> None:
    import time as _time

    d = tmp_path / "certs"
    assert cli_main(["certs", "init", "--dir", str(d)]) == 0
    assert cli_main(["certs", "issue", "--dir", str(d), "--client", "alice"]) == 0
    ident = tls.certificate_identity(d / "clients/alice.crt")
    assert abs(ident.issued_at - _time.time()) < 120


def test_watches_are_bounded_per_user_not_per_host(secured: Secured) -> None:
    """Eight watches that never read, from one host, locked every user of that host (a
    login node) out of `watch` (issue 35)."""
    with secured.client("alice") as c:
        study = c.submit(SLEEP_SPACE, "s.yaml").id
    stub_calls = []
    per_user = secured.server.service.watches.max_watches_per_client
    alice = secured.client("alice")
    channel = grpc.secure_channel(secured.server.address, secured.creds())
    from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc

    stub = pb_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
    meta = [("authorization", f"Bearer {secured.tokens['alice']}")]
    for _ in range(per_user):
        call = stub.WatchStudy(pb.WatchStudyRequest(study_id=study, min_interval_s=1e300),
                               metadata=meta)
        next(call)
        stub_calls.append(call)
    with pytest.raises(grpc.RpcError) as err:
        next(stub.WatchStudy(pb.WatchStudyRequest(study_id=study), metadata=meta))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "of user alice" in str(err.value.details())
    # Another user on the same host still watches (their own study).
    with secured.client("bob") as c:
        mine = c.submit(SLEEP_SPACE, "s.yaml").id
        assert next(iter(c.watch(mine, timeout_s=5))).study.id == mine
    for call in stub_calls:
        call.cancel()
    alice.close()
    channel.close()
