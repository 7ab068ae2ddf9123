"""A discrete-event simulation: the real Orchestrator, a virtual clock, simulated agents.

The simulator is wiring, not a mode of the core: it feeds the orchestrator the events a
cluster would send (nodes joining, trials finishing, profiles measured, nodes lost) at
the virtual times the interference model gives, and carries out its commands.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hypersack.core.clock import ManualClock
from hypersack.core.types import (
    ClusterSpec,
    Profile,
    StudyState,
    TrialState,
    WorkloadKey,
    ceil_units,
)
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.commands import (
    Command,
    KillTrial,
    LaunchGroup,
    LaunchTrial,
    ProfileWorkload,
    launched,
)
from hypersack.orchestrator.events import (
    Event,
    NodeJoined,
    NodeLost,
    ProfileFailed,
    ProfileMeasured,
    StudySubmitted,
    Tick,
    TrialFinished,
    TrialProgress,
    Wake,
)
from hypersack.orchestrator.fusion import fused_key
from hypersack.orchestrator.orchestrator import Orchestrator, OrchestratorConfig
from hypersack.orchestrator.shares import share_of
from hypersack.orchestrator.sharing import RatioLearner
from hypersack.policies.base import COMPUTE_SCALE, compute_capacity
from hypersack.sim.fused import fused_estimate
from hypersack.sim.interference import Interference, SharedTrial, reports, running_mix
from hypersack.sim.learning import Learning
from hypersack.sim.results import Segment, SimResult
from hypersack.store.base import Store
from hypersack.store.memory import MemoryStore

log = logging.getLogger(__name__)

_EPS = 1e-9
PROFILE_SETUP_S = 5.0  # process start and model build before the first profiled iteration


@dataclass
class _Running:
    trial_id: str
    model: str
    node: str
    gpu_index: int
    work_left_s: float
    shared: SharedTrial
    compute_pct: float
    start_s: float
    rate: float = 1.0
    members: list[str] = field(default_factory=list)  # a fused group's trials
    study_id: str = ""
    # With a learning curve: the trial's parameters, the epoch its work reached, the
    # epoch this attempt ends at (its rung, or its last) and the work of one epoch.
    params: dict[str, dict[str, object]] = field(default_factory=dict)  # per member
    epoch: int = 0
    end_epoch: float = 0.0
    epoch_work_s: float = 0.0

    def next_epoch_at(self, now: float) -> float:
        """When its work crosses the next whole epoch (or ends)."""
        after = max(0.0, self.end_epoch - self.epoch - 1) * self.epoch_work_s
        return now + max(0.0, self.work_left_s - after) / self.rate


class Simulation(Learning):
    """Run one study (and any `more` studies, each (time, space, owner), submitted at
    their times) to the end on a simulated cluster.

    `curve(params, epoch)`: the objective a trial reports after each epoch. With one,
    every trial reports it at each whole epoch (so a pruner ranks it), an attempt ends at
    the epoch its launch says to stop at, and a finished trial's objective is its last
    value; without one, trials report only their end, with the run time as objective.

    `truth` is what the workloads really need (the simulated hardware's behaviour);
    `history` is what the scheduler knows beforehand (None: the same as truth; an empty
    list: every workload is profiled first). `faults` are (time, event) pairs injected
    at virtual times, such as NodeLost or NodeJoined.
    """

    def __init__(self, space: SearchSpace, cluster: ClusterSpec, truth: Sequence[Profile], *,
                 config: OrchestratorConfig | None = None,
                 history: Sequence[Profile] | None = None,
                 interference: Interference | None = None,
                 store: Store | None = None,
                 faults: Sequence[tuple[float, Event]] = (),
                 max_time_s: float = 1e9,
                 on_event: Callable[[float, Event], None] | None = None,
                 more: Sequence[tuple[float, SearchSpace, str]] = (),
                 curve: Callable[[dict[str, object], int], float] | None = None,
                 learner: RatioLearner | None = None, sample_every_s: float = 30.0) -> None:
        self.space = space
        self.more = list(more)
        self.cluster = cluster
        self.truth = {(p.key, p.arch): p for p in truth}
        # No time bound on asking samplers: a simulated run is the same on any machine.
        self.config = replace(config or OrchestratorConfig(), ask_budget_s=None, history=False)
        self.interference = interference or Interference()
        self.store = store or MemoryStore()
        for p in truth if history is None else history:
            self.store.put_profile(p)
        self.clock = ManualClock(0.0)
        self.orchestrator = Orchestrator(self.store, self.clock, self.config)
        self.faults = list(faults)
        self.max_time_s = max_time_s
        self.on_event = on_event
        self.curve = curve
        # A learned sharing level: each GPU's slowdown, as its trials would report it,
        # sampled every `sample_every_s` of virtual time; the ratios it moves apply to
        # the next decisions. `ratio_moves`: (time, architecture, new ratio).
        self.learner = learner
        if learner is not None:
            # Its foresight simulates this study (the first), as the server's simulates
            # the one with the most trials pending.
            learner.weigh = self._weigh if self.config.learn_foresight else None
        self._believed = list(truth if history is None else history)
        self.sample_every_s = sample_every_s
        self._sampled: dict[tuple[str, int], float] = {}
        self.ratio_moves: list[tuple[float, str, float]] = []
        self._arch = {(n.name, g.index): g.arch for n in cluster.nodes for g in n.gpus}
        self._cores = {n.name: n.cores for n in cluster.nodes}
        for _, ev in self.faults:
            if isinstance(ev, NodeJoined):
                self._cores[ev.node.name] = ev.node.cores
                for g in ev.node.gpus:
                    self._arch[ev.node.name, g.index] = g.arch

    def run(self) -> SimResult:
        seq = itertools.count()
        queue: list[tuple[float, int, Event]] = []
        for node in self.cluster.nodes:
            heapq.heappush(queue, (0.0, next(seq), NodeJoined(node)))
        heapq.heappush(queue, (0.0, next(seq), StudySubmitted(self.space)))
        for at, space, owner in self.more:
            heapq.heappush(queue, (at, next(seq), StudySubmitted(space, owner)))
        for at, ev in self.faults:
            heapq.heappush(queue, (at, next(seq), ev))
        submissions = 1 + len(self.more)
        running: dict[str, _Running] = {}
        timeline: list[Segment] = []
        study_id: str | None = None
        studies: list[str] = []
        shares: dict[str, list[tuple[float, float]]] = {}
        submitted: dict[str, float] = {}
        first_launch: dict[str, float] = {}
        last_launch: dict[str, float] = {}
        ended: dict[str, float] = {}
        occupancy_area = busy_area = 0.0
        series: list[tuple[float, float]] = []  # (from time, occupancy), a step function
        profile_jobs = 0
        live_gpus: set[tuple[str, int]] = set()
        gpu_area = 0.0  # GPU-seconds that existed (for means under elasticity)
        now = 0.0
        ticks: set[float] = set()
        # GPUs holding nothing while a waiting trial fits them, after the latest event,
        # and how many events left any.
        idle_fit: list[tuple[str, int, str]] = []
        idle_fit_events = 0
        idle_fit_area = 0.0

        def apply(commands: list[Command]) -> None:
            nonlocal profile_jobs
            for cmd in commands:
                if isinstance(cmd, (LaunchTrial, LaunchGroup)):
                    arch = self._arch[cmd.node, cmd.gpu_index]
                    true = self._true(cmd.key, arch)
                    if true is None:
                        raise RuntimeError(f"simulator has no true profile for "
                                           f"{cmd.key.label()} on {arch}")
                    if isinstance(cmd, LaunchGroup):
                        job, members = cmd.group_id, [m.trial_id for m in cmd.members]
                        epochs, sid = cmd.members[0].epochs, cmd.members[0].study_id
                    else:
                        job, members, epochs = cmd.trial_id, [cmd.trial_id], cmd.epochs
                        sid = cmd.study_id
                    first_launch.setdefault(sid, now)
                    last_launch[sid] = now
                    r = running[job] = _Running(
                        job, cmd.key.model, cmd.node, cmd.gpu_index, true.run_time_s(epochs),
                        SharedTrial(true.demand.compute_pct, true.demand.cores,
                                    true.data_fraction),
                        cmd.demand.compute_pct, now, members=members, study_id=sid)
                    if self.curve is not None:
                        # From its checkpoint to its rung (or its end); a fused group's
                        # members are one rung's, each on its own curve.
                        first = cmd.members[0] if isinstance(cmd, LaunchGroup) else cmd
                        end = first.stop_at or first.epochs
                        segment = max(end - first.done_epochs, 1e-9)
                        r.work_left_s = true.run_time_s(segment)
                        r.params = {m.trial_id: dict(m.params) for m in launched([cmd])}
                        r.epoch, r.end_epoch = int(first.done_epochs), end
                        r.epoch_work_s = r.work_left_s / segment
                elif isinstance(cmd, KillTrial):
                    # A member of a fused group stops alone; the group goes on.
                    found = next((j for j, r in running.items()
                                  if cmd.trial_id in r.members), None)
                    if found is None:
                        continue
                    r = running[found]
                    r.members.remove(cmd.trial_id)
                    if not r.members:
                        del running[found]
                        timeline.append(Segment(r.trial_id, r.model, r.node, r.gpu_index,
                                                r.start_s, now, "KILLED"))
                elif isinstance(cmd, ProfileWorkload):
                    profile_jobs += 1
                    true = self._true(cmd.key, cmd.arch)
                    iters = cmd.iterations + cmd.warmup
                    done = now + PROFILE_SETUP_S + iters * (true.iter_time_s if true else 1.0)
                    ev: Event
                    if true is None:
                        ev = ProfileFailed(cmd.key, cmd.arch, cmd.node,
                                           "crashed: the workload does not run on this GPU")
                    else:
                        ev = ProfileMeasured(true.model_copy(update={"source": "measured"}),
                                             cmd.node)
                    timeline.append(Segment(f"profile:{cmd.key.label()}", cmd.key.model,
                                            cmd.node, cmd.gpu_index, now, done, "PROFILE"))
                    heapq.heappush(queue, (done, next(seq), ev))

        def handle(ev: Event) -> None:
            nonlocal study_id, submissions, idle_fit, idle_fit_events
            if self.on_event is not None:
                self.on_event(now, ev)
            if isinstance(ev, NodeLost):
                for tid in [t for t, r in running.items() if r.node == ev.node]:
                    r = running.pop(tid)
                    timeline.append(Segment(r.trial_id, r.model, r.node, r.gpu_index,
                                            r.start_s, now, "LOST", len(r.members)))
                for key in [k for k in live_gpus if k[0] == ev.node]:
                    live_gpus.discard(key)
            if isinstance(ev, NodeJoined):
                live_gpus.update((ev.node.name, g.index) for g in ev.node.gpus)
            if isinstance(ev, (ProfileMeasured, ProfileFailed)) and ev.node not in {
                    n for n, _ in live_gpus}:
                return  # the node that profiled is gone; the orchestrator asks again
            if isinstance(ev, StudySubmitted) and self.learner is not None:
                self._arriving(ev, self._running_mix(running), now)
            before = len(self.orchestrator.studies())
            apply(self.orchestrator.handle(ev))
            idle_fit = self.orchestrator.idle_fits()
            idle_fit_events += bool(idle_fit)
            wake = self.orchestrator.wake_at()
            if wake is not None and wake not in ticks:
                # Held promotions resume at a tick: the simulated server ticks then.
                ticks.add(wake)
                heapq.heappush(queue, (max(wake, now), next(seq), Wake()))
            if isinstance(ev, StudySubmitted):
                if len(self.orchestrator.studies()) == before:
                    submissions -= 1  # refused
                    return
                sid = self.orchestrator.studies()[-1].id
                study_id = study_id or sid
                studies.append(sid)
                submitted[sid] = now
                shares[sid] = [(now, 0.0)]
                if sid == study_id and self._arrived(self._running_mix(running), now):
                    # As the server's learner reconsiders a study that arrives, after
                    # the batch that placed its first trials; the next tick packs on.
                    self.orchestrator.s.decide_again = True
                    heapq.heappush(queue, (now, next(seq), Tick()))

        while True:
            for sid in studies:
                if sid not in ended and not self._active(sid):
                    ended[sid] = now
            if len(studies) == submissions and len(ended) == submissions:
                break
            self._update_rates(running, now)
            finish_at = {t: r.next_epoch_at(now) if r.end_epoch else now + r.work_left_s / r.rate
                         for t, r in running.items()}
            next_finish = min(finish_at.values(), default=float("inf"))
            next_event = queue[0][0] if queue else float("inf")
            nxt = min(next_finish, next_event)
            if nxt == float("inf") or nxt > self.max_time_s:
                break
            dt = nxt - now
            if dt > 0:
                occupancy = self._occupancy(running, live_gpus)
                occupancy_area += dt * occupancy
                mean = occupancy / len(live_gpus) if live_gpus else 0.0
                if not series or series[-1][1] != mean:
                    series.append((now, mean))
                if submissions > 1:
                    held = self._held(running, live_gpus)
                    for sid in studies:
                        share = held.get(sid, 0.0) / len(live_gpus) if live_gpus else 0.0
                        if shares[sid][-1][1] != share:
                            shares[sid].append((now, share))
                busy = {(r.node, r.gpu_index) for r in running.values()}
                busy_area += dt * len(busy)
                idle_fit_area += dt * len(idle_fit)
                gpu_area += dt * len(live_gpus)
                for r in running.values():
                    r.work_left_s -= r.rate * dt
            now = nxt
            self.clock.set(now)
            if next_finish <= next_event:
                done = sorted(t for t, at in finish_at.items() if at <= nxt + _EPS * max(1.0, nxt))
                for tid in done:
                    if tid not in running:
                        continue  # killed by the report of a trial before it
                    if running[tid].end_epoch:
                        self._epoch(running, tid, now, handle, timeline)
                        continue
                    r = running.pop(tid)
                    timeline.append(Segment(r.trial_id, r.model, r.node, r.gpu_index,
                                            r.start_s, now, "COMPLETED", len(r.members)))
                    # The simulated run time is the objective: no metric is missing.
                    for member in r.members:
                        handle(TrialFinished(member, r.node, {"sim_time_s": now - r.start_s},
                                             objective=now - r.start_s))
            else:
                _, _, ev = heapq.heappop(queue)
                handle(ev)

        trials = [t for sid in studies for t in self.orchestrator.trials(sid)]
        stuck = any(self._active(sid) for sid in studies)
        gpus = sorted({(n.name, g.index, g.arch) for n in self.cluster.nodes for g in n.gpus})
        return SimResult(
            makespan_s=now,
            completed=sum(t.state == TrialState.COMPLETED for t in trials),
            failed=sum(t.state == TrialState.FAILED for t in trials),
            trials=len(trials),
            launches=sum(t.launches for t in trials),
            mean_occupancy=occupancy_area / gpu_area if gpu_area else 0.0,
            mean_busy=busy_area / gpu_area if gpu_area else 0.0,
            decisions=self.orchestrator.decision_count,
            decision_time_s=self.orchestrator.decision_time_s,
            profile_jobs=profile_jobs,
            gpus=gpus,
            occupancy=series,
            timeline=timeline,
            stuck=stuck,
            shares=shares if submissions > 1 else {},
            submitted_s=submitted,
            first_launch_s=first_launch,
            last_launch_s=last_launch,
            ended_s=ended,
            idle_fit_s=idle_fit_area,
            idle_fit_events=idle_fit_events,
            rules={sid: c.describe() for sid in studies
                   if (c := self.orchestrator.rule_choice(sid)) is not None},
        )

    def _epoch(self, running: dict[str, _Running], tid: str, now: float,
               handle: Callable[[Event], None], timeline: list[Segment]) -> None:
        """A trial with a learning curve ended an epoch: it reports the curve's value,
        and its attempt ends there if that is its rung or its last epoch."""
        assert self.curve is not None
        r = running[tid]
        r.epoch += 1
        r.work_left_s = max(0.0, r.end_epoch - r.epoch) * r.epoch_work_s
        reported: dict[str, tuple[dict[str, float], float]] = {}
        for member in list(r.members):
            if member not in r.members:
                continue  # killed by an earlier member's report
            value = self.curve(r.params[member], r.epoch)
            metrics = {self.space.settings.objective.metric: value, "epoch": float(r.epoch)}
            reported[member] = (metrics, value)
            handle(TrialProgress(member, r.node, r.epoch, metrics))
        if tid not in running or r.epoch < r.end_epoch - 1e-9:
            return  # every member killed (pruned; its segment is the kill's), or goes on
        del running[tid]
        timeline.append(Segment(r.trial_id, r.model, r.node, r.gpu_index, r.start_s, now,
                                "COMPLETED", len(r.members)))
        for member in list(r.members):
            metrics, value = reported[member]
            handle(TrialFinished(member, r.node, metrics, objective=value))

    def _true(self, key: WorkloadKey, arch: str) -> Profile | None:
        """What a workload really needs; a fused width the truth lacks is estimated from
        the workload alone (`sim.fused`)."""
        true = self.truth.get((key, arch))
        if true is None and key.fusion_width > 1:
            single = self.truth.get((fused_key(key, 1), arch))
            if single is not None:
                true = self.truth[key, arch] = fused_estimate(single, key.fusion_width)
        return true

    def _running_mix(self, running: dict[str, _Running]) -> dict[str, dict[str, float]]:
        """Per architecture, the trials running there, by workload."""
        return running_mix([(self._arch[r.node, r.gpu_index], [r.model])
                            for r in running.values()])

    def _active(self, study_id: str) -> bool:
        return self.orchestrator.study(study_id).state == StudyState.ACTIVE

    def _update_rates(self, running: dict[str, _Running], now: float) -> None:
        by_gpu: dict[tuple[str, int], list[_Running]] = {}
        by_node: dict[str, list[SharedTrial]] = {}
        for r in running.values():
            by_gpu.setdefault((r.node, r.gpu_index), []).append(r)
            by_node.setdefault(r.node, []).append(r.shared)
        cpu = {n: self.interference.cpu_slowdown(self._cores[n], ts) for n, ts in by_node.items()}
        mixes = running_mix([(self._arch[gpu], [r.model for r in rs])
                             for gpu, rs in by_gpu.items()]) if self.learner else {}
        for (node, idx), rs in by_gpu.items():
            arch = self._arch[node, idx]
            shared = [r.shared for r in rs]
            for r, slow in zip(rs, self.interference.gpu_slowdowns(
                    arch, shared, [r.model for r in rs]), strict=True):
                r.rate = self.interference.rate(r.shared, slow, cpu[node])
            if self.learner is not None and \
                    now - self._sampled.get((node, idx), -math.inf) >= self.sample_every_s:
                self._sampled[node, idx] = now
                load = sum(r.shared.compute_pct for r in rs)
                for model, seen in reports([r.model for r in rs], [r.rate for r in rs]):
                    moved = self.learner.observe(arch, load, len(rs), seen, model,
                                                 mixes[arch])
                    if moved is not None:
                        self._moved(now, {arch: moved})

    def _held(self, running: dict[str, _Running], live: set[tuple[str, int]]
              ) -> dict[str, float]:
        """Each study's GPU-equivalents of scaled compute (at the server's ratios) held
        on live GPUs: the unit fair share counts in."""
        out: dict[str, float] = {}
        for r in running.values():
            if (r.node, r.gpu_index) in live:
                cap = compute_capacity(self.config.ratio(self._arch[r.node, r.gpu_index], {}))
                out[r.study_id] = out.get(r.study_id, 0.0) + share_of(
                    ceil_units(r.compute_pct, COMPUTE_SCALE), cap)
        return out

    def _occupancy(self, running: dict[str, _Running], live: set[tuple[str, int]]) -> float:
        """Sum over live GPUs of the scaled-compute share in use."""
        used: dict[tuple[str, int], float] = {}
        for r in running.values():
            used[r.node, r.gpu_index] = used.get((r.node, r.gpu_index), 0.0) + r.compute_pct
        total = 0.0
        for key, pct in used.items():
            if key in live:
                cap = 100.0 * self.config.ratio(self._arch[key],
                                                self.space.settings.oversubscription)
                total += min(1.0, pct / cap)
        return total


def baseline_config(config: OrchestratorConfig) -> OrchestratorConfig:
    """The same settings, one trial per GPU: what the paper compares against."""
    from dataclasses import replace

    return replace(config, exclusive=True)
