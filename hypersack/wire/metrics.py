"""The Prometheus endpoint both daemons serve (`--metrics-listen`), with
prometheus-client: each daemon registers a collector that reads its state when scraped,
in a registry of its own (several daemons can share a process: `hypersack run`, tests).

Without TLS the endpoint is plain HTTP and, like the gRPC port, loopback only unless
`--insecure`; with TLS it is HTTPS with the daemon's certificate and asks every scraper
for a client certificate signed by the cluster CA (`hypersack certs issue --client
prometheus`): study names, owners and trial ids are not for whoever is on the network.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from hypersack.core.errors import InvalidInput
from hypersack.wire.settings import is_loopback
from hypersack.wire.tls import CertPaths, checked

log = logging.getLogger(__name__)

# Buckets for latencies from a tenth of a millisecond to ten seconds.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class MetricsEndpoint:
    server: WSGIServer
    thread: threading.Thread
    port: int
    https: bool

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not 0 <= number <= 65535:
        raise InvalidInput(f"--metrics-listen {listen!r}: expected HOST:PORT, like "
                           "127.0.0.1:9464 (port 0: any free port)")
    return host.strip("[]") or "0.0.0.0", number  # noqa: S104 - the user asked for it


def serve_metrics(listen: str, collector: Collector, *, tls: CertPaths | None,
                  insecure: bool = False, insecure_flag: str = "--insecure"
                  ) -> MetricsEndpoint:
    """Serve `collector` at http(s)://listen/metrics on a thread of its own
    (`insecure_flag`: the daemon's flag that allows plain HTTP beyond loopback)."""
    host, port = split_listen(listen)
    if tls is None and not is_loopback(listen) and not insecure:
        raise InvalidInput(
            f"--metrics-listen {listen}: refused without TLS: the metrics name studies, "
            "their owners and trials. Give TLS files (the endpoint is then HTTPS and asks "
            f"for a client certificate of the cluster CA), listen on 127.0.0.1, or give "
            f"{insecure_flag}")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if tls is not None:
        checked(tls)
    try:
        server, thread = start_http_server(
            port, host, registry,
            certfile=None if tls is None else str(tls.cert),
            keyfile=None if tls is None else str(tls.key),
            client_cafile=None if tls is None else str(tls.ca),
            client_auth_required=tls is not None)
    except OSError as exc:
        raise InvalidInput(f"--metrics-listen {listen}: cannot listen: {exc.strerror or exc}"
                           ) from None
    bound = server.server_address[1]
    log.info("metrics at %s://%s:%d/metrics", "https" if tls else "http", host, bound)
    return MetricsEndpoint(server, thread, int(bound), tls is not None)
