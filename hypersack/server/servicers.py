"""gRPC servicers. They translate messages and errors; the service decides nothing either,
the orchestrator does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any, TypeVar

import grpc

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.core.errors import (
    AlreadyExists,
    HyperSackError,
    InvalidInput,
    NotFound,
    Overloaded,
)
from hypersack.core.types import StudyRecord
from hypersack.sampler.profiles import reject_repeats
from hypersack.server.service import AgentSession, SchedulerService, Snapshot
from hypersack.wire.convert import profile_from_pb, profile_to_pb, study_to_pb, trial_to_pb

log = logging.getLogger(__name__)

T = TypeVar("T")


def status_of(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, AlreadyExists):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(exc, InvalidInput):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, HyperSackError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def translated(fn: Callable[..., T]) -> Callable[..., T]:
    """Domain errors become status codes with the message; anything else is INTERNAL."""

    @wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> T:
        try:
            return fn(self, request, context)
        except HyperSackError as exc:
            context.abort(status_of(exc), str(exc))
        except Exception as exc:
            log.exception("internal error in %s", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
        raise AssertionError("unreachable")  # abort raises

    return wrapper


def _study(service: SchedulerService, study: StudyRecord, counts: dict[str, int]) -> pb.Study:
    """The study's message; its objective comes from the orchestrator's parsed space."""
    return study_to_pb(study, counts, service.orch.space(study.id).settings.objective)


def _update(service: SchedulerService, snap: Snapshot) -> pb.StudyUpdate:
    return pb.StudyUpdate(
        study=_study(service, snap.study, snap.counts),
        gpus=[pb.GpuLoad(node=n, gpu_index=i, trials=k, compute_share=s)
              for n, i, k, s in snap.gpus])


class SchedulerServicer(pb_grpc.SchedulerServicer):
    def __init__(self, service: SchedulerService) -> None:
        self._s = service

    @translated
    def SubmitStudy(self, request: pb.SubmitStudyRequest, context: grpc.ServicerContext
                    ) -> pb.Study:
        study = self._s.submit(request.space_yaml, request.source or "search space")
        return _study(self._s, study, self._s.counts(study.id))

    @translated
    def GetStudy(self, request: pb.GetStudyRequest, context: grpc.ServicerContext) -> pb.Study:
        study = self._s.orch.study(request.study_id)
        return _study(self._s, study, self._s.counts(study.id))

    @translated
    def ListStudies(self, request: pb.ListStudiesRequest, context: grpc.ServicerContext
                    ) -> pb.ListStudiesResponse:
        return pb.ListStudiesResponse(studies=[_study(self._s, s, self._s.counts(s.id))
                                               for s in self._s.orch.studies()])

    @translated
    def ListTrials(self, request: pb.ListTrialsRequest, context: grpc.ServicerContext
                   ) -> pb.ListTrialsResponse:
        return pb.ListTrialsResponse(
            trials=[trial_to_pb(t) for t in self._s.orch.trials(request.study_id)])

    @translated
    def GetTrial(self, request: pb.GetTrialRequest, context: grpc.ServicerContext) -> pb.Trial:
        return trial_to_pb(self._s.orch.trial(request.trial_id))

    def WatchStudy(self, request: pb.WatchStudyRequest, context: grpc.ServicerContext
                   ) -> Iterator[pb.StudyUpdate]:
        context.add_callback(self._s.wake)  # a cancelled watch frees its thread at once
        try:
            with self._s.watch_slot(peer_host(context.peer())):
                stream = self._s.watch(request.study_id, request.min_interval_s,
                                       context.is_active)
                for snap in stream:
                    yield _update(self._s, snap)
        except HyperSackError as exc:
            context.abort(status_of(exc), str(exc))

    @translated
    def CancelStudy(self, request: pb.CancelStudyRequest, context: grpc.ServicerContext
                    ) -> pb.Study:
        study = self._s.cancel(request.study_id)
        return _study(self._s, study, self._s.counts(study.id))

    @translated
    def ListNodes(self, request: pb.ListNodesRequest, context: grpc.ServicerContext
                  ) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=node_messages(self._s))

    @translated
    def DrainNode(self, request: pb.DrainNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        self._s.drain(request.node)
        return next(n for n in node_messages(self._s) if n.name == request.node)


    @translated
    def ListProfiles(self, request: pb.ListProfilesRequest, context: grpc.ServicerContext
                     ) -> pb.ListProfilesResponse:
        return pb.ListProfilesResponse(profiles=[
            profile_to_pb(p) for p in self._s.profiles(request.model, request.arch)])

    @translated
    def ImportProfiles(self, request: pb.ImportProfilesRequest, context: grpc.ServicerContext
                       ) -> pb.ImportProfilesResponse:
        profiles = [profile_from_pb(msg, where=f"profiles.{i}", default_source="imported")
                    for i, msg in enumerate(request.profiles)]
        reject_repeats(profiles)
        imported, kept = self._s.import_profiles(profiles, request.replace)
        return pb.ImportProfilesResponse(imported=imported, kept=kept)


def peer_host(peer: str) -> str:
    """`ipv4:127.0.0.1:5000` -> `ipv4:127.0.0.1`: the client's host, its port dropped."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def node_messages(service: SchedulerService) -> list[pb.Node]:
    sessions = service.sessions()
    load = service.orch.gpu_load()
    out = []
    for rec in service.orch.nodes():
        s = sessions.get(rec.spec.name)
        gpus = []
        for g in rec.spec.gpus:
            trials, share = load.get((rec.spec.name, g.index), (0, 0.0))
            state = s.gpu_state.get(g.index) if s else None
            gpus.append(pb.Gpu(index=g.index, arch=g.arch, memory_mib=g.memory_mib, uuid=g.uuid,
                               trials=trials, compute_share=share,
                               utilization_pct=state.utilization_pct if state else 0.0,
                               memory_used_mib=state.memory_used_mib if state else 0))
        out.append(pb.Node(name=rec.spec.name, cores=rec.spec.cores, draining=rec.draining,
                           connected=bool(s and s.connected),
                           last_seen_s=service.since(s.last_seen) if s else -1.0,
                           gpus=gpus, backend=s.backend if s else ""))
    return out


class AgentLinkServicer(pb_grpc.AgentLinkServicer):
    """One stream per agent: the first message registers, the rest are events."""

    def __init__(self, service: SchedulerService) -> None:
        self._s = service

    def Connect(self, request_iterator: Iterator[pb.AgentMessage],
                context: grpc.ServicerContext) -> Iterator[pb.ServerMessage]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("body") != "register":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "the first message on the agent stream must be register")
        try:
            session = self._s.register(first.register)
        except HyperSackError as exc:
            context.abort(status_of(exc), str(exc))
        reader = threading.Thread(target=self._read, args=(session, request_iterator, context),
                                  name=f"agent-{session.node}", daemon=True)
        reader.start()
        yield from session.messages()

    def _read(self, session: AgentSession, requests: Iterator[pb.AgentMessage],
              context: grpc.ServicerContext) -> None:
        try:
            for msg in requests:
                try:
                    self._s.agent_message(session, msg)
                except HyperSackError as exc:
                    # A bad message is refused; the stream and the server go on.
                    log.warning("agent %s: refused message: %s", session.node, exc)
        except grpc.RpcError:
            pass  # the agent went away
        except Exception:
            log.exception("agent %s: stream failed", session.node)
        finally:
            self._s.disconnected(session)
