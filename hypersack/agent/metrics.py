"""What an agent's `/metrics` says: its link to the server, its GPUs and MPS daemons as it
last sampled them, and each running trial's device use as the backend attributes it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hypersack.agent.mps import MPS
from hypersack.core import trial_env as sdk

if TYPE_CHECKING:
    from hypersack.agent.agent import Agent


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        node = agent.node
        now = time.monotonic()
        connected = GaugeMetricFamily("hypersack_agent_up", "1 while the stream to the "
                                      "server is up", labels=["node"])
        connected.add_metric([node], int(agent.connected.is_set()))
        yield connected
        sessions = CounterMetricFamily("hypersack_agent_sessions", "Streams to the server "
                                       "opened since the agent started", labels=["node"])
        sessions.add_metric([node], agent.sessions)
        yield sessions
        age = GaugeMetricFamily("hypersack_agent_heartbeat_age_seconds", "Seconds since "
                                "the agent last sent a heartbeat", labels=["node"])
        if agent.heartbeat_sent_at is not None:
            age.add_metric([node], max(0.0, now - agent.heartbeat_sent_at))
        yield age

        arch = {d.index: d.arch for d in agent.backend.devices()}
        util = GaugeMetricFamily("hypersack_agent_gpu_utilization_pct", "Device "
                                 "utilization at the last heartbeat",
                                 labels=["node", "gpu", "arch"])
        used = GaugeMetricFamily("hypersack_agent_gpu_memory_used_mib", "Device memory in "
                                 "use at the last heartbeat", labels=["node", "gpu", "arch"])
        for s in agent.device_states:
            labels = [node, str(s.index), arch.get(s.index, "")]
            util.add_metric(labels, s.utilization_pct)
            used.add_metric(labels, s.memory_used_mib)
        yield util
        yield used

        mps = GaugeMetricFamily("hypersack_agent_mps_up", "1 while the GPU's MPS daemon "
                                "serves it, 0 while its trials time-slice",
                                labels=["node", "gpu", "arch"])
        restarts = CounterMetricFamily("hypersack_agent_mps_restarts", "Restarts of the "
                                       "GPU's MPS daemon", labels=["node", "gpu", "arch"])
        for index, name in sorted(arch.items()):
            mode, count = agent.mps.mode(index) if agent.mps is not None else ("", 0)
            mps.add_metric([node, str(index), name], int(mode == MPS))
            restarts.add_metric([node, str(index), name], count)
        yield mps
        yield restarts

        memory = GaugeMetricFamily("hypersack_agent_trial_memory_mib", "Device memory of "
                                   "each running trial's processes, as last observed",
                                   labels=["node", "study", "trial", "attempt", "gpu"])
        peak = GaugeMetricFamily("hypersack_agent_trial_peak_memory_mib", "The most device "
                                 "memory each running trial used",
                                 labels=["node", "study", "trial", "attempt", "gpu"])
        busy = GaugeMetricFamily("hypersack_agent_trial_utilization_pct", "Device "
                                 "utilization attributed to each running trial, as last "
                                 "observed", labels=["node", "study", "trial", "attempt", "gpu"])
        running = GaugeMetricFamily("hypersack_agent_trials_running", "Trial processes "
                                    "running (a fused group counts each member)",
                                    labels=["node"])
        with agent.jobs_lock:
            jobs = [j for j in agent.jobs.values() if not j.profile and j.exit_code is None]
        for j in jobs:
            labels = [node, j.env.get(sdk.ENV_STUDY_ID, ""), j.id, str(j.attempt),
                      str(j.gpu_index)]
            memory.add_metric(labels, j.memory_mib)
            peak.add_metric(labels, j.peak_memory_mib)
            busy.add_metric(labels, j.util_pct)
        running.add_metric([node], len(jobs))
        yield from (memory, peak, busy, running)
