"""A decision at 8,000 GPUs reads each node's cached columns instead of walking every GPU
(issue 37, 3: an exit with trials pending cost 43 ms there, now about half): what is
built from the columns must be what walking the GPUs gives."""

from __future__ import annotations

import random

from hypersack.policies.base import ClusterView, FitBounds, Flat, GpuBin, Need, NodeBin


def _view(rng: random.Random) -> ClusterView:
    nodes = []
    for n in range(rng.randint(1, 30)):
        gpus = tuple(GpuBin(f"n{n}", i, rng.choice(["A100", "H100"]),
                            rng.choice([0, 500, 3000, 30000]), rng.choice([0, 900, 40000]),
                            slots=rng.choice([None, 0, 1, 3]))
                     for i in rng.sample(range(16), rng.randint(0, 8)))
        nodes.append(NodeBin(f"n{n}", rng.choice([0, 4000, 88000]), gpus))
    return ClusterView(tuple(nodes))


def test_flat_from_columns_is_flat_from_every_gpu() -> None:
    rng = random.Random(7)
    for _ in range(200):
        view = _view(rng)
        flat = Flat(view)
        gpus = [(ni, g) for ni, n in enumerate(view.nodes) for g in n.gpus]
        assert flat.node_of == [ni for ni, _ in gpus]
        assert flat.arch == [g.arch for _, g in gpus]
        assert flat.index == [g.index for _, g in gpus]
        assert flat.compute == [g.compute for _, g in gpus]
        assert flat.memory == [g.memory for _, g in gpus]
        assert flat.slots == [1 << 60 if g.slots is None else g.slots for _, g in gpus]
        assert flat.node_cores == [n.cores for n in view.nodes]
        if gpus:  # a policy's changes stay its own: the cached columns are not touched
            flat.take(0, Need(1, 1, 1))
            assert Flat(view).compute[0] == gpus[0][1].compute


def _bound_by_walking(view: ClusterView, needs: dict[str, Need]) -> int:
    total, big = 0, 1 << 30
    for arch, need in needs.items():
        for g in (g for n in view.nodes for g in n.gpus if g.arch == arch):
            if need.compute <= 0 and need.memory <= 0:
                return big
            by_compute = g.compute // need.compute if need.compute > 0 else big
            if need.compute > 0 and g.compute < need.compute:
                continue
            total += min(by_compute, g.memory // need.memory if need.memory > 0 else big)
    return total + 1


def test_fit_bounds_by_free_state_are_the_bounds_by_gpu() -> None:
    rng = random.Random(11)
    for _ in range(200):
        view = _view(rng)
        fits = FitBounds(view)
        for _ in range(5):
            needs = {a: Need(rng.choice([0, 400, 2500, 9000]), rng.choice([0, 800, 5000]), 1)
                     for a in rng.sample(["A100", "H100"], rng.randint(1, 2))}
            assert fits.bound(needs) == _bound_by_walking(view, needs), needs
