"""`hypersack`: the command line. Only this package configures logging and prints."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypersack import __version__
from hypersack.core.bounds import MAX_RATIO
from hypersack.core.errors import HyperSackError, InvalidInput
from hypersack.wire.settings import check_ratio_names, parse_ratios

EXIT_INPUT = 2


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidInput(f"{flag} {text!r}: expected numbers separated by commas") from None
    if not values or len(values) > 100 or any(not 0 < v <= MAX_RATIO for v in values):
        raise InvalidInput(f"{flag} {text!r}: expected up to 100 numbers in (0, "
                           f"{MAX_RATIO:g}], like 1,2,3")
    return values


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search-space file (YAML or JSON), e.g. examples/sp1.yaml")
    p.add_argument("--cluster", required=True,
                   help="cluster YAML file or shorthand NODESxGPUSxARCH-MEMGB[@CORES], "
                        "e.g. 1x4xA100-80GB@88,1x2xH100-80GB@96")
    p.add_argument("--profiles", required=True,
                   help="profiles file (YAML or CSV) with demands per workload and "
                        "architecture, e.g. examples/profiles-estimates.yaml")
    p.add_argument("--policy", help="predict, auto, eft, ff, ffd, wf, wfd, pack, optimal or "
                                    "a registered policy (default: the study's; a study "
                                    "that names none: predict, the rule whose simulated "
                                    "study ends first)")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option, e.g. time_limit_s=5 for optimal (repeatable)")
    p.add_argument("--ratio", action="append", default=[], metavar="ARCH=R",
                   help="oversubscription ratio for an architecture (repeatable); "
                        "default A100=3, H100=2.5, others 1")
    p.add_argument("--no-fusion", action="store_true",
                   help="never form fused groups: pack trials alone (the study's "
                        "settings.fusion: off does the same)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hypersack",
        description="Pack hyperparameter-search trials onto shared GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"hypersack {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("validate", help="check a search space and count its trials")
    p.add_argument("space", help="search-space file")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "plan", help="one scheduling decision, dry run: which trial goes to which GPU",
        description="Expand the search space, take demands from the profiles file, and "
                    "show one placement decision on an empty cluster: every trial's "
                    "demand, where it goes, what stays pending and why, per-GPU "
                    "occupancy and the solve time.")
    _common(p)
    p.add_argument("--compare", choices=["optimal"],
                   help="also solve the same instance with OR-Tools CP-SAT and report the gap")

    p = sub.add_parser(
        "simulate", help="run a study on a simulated cluster and compare with one trial per GPU",
        description="Drive the real orchestrator with a virtual clock and simulated agents "
                    "(interference model: docs/simulator.md). Reports makespan, the "
                    "one-trial-per-GPU baseline, the speedup, mean GPU occupancy and "
                    "per-GPU timelines.")
    _common(p)
    p.add_argument("--sweep", metavar="R1,R2,...",
                   help="run once per oversubscription ratio (applied to every "
                        "architecture) and print the speedup of each")
    p.add_argument("--gantt", metavar="FILE.svg", help="write per-GPU timelines as SVG")
    p.add_argument("--cold", action="store_true",
                   help="start with an empty history: every workload is profiled first")
    p.add_argument("--contention", type=float,
                   help="interference model: slowdown added per extra trial on a GPU")

    from hypersack.cli import admin, control, profiles, run

    run.add_parser(sub)
    control.add_parsers(sub)
    profiles.add_parser(sub)
    admin.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if args.command == "validate":
            return _validate(args)
        if args.command == "plan":
            from hypersack.cli.plan import run_plan

            return run_plan(args)
        if args.command == "simulate":
            from hypersack.cli.simulate import run_simulate

            return run_simulate(args)
        if args.command == "run":
            from hypersack.cli.run import run_embedded

            return run_embedded(args)
        if args.command == "profiles":
            from hypersack.cli.profiles import run_profiles

            return run_profiles(args)
        if args.command in ("certs", "users", "token", "whoami"):
            from hypersack.cli.admin import run_admin

            return run_admin(args)
        from hypersack.cli.control import run_control

        return run_control(args)
    except HyperSackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:
        return 0


def _validate(args: argparse.Namespace) -> int:
    from hypersack.grid.runnable import check_runnable
    from hypersack.grid.space import load_space
    from hypersack.policies.registry import policy_names

    space = load_space(args.space, policy_names())
    check_runnable(space, str(args.space))  # what submission refuses, refused here too
    axes = {name: values for name, values in space.axes()}
    conditions = space.conditions()
    if args.json:
        emit({"name": space.name, "trials": space.size(), "search": space.search.type,
              "axes": axes if space.search.type == "grid" else None,
              "conditions": conditions,
              "objectives": [o.model_dump() for o in space.settings.goals]})
    else:
        print(f"{space.name}: {space.size()} trials ({space.search.type} search)")
        goals = space.settings.goals
        print(("objectives: " if len(goals) > 1 else "objective: ") + ", ".join(
            f"{o.metric} ({o.mode})" for o in goals) + (
            " (results show the Pareto front)" if len(goals) > 1 else ""))
        for name, hp in space.hyperparameters.items():
            values = axes.get(name) if space.search.type == "grid" else None
            shown = (f"{len(values)} values: {', '.join(map(str, values))}" if values
                     else hp.model_dump(exclude={"when"}, exclude_none=True))
            when = conditions.get(name)
            print(f"  {name}: {shown}" + (
                "  (only when " + " and ".join(
                    f"{k} in {v}" for k, v in when.items()) + ")" if when else ""))
        if space.models and space.search.type == "grid":
            print(f"  model: {len(space.models)} values: {', '.join(space.models)}")
    return 0


def emit(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def load_inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """Space, cluster, profiles and orchestrator config from the common flags."""
    from hypersack.core.cluster import load_cluster
    from hypersack.grid.space import load_space
    from hypersack.orchestrator.orchestrator import DEFAULT_RATIOS, OrchestratorConfig
    from hypersack.policies.registry import make_policy, parse_policy_options, policy_names
    from hypersack.sampler.profiles import load_profiles
    from hypersack.sim.foresight import foresee

    space = load_space(args.space, policy_names())
    cluster = load_cluster(args.cluster)
    profiles = load_profiles(args.profiles)
    given = parse_ratios(args.ratio)
    ratios = {**DEFAULT_RATIOS, **given}
    check_ratio_names(ratios)
    options = parse_policy_options(args.policy_option)
    policy = args.policy or space.settings.policy
    make_policy(policy, **options)  # fail on a bad name or option before any work
    config = OrchestratorConfig(oversubscription=ratios, policy=policy,
                                policy_options={policy: options},
                                fusion=not getattr(args, "no_fusion", False),
                                foresight=foresee)  # for `predict`, as the server has it
    if given:
        # Ratios given on the command line win over the study's own.
        settings = space.settings.model_copy(update={"oversubscription": {
            **space.settings.oversubscription, **given}})
        space = space.model_copy(update={"settings": settings})
    return space, cluster, profiles, config


def with_ratio(config: Any, space: Any, cluster: Any, ratio: float) -> tuple[Any, Any]:
    ratios = {arch: ratio for arch in cluster.archs()}
    settings = space.settings.model_copy(update={"oversubscription": ratios})
    return (replace(config, oversubscription={**config.oversubscription, **ratios}),
            space.model_copy(update={"settings": settings}))


def out_path(path: str) -> Path:
    p = Path(path)
    if p.parent and not p.parent.exists():
        raise InvalidInput(f"cannot write {path}: folder {str(p.parent)!r} does not exist")
    return p


if __name__ == "__main__":
    sys.exit(main())
