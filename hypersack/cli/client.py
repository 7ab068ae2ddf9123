"""A thin client of the Scheduler service: RPC errors come back as domain errors."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from typing import Any, TypeVar

import grpc

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.core.errors import (
    STORE_UNAVAILABLE,
    AlreadyExists,
    HyperSackError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)

T = TypeVar("T")


class Unreachable(HyperSackError):
    pass


def speaks_tls(server: str, timeout_s: float = 2.0) -> bool:
    """Whether a TLS handshake with `server` (HOST:PORT) succeeds: a plain client that
    cannot reach it is then told to pass the CA, not that nothing runs there."""
    host, _, port = server.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only asking whether it speaks TLS at all
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock, \
                context.wrap_socket(sock, server_hostname=host or None):
            return True
    except (OSError, ValueError):
        return False


def domain_error(exc: grpc.RpcError, server: str, tls: bool = True) -> HyperSackError:
    code = exc.code()
    detail = exc.details() or str(code)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(detail)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return AlreadyExists(detail)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"not authenticated: {detail}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"permission denied: {detail}")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return InvalidInput(detail)
    if code == grpc.StatusCode.UNAVAILABLE and detail.startswith(STORE_UNAVAILABLE):
        return HyperSackError(detail)  # the server answered: its database fails
    if code == grpc.StatusCode.UNAVAILABLE and not tls and speaks_tls(server):
        return Unreachable(f"the HyperSack server at {server} speaks TLS: pass --tls-ca "
                           "(or set HYPERSACK_TLS_CA) with the cluster's CA certificate")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unreachable(f"cannot reach the HyperSack server at {server} ({detail}); is "
                           "hypersack-server running there? (--server or HYPERSACK_SERVER)")
    return HyperSackError(f"server error ({code.name}): {detail}")


class Client:
    """`credentials`: TLS to the server (None: plain, for a loopback server without TLS);
    `token`: the bearer token sent with every call."""

    def __init__(self, server: str, timeout_s: float = 30.0, *, token: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 server_name: str | None = None) -> None:
        self.server = server
        self.timeout_s = timeout_s
        self._tls = credentials is not None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        self._channel = (grpc.insecure_channel(server, options=options) if credentials is None
                         else grpc.secure_channel(server, credentials, options=options))
        self._stub = pb_grpc.SchedulerStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s,
                                               metadata=self._metadata)
        except grpc.RpcError as exc:
            raise domain_error(exc, self.server, self._tls) from None

    def submit(self, text: str, source: str) -> pb.Study:
        return self._call("SubmitStudy", pb.SubmitStudyRequest(space_yaml=text, source=source))  # type: ignore[no-any-return]

    def study(self, study_id: str) -> pb.Study:
        return self._call("GetStudy", pb.GetStudyRequest(study_id=study_id))  # type: ignore[no-any-return]

    def studies(self) -> list[pb.Study]:
        return list(self._call("ListStudies", pb.ListStudiesRequest()).studies)

    def trials(self, study_id: str) -> list[pb.Trial]:
        return list(self._call("ListTrials", pb.ListTrialsRequest(study_id=study_id)).trials)

    def trial(self, trial_id: str) -> pb.Trial:
        return self._call("GetTrial", pb.GetTrialRequest(trial_id=trial_id))  # type: ignore[no-any-return]

    def history(self, *, study_id: str = "", trial_id: str = "") -> pb.History:
        """Learning curves (every page) and spans of a study or of one trial."""
        whole = pb.History()
        request = pb.GetHistoryRequest(study_id=study_id, trial_id=trial_id)
        while True:
            page = self._call("GetHistory", request)
            whole.steps.extend(page.steps)
            whole.spans.extend(page.spans)
            if not page.more or not page.steps:
                return whole
            request.after_trial = page.steps[-1].trial_id
            request.after_step = page.steps[-1].step

    def explain(self, trial_id: str) -> pb.TrialExplanation:
        return self._call("ExplainTrial", pb.GetTrialRequest(trial_id=trial_id))  # type: ignore[no-any-return]

    def ask(self, study_id: str, params: list[dict[str, Any]]) -> list[pb.Trial]:
        request = pb.AskTrialsRequest(study_id=study_id,
                                      params_json=[json.dumps(p) for p in params])
        return list(self._call("AskTrials", request).trials)

    def cancel(self, study_id: str) -> pb.Study:
        return self._call("CancelStudy", pb.CancelStudyRequest(study_id=study_id))  # type: ignore[no-any-return]

    def extend(self, study_id: str, trials: int) -> pb.Study:
        return self._call("ExtendStudy", pb.ExtendStudyRequest(  # type: ignore[no-any-return]
            study_id=study_id, trials=trials))

    def nodes(self) -> list[pb.Node]:
        return list(self.cluster().nodes)

    def cluster(self) -> pb.ListNodesResponse:
        """The nodes, and how far each architecture is packed."""
        return self._call("ListNodes", pb.ListNodesRequest())  # type: ignore[no-any-return]

    def drain(self, node: str) -> pb.Node:
        return self._call("DrainNode", pb.DrainNodeRequest(node=node))  # type: ignore[no-any-return]

    def undrain(self, node: str) -> pb.Node:
        return self._call("UndrainNode", pb.DrainNodeRequest(node=node))  # type: ignore[no-any-return]

    def profiles(self, model: str = "", arch: str = "") -> list[pb.ProfileRecord]:
        return list(self._call("ListProfiles",
                               pb.ListProfilesRequest(model=model, arch=arch)).profiles)

    def import_profiles(self, profiles: list[pb.ProfileRecord], replace: bool) -> tuple[int, int]:
        reply = self._call("ImportProfiles",
                           pb.ImportProfilesRequest(profiles=profiles, replace=replace))
        return int(reply.imported), int(reply.kept)

    def forget_profiles(self, model: str, arch: str = "") -> int:
        reply = self._call("ForgetProfiles", pb.ForgetProfilesRequest(model=model, arch=arch))
        return int(reply.forgotten)

    def watch(self, study_id: str, min_interval_s: float = 0.2,
              timeout_s: float | None = None) -> Iterator[pb.StudyUpdate]:
        """The study's updates until it ends, or until `timeout_s` (then it just stops)."""
        try:
            yield from self._stub.WatchStudy(
                pb.WatchStudyRequest(study_id=study_id, min_interval_s=min_interval_s),
                metadata=self._metadata, timeout=timeout_s)
        except grpc.RpcError as exc:
            if timeout_s is not None and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise domain_error(exc, self.server, self._tls) from None


    def whoami(self) -> pb.User:
        return self._call("WhoAmI", pb.WhoAmIRequest())  # type: ignore[no-any-return]

    def add_user(self, name: str, role: str) -> pb.User:
        return self._call("AddUser", pb.AddUserRequest(name=name, role=role))  # type: ignore[no-any-return]

    def remove_user(self, name: str) -> pb.User:
        return self._call("RemoveUser", pb.RemoveUserRequest(name=name))  # type: ignore[no-any-return]

    def users(self) -> list[pb.User]:
        return list(self._call("ListUsers", pb.ListUsersRequest()).users)

    def create_token(self, user: str = "", label: str = "", ttl_s: float = 0.0
                     ) -> pb.CreateTokenResponse:
        return self._call("CreateToken", pb.CreateTokenRequest(  # type: ignore[no-any-return]
            user=user, label=label, ttl_s=ttl_s))

    def tokens(self, user: str = "") -> list[pb.Token]:
        return list(self._call("ListTokens", pb.ListTokensRequest(user=user)).tokens)

    def revoke_token(self, token_id: str) -> pb.Token:
        return self._call("RevokeToken", pb.RevokeTokenRequest(id=token_id))  # type: ignore[no-any-return]


def params_of(t: pb.Trial) -> dict[str, Any]:
    value = json.loads(t.params_json or "{}")
    return value if isinstance(value, dict) else {}
