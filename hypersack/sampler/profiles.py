"""Profile files (YAML or CSV, one flat row per workload and architecture)."""

from __future__ import annotations

import csv
import io
from collections.abc import Container, Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hypersack.core.errors import InvalidInput
from hypersack.core.files import load_yaml, read_text_file
from hypersack.core.types import STATED_KEY, Demand, Profile, WorkloadKey, parse_key_params
from hypersack.core.validation import format_validation_error

COLUMNS = ("model", "batch_size", "optimizer", "precision", "fusion_width", "params", "arch",
           "compute_pct", "memory_mib", "cores", "iter_time_s", "iters_per_epoch",
           "data_fraction", "source", "setup_s", "eval_s_per_epoch", "versions", "measured_at",
           "observed_memory_mib", "observed_compute_pct", "observed_trials", "corrected")
KEY_COLUMNS = ("model", "batch_size", "optimizer", "precision", "fusion_width", "params")
_DEMAND = ("compute_pct", "memory_mib", "cores")
MAX_PROFILE_ROWS = 100_000


def profile_from_row(row: dict[str, Any], *, where: str) -> Profile:
    unknown = {str(k) for k in row} - set(COLUMNS)
    if unknown:
        raise InvalidInput(f"{where}: unknown columns {sorted(unknown)}; valid: {list(COLUMNS)}")
    data = {k: v for k, v in row.items() if v not in (None, "")}
    try:
        if "params" in data:
            data["params"] = parse_key_params(str(data["params"]))
        return Profile.model_validate({
            "key": {k: data[k] for k in KEY_COLUMNS if k in data},
            "demand": {k: data[k] for k in _DEMAND if k in data},
            **{k: v for k, v in data.items() if k not in KEY_COLUMNS and k not in _DEMAND},
        })
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, where)) from None
    except ValueError as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def profile_to_row(p: Profile) -> dict[str, Any]:
    return {
        **p.key.model_dump(exclude={"params"}), "params": p.key.params_text(), "arch": p.arch,
        **p.demand.model_dump(),
        "iter_time_s": p.iter_time_s, "iters_per_epoch": p.iters_per_epoch,
        **p.model_dump(exclude={"key", "arch", "demand", "iter_time_s", "iters_per_epoch"}),
    }


def profile_owner(p: Profile) -> str:
    """Whose a profile is: a stated demand's study (`study NAME`), a command program's
    owner (its workload `OWNER:NAME`), or the cluster's (a zoo model, or a program on a
    server without users)."""
    stated = dict(p.key.params).get(STATED_KEY)
    if stated:
        return f"study {stated}"
    owner, sep, _ = p.key.model.rpartition(":")
    return owner if sep and owner else "cluster"


def load_profiles(path: str | Path) -> list[Profile]:
    p = Path(path)
    text = read_text_file(p, "profiles file")
    if p.suffix == ".csv":
        try:
            rows: list[dict[str, Any]] = list(csv.DictReader(io.StringIO(text)))
        except csv.Error as exc:
            raise InvalidInput(f"{p}: not valid CSV: {exc}") from None
    else:
        data = load_yaml(text, str(p))
        if not isinstance(data, dict) or not isinstance(data.get("profiles"), list):
            raise InvalidInput(f"{p}: expected a mapping with a 'profiles' list")
        rows = data["profiles"]
    if len(rows) > MAX_PROFILE_ROWS:
        raise InvalidInput(f"{p}: more than {MAX_PROFILE_ROWS} profiles")
    profiles = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidInput(f"{p}: profiles.{i}: expected a mapping")
        profiles.append(profile_from_row(row, where=f"{p}: profiles.{i}"))
    reject_repeats(profiles, f"{p}: ")
    return profiles


def reject_repeats(profiles: Iterable[Profile], where: str = "") -> None:
    """A workload given twice for one architecture is an error (which one would win?)."""
    seen: set[tuple[WorkloadKey, str]] = set()
    for i, prof in enumerate(profiles):
        if (prof.key, prof.arch) in seen:
            raise InvalidInput(f"{where}profiles.{i}: {prof.key.label()} on {prof.arch} "
                               "given twice")
        seen.add((prof.key, prof.arch))


def to_import(profiles: Iterable[Profile], known: Container[tuple[WorkloadKey, str]],
              replace: bool) -> list[Profile]:
    """What an import writes: every profile with `replace`, else those the history lacks
    (a measured history wins over a file)."""
    return [p for p in profiles if replace or (p.key, p.arch) not in known]


def select_profiles(profiles: Iterable[Profile], model: str = "", arch: str = ""
                    ) -> list[Profile]:
    """The profiles of one model and/or architecture ("" for all), in listing order."""
    return sorted((p for p in profiles if (not model or p.key.model == model)
                   and (not arch or p.arch == arch)),
                  key=lambda p: (p.key.model, p.key.batch_size, p.key.label(), p.arch))


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
