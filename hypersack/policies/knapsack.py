"""The knapsack moves of `improve`, over counts per GPU and class: one source, compiled
by numba where it is installed (`kernels` compiles them), run as plain Python where it
is not.

The functions below use only what numba's nopython mode and plain Python share: flat
int64 sequences indexed by position (a 1-D NumPy array when compiled, a list when not),
integer arithmetic and explicit loops. The rounds `pairs_row`, `repack_round` and
`kicks` are what `improve.pairs`, `improve.repack` and `improve.kicks` call; the same
call gives the same counts either way (tests/unit/test_kernels.py runs both).

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

from typing import Any

MAX_CAND = 64  # the densest pending classes a GPU's knapsack considers
NODES = 300  # branch-and-bound nodes per GPU
KICK_ROUNDS = 3  # rounds of pairs among a kick's GPUs

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
    depth = 0  # the counts at and past this level are all 0
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
            for j in range(i, depth):  # the counts past this node's level: stale
                work[cnt + j] = 0
            depth = i
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


def _pair(g: int, h: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any,
          node_of: Any, arch_of: Any, need_c: Any, need_m: Any, need_k: Any, value: Any,
          rows: Any, nrows: Any, on: Any, left: Any, tot: Any, work: Any,
          saved: Any, limit: int) -> int:
    """The pair (g, h): both GPUs emptied, then filled in turn (g, then h) by
    `repack_gpu` from the pending pool; put back as they were if the two then hold less
    value (equal is kept: it opens other pairs). Returns the effort spent, plus GAINED
    if the pair gained."""
    zero = 2 * C  # saved[2C:3C] stays all zeros: the counts of an emptied GPU
    old = _held(g, C, value, on) + _held(h, C, value, on)
    for c in range(C):
        saved[c] = on[g * C + c]
        saved[C + c] = on[h * C + c]
    _move(g, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k, on,
          left, tot, saved, zero)
    _move(h, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k, on,
          left, tot, saved, zero)
    spent = C  # the pair's own walks over the classes
    for x in (g, h):
        cost = repack_gpu(x, C, comp, mem, slots, cores, node_of, arch_of, need_c,
                          need_m, need_k, value, rows, nrows, on, left, tot, limit, work)
        spent += cost if cost > 0 else -cost
    new = _held(g, C, value, on) + _held(h, C, value, on)
    if new < old:  # back as they were (a pool or node count may dip in between)
        _move(g, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k,
              on, left, tot, saved, 0)
        _move(h, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m, need_k,
              on, left, tot, saved, C)
    elif new > old:
        return spent + GAINED
    return spent


def pairs_row(g: int, G: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any,
              node_of: Any, arch_of: Any, need_c: Any, need_m: Any, need_k: Any, value: Any,
              rows: Any, nrows: Any, on: Any, left: Any, tot: Any, budget: int,
              work: Any, saved: Any) -> int:
    """Every pair (g, h), h != g, in order (`_pair`). Stops before a pair once `budget`
    is spent. Returns the effort spent, plus GAINED if a pair gained."""
    spent = 0
    gained = 0
    for h in range(G):
        if h == g or (tot[g] == 0 and tot[h] == 0):
            continue
        if spent >= budget:
            break
        r = _pair(g, h, C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m,
                  need_k, value, rows, nrows, on, left, tot, work, saved, NODES)
        spent += r % GAINED
        if r >= GAINED:
            gained = 1
    return spent + gained * GAINED


def _lcg(s: int) -> int:
    """The next state of a Park-Miller generator (1 <= s < 2^31 - 1): products stay
    below 2^47, so compiled and plain give the same sequence."""
    return (s * 48271) % 2147483647


def _keep(k: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any, node_of: Any,
          on: Any, left: Any, tot: Any, picks: Any, snap: Any, back: bool) -> None:
    """Save into `snap` what moves among the GPUs `picks[:k]` can change (their rows,
    their nodes' cores, the pending pool), or restore it."""
    w = C + 5
    for j in range(k):
        g = picks[j]
        o = j * w
        if back:
            comp[g] = snap[o]
            mem[g] = snap[o + 1]
            slots[g] = snap[o + 2]
            tot[g] = snap[o + 3]
            cores[node_of[g]] = snap[o + 4]
            for c in range(C):
                on[g * C + c] = snap[o + 5 + c]
        else:
            snap[o] = comp[g]
            snap[o + 1] = mem[g]
            snap[o + 2] = slots[g]
            snap[o + 3] = tot[g]
            snap[o + 4] = cores[node_of[g]]
            for c in range(C):
                snap[o + 5 + c] = on[g * C + c]
    o = k * w
    for c in range(C):
        if back:
            left[c] = snap[o + c]
        else:
            snap[o + c] = left[c]


def snap_size(width: int, C: int) -> int:
    """Length of the snapshot `kicks` keeps: `width` GPUs' rows and the pool."""
    return width * (C + 5) + C


def kicks(G: int, C: int, comp: Any, mem: Any, slots: Any, cores: Any, node_of: Any,
          arch_of: Any, need_c: Any, need_m: Any, need_k: Any, value: Any, rows: Any,
          nrows: Any, on: Any, left: Any, tot: Any, budget: int, work: Any, saved: Any,
          snap: Any, noisy: Any, picks: Any, seed: int, width: int, noise: int,
          stall: int, state: Any) -> int:
    """Iterated local search once the pairs have converged, until `budget` is spent or
    `stall` kicks in a row gained nothing. A kick empties `width` GPUs drawn at random
    and refills each by its knapsack with every class's value perturbed by up to
    +-`noise` per mille (so the refill strays from the local optimum; with `state[3]`
    0, GPUs of one node each within their share of its free cores, else in turn), then
    re-solves the pairs among those GPUs (`_pair`, true values) until none gains (at
    most KICK_ROUNDS rounds). The plan is kept if those GPUs hold at least the value they
    held (equal value moves the search along a plateau), else put back. Only the drawn
    GPUs, their nodes' cores and the pool change, so a kick costs about width^2
    knapsacks whatever the cluster's size. `seed` fixes the draws: the same budget
    gives the same plan. `state` carries across calls: kicks since the last gain, kicks
    made, the last kick that gained, the way of refilling (read only). Returns the
    effort spent, plus GAINED if the plan holds more than it began with."""
    spent = 0
    gain = 0
    s = seed % 2147483646 + 1
    zero = 2 * C  # saved[2C:3C] stays all zeros (_pair)
    k = width if width < G else G
    while spent < budget and k > 1 and state[0] < stall:
        state[0] += 1
        state[1] += 1
        for j in range(k):
            while True:
                s = _lcg(s)
                g = s % G
                fresh = True
                for i in range(j):
                    if picks[i] == g:
                        fresh = False
                if fresh:
                    break
            picks[j] = g
        _keep(k, C, comp, mem, slots, cores, node_of, on, left, tot, picks, snap, False)
        before = 0
        for j in range(k):
            before += _held(picks[j], C, value, on)
        spent += k * (C + 5) + C
        for j in range(k):
            _move(picks[j], C, comp, mem, slots, cores, node_of, arch_of, need_c, need_m,
                  need_k, on, left, tot, saved, zero)
        for c in range(C):
            s = _lcg(s)
            noisy[c] = value[c] * (1000 - noise + s % (2 * noise + 1)) // 1000 + 1
        for j in range(k):
            # Sharing: the emptied GPUs of one node share its free cores, each refill
            # taking at most its share of what is left (the pairs after may move them),
            # so that where a node's cores bind the first refilled GPU does not starve
            # the others.
            node = node_of[picks[j]]
            hold = 0
            if state[3] == 0:
                later = 0
                for i in range(j + 1, k):
                    if node_of[picks[i]] == node:
                        later += 1
                hold = cores[node] * later // (later + 1)
            cores[node] -= hold
            cost = repack_gpu(picks[j], C, comp, mem, slots, cores, node_of, arch_of, need_c,
                              need_m, need_k, noisy, rows, nrows, on, left, tot, NODES,
                              work)
            cores[node] += hold
            spent += cost if cost > 0 else -cost
        for _ in range(KICK_ROUNDS):
            gained = 0
            for j in range(k):
                for i in range(k):
                    if i != j:
                        r = _pair(picks[j], picks[i], C, comp, mem, slots, cores, node_of,
                                  arch_of, need_c, need_m, need_k, value, rows, nrows, on,
                                  left, tot, work, saved, NODES)
                        spent += r % GAINED
                        if r >= GAINED:
                            gained = 1
            if gained == 0:
                break
        after = 0
        for j in range(k):
            after += _held(picks[j], C, value, on)
        spent += k * C
        if after > before:
            gain = 1
            state[0] = 0
            state[2] = state[1]
        elif after < before:
            _keep(k, C, comp, mem, slots, cores, node_of, on, left, tot, picks, snap, True)
    return spent + gain * GAINED


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
