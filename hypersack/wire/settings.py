"""Settings for both daemons: flags, then `HYPERSACK_*` environment, then a YAML config
file, then defaults (pydantic-settings)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from hypersack.core.bounds import (
    MAX_NAME_CHARS,
    MAX_NODES,
    MAX_RATIO,
    NAME_PATTERN,
    Name,
    PositiveSeconds,
    Ratio,
    is_name,
)
from hypersack.core.cluster import near_miss
from hypersack.core.errors import InvalidInput
from hypersack.core.files import load_yaml_file
from hypersack.core.types import UserShare
from hypersack.core.validation import format_validation_error
from hypersack.wire.tls import CertPaths


def _tls_paths(ca: Path | None, cert: Path | None, key: Path | None,
               directory: Path | None, cert_name: str, key_name: str) -> CertPaths | None:
    """The three TLS files from flags, or from a `hypersack certs` directory."""
    if directory is not None:
        ca = ca or directory / "ca.crt"
        cert = cert or directory / cert_name
        key = key or directory / key_name
    given = [p for p in (ca, cert, key) if p is not None]
    if not given:
        return None
    if ca is None or cert is None or key is None:
        raise InvalidInput("TLS needs the CA certificate, this side's certificate and its "
                           "key (--tls-ca, --tls-cert, --tls-key, or --tls-dir)")
    return CertPaths(ca, cert, key)


# A user name, or "*" for everyone not named.
ShareKey = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS,
                                pattern=rf"^\*$|{NAME_PATTERN}")]


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYPERSACK_", extra="forbid",
                                      allow_inf_nan=False)

    listen: str = Field(default="127.0.0.1:50051",
                        description="address to listen on; 0.0.0.0:50051 for a cluster")
    db: Path = Field(default=Path("hypersack.db"), description="SQLite database file")
    init: bool = Field(default=False, description="start a new cluster on an empty db file")
    insecure: bool = Field(default=False, description="accept a non-loopback --listen "
                           "without TLS or authentication (behind a firewall only)")
    tls_dir: Path | None = Field(default=None, description="a `hypersack certs` directory: "
                                 "ca.crt, server.crt, server.key")
    tls_ca: Path | None = Field(default=None, description="the cluster CA's certificate")
    tls_cert: Path | None = Field(default=None, description="this server's certificate")
    tls_key: Path | None = Field(default=None, description="this server's private key")
    agent_listen: str | None = Field(
        default=None, description="the mutual-TLS port for agents (and clients with client "
        "certificates); default: the --listen port + 1")
    share_results: bool = Field(default=False, description="users may read (not cancel, "
                                "not see the logs of) other users' studies")
    policy: str | None = Field(default=None, description="override every study's policy")
    oversubscription: dict[str, float] = Field(
        default_factory=lambda: {"A100": 3.0, "H100": 2.5},
        description="oversubscription ratio per GPU architecture")
    default_ratio: Ratio = 1.0
    learn_ratio: bool = Field(default=True, description="learn each architecture's ratio "
                              "from the slowdown running trials report (from the "
                              "configured one, a quarter at a time; off: the configured "
                              "ratios stay)")
    learn_ratio_max: Ratio = Field(default=4.0, description="the highest ratio learning "
                                   "may reach (or the configured one, if higher)")
    learn_sample_every_s: PositiveSeconds = Field(default=30.0, description="at most one "
                                                  "slowdown sample per GPU this often")
    learn_decide_every_s: PositiveSeconds = Field(default=60.0, description="at most one "
                                                  "learned move per architecture this often")
    learn_min_samples: int = Field(default=40, ge=3, le=100_000, description="slowdown "
                                   "samples before a learned ratio moves, and between moves")
    learn_settle_s: PositiveSeconds = Field(default=10.0, description="no slowdown sample "
                                            "from a GPU whose trials changed this lately "
                                            "(new trials start: imports, CUDA contexts)")
    learn_by_workload: bool = Field(default=True, description="a slowdown fit per workload "
                                    "(model) with learn_min_samples samples of its own, "
                                    "weighed by the trials running; false: one fit of all")
    learn_foresight: bool = Field(default=True, description="step each learned ratio "
                                  "toward the one under which the study with the most "
                                  "trials pending, simulated with the learned slowdown, "
                                  "ends first; false: toward the most progress per GPU")
    heartbeat_interval_s: PositiveSeconds = 5.0
    heartbeat_timeout_s: PositiveSeconds = 30.0
    tick_interval_s: PositiveSeconds = 1.0
    batch_gather_ms: float = Field(
        default=3.0, ge=0, le=100, description="under load (agents' reports arriving within "
        "this of each other), how long a batch waits for more before it is applied: fewer, "
        "larger batches cost less server CPU per trial, for at most this much on a "
        "relaunch; 0: each report at once")
    retries: int | None = Field(default=None, ge=0,
                                description="default retries for studies that set none")
    max_study_trials: int = Field(default=100_000, ge=1)
    max_agents: int = Field(default=512, ge=1, le=MAX_NODES)
    max_watches: int = Field(default=32, ge=1, le=1024)
    profiles: list[Path] = Field(default_factory=list,
                                 description="profile files imported into the history")
    metrics_listen: str | None = Field(
        default=None, max_length=300, description="serve Prometheus metrics at "
        "HOST:PORT/metrics (HTTPS with a client certificate when TLS is on)")
    reflection: bool = Field(default=True, description="serve gRPC reflection beside "
                             "the health service (grpcurl, grpcui)")
    shares: dict[ShareKey, UserShare] = Field(
        default_factory=dict, max_length=100_000,
        description="fair-share weight, quotas (max_gpus, max_compute) and max_priority "
        "per user name; '*' for everyone not named")

    def tls(self) -> CertPaths | None:
        return _tls_paths(self.tls_ca, self.tls_cert, self.tls_key, self.tls_dir,
                          "server.crt", "server.key")

    @field_validator("oversubscription")
    @classmethod
    def _ratios(cls, ratios: dict[str, float]) -> dict[str, float]:
        for arch, r in ratios.items():
            if not 0 < r <= MAX_RATIO:
                raise ValueError(f"ratio for {arch!r} must be a number in (0, {MAX_RATIO:g}] "
                                 f"(got {r})")
        try:
            check_ratio_names(ratios)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return ratios


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYPERSACK_", extra="forbid",
                                      allow_inf_nan=False)

    server: str = Field(default="127.0.0.1:50051", description="server address")
    node: Name | None = Field(default=None, description="node name (default: host name)")
    backend: str = Field(default="auto", description="auto, nvml, cpu or fake")
    inventory: str | None = Field(default=None,
                                  description="for the fake backend: e.g. 4xA100-80GB@88")
    workdir: Path = Field(default=Path("hypersack-work"),
                          description="trial working directories and logs")
    poll_interval_s: PositiveSeconds = 0.2
    reconnect_max_s: PositiveSeconds = 10.0
    log_max_mib: int = Field(default=64, ge=1, le=1 << 20,
                             description="cap on each trial's log; the tail is kept")
    allow_commands: str | None = Field(
        default=None, max_length=4096,
        description="let command programs run: '*' any executable, or a comma list")
    allow_shell: bool = Field(default=False, description="let templates run shells or "
                              "inline code (sh -c, python -c)")
    allow_modules: str | None = Field(default=None, max_length=4096,
                                      description="modules `python -m` may run: a comma list")
    pass_env: list[str] = Field(default_factory=list, max_length=256,
                                description="more variables trials may see (NAME or PREFIX*)")
    tls_dir: Path | None = Field(default=None, description="a `hypersack certs` directory: "
                                 "ca.crt, nodes/NODE.crt, nodes/NODE.key")
    tls_ca: Path | None = Field(default=None, description="the cluster CA's certificate")
    tls_cert: Path | None = Field(default=None, description="this node's certificate")
    tls_key: Path | None = Field(default=None, description="this node's private key")
    tls_server_name: str | None = Field(default=None, max_length=253, description="the name "
                                        "in the server's certificate, if not the --server host")
    owner: str | None = Field(default=None, max_length=128, description="the one study "
                              "owner whose trials this agent runs ('*': any)")
    run_as: str | None = Field(default=None, max_length=64, description="the Unix user "
                               "trials run as (needed when the agent runs as root)")
    user_map: list[str] = Field(default_factory=list, max_length=4096, description="OWNER="
                                "UNIXUSER: trials of that study owner run as that user")
    allow_root_trials: bool = Field(default=False, description="an agent running as root "
                                    "may run trials as root (a single-user machine only)")
    warm_start: bool = Field(default=True, description="fork Python trials from a warm "
                             "process that imported their libraries once (false: every "
                             "trial starts a new interpreter)")
    mps: bool = Field(default=True, description="run an MPS daemon per GPU where "
                      "nvidia-cuda-mps-control is found (false: co-located trials time-slice)")
    metrics_listen: str | None = Field(
        default=None, max_length=300, description="serve Prometheus metrics at "
        "HOST:PORT/metrics (HTTPS with a client certificate when TLS is on)")
    checkpoint_dir: Path | None = Field(
        default=None, description="trials' checkpoints under this folder instead of the "
        "node's work directory: on a file system every node mounts, a promoted trial "
        "resumes from its checkpoint on any node")
    metrics_insecure: bool = Field(default=False, description="serve plain-HTTP metrics "
                                   "on a non-loopback address without TLS")

    def tls(self, node: str) -> CertPaths | None:
        return _tls_paths(self.tls_ca, self.tls_cert, self.tls_key, self.tls_dir,
                          f"nodes/{node}.crt", f"nodes/{node}.key")


S = TypeVar("S", bound=BaseSettings)


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def load_settings(cls: type[S], flags: dict[str, Any], config: Path | None = None) -> S:
    """Flags (the ones given) override the environment, which overrides the file."""
    values: dict[str, Any] = {}
    if config is not None:
        data = load_yaml_file(config, "config file")
        if data is not None and not isinstance(data, dict):
            raise InvalidInput(f"{config}: expected a mapping of settings")
        values = data or {}
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise InvalidInput(f"{config}: unknown setting(s) {unknown}; valid: "
                               f"{', '.join(cls.model_fields)}")

    class _WithFile(cls):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(
            cls_, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, _FileSource(settings_cls, values)

    try:
        settings = _WithFile(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, "settings")) from None
    return cls.model_validate(settings.model_dump())


def next_port(listen: str) -> str:
    """HOST:PORT -> HOST:PORT+1 (port 0, any free port, stays 0)."""
    host, _, port = listen.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise InvalidInput(f"--listen {listen!r}: expected HOST:PORT") from None
    return f"{host}:{number + 1 if number else 0}"


def is_loopback(listen: str) -> bool:
    """Whether a listen address (HOST:PORT) accepts connections from this host only."""
    host = listen.rpartition(":")[0].strip("[]").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def check_ratio_names(ratios: Mapping[str, float]) -> None:
    """Refuse ratios where one architecture is named twice (`a100` beside the default
    A100): the near miss would apply to no GPU, without a word."""
    for name in sorted(ratios):
        meant = sorted(a for a in ratios if near_miss(name, a))
        if meant:
            raise InvalidInput(
                f"ratios for both {name[:40]!r} and {meant[0][:40]!r}: architectures are matched "
                "exactly, so one of them would apply to no GPU; keep the name `hypersack "
                "nodes` shows (the defaults are A100 and H100)")


def parse_ratios(pairs: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs:
        arch, sep, value = pair.partition("=")
        try:
            ratio = float(value)
        except ValueError:
            ratio = float("nan")
        if not sep or not is_name(arch) or not 0 < ratio <= MAX_RATIO:
            raise InvalidInput(f"--ratio {pair!r}: expected ARCH=RATIO with RATIO in (0, "
                               f"{MAX_RATIO:g}], like A100=3")
        out[arch] = ratio
    return out
