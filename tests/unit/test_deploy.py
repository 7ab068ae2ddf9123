"""deploy/: the Kubernetes manifests validate against a current Kubernetes's schemas, and
every manifest, unit and container file names settings, flags, ports, paths and programs
that the code has (a renamed flag or port breaks here, not on a cluster)."""

from __future__ import annotations

import configparser
import shlex
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hypersack.agent.app import _parser as agent_parser
from hypersack.cli.main import build_parser
from hypersack.grid.space import parse_space
from hypersack.server.app import _parser as server_parser
from hypersack.wire.settings import AgentSettings, ServerSettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = "1.37.0"  # the newest schemas kubernetes-validate ships (1.37.0)
SCRIPTS = {e.name for e in distribution("hypersack").entry_points
           if e.group == "console_scripts"}


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _find(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name)


def _settings(cls: type, text: str, tmp_path: Path) -> Any:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return load_settings(cls, {}, path)


@pytest.mark.parametrize("where,doc", _docs(), ids=lambda x: x if isinstance(x, str) else
                         f"{x['kind']}/{x['metadata']['name']}")
def test_each_manifest_validates_strictly(where: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    assert doc["metadata"].get("namespace", "hypersack") == "hypersack" or \
        doc["kind"] == "Namespace"


def test_the_validator_does_catch_a_bad_manifest() -> None:
    bad = _find("Deployment", "hypersack-server")
    bad = {**bad, "spec": {**bad["spec"], "replicas": "one"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"]
                if c["name"] == name)


def _port(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def _mounts(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}


def test_the_server_manifests_match_its_settings(tmp_path: Path) -> None:
    config = _find("ConfigMap", "hypersack-config")["data"]
    settings = _settings(ServerSettings, config["server.yaml"], tmp_path)
    deployment = _find("Deployment", "hypersack-server")
    server = _container(deployment, "server")
    assert server["command"] == ["hypersack-server"] and "hypersack-server" in SCRIPTS
    args = server_parser().parse_args(server["args"])
    assert args.config == Path("/etc/hypersack/server.yaml")
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"clients": _port(settings.listen),
                     "agents": _port(settings.agent_listen),
                     "metrics": _port(settings.metrics_listen)}
    service = _find("Service", "hypersack-server")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    mounts = _mounts(deployment, server)
    assert mounts[str(settings.db.parent)] == "db"  # the database on the volume
    assert mounts[str(settings.tls_dir)] == "tls"
    assert "/etc/hypersack/server.yaml" in mounts
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["db"]["persistentVolumeClaim"]["claimName"] == \
        _find("PersistentVolumeClaim", "hypersack-db")["metadata"]["name"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # one writer, always
    secret = _find("Secret", volumes["tls-secret"]["secret"]["secretName"])
    assert set(secret["stringData"]) == {"ca.crt", "server.crt", "server.key"}
    init = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["initContainers"]}
    admin = shlex.split(init["first-admin"]["args"][0].split("||", 1)[1])
    parsed = build_parser().parse_args(admin[1:])
    assert (parsed.command, parsed.action, parsed.db) == ("users", "add", settings.db)


def test_the_agent_manifest_matches_its_settings_and_the_service(tmp_path: Path) -> None:
    config = _find("ConfigMap", "hypersack-config")["data"]
    settings = _settings(AgentSettings, config["agent.yaml"], tmp_path)
    server_settings = _settings(ServerSettings, config["server.yaml"], tmp_path)
    daemonset = _find("DaemonSet", "hypersack-agent")
    agent = _container(daemonset, "agent")
    assert agent["command"] == ["hypersack-agent"] and "hypersack-agent" in SCRIPTS
    assert agent_parser().parse_args(agent["args"]).config == Path("/etc/hypersack/agent.yaml")
    host, _, port = settings.server.rpartition(":")
    service = _find("Service", "hypersack-server")
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) == _port(server_settings.agent_listen)
    assert settings.tls_server_name == host  # in the server certificate (the README)
    env = {e["name"]: e for e in agent["env"]}
    assert env["HYPERSACK_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "node" in AgentSettings.model_fields  # what HYPERSACK_NODE sets
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostIPC"] is True  # MPS clients and daemons share memory
    mounts = _mounts(daemonset, agent)
    assert mounts[str(settings.workdir)] == "work" and mounts[str(settings.tls_dir)] == "tls"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "hostPath" in volumes["work"]  # the MPS pipes and trial directories
    assert {p["name"]: p["containerPort"] for p in agent["ports"]} == \
        {"metrics": _port(settings.metrics_listen)}


def test_the_submit_job_submits_a_valid_study() -> None:
    job = _find("Job", "hypersack-submit")
    submit = _container(job, "submit")
    args = build_parser().parse_args(submit["args"])
    assert args.command == "submit" and args.watch
    space = _find("ConfigMap", "hypersack-study")["data"]["space.yaml"]
    assert parse_space(yaml.safe_load(space)).size() == 16
    env = {e["name"]: e for e in submit["env"]}
    assert env["HYPERSACK_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == \
        _find("Secret", "hypersack-admin-token")["metadata"]["name"]
    assert _port(env["HYPERSACK_SERVER"]["value"]) == 50051


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DEPLOY / "systemd" / name).read_text())
    return unit


@pytest.mark.parametrize("name,parser,cls,config", [
    ("hypersack-server.service", server_parser, ServerSettings, "server.yaml"),
    ("hypersack-agent.service", agent_parser, AgentSettings, "agent.yaml")])
def test_the_systemd_units_start_the_daemons_as_configured(name: str, parser: Any,
                                                           cls: type, config: str,
                                                           tmp_path: Path) -> None:
    unit = _unit(name)
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name in SCRIPTS
    args = parser().parse_args(argv[1:])
    assert args.config == Path("/etc/hypersack") / config
    settings = _settings(cls, (DEPLOY / "systemd" / config).read_text(), tmp_path)
    state = Path("/var/lib") / service["StateDirectory"]
    where = settings.db if cls is ServerSettings else settings.workdir
    assert where == state or state in where.parents  # on the persistent state directory
    assert service["Restart"] == "on-failure" and service["User"] == "hypersack"
    assert service["Environment"].split("=", 1)[1] in ("json",)
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    sysusers = (DEPLOY / "systemd" / "hypersack.sysusers.conf").read_text()
    assert any(line.split()[:2] == ["u", service["User"]] for line in sysusers.splitlines())


def test_the_container_file_runs_what_the_package_installs() -> None:
    lines = [x.strip() for x in (DEPLOY / "container" / "Containerfile").read_text()
             .replace("\\\n", " ").splitlines() if x.strip() and not x.startswith("#")]
    instructions = {line.split()[0] for line in lines}
    assert instructions <= {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE",
                            "ENTRYPOINT", "CMD"}
    cmd = next(line for line in lines if line.startswith("CMD "))
    argv = yaml.safe_load(cmd[4:])
    assert argv[0] in SCRIPTS
    assert server_parser().parse_args(argv[1:]).config == Path("/etc/hypersack/server.yaml")
    exposed = {int(p) for line in lines if line.startswith("EXPOSE ")
               for p in line.split()[1:]}
    assert exposed == {50051, 50052, 9464, 9465}
    user = next(line for line in lines if line.startswith("USER ")).split()[1]
    assert user.split(":")[0] != "0" and user != "root"
    copied = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert all((ROOT / c).exists() for c in copied)
