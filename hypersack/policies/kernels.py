"""Where `improve`'s knapsack moves (`knapsack`) run: compiled by numba where it is
installed, as the same source in plain Python where it is not.

`compiled(name)` gives a round compiled, or None where the plain one must serve (numba
missing or failing, HYPERSACK_KERNELS=plain, or a compile under way in the background);
the functions of `knapsack` are also importable from here, so that `kernels.NAME` is the
plain round of that name.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from hypersack.policies import knapsack
from hypersack.policies.knapsack import (
    GAINED,
    kicks,
    pairs_row,
    repack_gpu,
    repack_round,
    scratch_size,
    snap_size,
)

__all__ = ["GAINED", "ROUNDS", "compile_now", "compiled", "in_background", "kicks",
           "pairs_row", "repack_gpu", "repack_round", "scratch_size", "snap_size"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_compiled: dict[str, Callable[..., int]] = {}
_state = "unknown"  # "unknown", "compiling", "ready", "missing"
ROUNDS = ("pairs_row", "repack_round", "kicks")


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
    space = dict(vars(knapsack))
    for name in ("_ratio_floor", "_bound", "_held", "_move", "repack_gpu", "_pair", "_lcg",
                 "_keep", *ROUNDS):
        plain = getattr(knapsack, name)
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
    fns["kicks"](G, C, *common, 0, work, z(3 * C), z(snap_size(2, C)), z(C), z(2), 1, 2, 1, 1,
                 z(4))


def compiled(name: str) -> Callable[..., int] | None:
    """The compiled round `name`, or None where it cannot be compiled or is being
    compiled in the background: the plain rounds serve then, with the same plans. The
    first ask in a process compiles it there and then (about 1-2 s from numba's cache,
    9 s the first time on a machine), or, after `in_background()`, in a background
    thread while the plain rounds serve."""
    fn = _compiled.get(name)
    if fn is None and _state == "unknown":
        if _background:
            # Not a daemon: a process that ends mid-compile waits for it (at most the
            # compile's ~9 s) rather than tear LLVM down under it, which aborts the
            # process (an LLVM assertion, exit 134) after its work is done.
            threading.Thread(target=compile_now, name="hypersack-kernels").start()
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
