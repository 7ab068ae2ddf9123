"""What the server's `/metrics` says, read from the service when Prometheus scrapes.

Names start with `hypersack_`. Series per study cover the studies that are active and
the latest `RECENT_STUDIES` others (a long-lived server keeps every study it ran; their
series would grow for ever); `hypersack_trials_all` counts every trial by state.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hypersack.core.types import StudyState, TrialState
from hypersack.wire.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from hypersack.server.service import SchedulerService

RECENT_STUDIES = 20


class LatencyHistograms:
    """The server's latency histograms, observed as the service works."""

    def __init__(self) -> None:
        # Not in the global registry: the collector yields their samples.
        def h(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=LATENCY_BUCKETS, registry=None)

        self.decision = h("hypersack_decision_seconds",
                          "Time of each policy run (one study's pending trials placed)")
        self.batch = h("hypersack_batch_seconds",
                       "Time of each batch of events, the service's lock held")
        self.exit = h("hypersack_exit_handled_seconds",
                      "From a trial's exit arriving to the launches it freed room for "
                      "being sent")
        self.loop_lag = h("hypersack_grpc_loop_lag_seconds",
                          "How late the gRPC event loop ran a timer set every 50 ms: "
                          "how long agents' messages wait there, both ways")
        self.gc_pause = h("hypersack_gc_pause_seconds",
                          "Each full collection of Python's cyclic garbage collector: "
                          "every thread of the server waits for it")
        # The same, the latest 100,000 (for the counters the server prints at exit).
        self.lags: collections.deque[float] = collections.deque(maxlen=100_000)
        self.gc_pauses: collections.deque[float] = collections.deque(maxlen=100_000)
        self._gc_began: float | None = None
        self._seen_decisions = 0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """A gc.callbacks hook: times the full collections (generation 2)."""
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            pause = time.perf_counter() - self._gc_began
            self._gc_began = None
            self.gc_pauses.append(pause)
            self.gc_pause.observe(pause)

    def observe_lag(self, lag_s: float) -> None:
        """From the gRPC loop (bridge.watch_lag)."""
        self.lags.append(lag_s)
        self.loop_lag.observe(lag_s)

    def observe_decisions(self, service: SchedulerService) -> None:
        """The policy runs since the last call (lock held)."""
        orch = service.orch
        new = orch.decision_count - self._seen_decisions
        self._seen_decisions = orch.decision_count
        if new <= 0:
            return
        for d in list(orch.decisions)[-new:]:
            self.decision.observe(d.solve_time_s)

    def collect(self) -> Iterator[Metric]:
        for h in (self.decision, self.batch, self.exit, self.loop_lag, self.gc_pause):
            yield from h.collect()


class ServerCollector(Collector):
    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        orch = service.orch
        with service.locked():
            now = service.since(0.0)
            studies = orch.studies()
            shown = [s for s in studies if s.state == StudyState.ACTIVE]
            shown += [s for s in studies if s.state != StudyState.ACTIVE][-RECENT_STUDIES:]
            # One pass over the trials: counts per study and in all, the running ones.
            by_study: dict[str, collections.Counter[TrialState]] = {}
            everything: collections.Counter[TrialState] = collections.Counter()
            running = []
            for s in studies:
                counts = by_study[s.id] = collections.Counter()
                active = s.state == StudyState.ACTIVE  # reservations: active studies'
                for t in orch.trials(s.id):
                    counts[t.state] += 1
                    if active and t.state == TrialState.RUNNING:
                        running.append(t)
                everything.update(counts)
            nodes = orch.nodes()
            load = orch.gpu_load()
            sessions = dict(service.sessions())
            last = {}
            for d in orch.decisions:
                last[d.study_id] = d
            stats = dict(service.stats)
            decisions, decision_s = orch.decision_count, orch.decision_time_s
            levels = orch.sharing.levels()
            idle_fits = orch.idle_fits()

        g = GaugeMetricFamily("hypersack_studies", "Studies by state", labels=["state"])
        per_state = collections.Counter(s.state for s in studies)
        for study_state in StudyState:
            g.add_metric([study_state.value], per_state.get(study_state, 0))
        yield g

        g = GaugeMetricFamily("hypersack_trials", "Trials by study and state (active "
                              f"studies and the latest {RECENT_STUDIES} others)",
                              labels=["study", "name", "owner", "state"])
        for s in shown:
            for state in TrialState:
                g.add_metric([s.id, s.name, s.owner, state.value],
                             by_study[s.id].get(state, 0))
        yield g

        g = GaugeMetricFamily("hypersack_trials_all", "Every trial the server keeps, by "
                              "state", labels=["state"])
        for state in TrialState:
            g.add_metric([state.value], everything.get(state, 0))
        yield g

        memory = GaugeMetricFamily("hypersack_trial_reserved_memory_mib", "GPU memory "
                                   "reserved for each running trial",
                                   labels=["study", "trial", "node", "gpu"])
        compute = GaugeMetricFamily("hypersack_trial_reserved_compute_pct", "GPU compute "
                                    "(percent of one GPU) reserved for each running trial",
                                    labels=["study", "trial", "node", "gpu"])
        for t in running:
            if t.demand is None or t.node is None:
                continue
            labels = [t.study_id, t.id, t.node, str(t.gpu_index)]
            memory.add_metric(labels, t.demand.memory_mib)
            compute.add_metric(labels, t.demand.compute_pct)
        yield memory
        yield compute

        up = GaugeMetricFamily("hypersack_node_up", "1 while the node's agent is "
                               "connected", labels=["node"])
        age = GaugeMetricFamily("hypersack_node_heartbeat_age_seconds", "Seconds since "
                                "the node's agent was last heard", labels=["node"])
        draining = GaugeMetricFamily("hypersack_node_draining", "1 while the node is "
                                     "drained", labels=["node"])
        for n in nodes:
            session = sessions.get(n.spec.name)
            up.add_metric([n.spec.name], int(session is not None and session.connected))
            draining.add_metric([n.spec.name], int(n.draining))
            if session is not None:
                age.add_metric([n.spec.name], max(0.0, now - session.last_seen))
        yield up
        yield age
        yield draining

        share = GaugeMetricFamily("hypersack_gpu_placed_compute_ratio", "Scaled compute "
                                  "given out on each GPU, 0..1 (its oversubscribed "
                                  "capacity is 1)", labels=["node", "gpu", "arch"])
        trials = GaugeMetricFamily("hypersack_gpu_trials", "Trials placed on each GPU",
                                   labels=["node", "gpu", "arch"])
        util = GaugeMetricFamily("hypersack_gpu_utilization_pct", "GPU utilization as "
                                 "the agent last reported it", labels=["node", "gpu", "arch"])
        used = GaugeMetricFamily("hypersack_gpu_memory_used_mib", "GPU memory in use as "
                                 "the agent last reported it", labels=["node", "gpu", "arch"])
        mps = GaugeMetricFamily("hypersack_gpu_mps", "1 while the GPU is shared through "
                                "its MPS daemon, 0 while time-sliced",
                                labels=["node", "gpu", "arch"])
        restarts = GaugeMetricFamily("hypersack_gpu_mps_restarts", "Restarts of the GPU's "
                                     "MPS daemon", labels=["node", "gpu", "arch"])
        for n in nodes:
            session = sessions.get(n.spec.name)
            for gpu in n.spec.gpus:
                labels = [n.spec.name, str(gpu.index), gpu.arch]
                count, ratio = load.get((n.spec.name, gpu.index), (0, 0.0))
                share.add_metric(labels, ratio)
                trials.add_metric(labels, count)
                reported = session.gpu_state.get(gpu.index) if session is not None else None
                if reported is not None:
                    util.add_metric(labels, reported.utilization_pct)
                    used.add_metric(labels, reported.memory_used_mib)
                    mps.add_metric(labels, int(reported.sharing == "mps"))
                    restarts.add_metric(labels, reported.mps_restarts)
        yield from (share, trials, util, used, mps, restarts)

        g = GaugeMetricFamily("hypersack_gpus_idle_while_trials_fit", "GPUs holding "
                              "nothing while a waiting trial would fit them now: held "
                              "back by a study's share, a user's quota, or its study's "
                              "wait for predict's choice (else a decision would have "
                              "placed it)")
        g.add_metric([], len(idle_fits))
        yield g

        in_force = GaugeMetricFamily("hypersack_oversubscription_ratio", "The architecture's "
                                  "ratio in force (learned, or configured)", labels=["arch"])
        configured = GaugeMetricFamily("hypersack_oversubscription_ratio_configured", "The "
                                       "architecture's configured ratio", labels=["arch"])
        samples = GaugeMetricFamily("hypersack_oversubscription_samples", "Slowdown samples "
                                    "behind the learned ratio (0 when learning is off)",
                                    labels=["arch"])
        moves = CounterMetricFamily("hypersack_oversubscription_moves", "Times the learned "
                                    "ratio moved", labels=["arch"])
        fitted = GaugeMetricFamily("hypersack_oversubscription_fit", "The learned slowdown "
                                   "model: contention (per extra trial), saturation_pct, "
                                   "and queued (the share of an iteration that queues)",
                                   labels=["arch", "parameter"])
        by_workload = GaugeMetricFamily(
            "hypersack_oversubscription_workload_fit", "A workload's own learned slowdown "
            "model (where it has samples enough): samples, contention, saturation_pct (0: "
            "none believed) and queued", labels=["arch", "workload", "parameter"])
        for lv in levels:
            for w in lv.workloads:
                for name in ("samples", "contention", "saturation_pct", "queued"):
                    by_workload.add_metric([lv.arch, w.workload, name], getattr(w, name))
            in_force.add_metric([lv.arch], lv.ratio)
            configured.add_metric([lv.arch], lv.configured)
            samples.add_metric([lv.arch], lv.samples)
            moves.add_metric([lv.arch], lv.moves)
            if lv.saturation_pct:
                fitted.add_metric([lv.arch, "contention"], lv.contention)
                fitted.add_metric([lv.arch, "saturation_pct"], lv.saturation_pct)
                fitted.add_metric([lv.arch, "queued"], lv.queued)
        yield from (in_force, configured, samples, moves, fitted, by_workload)

        yield CounterMetricFamily("hypersack_decisions", "Policy runs", value=decisions)
        yield CounterMetricFamily("hypersack_decision_solve_seconds", "Time spent in "
                                  "policies", value=decision_s)
        objective = GaugeMetricFamily("hypersack_last_decision_objective", "Work the "
                                      "study's latest policy run placed (compute units)",
                                      labels=["study", "policy"])
        bound = GaugeMetricFamily("hypersack_last_decision_bound", "A proven upper bound "
                                  "on that objective, where the policy knows one",
                                  labels=["study", "policy"])
        placed = GaugeMetricFamily("hypersack_last_decision_placed_ratio", "Share of the "
                                   "pending trials the study's latest policy run placed",
                                   labels=["study", "policy"])
        for d in last.values():
            labels = [d.study_id, d.policy]
            objective.add_metric(labels, d.plan.objective)
            if d.plan.bound is not None:
                bound.add_metric(labels, d.plan.bound)
            placed.add_metric(labels, d.placed / d.items if d.items else 1.0)
        yield from (objective, bound, placed)

        for key, doc in (("events", "Events applied"), ("heartbeats", "Heartbeats read"),
                         ("stale", "Events ignored as stale"),
                         ("refused", "Events refused (and undone)"),
                         ("batches", "Batches of events"),
                         ("failed_batches", "Batches undone because the store failed"),
                         ("profile_jobs", "Profile runs sent to agents")):
            yield CounterMetricFamily(f"hypersack_{key}", doc, value=stats.get(key, 0))
        yield GaugeMetricFamily("hypersack_agents_connected", "Agents connected now",
                                value=sum(s.connected for s in sessions.values()))
        yield from service.histograms.collect()
        yield GaugeMetricFamily("hypersack_scrape_timestamp_seconds", "When this scrape "
                                "was answered (Unix time)", value=time.time())

