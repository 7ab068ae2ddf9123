"""Small builders for tests of the core: profiles, search spaces, an orchestrator over a
memory store and a manual clock, and the launches among commands."""

from __future__ import annotations

from typing import Any

from hypersack.core.clock import ManualClock
from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.grid.space import parse_space
from hypersack.orchestrator import LaunchTrial, Orchestrator, OrchestratorConfig
from hypersack.store import MemoryStore, Store


def prof(model: str, bs: int, compute: float = 50.0, memory: int = 1000, arch: str = "A100",
         it: float = 0.1) -> Profile:
    return Profile(key=WorkloadKey(model=model, batch_size=bs), arch=arch,
                   demand=Demand(compute_pct=compute, memory_mib=memory, cores=1),
                   iter_time_s=it, iters_per_epoch=100)


def space(n_lr: int = 4, retries: int = 1, models: tuple[str, ...] = ("resnet18",),
          batch: tuple[int, ...] = (64,), ratio: float = 1.0, fusion: str = "off") -> Any:
    # Packing trials alone unless a test asks for fused groups (tests/unit/test_fusion.py).
    return parse_space({
        "name": "t", "models": list(models),
        "hyperparameters": {"batch_size": list(batch),
                            "lr": [round(0.1 * (i + 1), 2) for i in range(n_lr)]},
        "settings": {"retries": retries, "policy": "ff", "oversubscription": {"A100": ratio},
                     "fusion": fusion},
    })


def make(store: Store | None = None, profiles: list[Profile] | None = None,
         clock: ManualClock | None = None, **config: Any
         ) -> tuple[Orchestrator, Store, ManualClock]:
    store = store or MemoryStore()
    for p in profiles if profiles is not None else [prof("resnet18", 64)]:
        store.put_profile(p)
    clock = clock or ManualClock(100.0)
    return Orchestrator(store, clock, OrchestratorConfig(**config)), store, clock


def launches(cmds: list[Any]) -> list[LaunchTrial]:
    return [c for c in cmds if isinstance(c, LaunchTrial)]


def study(name: str, n: int = 20, **settings: Any) -> Any:
    return parse_space({
        "name": name, "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": [round(0.001 * (i + 1), 4)
                                                       for i in range(n)]},
        "settings": {"policy": "ff", "oversubscription": {"A100": 1.0}, "fusion": "off",
                     **settings},
    })


FUSED_KEY = WorkloadKey(model="resnet18", batch_size=64)


def fused_prof(width: int = 1, compute: float = 40.0, memory: int = 1000, it: float = 0.1,
         arch: str = "A100") -> Profile:
    return Profile(key=FUSED_KEY.model_copy(update={"fusion_width": width}), arch=arch,
                   demand=Demand(compute_pct=compute, memory_mib=memory, cores=1),
                   iter_time_s=it, iters_per_epoch=100)


# Width K: memory 400 + 600 K, compute rising slower than K, iteration time too.
WIDE = [fused_prof(), fused_prof(2, 60, 1600, 0.12), fused_prof(4, 80, 2800, 0.16),
        fused_prof(8, 95, 5200, 0.25)]
