"""The pure core: events in, commands out. No I/O beyond the injected store and clock."""

from hypersack.orchestrator.commands import Command, KillTrial, LaunchTrial, ProfileWorkload
from hypersack.orchestrator.events import (
    Event,
    Heartbeat,
    NodeDrained,
    NodeJoined,
    NodeLost,
    ProfileFailed,
    ProfileMeasured,
    ProfilesImported,
    RunningTrial,
    StudyCancelled,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
    TrialOutOfMemory,
    TrialProgress,
    TrialStarted,
)
from hypersack.orchestrator.orchestrator import Orchestrator, OrchestratorConfig

__all__ = [
    "Command",
    "Event",
    "Heartbeat",
    "KillTrial",
    "LaunchTrial",
    "NodeDrained",
    "NodeJoined",
    "NodeLost",
    "Orchestrator",
    "OrchestratorConfig",
    "ProfileFailed",
    "ProfileMeasured",
    "ProfileWorkload",
    "ProfilesImported",
    "RunningTrial",
    "StudyCancelled",
    "StudySubmitted",
    "Tick",
    "TrialFailed",
    "TrialFinished",
    "TrialOutOfMemory",
    "TrialProgress",
    "TrialStarted",
]
