"""Why a trial is where it is, for people (`hypersack why`). Reads, changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from hypersack.core.types import (
    StudyState,
    TrialRecord,
    TrialState,
)
from hypersack.orchestrator import shares
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.cluster import (
    COMPUTE,
    CORES,
    DRAINING,
    EXCLUSIVE,
    MEMORY,
    PROFILING,
    Node,
)
from hypersack.orchestrator.decide import Decider
from hypersack.orchestrator.learned import LearnedSharing
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.state import CoreState
from hypersack.policies.base import (
    COMPUTE_SCALE,
    CORE_SCALE,
    Need,
    compute_capacity,
    core_units,
)

log = logging.getLogger(__name__)

MAX_EXPLAINED_GPUS = 64  # `hypersack why` lists at most this many GPUs


class Explainer:
    def __init__(self, s: CoreState, book: Book, profiling: Profiling, decider: Decider,
                 sharing: LearnedSharing) -> None:
        self.s = s
        self.sharing = sharing
        self.book = book
        self.profiling = profiling
        self.decider = decider

    def explain(self, trial_id: str, others: bool = True) -> list[str]:
        """Why a trial is where it is, for people (`hypersack why`): for a waiting trial,
        what blocks it on each GPU and what holds its study back. Reads, changes nothing.
        `others`: name other studies (else only count them)."""
        t = self.book.trial(trial_id)
        study = self.s.studies[t.study_id]
        head = f"{t.id} is {t.state.value}"
        if t.state == TrialState.RUNNING:
            gpu = self.s.cluster.gpu(t.node, t.gpu_index)
            return [f"{head} on {t.node}:{t.gpu_index} (attempt {t.launches})"
                    + (f", fused group {t.group} of {t.group_width}" if t.group else ""),
                    *self.ratio_lines(t, [gpu.arch] if gpu else [])]
        if t.state == TrialState.PAUSED:
            return [f"{head} at epoch {t.done_epochs:g}, waiting for the rung's other "
                    "trials: the pruner promotes the best of each rung and prunes the rest",
                    *self.explain_windows(t.study_id)]
        if t.state not in (TrialState.PENDING, TrialState.PROFILING):
            return [head + (f": {t.reason}" if t.reason else "")]
        if study.state != StudyState.ACTIVE:
            return [f"{head}, but its study is {study.state.value}"]
        open_nodes = self.s.cluster.open_nodes()
        out = [head]
        closed = sorted(n.spec.name for n in self.s.cluster if n.draining)
        if closed:
            out.append(f"draining, so taking no new work: {', '.join(closed[:20])}")
        if not open_nodes:
            out.append("no node is connected and open: start an agent, or undrain a node")
            return out
        archs = self.s.cluster.archs_of(open_nodes)
        needs = self.profiling.needs(t, archs)
        for arch in sorted(archs - set(needs)):
            failed = self.s.profile_failed.get((t.key, arch))
            out.append(f"{arch}: " + (f"profiling failed: {failed}" if failed else
                       "waiting for its workload's profile there (each workload is "
                       "profiled once per architecture)"))
        out += self.explain_gpus(t, open_nodes, needs)
        choice = self.decider.rules.describe(t.study_id)
        if choice is not None:
            out.append(f"its study's policy is predict: {choice}")
        out += self.ratio_lines(t, sorted(needs))
        out += self.explain_queue(t, others)
        return out

    def ratio_lines(self, t: TrialRecord, archs: list[str]) -> list[str]:
        """How far each architecture is packed for this trial's study, and why."""
        own = self.s.spaces[t.study_id].settings.oversubscription
        mine = [f"{a}: ratio {own[a]:g} (its study's settings.oversubscription)"
                for a in archs if a in own]
        return mine + [lv.describe() for lv in self.sharing.levels(
            [a for a in archs if a not in own]) if lv.arch in archs]

    def explain_gpus(self, t: TrialRecord, open_nodes: list[Node],
                      needs: Mapping[str, Need]) -> list[str]:
        ratios = self.s.spaces[t.study_id].settings.oversubscription
        lines: list[str] = []
        fits = 0
        for node in open_nodes:
            free_cores = core_units(node.spec.cores) - node.used_cores
            for idx, gpu in sorted(node.gpus.items()):
                need = needs.get(gpu.arch)
                if need is None:
                    continue
                cap = compute_capacity(self.s.config.ratio(gpu.arch, ratios))
                said = {
                    PROFILING: "it runs a profile job",
                    DRAINING: "it drains for a profile job",
                    EXCLUSIVE: "one trial per GPU (exclusive) and it has one",
                    COMPUTE: f"compute: needs {need.compute / COMPUTE_SCALE:g}%, "
                             f"{max(0, cap - gpu.used_compute) / COMPUTE_SCALE:g}% of "
                             f"{cap / COMPUTE_SCALE:g}% free",
                    MEMORY: f"memory: needs {need.memory} MiB, "
                            f"{max(0, gpu.memory_mib - gpu.used_memory)} MiB of "
                            f"{gpu.memory_mib} free",
                    CORES: f"cores: needs {need.cores / CORE_SCALE:g}, node has "
                           f"{max(0, free_cores) / CORE_SCALE:g} of {node.spec.cores:g} free"}
                why = [said[s] for s in self.s.cluster.shortfalls(node, gpu, need, cap)]
                fits += not why
                if len(lines) < MAX_EXPLAINED_GPUS:
                    lines.append(f"{node.spec.name}:{idx} ({gpu.arch}, {len(gpu.trials)} "
                                 f"trials): " + ("; ".join(why) if why else "fits now"))
        shown = sum(len(n.gpus) for n in open_nodes)
        if shown > MAX_EXPLAINED_GPUS:
            lines.append(f"... and {shown - MAX_EXPLAINED_GPUS} more GPUs")
        if fits:
            lines.append(f"fits on {fits} GPU(s) now: it is placed at the next decision "
                         "unless its study's share, its user's quota or trials ahead of it "
                         "take the room first")
        return lines

    def explain_queue(self, t: TrialRecord, others: bool) -> list[str]:
        """What holds the study back: trials ahead, its share, its user's quota, and
        studies of a higher priority."""
        lines: list[str] = []
        waiting: Mapping[str, int] = self.s.waiting.get(t.study_id) or {}
        mine = self.book.wait_order(t)
        ahead = sum(1 for order in waiting.values() if order < mine)  # their wait orders
        if ahead:
            lines.append(f"{ahead} trial(s) of its study wait ahead of it")
        active = [s for s in self.book.studies() if s.state == StudyState.ACTIVE]
        claims, quotas = self.decider.claims(active)
        by_id = {c.study_id: c for c in claims}
        claim = by_id[t.study_id]
        rule = self.s.config.share_rule(claim.user)
        quota = quotas[claim.user]
        if quota.compute is not None and quota.compute <= shares.EPS:
            lines.append(f"its user {claim.user or '(local)'} has used their quota of "
                         f"{rule.max_compute:g} GPU-equivalents of compute")
        if quota.gpus is not None and quota.gpus <= 0:
            lines.append(f"its user {claim.user or '(local)'} occupies their quota of "
                         f"{rule.max_gpus} GPUs (it fits only where they already run)")
        above = [c for c in claims if c.priority > claim.priority and c.pending]
        if above:
            lines.append(f"{len(above)} studies of a higher priority wait and go first"
                         + (": " + ", ".join(f"{c.study_id} (priority {c.priority})"
                                             for c in above[:10]) if others else ""))
        level = [c for c in claims if c.priority == claim.priority]
        if len(level) > 1:
            capacity = float(sum(len(n.gpus) for n in self.s.cluster.open_nodes()))
            capacity -= sum(c.used for c in claims if c.priority > claim.priority)
            fair = shares.targets(level, capacity, self.decider.user_weight)
            share = fair.get(t.study_id, 0.0)
            line = (f"fair share: its study holds {claim.used:.2f} of {share:.2f} "
                    f"GPU-equivalents (weight {claim.weight:g}, {len(level)} active "
                    f"studies at priority {claim.priority})")
            if claim.used >= share - shares.EPS:
                under = [c for c in level if c.pending and c.study_id != t.study_id
                         and c.used < fair.get(c.study_id, 0.0) - shares.EPS]
                line += "; at or over its share, so "
                line += (", ".join(f"{c.study_id} ({c.used:.2f} of "
                                   f"{fair.get(c.study_id, 0.0):.2f})" for c in under[:10])
                         if others and under else
                         f"{len(under)} studies under theirs" if under else "others")
                line += " go first"
            lines.append(line)
        return lines + self.explain_windows(t.study_id)

    def explain_windows(self, study_id: str) -> list[str]:
        now = self.s.clock.now()
        return [f"rung {rung}'s promotions wait {due - now:.1f} s more for their window "
                "(promotion_window_s), to be placed together"
                for (sid, rung), due in sorted(self.s.windows.items())
                if sid == study_id and due > now]
