"""The orchestrator's queries: what the server, the CLI and the tests read of its state.

Read-only: nothing here changes the state or the store. A mixin of `Orchestrator`
(orchestrator.py), which keeps the runtime (events, batches and their undo, the decision
cycle); the attributes it reads are the modules the orchestrator builds over the state.
"""

from __future__ import annotations

from typing import Any

from hypersack.core.errors import NotFound
from hypersack.core.types import (
    HistoryStep,
    NodeRecord,
    Profile,
    Span,
    StudyRecord,
    StudyState,
    TrialRecord,
    TrialState,
)
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.explain import Explainer
from hypersack.orchestrator.foresight import Choice
from hypersack.orchestrator.journal import JournaledLog
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.pruning import Pruning
from hypersack.orchestrator.state import CoreState, Decision
from hypersack.policies.base import Need, compute_capacity
from hypersack.sampler.planning import Slot


class Queries:
    """Reads of the orchestrator's state and store."""

    s: CoreState
    book: Book
    pruning: Pruning
    profiling: Profiling
    explainer: Explainer

    @property
    def decisions(self) -> JournaledLog[Decision]:
        """The recent policy runs, with how many there were and their solve time."""
        return self.s.decisions

    @property
    def decision_count(self) -> int:
        return self.s.decisions.count

    def rule_choice(self, study_id: str) -> Choice | None:
        """The rule chosen for a study under `predict`, and why (None: not yet)."""
        return self.explainer.decider.rules.chosen.get(study_id)

    def history(self, *, study_id: str = "", trial_id: str = "",
                after: tuple[str, int] = ("", -1), limit: int | None = None
                ) -> list[HistoryStep]:
        """Learning curves, as the store keeps them (see Curves)."""
        return self.s.store.history(study_id=study_id, trial_id=trial_id, after=after,
                                    limit=limit)

    def spans(self, study_id: str) -> list[Span]:
        return self.s.store.spans(study_id)

    def last_steps(self, study_id: str) -> dict[str, HistoryStep]:
        return self.s.store.last_steps(study_id)

    @property
    def decision_time_s(self) -> float:
        return self.s.decisions.total

    def studies(self) -> list[StudyRecord]:
        return self.book.studies()

    def study(self, study_id: str) -> StudyRecord:
        return self.book.study(study_id)

    def space(self, study_id: str) -> SearchSpace:
        self.study(study_id)
        return self.s.spaces[study_id]

    def trials(self, study_id: str | None = None) -> list[TrialRecord]:
        if study_id is None:
            return [self.s.trials[t] for s in self.studies() for t in self.s.by_study[s.id]]
        self.study(study_id)
        return [self.s.trials[t] for t in self.s.by_study[study_id]]

    def trial(self, trial_id: str) -> TrialRecord:
        return self.book.trial(trial_id)

    def counts(self, study_id: str) -> dict[TrialState, int]:
        """How many of the study's trials are in each state (every state, zeros too)."""
        self.study(study_id)
        return {s: self.s.state_counts.get((study_id, s), 0) for s in TrialState}

    def has_node(self, name: str) -> bool:
        return name in self.s.cluster

    def nodes(self) -> list[NodeRecord]:
        return [n.record() for n in self.s.cluster]

    def profiles(self) -> list[Profile]:
        return list(self.s.profiles.values())

    def gpu_trials(self, node: str, gpu_index: int) -> frozenset[str]:
        """The trials a GPU holds."""
        gpu = self.s.cluster.gpu(node, gpu_index)
        if gpu is None:
            raise NotFound(f"no GPU {node}:{gpu_index}")
        return frozenset(gpu.trials)

    def decision_inputs(self) -> dict[str, Any]:
        """What the next decision reads, comparable between two orchestrators (a live one
        and one rebuilt from its store): each active study's waiting trials in order with
        their needs, its pending counts per workload group, and the cluster's free
        capacity as the policies see it."""
        open_nodes = self.s.cluster.open_nodes()
        archs = self.s.cluster.archs_of(open_nodes)
        key_of = {number: key for key, number in self.s.key_numbers.items()}
        out: dict[str, Any] = {"view": self.s.cluster.view(open_nodes, {})}
        for s in self.studies():
            if s.state != StudyState.ACTIVE:
                continue
            pending = [(t.id, t.state, sorted(self.profiling.needs(t, archs).items()))
                       for t in self.book.pending_of(s.id)]
            counts = {(key_of[number].label(), override, segment): n
                      for (number, override, segment), n in
                      (self.s.pending_groups.get(s.id) or {}).items()}
            out[s.id] = (pending, counts)
        return out

    def gpu_load(self) -> dict[tuple[str, int], tuple[int, float]]:
        """(node, GPU index) -> (trials running, scaled-compute share used, 0..1)."""
        return self.s.cluster.gpu_load()

    def held(self, node: str, gpu_index: int) -> tuple[int, int, int]:
        """What a GPU has given out: compute units, memory MiB and trials."""
        gpu = self.s.cluster.gpu(node, gpu_index)
        if gpu is None:
            raise NotFound(f"no GPU {node}:{gpu_index}")
        return gpu.used_compute, gpu.used_memory, len(gpu.trials)

    def explain(self, trial_id: str, others: bool = True) -> list[str]:
        """Why a trial is where it is, for people (`hypersack why`)."""
        return self.explainer.explain(trial_id, others)

    def known_slots(self, model: str, arch: str = "") -> list[Slot]:
        """What the history holds of a workload (profiles and failures), for forgetting."""
        return self.profiling.known_slots(model, arch)

    def wake_at(self) -> float | None:
        """The next time a tick has something to do besides checking heartbeats (a held
        promotion resuming, a study's wait for its rule ending)."""
        times = [t for t in (self.pruning.wake_at(), self.explainer.decider.rules.wake_at())
                 if t is not None]
        return min(times, default=None)

    def idle_fits(self) -> list[tuple[str, int, str]]:
        """GPUs that hold nothing while a waiting trial would fit them now: (node, GPU
        index, the first such trial in its study's order) per GPU. A decision leaves
        none (it places what fits), unless a study's share or a user's quota holds the
        trial back on purpose: those GPUs are listed too. The simulator adds up this
        time after every event (SimResult.idle_fit_s); /metrics counts the GPUs."""
        active = [s for s in self.book.studies()
                  if s.state == StudyState.ACTIVE and self.book.has_pending(s.id)]
        if not active:
            return []  # nothing waits: a study's tail costs no walk over the GPUs
        nodes = self.s.cluster.open_nodes()
        idle = [(n, g) for n in nodes for g in n.gpus.values()
                if not g.trials and g.profiling is None and g.reserved_for is None]
        if not idle:
            return []
        archs = self.s.cluster.open_archs()
        waiting: list[tuple[TrialRecord, dict[str, Need], set[str], dict[str, float]]] = []
        for study in active:
            seen: set[object] = set()
            allowed = {n.spec.name for n in self.s.nodes_for(study.id, nodes)}
            ratios = self.s.spaces[study.id].settings.oversubscription
            # The study's kinds (workload, memory correction) among its pending groups:
            # the walk stops once each has its first trial, not at the 20,000th.
            kinds = {(number, override) for number, override, _ in
                     self.s.pending_groups.get(study.id) or {}}
            for t in self.book.pending_in_order(study.id):
                kind = (self.book.key_number(t), t.memory_override_mib)
                if kind not in seen:
                    seen.add(kind)
                    waiting.append((t, self.profiling.needs(t, archs), allowed, ratios))
                    if len(seen) >= len(kinds):
                        break
        out = []
        # An empty GPU's fit depends only on these: a thousand idle GPUs of a few shapes
        # (a study no GPU can hold, say) cost a few checks, not a thousand times its kinds.
        known: dict[tuple[str, int, int, int, int, float, str], str | None] = {}
        for node, gpu in idle:
            shape = (gpu.arch, gpu.memory_mib, gpu.used_compute, gpu.used_memory,
                     node.used_cores, node.spec.cores, node.spec.owner)
            if shape not in known:
                known[shape] = None
                for t, needs, allowed, ratios in waiting:
                    need = needs.get(gpu.arch)
                    if need is None or node.spec.name not in allowed:
                        continue
                    cap = compute_capacity(self.s.config.ratio(gpu.arch, ratios))
                    if not self.s.cluster.shortfalls(node, gpu, need, cap):
                        known[shape] = t.id
                        break
            found = known[shape]
            if found is not None:
                out.append((node.spec.name, gpu.spec_index, found))
        return out
