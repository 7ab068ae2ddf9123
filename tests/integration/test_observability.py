"""What operators see of a running cluster: /metrics on the server and the agents (read
by a real Prometheus where one is installed), gRPC reflection, JSON logs."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from hypersack.testing.cluster import Cluster, free_port, space_yaml, wait_for
from hypersack.testing.cluster import submit as _submit
from hypersack.testing.cluster import trials as _trials
from hypersack.wire import tls as _tls


def _tls_context(c: Cluster, client: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(c.certs / "ca.crt"))
    ctx.check_hostname = False  # the agent's name is checked by Prometheus below
    if client:
        paths = _tls.leaf_paths(c.certs, _tls.CLIENT, "prometheus")
        if not paths.cert.exists():
            _tls.issue(c.certs, _tls.CLIENT, "prometheus")
        ctx.load_cert_chain(str(paths.cert), str(paths.key))
    return ctx


def _scrape(url: str, ctx: ssl.SSLContext | None = None) -> dict[str, list[Any]]:
    with urllib.request.urlopen(url, timeout=10, context=ctx) as reply:
        text = reply.read().decode()
    out: dict[str, list[Any]] = {}  # by sample name (a counter's ends in _total)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, [])
               if all(s.labels.get(k) == v for k, v in labels.items()))


def _running_cluster(c: Cluster) -> tuple[str, int, int]:
    server_port, agent_port = free_port(), free_port()
    # Slowdown samples every half second per GPU: the metrics show them arriving.
    config = c.tmp / "server.yaml"
    config.write_text("learn_sample_every_s: 0.5\nlearn_settle_s: 0.5\n")
    c.start_server("--metrics-listen", f"127.0.0.1:{server_port}", "--config", str(config))
    c.start_agent("n1", "1xA100-80GB@48", "--metrics-listen", f"127.0.0.1:{agent_port}")
    study = _submit(c, space_yaml("observed", seconds_per_epoch=3.0, epochs=3))
    wait_for("trials running", lambda: any(t.state == "RUNNING" for t in _trials(c, study)))
    return study, server_port, agent_port


def test_metrics_over_https_need_a_client_certificate(cluster: Cluster) -> None:
    study, server_port, agent_port = _running_cluster(cluster)
    server = f"https://127.0.0.1:{server_port}/metrics"
    agent = f"https://127.0.0.1:{agent_port}/metrics"
    for url in (server, agent):
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _scrape(url, _tls_context(cluster, client=False))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _scrape(url.replace("https", "http"))
    ctx = _tls_context(cluster)
    wait_for("the agent's first heartbeat in the metrics",
             lambda: "hypersack_gpu_utilization_pct" in _scrape(server, ctx), 30)
    s = _scrape(server, ctx)
    running = _value(s, "hypersack_trials", study=study, state="RUNNING")
    assert running >= 1
    assert _value(s, "hypersack_trials", study=study) == 8
    assert _value(s, "hypersack_node_up", node="n1") == 1
    assert "hypersack_gpus_idle_while_trials_fit" in s  # its one GPU runs trials
    assert _value(s, "hypersack_gpus_idle_while_trials_fit") == 0
    assert _value(s, "hypersack_gpu_trials", node="n1", gpu="0", arch="A100") >= 1
    assert 0 < _value(s, "hypersack_gpu_placed_compute_ratio", node="n1", gpu="0") <= 1
    assert _value(s, "hypersack_decisions_total") >= 1
    assert _value(s, "hypersack_decision_seconds_count") >= 1
    assert _value(s, "hypersack_grpc_loop_lag_seconds_count") >= 1  # every 50 ms
    assert 0 <= _value(s, "hypersack_node_heartbeat_age_seconds", node="n1") < 30
    assert _value(s, "hypersack_trial_reserved_memory_mib", study=study) > 0
    assert _value(s, "hypersack_oversubscription_ratio_configured", arch="A100") == 3
    assert 1 <= _value(s, "hypersack_oversubscription_ratio", arch="A100") <= 4
    # The trials' own iteration times reached the server as slowdown samples.
    wait_for("a slowdown sample", lambda: _value(_scrape(server, ctx),
                                                  "hypersack_oversubscription_samples",
                                                  arch="A100") >= 1, 30)
    a = _scrape(agent, ctx)
    assert _value(a, "hypersack_agent_up", node="n1") == 1
    assert _value(a, "hypersack_agent_trials_running", node="n1") >= 1
    trials = {x.labels["trial"] for x in a["hypersack_agent_trial_memory_mib"]}
    on_server = {t.id for t in _trials(cluster, study) if t.state == "RUNNING"}
    assert trials and trials <= on_server | {t.id for t in _trials(cluster, study)}
    assert _value(a, "hypersack_agent_mps_up", node="n1", gpu="0") == 0  # no MPS here


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (Debian: apt-get "
                    "install prometheus; .ci/run installs it)")
def test_a_real_prometheus_scrapes_a_running_study(cluster: Cluster, tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    study, server_port, agent_port = _running_cluster(cluster)
    client = _tls_context(cluster) and _tls.leaf_paths(cluster.certs, _tls.CLIENT, "prometheus")
    tls = {"ca_file": str(cluster.certs / "ca.crt"), "cert_file": str(client.cert),
           "key_file": str(client.key)}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "hypersack-server", "scheme": "https",
             "tls_config": {**tls, "server_name": "localhost"},
             "static_configs": [{"targets": [f"127.0.0.1:{server_port}"]}]},
            {"job_name": "hypersack-agent", "scheme": "https",
             "tls_config": {**tls, "server_name": _tls.node_server_name("n1")},
             "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # YAML reads JSON
    web = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address={web}"], stdout=log,
                            stderr=subprocess.STDOUT)

    def query(q: str) -> list[Any]:
        url = f"http://{web}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return list(json.load(reply)["data"]["result"])
        except (urllib.error.URLError, ConnectionError):
            return []

    try:
        wait_for("Prometheus to scrape both targets", lambda: {
            (r["metric"]["job"], r["value"][1]) for r in query("up")} == {
            ("hypersack-server", "1"), ("hypersack-agent", "1")}, 60, 0.5)
        promql = f'sum by (state) (hypersack_trials{{study="{study}"}})'
        wait_for("a running trial in PromQL", lambda: any(
            r["metric"]["state"] == "RUNNING" and float(r["value"][1]) >= 1
            for r in query(promql)), 60, 0.5)
        by_state = {r["metric"]["state"]: float(r["value"][1]) for r in query(promql)}
        assert sum(by_state.values()) == 8, by_state
        agent = query("sum(hypersack_agent_trials_running)")
        assert agent and float(agent[0]["value"][1]) >= 1
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()


def test_reflection_lists_the_services(cluster: Cluster) -> None:
    cluster.start_server()
    with cluster.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            list_services="")]), timeout=10)
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"hypersack.v1.Scheduler", "hypersack.v1.AgentLink",
            "grpc.health.v1.Health"} <= names
    # Reflection answers anyone (the schema is public); the calls themselves do not.
    with cluster.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="hypersack.v1.Scheduler")]), timeout=10)
        files = [r.file_descriptor_response for r in replies]
    assert files and files[0].file_descriptor_proto
    from hypersack._proto.v1 import hypersack_pb2 as pb
    from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
    with cluster.channel() as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.SchedulerStub(channel).ListStudies(pb.ListStudiesRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_json_logs(cluster: Cluster) -> None:
    cluster.start_server("--log-format", "json")
    cluster.start_agent("n1", "1xA100-80GB@48", "--log-format", "json")
    wait_for("the agent to connect", lambda: "connected" in cluster.logs("server"), 30)
    lines = [json.loads(line) for line in cluster.logs("server").splitlines()
             if line.startswith("{")]
    assert lines, cluster.logs("server")
    assert all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    assert any("agent n1 connected" in x["message"] for x in lines)
    assert any(x["logger"].startswith("hypersack.server") for x in lines)
    agent = [line for line in cluster.logs("n1").splitlines() if line.strip()]
    assert agent and all(json.loads(line)["level"] for line in agent if line.startswith("{"))


def test_a_daemon_refuses_bad_observability_flags(tmp_path: Path) -> None:
    import os
    import sys
    base = [sys.executable, "-m", "hypersack.server.app", "--db", str(tmp_path / "x.db")]
    for flags, said in ((["--metrics-listen", "0.0.0.0:9464"], "refused without TLS"),
                        (["--metrics-listen", "nonsense"], "expected HOST:PORT"),
                        (["--log-format", "xml"], "invalid choice"),
                        (["--log-level", "LOUD"], "log level")):
        out = subprocess.run([*base, *flags], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        assert out.returncode == 2, (flags, out.stderr)
        assert said in out.stderr, (flags, out.stderr)
    (tmp_path / "a-file").write_text("")
    agent = [sys.executable, "-m", "hypersack.agent.app", "--server", "127.0.0.1:1",
             "--backend", "fake", "--inventory", "1xA100-80GB@4",
             "--workdir", str(tmp_path / "work"),
             *(["--allow-root-trials"] if os.geteuid() == 0 else [])]
    for flags, said in ((["--metrics-listen", "0.0.0.0:9465"], "or give --metrics-insecure"),
                        (["--checkpoint-dir", str(tmp_path / "a-file")],
                         "not a folder this agent can use")):
        out = subprocess.run([*agent, *flags], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        assert out.returncode == 2, (flags, out.stderr)
        assert said in out.stderr.strip().splitlines()[-1], (flags, out.stderr)


def test_why_says_what_blocks_a_waiting_trial(cluster: Cluster) -> None:
    import os
    import sys
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48")
    # The running trial lasts past the test (each `why` is a process of its own, seconds
    # under load: with 10 s of sleep it had ended before it was asked about).
    study = _submit(cluster, space_yaml("why", seconds_per_epoch=60.0, epochs=2, ratio=1.0))
    wait_for("trials running", lambda: any(t.state == "RUNNING" for t in _trials(cluster, study)))
    trials = _trials(cluster, study)
    waiting = next(t for t in trials if t.state == "PENDING")
    running = next(t for t in trials if t.state == "RUNNING")
    env = {**os.environ, "HYPERSACK_TOKEN": cluster.admin_token}

    def why(trial: str) -> str:
        out = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "why", trial,
                              *cluster.cli_flags()], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    out = why(waiting.id)
    assert f"{waiting.id} is PENDING" in out
    assert "n1:0 (A100" in out and "compute: needs" in out, out
    # The default policy chose the study's rule by simulating it (the server's foresight,
    # in its simulation process: the choice may come in after the first decision).
    wait_for("the rule chosen", lambda: "policy is predict: rule " in why(waiting.id))
    out = why(waiting.id)
    assert "its study's policy is predict: rule " in out and "simulated ends: " in out, out
    assert f"{running.id} is RUNNING on n1:0" in why(running.id)
    with cluster.client() as client:
        assert client.explain(waiting.id).lines[0] == f"{waiting.id} is PENDING"
    bad = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "why", "nope",
                          *cluster.cli_flags()], capture_output=True, text=True, env=env,
                         timeout=60)
    assert bad.returncode != 0 and "no trial 'nope'" in bad.stderr
