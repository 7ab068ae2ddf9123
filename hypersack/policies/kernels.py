"""The knapsack moves of `improve`, over counts per GPU and class: one source, compiled
by numba where it is installed, run as plain Python where it is not.

The functions below use only what numba's nopython mode and plain Python share: flat
int64 sequences indexed by position (a 1-D NumPy array when compiled, a list when not),
integer arithmetic and explicit loops. The rounds `pairs_row` and `repack_round` are
what `improve.pairs` and `improve.repack` call; the same call gives the same counts
either way (tests/unit/test_kernels.py runs both).

Layout of the arguments (G GPUs, C classes, A architectures, N nodes):

    arch_of[G], node_of[G]               each GPU's architecture and node
    comp[G], mem[G], slots[G], cores[N]  what is free (changed in place)
    need_c/m/k[A * C + c]                a class's need on an architecture (compute,
                                         memory, cores); absent where `rows` omits it
    value[C]                             a class's value per item
    rows[A * C + r], nrows[A]            per architecture the classes it can run,
                                         densest first
    on[G * C + c], left[C]               items of each class per GPU, and pending
    tot[G]                               items per GPU
    work                                 scratch (see `scratch_size`)
"""

from __future__ import annotations

import logging
import os
import threading
import time
import types
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_CAND = 64  # the densest pending classes a GPU's knapsack considers
NODES = 300  # branch-and-bound nodes per GPU

# Scratch layout: cand, cav, cnt, best (C each), three bounds (C + 1 each, scaled), the
# stack (STACK_W entries a row).
STACK_W = 7
_INF = 1 << 62
GAINED = 1 << 40  # added to a round's effort when it improved the plan


def scratch_size(classes: int, items: int) -> int:
    """Length of the int64 scratch one call needs for `classes` classes of `items` items
    in all (placed and pending): the depth-first stack keeps at most q + 1 rows per
    level, q at most the class's items."""
    return 4 * classes + 3 * (classes + 1) + STACK_W * (items + classes + 1)


def _ratio_floor(v: int, n: int) -> int:
    """v / n as a fixed-point bound (2^20 units), or 'unbounded' where n is 0."""
    if n == 0:
        return _INF
    return (v << 20) // n + 1


def repack_gpu(g: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any, node_of: Any,
               arch_of: Any, need_c: Any, need_m: Any, need_k: Any, value: Any, rows: Any,
               nrows: Any, on: Any, left: Any, tot: Any, limit: int, work: Any) -> int:
    """Re-solve GPU g's knapsack: its own items and the pending ones, within compute,
    memory, the node's free cores and slots, by depth-first branch and bound over
    classes (the most of each first) in at most `limit` nodes. The GPU keeps the filling
    of most value (its own unless strictly beaten). Returns the cost: nodes searched,
    candidate classes and the classes walked (C), negated when nothing improved."""
    a = arch_of[g]
    node = node_of[g]
    base = a * C
    row0 = g * C
    old_value = 0
    for c in range(C):
        k = on[row0 + c]
        if k:
            comp[g] += k * need_c[base + c]
            mem[g] += k * need_m[base + c]
            slots[g] += k
            cores[node] += k * need_k[base + c]
            old_value += k * value[c]
    cap_c = comp[g]
    cap_m = mem[g]
    cap_k = cores[node]
    cap_s = slots[g]
    cand = 0  # offsets into work
    cav = C
    cnt = 2 * C
    best = 3 * C
    per_c = 4 * C
    per_m = per_c + C + 1
    per_k = per_m + C + 1
    st = per_k + C + 1
    m = 0
    stop = nrows[a]
    for r in range(nrows[a]):
        c = rows[base + r]
        avail = left[c]
        held = on[row0 + c]
        if (avail or held) and need_c[base + c] <= cap_c and need_m[base + c] <= cap_m \
                and need_k[base + c] <= cap_k:
            if m < MAX_CAND:
                work[cand + m] = c
                work[cav + m] = avail + held
                m += 1
                if m == MAX_CAND:
                    stop = r + 1
                    break
    # The GPU's own classes always stay candidates: its old filling stays reachable.
    for r in range(stop, nrows[a]):
        c = rows[base + r]
        held = on[row0 + c]
        if held and need_c[base + c] <= cap_c and need_m[base + c] <= cap_m \
                and need_k[base + c] <= cap_k:
            work[cand + m] = c
            work[cav + m] = left[c] + held
            m += 1
    # Upper bound from position i on: what the tightest resource left could hold at the
    # best value per unit of it among the remaining classes (fixed point, rounded up).
    work[per_c + m] = 0
    work[per_m + m] = 0
    work[per_k + m] = 0
    for i in range(m - 1, -1, -1):
        c = work[cand + i]
        v = value[c]
        work[per_c + i] = max(work[per_c + i + 1], _ratio_floor(v, need_c[base + c]))
        work[per_m + i] = max(work[per_m + i + 1], _ratio_floor(v, need_m[base + c]))
        work[per_k + i] = max(work[per_k + i + 1], _ratio_floor(v, need_k[base + c]))
    for i in range(m):
        work[cnt + i] = 0
    best_value = old_value
    found = False
    nodes = 0
    sp = 0
    work[st] = 0
    work[st + 1] = 0
    work[st + 2] = cap_c
    work[st + 3] = cap_m
    work[st + 4] = cap_k
    work[st + 5] = cap_s
    work[st + 6] = -1
    sp = 1
    while sp and nodes < limit:
        sp -= 1
        o = st + sp * STACK_W
        i = work[o]
        val = work[o + 1]
        rc = work[o + 2]
        rm = work[o + 3]
        rk = work[o + 4]
        rs = work[o + 5]
        k = work[o + 6]
        if k >= 0:
            work[cnt + i - 1] = k
            for j in range(i, m):
                work[cnt + j] = 0
        nodes += 1
        if val > best_value:
            best_value = val
            found = True
            for j in range(m):
                work[best + j] = work[cnt + j] if j < i else 0
        if i == m:
            continue
        bound = _bound(rc, work[per_c + i])
        b = _bound(rm, work[per_m + i])
        if b < bound:
            bound = b
        b = _bound(rk, work[per_k + i])
        if b < bound:
            bound = b
        if val + bound <= best_value:
            continue
        c = work[cand + i]
        nc = need_c[base + c]
        nm = need_m[base + c]
        nk = need_k[base + c]
        v = value[c]
        q = work[cav + i]
        if rs < q:
            q = rs
        if nc and rc // nc < q:
            q = rc // nc
        if nm and rm // nm < q:
            q = rm // nm
        if nk and rk // nk < q:
            q = rk // nk
        for kk in range(q + 1):  # pushed last is explored first: the most of it
            o = st + sp * STACK_W
            work[o] = i + 1
            work[o + 1] = val + kk * v
            work[o + 2] = rc - kk * nc
            work[o + 3] = rm - kk * nm
            work[o + 4] = rk - kk * nk
            work[o + 5] = rs - kk
            work[o + 6] = kk
            sp += 1
    if not found:
        for c in range(C):
            k = on[row0 + c]
            if k:
                comp[g] -= k * need_c[base + c]
                mem[g] -= k * need_m[base + c]
                slots[g] -= k
                cores[node] -= k * need_k[base + c]
        return -(nodes + m + C)
    for c in range(C):
        left[c] += on[row0 + c]
        on[row0 + c] = 0
    total = 0
    for i in range(m):
        k = work[best + i]
        if k:
            c = work[cand + i]
            on[row0 + c] = k
            left[c] -= k
            total += k
            comp[g] -= k * need_c[base + c]
            mem[g] -= k * need_m[base + c]
            slots[g] -= k
            cores[node] -= k * need_k[base + c]
    tot[g] = total
    return nodes + m + C


def _bound(r: int, per: int) -> int:
    """What `r` units left could still hold at `per` value a unit (fixed point)."""
    if per >= _INF:  # a class that needs none of it: no bound from this resource
        return _INF
    if r <= 0:
        return 0
    # r * per / 2^20 in two parts, so that no product leaves int64 when compiled (per
    # is up to value x 2^20, and r a GPU's MiB or compute units).
    return r * (per >> 20) + ((r * (per & 0xFFFFF)) >> 20)


def _held(g: int, C: int, value: Any, on: Any) -> int:
    total = 0
    row0 = g * C
    for c in range(C):
        total += on[row0 + c] * value[c]
    return total


def _move(g: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any, node_of: Any,
          arch_of: Any, need_c: Any, need_m: Any, need_k: Any, on: Any, left: Any,
          tot: Any, counts: Any, off: int) -> None:
    """Make GPU g hold `counts[off:off + C]`: what it gives up goes to the pending pool,
    what it gains comes from it."""
    base = arch_of[g] * C
    node = node_of[g]
    row0 = g * C
    n = 0
    for c in range(C):
        k = counts[off + c] - on[row0 + c]
        if k:
            comp[g] -= k * need_c[base + c]
            mem[g] -= k * need_m[base + c]
            slots[g] -= k
            cores[node] -= k * need_k[base + c]
            left[c] -= k
            on[row0 + c] = counts[off + c]
        n += counts[off + c]
    tot[g] = n


def pairs_row(g: int, G: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any,
              node_of: Any, arch_of: Any, need_c: Any, need_m: Any, need_k: Any, value: Any,
              rows: Any, nrows: Any, on: Any, left: Any, tot: Any, budget: int,
              work: Any, saved: Any) -> int:
    """Every pair (g, h), h != g, in order: both GPUs emptied, then filled in turn (g,
    then h) by `repack_gpu` from the pending pool; put back as they were if the two
    then hold less value (equal is kept: it opens other pairs). Stops before a pair once
    `budget` is spent. Returns the effort spent, plus GAINED if a pair gained."""
    spent = 0
    gained = 0
    zero = 2 * C  # saved[2C:3C] stays all zeros: the counts of an emptied GPU
    for h in range(G):
        if h == g or (tot[g] == 0 and tot[h] == 0):
            continue
        if spent >= budget:
            break
        old = _held(g, C, value, on) + _held(h, C, value, on)
        for c in range(C):
            saved[c] = on[g * C + c]
            saved[C + c] = on[h * C + c]
        _move(g, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k, on,
              left, tot, saved, zero)
        _move(h, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k, on,
              left, tot, saved, zero)
        spent += C  # the pair's own walks over the classes
        for x in (g, h):
            cost = repack_gpu(x, C, comp, mem, slots, cores, node_of, arch_of, need_c,
                              need_m, need_k, value, rows, nrows, on, left, tot, NODES, work)
            spent += cost if cost > 0 else -cost
        new = _held(g, C, value, on) + _held(h, C, value, on)
        if new < old:  # back as they were (a pool or node count may dip in between)
            _move(g, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k,
                  on, left, tot, saved, 0)
            _move(h, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k,
                  on, left, tot, saved, C)
        elif new > old:
            gained = 1
    return spent + gained * GAINED


def repack_round(G: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any,
                 node_of: Any, arch_of: Any, need_c: Any, need_m: Any, need_k: Any,
                 value: Any, rows: Any, nrows: Any, on: Any, left: Any, tot: Any,
                 budget: int, work: Any, solved_at: Any, changes: Any) -> int:
    """One round of `repack_gpu` over the GPUs that hold items, skipping those solved
    without gain since the pending pool last changed (`changes[0]` counts the gains,
    `solved_at[g]` its value when g last gained nothing). Stops before a GPU once
    `budget` is spent. Returns the effort spent, plus GAINED if a GPU improved."""
    spent = 0
    gained = 0
    for g in range(G):
        if tot[g] == 0 or solved_at[g] == changes[0]:
            continue
        if spent >= budget:
            break
        limit = budget - spent
        if limit > NODES:
            limit = NODES
        cost = repack_gpu(g, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m,
                          need_k, value, rows, nrows, on, left, tot, limit, work)
        if cost > 0:
            spent += cost
            changes[0] += 1
            gained = 1
        else:
            spent -= cost
            solved_at[g] = changes[0]
    return spent + gained * GAINED


_lock = threading.Lock()
_compiled: dict[str, Callable[..., int]] = {}
_state = "unknown"  # "unknown", "compiling", "ready", "missing"
ROUNDS = ("pairs_row", "repack_round")


def compile_now() -> bool:
    """Compile the rounds: about 9 s on a 2-core machine the first time, 1-2 s for a
    later process, which loads numba's cache from disk. False where numba is missing,
    fails, or HYPERSACK_KERNELS=plain is set. Safe from any thread: a second caller
    while the first compiles returns False at once."""
    global _state
    with _lock:
        if _state != "unknown":
            return _state == "ready"
        _state = "compiling"
    plain = os.environ.get("HYPERSACK_KERNELS", "") == "plain"
    fns = {} if plain else _compile()
    with _lock:
        _compiled.update(fns)
        _state = "ready" if fns else "missing"
    return bool(fns)


def _compile() -> dict[str, Callable[..., int]]:
    """The compiled rounds, or none where numba is missing or fails."""
    try:
        import numba
        import numpy as np
    except ImportError:
        return {}
    began = time.monotonic()
    log.info("compiling pack's knapsack kernels with numba (about 9 s the first time on a "
             "machine, 1-2 s after, from numba's cache)")
    # Cached on disk where the package's folder (or numba's cache folder) is writable;
    # compiled in memory where it is not.
    for cache in (True, False):
        try:
            fns = _jit(numba.njit(cache=cache, nogil=True))
            # A call on a one-class, two-GPU cluster compiles them (or loads them).
            _smoke(fns, np)
        except Exception:  # a failed compile or cache: the plain path serves
            log.warning("the compiled knapsack kernels failed (cache=%s)", cache,
                        exc_info=True)
            continue
        log.info("pack's knapsack kernels compiled in %.1f s", time.monotonic() - began)
        return fns
    return {}


def _jit(jit: Callable[[Any], Callable[..., int]]) -> dict[str, Callable[..., int]]:
    """Copies of the functions that call each other's compiled forms: the plain ones
    stay plain for the fallback."""
    space = dict(globals())
    for name in ("_ratio_floor", "_bound", "_held", "_move", "repack_gpu", *ROUNDS):
        plain = globals()[name]
        space[name] = jit(types.FunctionType(plain.__code__, space, name))
    return {name: space[name] for name in ROUNDS}


def _smoke(fns: dict[str, Callable[..., int]], np: Any) -> None:
    def z(n: int) -> Any:
        return np.zeros(n, dtype=np.int64)
    G, C = 2, 1
    common = (z(G), z(G), z(G), z(1), z(G), z(G), z(C), z(C), z(C), z(C), z(C), z(1),
              z(G * C), z(C), z(G))
    work = z(scratch_size(C, 1))
    fns["pairs_row"](0, G, C, *common, 0, work, z(3 * C))
    fns["repack_round"](G, C, *common, 0, work, z(G) - 1, z(1))


def compiled(name: str) -> Callable[..., int] | None:
    """The compiled round `name`, or None where it cannot be compiled or is being
    compiled in the background: the plain rounds serve then, with the same plans. The
    first ask in a process compiles it there and then (about 1-2 s from numba's cache,
    9 s the first time on a machine), or, after `in_background()`, in a background
    thread while the plain rounds serve."""
    fn = _compiled.get(name)
    if fn is None and _state == "unknown":
        if _background:
            threading.Thread(target=compile_now, name="hypersack-kernels", daemon=True).start()
        else:
            compile_now()
            fn = _compiled.get(name)
    return fn


_background = False


def in_background() -> None:
    """Compile on the first ask in a background thread, so that no decision waits for it
    (the server: its decisions run the plain rounds meanwhile). A process that never
    asks (no `pack` or `auto` decision) never pays for numba's import or memory."""
    global _background
    _background = True
