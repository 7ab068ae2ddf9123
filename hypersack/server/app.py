"""`hypersack-server`: builds the store, the service and the gRPC server, and runs them."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sqlite3
import sys
import threading
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import ValidationError

from hypersack import __version__
from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.core.clock import Clock
from hypersack.core.errors import HyperSackError, InvalidInput
from hypersack.orchestrator import OrchestratorConfig
from hypersack.policies.registry import policy_names
from hypersack.sampler.profiles import load_profiles, to_import
from hypersack.server.auth import Authenticator
from hypersack.server.bridge import LoopThread, offloaded, watch_lag
from hypersack.server.metrics import ServerCollector
from hypersack.server.service import SchedulerService
from hypersack.server.servicers import AgentLinkServicer, SchedulerServicer
from hypersack.server.threads import name_os_thread
from hypersack.sim.foresight import foresee, foresee_ratios
from hypersack.sim.process import SimProcess
from hypersack.store.sqlite import DamagedDatabase, DatabaseLock, SqliteStore, StoreError
from hypersack.wire.logs import add_log_flags, parse_daemon_args
from hypersack.wire.metrics import MetricsEndpoint, serve_metrics
from hypersack.wire.settings import (
    ServerSettings,
    is_loopback,
    load_settings,
    next_port,
    parse_ratios,
)
from hypersack.wire.tls import server_credentials

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 << 20
SERVICES = ("hypersack.v1.Scheduler", "hypersack.v1.AgentLink")


class HyperSackServer:
    """The server daemon's parts, startable in a process of its own or embedded."""

    def __init__(self, settings: ServerSettings, clock: Clock | None = None) -> None:
        if settings.policy is not None and settings.policy not in policy_names():
            raise InvalidInput(f"unknown policy {settings.policy!r}; valid: "
                               f"{', '.join(policy_names())}")
        self.settings = settings
        self.tls = settings.tls()
        if self.tls is None and settings.agent_listen:
            raise InvalidInput("--agent-listen is the mutual-TLS port: give TLS files too "
                               "(--tls-dir, or --tls-ca/--tls-cert/--tls-key)")
        if self.tls is None and not is_loopback(settings.listen):
            if not settings.insecure:
                raise InvalidInput(
                    f"--listen {settings.listen}: refused without TLS, which also turns on "
                    "authentication: anyone who can reach the port could run code on every "
                    "GPU node. Give --tls-dir (made by `hypersack certs init`), listen on "
                    "127.0.0.1, or give --insecure on a network only the cluster reaches")
            log.warning("listening on %s WITHOUT TLS or authentication (--insecure): "
                        "anyone who can reach this port controls the cluster",
                        settings.listen)
        self.agent_listen = (settings.agent_listen or next_port(settings.listen)
                             if self.tls else settings.listen)
        # Read (and check) the key and certificates before anything else starts.
        self._credentials = None if self.tls is None else (
            server_credentials(self.tls, require_client_cert=False),
            server_credentials(self.tls, require_client_cert=True))
        profiles = [p for path in settings.profiles for p in load_profiles(path)]
        self.sims = SimProcess()  # started by the first study under predict
        empty_db(settings.db, settings.init)
        # One writer: a second server on the same database stops here, saying who holds it.
        self._lock = DatabaseLock(settings.db)
        try:
            self.store = SqliteStore(settings.db)
            known = {(p.key, p.arch) for p in self.store.list_profiles()}
            with self.store.transaction():
                for p in to_import(profiles, known, replace=False):
                    self.store.put_profile(p)
            config = OrchestratorConfig(oversubscription=dict(settings.oversubscription),
                                        default_ratio=settings.default_ratio,
                                        heartbeat_timeout_s=settings.heartbeat_timeout_s,
                                        restore_grace_s=settings.heartbeat_timeout_s,
                                        # Three heartbeats, so a launch in flight when
                                        # one was sent is never taken for a lost one.
                                        missing_grace_s=max(
                                            5.0, 3 * settings.heartbeat_interval_s),
                                        policy=settings.policy,
                                        shares=dict(settings.shares),
                                        learn_ratio=settings.learn_ratio,
                                        learn_ratio_max=settings.learn_ratio_max,
                                        learn_sample_every_s=settings.learn_sample_every_s,
                                        learn_decide_every_s=settings.learn_decide_every_s,
                                        learn_min_samples=settings.learn_min_samples,
                                        learn_settle_s=settings.learn_settle_s,
                                        learn_by_workload=settings.learn_by_workload,
                                        learn_foresight=settings.learn_foresight,
                                        # The default policy's simulations (`predict`),
                                        # and the learned ratio's.
                                        foresight=foresee, ratio_foresight=foresee_ratios,
                                        # ... in a process of their own, off the event
                                        # worker (orchestrator/foresight.py).
                                        foresight_pool=self.sims)
            self.service = SchedulerService(
                self.store, config, clock=clock,
                heartbeat_interval_s=settings.heartbeat_interval_s,
                tick_interval_s=settings.tick_interval_s, default_retries=settings.retries,
                max_study_trials=settings.max_study_trials, max_watches=settings.max_watches,
                max_agents=settings.max_agents,
                batch_gather_s=settings.batch_gather_ms / 1000)
        except (sqlite3.Error, ValidationError, StoreError, InvalidInput, ValueError) as exc:
            self._lock.release()
            hint = "" if isinstance(exc, DamagedDatabase) else \
                " (restore it from a backup, or start on a new file)"
            raise InvalidInput(f"database {str(settings.db)!r} cannot be used: "
                               f"{_first_line(exc)}{hint}") from None
        except BaseException:
            self._lock.release()
            raise
        self.service.on_fatal = self._fatal
        self.sims.on_answer = self.service.poke  # a simulation's answer is taken in at once
        self.service.on_store = self._store_state
        # With TLS every client call needs a token (or a client certificate), and agents
        # a node certificate; without it everyone is the local admin (loopback only).
        self.auth = Authenticator(self.store, enabled=self.tls is not None,
                                  share_results=settings.share_results, clock=clock)
        self.failed = threading.Event()
        # grpc.aio on a loop of its own: agent streams are served there without a thread
        # each; client calls run on the pool, watches (at most max_watches) included.
        self._pool = futures.ThreadPoolExecutor(max_workers=32 + settings.max_watches,
                                                thread_name_prefix="hypersack-rpc",
                                                initializer=name_os_thread)
        self._loop = LoopThread("hypersack-grpc")
        self._lag: futures.Future[None] | None = None  # bridge.watch_lag on the loop
        self._health = health.aio.HealthServicer()
        try:
            self._grpc = self._loop.run(self._build(settings))
        except BaseException:
            self._loop.close()
            self._pool.shutdown(wait=False)
            self.store.close()
            self._lock.release()
            raise
        self.port = 0
        self.agent_port = 0
        self.metrics: MetricsEndpoint | None = None

    async def _build(self, settings: ServerSettings) -> grpc.aio.Server:
        concurrent = settings.max_agents + 64 + settings.max_watches
        server = grpc.aio.server(
            maximum_concurrent_rpcs=concurrent,
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", 64 << 20),
                     ("grpc.so_reuseport", 0)])
        pb_grpc.add_SchedulerServicer_to_server(  # type: ignore[no-untyped-call]
            offloaded(SchedulerServicer(self.service, self.auth),
                      pb.DESCRIPTOR.services_by_name["Scheduler"], self._pool), server)
        pb_grpc.add_AgentLinkServicer_to_server(  # type: ignore[no-untyped-call]
            AgentLinkServicer(self.service, self.auth, tls=self.tls is not None,
                              pool=self._pool), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if settings.reflection:
            # The schema is public (proto/ in the source); calls still need a token.
            reflection.enable_server_reflection(
                (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server

    def _set_health(self, status: int) -> None:
        async def set_all() -> None:
            for name in ("", *SERVICES):
                await self._health.set(name, status)
        if not self._loop.closed:
            self._loop.post(set_all())

    def start(self) -> int:
        """Listen and serve; returns the bound port (useful with port 0)."""
        if self._credentials is None:
            try:
                self.port = self.agent_port = self._grpc.add_insecure_port(self.settings.listen)
            except RuntimeError:
                self.port = 0
        else:
            # Two ports: TLS for clients (a token says who they are), and mutual TLS for
            # agents, whose certificate says which node they are. gRPC cannot ask for a
            # client certificate without requiring one, so one port cannot serve both.
            for_clients, for_agents = self._credentials
            try:
                self.port = self._grpc.add_secure_port(self.settings.listen, for_clients)
                self.agent_port = self._grpc.add_secure_port(self.agent_listen, for_agents)
            except RuntimeError:
                self.port = 0
        if self.port == 0 or self.agent_port == 0:
            raise InvalidInput(f"cannot listen on {self.settings.listen!r}"
                               + (f" and {self.agent_listen!r}" if self.tls else ""))
        if self.settings.metrics_listen:
            self.metrics = serve_metrics(self.settings.metrics_listen,
                                         ServerCollector(self.service), tls=self.tls,
                                         insecure=self.settings.insecure)
        self.service.start()
        self._loop.run(self._grpc.start())
        self._lag = self._loop.post(watch_lag(self.service.histograms.observe_lag))
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("hypersack-server %s listening on %s (port %d), database %s", __version__,
                 self.settings.listen, self.port, self.settings.db)
        if self.tls:
            log.info("TLS on; clients authenticate with tokens; agents connect with node "
                     "certificates to port %d", self.agent_port)
            if not self.store.list_users():
                log.warning("no users yet, so no client can do anything: stop the server "
                            "and run `hypersack users add NAME --role admin --db %s`",
                            self.settings.db)
        return self.port

    @property
    def address(self) -> str:
        return f"{_dial_host(self.settings.listen)}:{self.port}"

    @property
    def agent_address(self) -> str:
        return f"{_dial_host(self.agent_listen)}:{self.agent_port}"

    def _store_state(self, failure: str | None) -> None:
        """NOT_SERVING while the store fails, SERVING again once it works."""
        self._set_health(health_pb2.HealthCheckResponse.SERVING if failure is None
                         else health_pb2.HealthCheckResponse.NOT_SERVING)

    def _fatal(self, reason: str) -> None:
        """A loop of the service stopped: say NOT_SERVING, and let main() exit non-zero."""
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.failed.set()

    def stop(self, grace_s: float = 1.0) -> None:
        if not self._loop.closed:  # stopping twice is stopping once
            self._loop.run(self._health.enter_graceful_shutdown())
            if self._lag is not None:
                self._lag.cancel()
            self.service.stop()
            self.sims.shutdown(wait=False)
            self._loop.run(self._grpc.stop(grace_s))
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._loop.close()
        if self.metrics is not None:
            self.metrics.stop()
        self.store.close()
        self._lock.release()

    def wait(self) -> None:
        if not self._loop.closed:
            self._loop.run(self._grpc.wait_for_termination())


def _dial_host(listen: str) -> str:
    host = listen.rsplit(":", 1)[0]
    if host in ("0.0.0.0", "[::]", ""):  # noqa: S104 - a wildcard: dial loopback
        host = "127.0.0.1"
    return host


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hypersack-server",
        description="HyperSack head-node daemon: accepts studies from the CLI, keeps one "
                    "stream per agent, packs trials onto GPUs. Settings come from flags, "
                    "then HYPERSACK_* environment variables, then --config.")
    p.add_argument("--config", type=Path, help="YAML file of settings (the flag names, "
                   "with underscores: listen, db, heartbeat_timeout_s, ...)")
    p.add_argument("--listen", help="address (default 127.0.0.1:50051; 0.0.0.0:50051 "
                   "with --insecure to accept agents from other hosts)")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="accept --listen on a non-loopback address without TLS or "
                   "authentication; only on a network only the cluster reaches")
    p.add_argument("--tls-dir", type=Path, help="TLS and authentication from a `hypersack "
                   "certs init` directory (ca.crt, server.crt, server.key)")
    p.add_argument("--tls-ca", type=Path, help="the cluster CA certificate (instead of "
                   "--tls-dir)")
    p.add_argument("--tls-cert", type=Path, help="this server's certificate")
    p.add_argument("--tls-key", type=Path, help="this server's private key (mode 0600)")
    p.add_argument("--agent-listen", help="with TLS: the mutual-TLS port agents dial "
                   "(default: the --listen port + 1)")
    p.add_argument("--share-results", action="store_true", default=None,
                   help="users may read other users' studies and results (not their logs)")
    p.add_argument("--db", type=Path, help="SQLite database (default hypersack.db); "
                   "restart on the same file to resume every study")
    p.add_argument("--init", action="store_true", default=None,
                   help="start a new cluster on an existing empty (0-byte) --db file "
                   "(refused otherwise: an emptied database is a lost cluster)")
    p.add_argument("--policy", help=f"override every study's policy: {', '.join(policy_names())}")
    p.add_argument("--ratio", action="append", default=[], metavar="ARCH=R",
                   help="oversubscription ratio per architecture (repeatable); default "
                        "A100=3, H100=2.5")
    p.add_argument("--no-learn-ratio", dest="learn_ratio", action="store_false",
                   default=None, help="keep the configured ratios: do not learn them from "
                   "the slowdown running trials report (learned by default, from the "
                   "configured ratio, a quarter at a time; `hypersack nodes` shows them)")
    p.add_argument("--heartbeat-timeout-s", type=float,
                   help="a node silent this long is lost and its trials run elsewhere "
                        "(default 30)")
    p.add_argument("--heartbeat-interval-s", type=float, help="agents' heartbeat (default 5)")
    p.add_argument("--retries", type=int, help="default retries of a failing trial for "
                   "studies that set none (default 2)")
    p.add_argument("--profiles", type=Path, action="append",
                   help="import a profile file into the history (repeatable)")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (loopback, or "
                   "--insecure); with TLS, HTTPS asking for a client certificate of the "
                   "cluster CA (hypersack certs issue --client prometheus)")
    p.add_argument("--no-reflection", dest="reflection", action="store_false", default=None,
                   help="do not serve gRPC reflection (served by default, for grpcurl)")
    add_log_flags(p)
    p.add_argument("--version", action="version", version=f"hypersack-server {__version__}")
    return p


def empty_db(db: Path, init: bool) -> None:
    """An existing database file of 0 bytes is refused unless `init` asks for a new
    cluster: it would start with no studies, nodes or users, and the trials of agents
    that reconnect would be killed. A missing file is a new cluster."""
    try:
        size = db.stat().st_size
    except OSError:
        return
    if size == 0 and not init:
        raise InvalidInput(f"database {str(db)!r} is empty (0 bytes): a server on it starts "
                           "a new cluster with no studies, nodes or users, and kills the "
                           "trials of agents that reconnect. Restore it from a backup, or "
                           "give --init to start a new cluster on it")


def settings_from_args(args: argparse.Namespace) -> ServerSettings:

    flags = {"listen": args.listen, "db": args.db, "init": args.init, "policy": args.policy,
             "insecure": args.insecure, "tls_dir": args.tls_dir, "tls_ca": args.tls_ca,
             "tls_cert": args.tls_cert, "tls_key": args.tls_key,
             "agent_listen": args.agent_listen, "share_results": args.share_results,
             "heartbeat_timeout_s": args.heartbeat_timeout_s,
             "heartbeat_interval_s": args.heartbeat_interval_s, "retries": args.retries,
             "profiles": args.profiles, "metrics_listen": args.metrics_listen,
             "reflection": args.reflection, "learn_ratio": args.learn_ratio,
             "oversubscription": ({"A100": 3.0, "H100": 2.5} | parse_ratios(args.ratio))
             if args.ratio else None}
    return load_settings(ServerSettings, flags, args.config)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_daemon_args(_parser(), argv)
    try:
        server = HyperSackServer(settings_from_args(args))
        server.start()
    except HyperSackError as exc:
        print(f"hypersack-server: error: {exc}", file=sys.stderr)
        return 2
    done = server.failed  # set by a signal, or by a loop of the service that stopped

    def _stop(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    log.info("shutting down")
    server.stop()
    if server.service.fatal is not None:
        print(f"hypersack-server: error: {server.service.fatal}", file=sys.stderr)
        return 1
    # One JSON line of counters for operators and benchmarks.
    orch = server.service.orch
    exits = sorted(server.service.exit_latency)
    batches = sorted(server.service.batch_time)
    lags = sorted(server.service.histograms.lags)
    pauses = list(server.service.histograms.gc_pauses)

    def at(q: float, xs: list[float] = exits) -> float | None:
        return round(1000 * xs[int(q * (len(xs) - 1))], 3) if xs else None
    print(json.dumps({**server.service.stats, "decisions": orch.decision_count,
                      "decision_mean_ms": round(1000 * orch.decision_time_s
                                                / max(1, orch.decision_count), 3),
                      "exit_handled_p50_ms": at(0.5), "exit_handled_p99_ms": at(0.99),
                      "batch_p50_ms": at(0.5, batches), "batch_p99_ms": at(0.99, batches),
                      "loop_lag_p50_ms": at(0.5, lags), "loop_lag_p99_ms": at(0.99, lags),
                      "gc_full_collections": len(pauses),
                      "gc_full_max_ms": round(1000 * max(pauses, default=0.0), 3),
                      "gc_full_total_ms": round(1000 * sum(pauses), 3),
                      "gc_full_last_ms": [round(1000 * x, 1) for x in pauses[-50:]],
                      "gc_scheduled_runs": server.service.full_gc.runs,
                      "gc_scheduled_freed": server.service.full_gc.freed}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
