"""Studies submitted, given trials (a manual search) and cancelled."""

from __future__ import annotations

import hashlib
import logging

from hypersack.core.bounds import MAX_EXTEND
from hypersack.core.cluster import near_miss
from hypersack.core.errors import (
    InvalidInput,
)
from hypersack.core.types import (
    StudyRecord,
    StudyState,
    TrialState,
)
from hypersack.grid.adaptive import check_search
from hypersack.grid.expand import asked_trial, expand
from hypersack.grid.params import MAX_TRIALS_CAP
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.commands import (
    Command,
)
from hypersack.orchestrator.events import (
    StudyCancelled,
    StudyExtended,
    StudySubmitted,
    TrialsAsked,
)
from hypersack.orchestrator.pruning import Pruning
from hypersack.orchestrator.state import CoreState, short

log = logging.getLogger(__name__)


class StudyEvents:
    def __init__(self, s: CoreState, book: Book, pruning: Pruning) -> None:
        self.s = s
        self.book = book
        self.pruning = pruning

    def known_archs(self) -> set[str]:
        """The GPU architectures this server knows: its nodes' (open or not), its
        profiles' and its configured ratios'."""
        known = {a for n in self.s.cluster for a in n.archs()}
        known |= {arch for _, arch in self.s.profiles}
        return known | set(self.s.config.oversubscription)

    def _arch_warning(self, space: SearchSpace) -> str | None:
        """What to warn of where a study's settings (`oversubscription`, `demand` per
        architecture) name architectures this server does not know. Architectures are
        matched exactly, so a near miss of a known one (`a100` or `A100-80GB` for
        `A100`) would be ignored without a word: it is refused, naming the one meant."""
        settings = space.settings
        named = set(settings.oversubscription)
        if isinstance(settings.demand, dict):
            named |= set(settings.demand)
        known = self.known_archs()
        unknown = sorted(named - known)
        for arch in unknown:
            meant = sorted(k for k in known if near_miss(arch, k))
            if meant:
                where = "oversubscription" if arch in settings.oversubscription else "demand"
                raise InvalidInput(
                    f"settings.{where}: {arch[:40]!r} is not an architecture of this "
                    f"cluster; did you mean {meant[0]!r}? (architectures are matched "
                    f"exactly; known here: {', '.join(sorted(known))})")
        if not unknown or not known:
            return None
        return (f"settings name architecture(s) {', '.join(a[:40] for a in unknown)} that "
                f"no node or profile here has (known here: {', '.join(sorted(known))}); "
                "they apply once such a node joins")

    def on_submitted(self, event: StudySubmitted) -> list[Command]:
        space = owned_workload(event.space, event.owner)
        seq = max((s.seq for s in self.s.studies.values()), default=0) + 1
        # Numbered per name (sp1-1, sp1-2, ...). Unique: a name never ends in -<digits>
        # of another name's number, as the number is always the last dash's part.
        number = 1 + sum(s.name == space.name for s in self.s.studies.values())
        study_id = f"{space.name}-{number}"
        while study_id in self.s.studies:  # a name like "a-1" beside "a": never reused
            number += 1
            study_id = f"{space.name}-{number}"
        study = StudyRecord(id=study_id, name=space.name, space=space.model_dump(mode="json"),
                            submitted_at=self.s.clock.now(), seq=seq, owner=event.owner)
        check_search(space)  # a sampler this server cannot run is refused now
        arch_warning = self._arch_warning(space)  # a near miss is refused here
        trials = expand(space, study_id)
        self.s.store.add_study(study, trials)
        self.s.studies[study_id] = study
        self.s.spaces[study_id] = space
        self.s.by_study[study_id] = [t.id for t in trials]
        self.s.open[study_id] = len(trials)
        waiting = self.book.waiting_in(study_id)
        for i, t in enumerate(trials):
            self.book.added(t)
            self.s.place[t.id] = i
            if t.state == TrialState.PENDING:
                waiting[t.id] = self.book.wait_order(t)
                self.book.count_group(t, 1)
        # A new study profiles again what failed before: its user may have fixed the
        # program since (the failure is not the workload's for good).
        keys = {t.key for t in trials}
        for slot in [s for s in self.s.profile_failed if s[0] in keys]:
            log.info("study %s: profiling %s on %s again (it failed before: %s)", study_id,
                     slot[0].label(), slot[1], short(self.s.profile_failed[slot], 200))
            self.s.forget_profile_failure(slot)
        if arch_warning:
            self.book.warn(study_id, arch_warning)
        log.info("study %s submitted: %d trials%s", study_id, space.size(),
                 f" (asked of Optuna's {space.search.sampler} sampler as capacity frees)"
                 if space.search.adaptive else "")
        return self.s.decide()

    def on_asked(self, event: TrialsAsked) -> list[Command]:
        """Trials given by the owner of a manual search, run like any others."""
        study = self.book.study(event.study_id)
        space = self.s.spaces[study.id]
        if space.search.type != "manual":
            raise InvalidInput(f"study {study.id} searches by {space.search.type}; only a "
                               "study with search type manual takes trials from outside")
        if study.state != StudyState.ACTIVE:
            raise InvalidInput(f"study {study.id} is {study.state.value}")
        left = self.book.asks_left(study.id)
        if len(event.params) > left:
            raise InvalidInput(f"study {study.id} takes {left} more trial(s) (search.trials "
                               f"= {space.size()}); {len(event.params)} given")
        if not event.params:
            return []
        start = len(self.s.by_study[study.id])
        self.book.add_trials(study.id, [
            asked_trial(space, study.id, start + i, space.point(p))
            for i, p in enumerate(event.params)])
        return self.s.decide()

    def on_extended(self, event: StudyExtended) -> list[Command]:
        """More trials: an adaptive search's count grows (its sampler, with every trial
        it was told, asks them as capacity frees), a random search draws the next points
        of its seeded stream; an ended study is active again. A grid has every point
        already; a cancelled study stays cancelled."""
        study = self.book.study(event.study_id)
        space = self.s.spaces[study.id]
        search = space.search
        if search.type == "grid":
            raise InvalidInput(f"study {study.id} is a grid: it has all its points; submit a "
                               "space with more values (or search type random or optuna)")
        if study.state == StudyState.CANCELLED:
            raise InvalidInput(f"study {study.id} was cancelled; submit it again")
        if not 1 <= event.trials <= MAX_EXTEND:
            raise InvalidInput(f"extend by 1 to {MAX_EXTEND} trials ({event.trials} asked)")
        field = "samples" if search.type == "random" else "trials"
        total = space.size() + event.trials
        if total > min(space.settings.max_trials, MAX_TRIALS_CAP):
            raise InvalidInput(f"study {study.id} would have {total} trials, more than "
                               f"settings.max_trials={space.settings.max_trials}")
        grown = space.model_copy(update={"search": search.model_copy(update={field: total})})
        self.s.spaces[study.id] = grown
        study = study.model_copy(update={"space": {
            **study.space, "search": {**study.space.get("search", {}), field: total}}})
        self.s.studies[study.id] = study
        if search.type == "random":
            old = len(self.s.by_study[study.id])
            self.book.add_trials(study.id, expand(grown, study.id)[old:])
        if study.state != StudyState.ACTIVE:
            self.book.set_study(study, StudyState.ACTIVE)
        else:
            self.s.dirty_studies.add(study.id)
        log.info("study %s extended by %d trial(s) to %d", study.id, event.trials, total)
        return self.s.decide()

    def on_cancelled(self, event: StudyCancelled) -> list[Command]:
        return self.pruning.stop_study(event.study_id, StudyState.CANCELLED,
                                       "study cancelled") + self.s.decide()


def submitted_workloads(event: StudySubmitted) -> dict[str, float]:
    """The trials a submitted study brings, by workload as their keys will name it (a
    built-in program's models, an equal share each; a command program's workload in its
    owner's namespace); empty where the submission will be refused."""
    try:
        space = owned_workload(event.space, event.owner)
        check_search(space)
        size = float(space.size())
    except Exception:  # refused when it is handled
        return {}
    if space.program.command is not None:
        return {space.workload or space.program.identity(): size}
    models = list(dict.fromkeys(space.models))
    return {m: size / len(models) for m in models} if models else {}


def owned_workload(space: SearchSpace, owner: str) -> SearchSpace:
    """A command program's workload lives in its owner's namespace (`OWNER:NAME`), so
    that one user's measurements or stated demands never stand for another's program of
    the same name. Only the owner names workloads of that namespace; an admin may import
    profiles into any (`hypersack profiles import`)."""
    if space.program.command is None or not owner:
        return space
    name = space.workload or space.program.identity()
    if ":" in name:
        if not name.startswith(f"{owner}:"):
            raise InvalidInput(f"workload {short(name, 80)!r}: a name with ':' is "
                               f"OWNER:NAME, and this study's owner is {short(owner, 64)!r}")
        return space
    full = f"{owner}:{name}"
    if len(full) > 64:  # the workload field's limit: still the owner's, still told apart
        digest = hashlib.sha256(full.encode()).hexdigest()[:12]
        full = f"{owner[:40]}:{name[:10]}@{digest}"
    return space.model_copy(update={"workload": full})
