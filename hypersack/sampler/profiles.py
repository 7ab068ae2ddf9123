"""Profile files (YAML or CSV, one flat row per workload and architecture)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hypersack.core.errors import InvalidInput
from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.core.validation import format_validation_error

COLUMNS = ("model", "batch_size", "optimizer", "precision", "fusion_width", "arch",
           "compute_pct", "memory_mib", "cores", "iter_time_s", "iters_per_epoch",
           "data_fraction", "source", "setup_s", "eval_s_per_epoch", "versions", "measured_at",
           "observed_memory_mib", "observed_compute_pct", "observed_trials", "corrected")
_KEY = ("model", "batch_size", "optimizer", "precision", "fusion_width")
_DEMAND = ("compute_pct", "memory_mib", "cores")


def profile_from_row(row: dict[str, Any], *, where: str) -> Profile:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise InvalidInput(f"{where}: unknown columns {sorted(unknown)}; valid: {list(COLUMNS)}")
    data = {k: v for k, v in row.items() if v not in (None, "")}
    try:
        return Profile.model_validate({
            "key": {k: data[k] for k in _KEY if k in data},
            "demand": {k: data[k] for k in _DEMAND if k in data},
            **{k: v for k, v in data.items() if k not in _KEY and k not in _DEMAND},
        })
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, where)) from None


def profile_to_row(p: Profile) -> dict[str, Any]:
    return {
        **p.key.model_dump(), "arch": p.arch, **p.demand.model_dump(),
        "iter_time_s": p.iter_time_s, "iters_per_epoch": p.iters_per_epoch,
        **p.model_dump(exclude={"key", "arch", "demand", "iter_time_s", "iters_per_epoch"}),
    }


def load_profiles(path: str | Path) -> list[Profile]:
    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"profiles file {str(p)!r} does not exist")
    text = p.read_text()
    if p.suffix == ".csv":
        rows: list[dict[str, Any]] = list(csv.DictReader(io.StringIO(text)))
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidInput(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("profiles"), list):
            raise InvalidInput(f"{p}: expected a mapping with a 'profiles' list")
        rows = data["profiles"]
    profiles = []
    seen: set[tuple[WorkloadKey, str]] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidInput(f"{p}: profiles.{i}: expected a mapping")
        prof = profile_from_row(row, where=f"{p}: profiles.{i}")
        if (prof.key, prof.arch) in seen:
            raise InvalidInput(f"{p}: profiles.{i}: {prof.key.label()} on {prof.arch} given twice")
        seen.add((prof.key, prof.arch))
        profiles.append(prof)
    return profiles


def dump_profiles(profiles: Iterable[Profile], fmt: str = "yaml") -> str:
    rows = [profile_to_row(p) for p in profiles]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    return yaml.safe_dump({"profiles": rows}, sort_keys=False, default_flow_style=None, width=1000)


def demand_with_override(profile: Profile, memory_override_mib: int | None) -> Demand:
    if memory_override_mib is None or memory_override_mib <= profile.demand.memory_mib:
        return profile.demand
    return profile.demand.model_copy(update={"memory_mib": memory_override_mib})
