"""A stand-in for the server's simulation process (`OrchestratorConfig.foresight_pool`):
its calls end when a test says, so that a test can see what happens meanwhile."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

Call = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]


class HeldPool(Executor):
    """A pool whose calls end when the test says (`finish`)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.calls.append((future, fn, args))
        return future

    @property
    def simulations(self) -> list[Call]:
        """The calls but the trivial one that readies the pool (`bool()`)."""
        return [c for c in self.calls if c[1] is not bool]

    def finish(self) -> None:
        """Run every call not yet ended, here and now."""
        for future, fn, args in self.calls:
            if not future.done():
                try:
                    future.set_result(fn(*args))
                except Exception as exc:
                    future.set_exception(exc)
