"""gRPC servicers. They translate messages and errors; the service decides nothing either,
the orchestrator does."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from functools import partial, wraps
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
    PermissionDenied,
    StoreUnavailable,
    Unauthenticated,
)
from hypersack.core.types import StudyRecord, TokenRecord, UserRecord
from hypersack.orchestrator.events import StudyCancelled, StudyExtended
from hypersack.sampler.profiles import reject_repeats
from hypersack.server.auth import Authenticator, Principal, bearer
from hypersack.server.bridge import Aborted, Waker
from hypersack.server.intake import AgentSession
from hypersack.server.service import SchedulerService
from hypersack.server.views import node_messages, sharing_messages
from hypersack.server.watches import Snapshot
from hypersack.wire.convert import (
    history_to_pb,
    profile_from_pb,
    profile_to_pb,
    study_to_pb,
    trial_to_pb,
)
from hypersack.wire.tls import Identity, identity_of

log = logging.getLogger(__name__)

T = TypeVar("T")


def status_of(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, AlreadyExists):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(exc, InvalidInput):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(exc, PermissionDenied):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, HyperSackError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def translated(fn: Callable[..., T]) -> Callable[..., T]:
    """Domain errors become status codes with the message; anything else is INTERNAL."""

    @wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> T:
        try:
            return fn(self, request, context)
        except Aborted:
            raise
        except HyperSackError as exc:
            context.abort(status_of(exc), str(exc))
        except Exception as exc:
            log.exception("internal error in %s", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
        raise AssertionError("unreachable")  # abort raises

    return wrapper


MAX_ASKED = 1000  # trials one AskTrials call may add
MAX_PARAMS_CHARS = 64 * 1024
# Learning-curve steps per GetHistory reply: at most 16 metrics each, well within the
# 4 MiB a gRPC message may carry.
HISTORY_PAGE = 5000


def _study(service: SchedulerService, study: StudyRecord, counts: dict[str, int]) -> pb.Study:
    """The study's message; its objective comes from the orchestrator's parsed space."""
    space = service.orch.space(study.id)
    return study_to_pb(study, counts, space.settings.goals, space.size())


def _update(service: SchedulerService, snap: Snapshot) -> pb.StudyUpdate:
    return pb.StudyUpdate(
        study=_study(service, snap.study, snap.counts),
        gpus=[pb.GpuLoad(node=n, gpu_index=i, trials=k, compute_share=s)
              for n, i, k, s in snap.gpus])


def peer_identity(context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any]
                  ) -> Identity | None:
    """The identity in the certificate the peer presented. Only the mutual-TLS port asks
    for one, and it accepts only certificates signed by the cluster's CA."""
    pems = list(context.auth_context().get("x509_pem_cert", ()))
    return identity_of(pems[0]) if pems else None


def _user_pb(user: UserRecord, via: str = "") -> pb.User:
    return pb.User(name=user.name, role=user.role.value, created_at=user.created_at, via=via)


def _token_pb(t: TokenRecord) -> pb.Token:
    return pb.Token(id=t.id, user=t.user, created_at=t.created_at, revoked_at=t.revoked_at,
                    label=t.label, expires_at=t.expires_at)


class SchedulerServicer(pb_grpc.SchedulerServicer):
    """Every call is authenticated first; what it may see or change is the auth rules'."""

    def __init__(self, service: SchedulerService, auth: Authenticator) -> None:
        self._s = service
        self._auth = auth

    def _who(self, context: grpc.ServicerContext) -> Principal:
        return self._auth.client(bearer(context.invocation_metadata()), peer_identity(context))

    def _readable(self, who: Principal, study_id: str) -> StudyRecord:
        with self._s.locked():
            study = self._s.orch.study(study_id)
        self._auth.require_read(who, study)
        return study

    def _study_pb(self, study_id: str) -> pb.Study:
        """A study's message as of the last batch (read under the service's lock, so never
        a state that a refused event is rolling back)."""
        with self._s.locked():
            return _study(self._s, self._s.orch.study(study_id), self._s.counts(study_id))

    def _readable_any(self, study_id: str) -> StudyRecord:
        """The study's record, read under the lock (its owner is checked by the caller)."""
        with self._s.locked():
            return self._s.orch.study(study_id)

    def _trial(self, who: Principal, trial: pb.Trial, study: StudyRecord) -> pb.Trial:
        if not self._auth.owns(who, study):
            trial.log_tail = ""  # shared results, never someone else's logs
        return trial

    @translated
    def SubmitStudy(self, request: pb.SubmitStudyRequest, context: grpc.ServicerContext
                    ) -> pb.Study:
        who = self._who(context)
        study = self._s.submit(request.space_yaml, request.source or "search space",
                               owner=who.name, admin=who.is_admin)
        return self._study_pb(study.id)

    @translated
    def GetStudy(self, request: pb.GetStudyRequest, context: grpc.ServicerContext) -> pb.Study:
        study = self._readable(self._who(context), request.study_id)
        return self._study_pb(study.id)

    @translated
    def ListStudies(self, request: pb.ListStudiesRequest, context: grpc.ServicerContext
                    ) -> pb.ListStudiesResponse:
        who = self._who(context)
        with self._s.locked():
            readable = [s for s in self._s.orch.studies() if self._auth.may_read(who, s)]
            return pb.ListStudiesResponse(studies=[_study(self._s, s, self._s.counts(s.id))
                                                   for s in readable])

    @translated
    def ListTrials(self, request: pb.ListTrialsRequest, context: grpc.ServicerContext
                   ) -> pb.ListTrialsResponse:
        who = self._who(context)
        study = self._readable(who, request.study_id)
        with self._s.locked():  # the records are immutable: converted outside the lock
            trials = self._s.orch.trials(request.study_id)
            last = self._s.orch.last_steps(request.study_id)
        objective = self._s.orch.space(request.study_id).settings.objective.metric
        return pb.ListTrialsResponse(trials=[
            self._trial(who, trial_to_pb(t, last.get(t.id), objective), study)
            for t in trials])

    @translated
    def GetHistory(self, request: pb.GetHistoryRequest, context: grpc.ServicerContext
                   ) -> pb.History:
        """Learning curves of one trial or a study's, in pages of HISTORY_PAGE steps,
        with the study's spans on the first page: readable by whoever reads the study."""
        who = self._who(context)
        study_id = request.study_id
        if request.trial_id:
            with self._s.locked():
                study_id = self._s.orch.trial(request.trial_id).study_id
        self._readable(who, study_id)
        after = (request.after_trial, int(request.after_step)) if request.after_trial \
            else ("", -1)
        with self._s.locked():
            steps = self._s.orch.history(study_id="" if request.trial_id else study_id,
                                         trial_id=request.trial_id, after=after,
                                         limit=HISTORY_PAGE + 1)
            spans = [] if request.after_trial else self._s.orch.spans(study_id)
        if request.trial_id:
            spans = [s for s in spans if s.trial_id == request.trial_id]
        reply = history_to_pb(steps[:HISTORY_PAGE], spans)
        reply.more = len(steps) > HISTORY_PAGE
        return reply

    @translated
    def GetTrial(self, request: pb.GetTrialRequest, context: grpc.ServicerContext) -> pb.Trial:
        who = self._who(context)
        with self._s.locked():
            trial = self._s.orch.trial(request.trial_id)
        study = self._readable(who, trial.study_id)
        return self._trial(who, trial_to_pb(trial), study)

    @translated
    def ExplainTrial(self, request: pb.GetTrialRequest, context: grpc.ServicerContext
                     ) -> pb.TrialExplanation:
        who = self._who(context)
        with self._s.locked():
            trial = self._s.orch.trial(request.trial_id)
        self._readable(who, trial.study_id)
        lines = self._s.explain(trial.id, others=who.is_admin)
        return pb.TrialExplanation(trial_id=trial.id, state=trial.state.value, lines=lines)

    def WatchStudy(self, request: pb.WatchStudyRequest, context: grpc.ServicerContext
                   ) -> Iterator[pb.StudyUpdate]:
        context.add_callback(self._s.watches.wake)  # a cancelled watch frees its thread at once
        try:
            who = self._who(context)
            self._readable(who, request.study_id)
            # Bounded per user: one user's open watches never shut out another working
            # from the same login node. Without authentication, per client host.
            holder = (f"user {who.name}" if who.via != "local" else
                      f"host {peer_host(context.peer())}")
            with self._s.watches.slot(holder):
                stream = self._s.watches.watch(request.study_id, request.min_interval_s,
                                       context.is_active)
                for snap in stream:
                    yield _update(self._s, snap)
        except HyperSackError as exc:
            context.abort(status_of(exc), str(exc))

    @translated
    def CancelStudy(self, request: pb.CancelStudyRequest, context: grpc.ServicerContext
                    ) -> pb.Study:
        self._auth.require_owner(self._who(context), self._readable_any(request.study_id),
                                 "cancelling")
        study = self._s.change_study(StudyCancelled(request.study_id))
        return self._study_pb(study.id)

    @translated
    def ExtendStudy(self, request: pb.ExtendStudyRequest, context: grpc.ServicerContext
                    ) -> pb.Study:
        self._auth.require_owner(self._who(context), self._readable_any(request.study_id),
                                 "extending")
        study = self._s.change_study(StudyExtended(request.study_id, int(request.trials)))
        return self._study_pb(study.id)

    @translated
    def AskTrials(self, request: pb.AskTrialsRequest, context: grpc.ServicerContext
                  ) -> pb.ListTrialsResponse:
        who = self._who(context)
        study = self._readable_any(request.study_id)
        self._auth.require_owner(who, study, "adding trials to")
        if len(request.params_json) > MAX_ASKED:
            raise InvalidInput(f"at most {MAX_ASKED} trials per call "
                               f"({len(request.params_json)} given)")
        params = []
        for i, text in enumerate(request.params_json):
            if len(text) > MAX_PARAMS_CHARS:
                raise InvalidInput(f"trial {i}: parameters longer than {MAX_PARAMS_CHARS} "
                                   "characters")
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise InvalidInput(f"trial {i}: parameters are not JSON: {exc}") from None
            params.append(value)
        trials = self._s.ask(study.id, params)
        return pb.ListTrialsResponse(trials=[self._trial(who, trial_to_pb(t), study)
                                             for t in trials])

    @translated
    def ListNodes(self, request: pb.ListNodesRequest, context: grpc.ServicerContext
                  ) -> pb.ListNodesResponse:
        self._who(context)
        return pb.ListNodesResponse(nodes=node_messages(self._s),
                                    sharing=sharing_messages(self._s))

    @translated
    def DrainNode(self, request: pb.DrainNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        self._auth.require_admin(self._who(context), f"draining {request.node[:80]!r}")
        self._s.drain(request.node)
        return next(n for n in node_messages(self._s) if n.name == request.node)

    @translated
    def UndrainNode(self, request: pb.DrainNodeRequest, context: grpc.ServicerContext
                    ) -> pb.Node:
        self._auth.require_admin(self._who(context), f"undraining {request.node[:80]!r}")
        self._s.drain(request.node, draining=False)
        return next(n for n in node_messages(self._s) if n.name == request.node)

    @translated
    def ListProfiles(self, request: pb.ListProfilesRequest, context: grpc.ServicerContext
                     ) -> pb.ListProfilesResponse:
        self._who(context)
        return pb.ListProfilesResponse(profiles=[
            profile_to_pb(p) for p in self._s.profiles(request.model, request.arch)])

    @translated
    def ImportProfiles(self, request: pb.ImportProfilesRequest, context: grpc.ServicerContext
                       ) -> pb.ImportProfilesResponse:
        self._auth.require_admin(self._who(context), "importing profiles")
        profiles = [profile_from_pb(msg, where=f"profiles.{i}", default_source="imported")
                    for i, msg in enumerate(request.profiles)]
        reject_repeats(profiles)
        imported, kept = self._s.import_profiles(profiles, request.replace)
        return pb.ImportProfilesResponse(imported=imported, kept=kept)

    @translated
    def ForgetProfiles(self, request: pb.ForgetProfilesRequest, context: grpc.ServicerContext
                       ) -> pb.ForgetProfilesResponse:
        self._auth.require_admin(self._who(context), "forgetting profiles")
        return pb.ForgetProfilesResponse(forgotten=self._s.forget(request.model, request.arch))

    @translated
    def WhoAmI(self, request: pb.WhoAmIRequest, context: grpc.ServicerContext) -> pb.User:
        who = self._who(context)
        return pb.User(name=who.name, role=who.role.value, via=who.via,
                       expires_at=who.expires_at)

    @translated
    def AddUser(self, request: pb.AddUserRequest, context: grpc.ServicerContext) -> pb.User:
        return _user_pb(self._auth.add_user(self._who(context), request.name, request.role))

    @translated
    def RemoveUser(self, request: pb.RemoveUserRequest, context: grpc.ServicerContext
                   ) -> pb.User:
        return _user_pb(self._auth.remove_user(self._who(context), request.name))

    @translated
    def ListUsers(self, request: pb.ListUsersRequest, context: grpc.ServicerContext
                  ) -> pb.ListUsersResponse:
        return pb.ListUsersResponse(users=[_user_pb(u)
                                           for u in self._auth.users(self._who(context))])

    @translated
    def CreateToken(self, request: pb.CreateTokenRequest, context: grpc.ServicerContext
                    ) -> pb.CreateTokenResponse:
        record, secret = self._auth.create_token(self._who(context), request.user,
                                                 request.label, request.ttl_s)
        return pb.CreateTokenResponse(token=_token_pb(record), secret=secret)

    @translated
    def ListTokens(self, request: pb.ListTokensRequest, context: grpc.ServicerContext
                   ) -> pb.ListTokensResponse:
        return pb.ListTokensResponse(tokens=[
            _token_pb(t) for t in self._auth.tokens(self._who(context), request.user)])

    @translated
    def RevokeToken(self, request: pb.RevokeTokenRequest, context: grpc.ServicerContext
                    ) -> pb.Token:
        return _token_pb(self._auth.revoke_token(self._who(context), request.id))


def peer_host(peer: str) -> str:
    """`ipv4:127.0.0.1:5000` -> `ipv4:127.0.0.1`: the client's host, its port dropped."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class AgentLinkServicer(pb_grpc.AgentLinkServicer):
    """One stream per agent: the first message registers, the rest are events."""

    def __init__(self, service: SchedulerService, auth: Authenticator, *, tls: bool,
                 pool: futures.Executor) -> None:
        self._s = service
        self._auth = auth
        self._tls = tls
        self._pool = pool  # for what takes the service's lock
        self._waker: Waker | None = None

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],
                      context: grpc.aio.ServicerContext[Any, Any]
                      ) -> AsyncIterator[pb.ServerMessage]:
        """Served on the event loop: what the agent sends goes to the service's inbox as
        it arrives, and what the service sends the agent is written as it is queued,
        without a thread for either (bridge.py)."""
        peer = peer_identity(context)
        try:
            # Before reading anything: a peer without a node certificate never holds a
            # stream open.
            self._auth.agent(peer, None, tls=self._tls)
        except HyperSackError as exc:
            log.warning("refused an agent from %s: %s", context.peer(), exc)
            await context.abort(status_of(exc), str(exc))
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        if first.WhichOneof("body") != "register":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the first message on the agent stream must be register")
        loop = asyncio.get_running_loop()
        try:
            # The certificate's node, and only it: a client certificate, another node's
            # certificate or none (on a TLS server) never makes an agent.
            self._auth.agent(peer, first.register.node, tls=self._tls)
            # The service's lock may be held by a decision: not on the loop.
            session = await loop.run_in_executor(self._pool, self._s.register, first.register)
        except HyperSackError as exc:
            if isinstance(exc, (Unauthenticated, PermissionDenied)):
                log.warning("refused an agent from %s: %s", context.peer(), exc)
            await context.abort(status_of(exc), str(exc))
        wake = asyncio.Event()
        # One wake-up of the loop per batch of messages, for all the streams the batch
        # writes to, not one per message: each costs the sending thread a write to the
        # loop's self-pipe.
        if self._waker is None:
            self._waker = Waker(loop)  # every stream is served on the one loop
            self._s.hold_wakes = self._waker.held
        session.on_send = partial(self._waker.call, wake.set)
        handler = asyncio.current_task()
        if handler is not None:  # cut the stream of an agent that does not read
            def cut(task: asyncio.Task[Any] = handler) -> None:
                loop.call_soon_threadsafe(task.cancel)

            session.on_overflow = cut
        reader = asyncio.create_task(self._read(session, request_iterator, wake))
        try:
            while True:
                wake.clear()
                for msg in session.drain():
                    if msg is None:
                        return
                    yield msg
                if reader.done():
                    return
                await wake.wait()
        finally:
            reader.cancel()
            session.on_send = None
            session.on_overflow = None
            try:
                self._pool.submit(self._s.disconnected, session)
            except RuntimeError:  # the pool is shut down: the server is stopping
                self._s.disconnected(session)

    async def _read(self, session: AgentSession, requests: AsyncIterator[pb.AgentMessage],
                    done: asyncio.Event) -> None:
        try:
            async for msg in requests:
                try:
                    self._s.agent_message(session, msg)
                except HyperSackError as exc:
                    # A bad message is refused; the stream and the server go on.
                    log.warning("agent %s: refused message: %s", session.node, exc)
        except (grpc.RpcError, asyncio.CancelledError):
            pass  # the agent went away, or the stream ended
        except Exception:
            log.exception("agent %s: stream failed", session.node)
        finally:
            done.set()
