"""What an agent reports, as the core's events: exits and profile results, each checked
and bounded (the service applies them; nothing here decides)."""

from __future__ import annotations

from pydantic import ValidationError

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.bounds import iteration_timing
from hypersack.core.errors import InvalidInput
from hypersack.core.trial_env import OOM_EXIT_CODE
from hypersack.core.validation import format_validation_error
from hypersack.orchestrator.events import (
    Event,
    ProfileFailed,
    ProfileMeasured,
    TrialFailed,
    TrialFinished,
    TrialLogged,
    TrialOutOfMemory,
    TrialProgress,
)
from hypersack.wire.convert import (
    LOG_TAIL_CHARS,
    clean_memory,
    clean_metrics,
    key_from_pb,
    nonfinite_names,
    profile_from_pb,
)

MAX_STEPS_PER_MESSAGE = 256  # steps of a learning curve one metrics message may carry
MAX_SAMPLE_ID = 256  # a profile result's trial id: longer is no trial's


def progress_event(node: str, m: pb.TrialMetrics) -> TrialProgress:
    """A running trial's metrics, with each step it reported since the last message (the
    latest MAX_STEPS_PER_MESSAGE, each step's metrics cleaned as the latest are)."""
    steps = tuple((int(s.step), clean_metrics(s.metrics))
                  for s in list(m.steps)[-MAX_STEPS_PER_MESSAGE:])
    iter_s, window_s = iteration_timing(m.iter_time_s, m.iter_window_s) or (0.0, 0.0)
    return TrialProgress(m.trial_id, node, int(m.step), clean_metrics(m.metrics), m.attempt,
                         nonfinite_names(m.metrics), steps, iter_s, window_s)


def exit_event(node: str, e: pb.TrialExited) -> Event:
    """The event a trial's exit stands for: finished, fenced (not its failure), out of
    memory, or failed; or, for an attempt the server stopped, its log."""
    tail = e.log_tail[-LOG_TAIL_CHARS:]
    if e.killed:
        return TrialLogged(e.trial_id, node, e.attempt, tail)
    if e.exit_code == 0:
        return TrialFinished(e.trial_id, node, clean_metrics(e.metrics), log_tail=tail,
                             attempt=e.attempt, nonfinite=nonfinite_names(e.metrics))
    if e.fenced:
        return TrialFailed(e.trial_id, node, e.exit_code, tail, attempt=e.attempt,
                           fenced=True)
    if e.out_of_memory or e.exit_code == OOM_EXIT_CODE:
        return TrialOutOfMemory(e.trial_id, node, clean_memory(e.peak_memory_mib),
                                attempt=e.attempt)
    return TrialFailed(e.trial_id, node, e.exit_code, tail, attempt=e.attempt)

def profile_event(node: str, p: pb.ProfileResult) -> Event:
    """The event a profile result stands for; a measurement that does not hold together
    (another workload, bad numbers) is the profile's failure."""
    try:
        key = key_from_pb(p.key)
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, "profile.key")) from None
    except ValueError as exc:
        raise InvalidInput(f"profile.key: {exc}") from None
    sample = p.sample[:MAX_SAMPLE_ID]  # opaque: compared with the job's, never stored
    if not p.ok:
        return ProfileFailed(key, p.arch, node, p.error[-LOG_TAIL_CHARS:] or "failed", sample)
    try:
        profile = profile_from_pb(p.profile, where="profile",
                                  default_source=f"measured on {node}")
    except InvalidInput as exc:
        return ProfileFailed(key, p.arch, node, f"invalid measurement: {exc}", sample)
    if profile.key != key or profile.arch != p.arch:
        return ProfileFailed(key, p.arch, node, "invalid measurement: it names another "
                             f"workload ({profile.key.label()} on {profile.arch})", sample)
    return ProfileMeasured(profile, node, sample)
