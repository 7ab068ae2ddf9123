"""Serving on grpc.aio: the event loop in a thread of its own, and the blocking servicers
on a thread pool beside it.

Agent streams are served on the loop itself (servicers.AgentLinkServicer.Connect is a
coroutine), so 200 agents cost no thread each; the synchronous grpc server held two per
agent (a handler writing and a reader), and switching among ~400 threads cost the
server's event worker time. Client calls are short and take the service's lock, so they
run, unchanged, on a pool (`offloaded`): the loop never waits for the lock.

grpc.aio can run synchronous handlers itself (`migration_thread_pool`), but its
synchronous context's abort() does not stop the handler on every grpcio release, and
is_active()/add_callback() do not exist there; `CallContext` gives the handlers what they
use of a context, with those meanings.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from hypersack.server.threads import name_os_thread

T = TypeVar("T")


class Aborted(Exception):
    """A handler ended its call with a status (CallContext.abort)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """What a synchronous handler uses of its call's context, for a call served on the
    loop: abort() raises (nothing after it runs); is_active() turns false, and the
    callbacks run, once the call ends or the client goes away."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._metadata = context.invocation_metadata()
        self._auth = context.auth_context()
        self._peer = context.peer()
        self._active = True
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def invocation_metadata(self) -> Any:
        return self._metadata

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        return self._auth

    def peer(self) -> str:
        return self._peer

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)

    def is_active(self) -> bool:
        return self._active

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if self._active:
                self._callbacks.append(callback)
                return True
        return False

    def end(self) -> None:
        with self._lock:
            self._active = False
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()


_END = object()


def _unary(fn: Callable[[Any, CallContext], Any], pool: futures.Executor
           ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Coroutine[Any, Any, Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        ctx = CallContext(context)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, request, ctx)
        except Aborted as exc:
            await context.abort(exc.code, exc.details)
        finally:
            ctx.end()
    return call


def _streaming(fn: Callable[[Any, CallContext], Iterator[Any]], pool: futures.Executor
               ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        # The generator runs in one pool thread from start to end (it may block, and a
        # generator is closed in the thread that ran it); its items reach the loop by a
        # queue.
        ctx = CallContext(context)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue()

        def put(item: Any, exc: BaseException | None = None) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, (item, exc))
            except RuntimeError:
                pass  # the loop is closed: the server stopped

        def pump() -> None:
            gen = fn(request, ctx)
            try:
                for item in gen:
                    if not ctx.is_active():
                        break
                    put(item)
            except BaseException as exc:  # handed to the loop, raised there
                put(_END, exc)
                return
            finally:
                close = getattr(gen, "close", None)
                if close is not None:
                    close()
            put(_END)

        pool.submit(pump)
        try:
            while True:
                item, exc = await items.get()
                if item is _END:
                    if isinstance(exc, Aborted):
                        await context.abort(exc.code, exc.details)
                    if exc is not None:
                        raise exc
                    return
                yield item
        finally:
            ctx.end()  # a handler waiting for news is woken, and its thread freed
    return call


def offloaded(servicer: object, service: ServiceDescriptor, pool: futures.Executor
              ) -> SimpleNamespace:
    """`servicer`'s synchronous handlers for `service`'s methods as coroutines (unary
    responses) and async generators (streamed responses) that run them on `pool`."""
    methods: dict[str, Any] = {}
    for m in service.methods:
        if m.client_streaming:
            raise TypeError(f"{service.name}.{m.name}: client streams are not offloaded")
        fn = getattr(servicer, m.name)
        methods[m.name] = _streaming(fn, pool) if m.server_streaming else _unary(fn, pool)
    return SimpleNamespace(**methods)


class Waker:
    """Runs callbacks on an event loop from other threads, with one wake-up of the loop
    (a write to its self-pipe) for all the callbacks asked for before it runs, however
    many streams they are for: the event worker's decision may queue launches for tens of
    agents at once. A callback asked for again before it ran runs once. While `held`,
    callbacks wait and the loop is woken once when the hold ends: a batch's
    acknowledgements and commands, however many, cost one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._due: dict[Callable[[], None], None] = {}  # in the order asked for
        self._scheduled = False  # the loop is asked to run what is due
        self._holds = 0

    def call(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._due[callback] = None
            if self._scheduled or self._holds:
                return
            self._scheduled = True
        self._schedule()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Callbacks asked for inside wait for its end (one wake-up for all of them)."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                go = not self._holds and bool(self._due) and not self._scheduled
                if go:
                    self._scheduled = True
            if go:
                self._schedule()

    def _schedule(self) -> None:
        try:
            try:
                on_loop = asyncio.get_running_loop() is self._loop
            except RuntimeError:  # another thread: no loop runs there
                on_loop = False
            if on_loop:
                # Asked on the loop itself (a heartbeat's acknowledgement on receipt): it
                # runs what is due next, without a write to its own self-pipe.
                self._loop.call_soon(self._run)
            else:
                self._loop.call_soon_threadsafe(self._run)
        except RuntimeError:
            pass  # the loop is closed: the server stopped

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, {}
            self._scheduled = False
        for callback in due:
            callback()


LAG_PERIOD_S = 0.05


async def watch_lag(observe: Callable[[float], None], period_s: float = LAG_PERIOD_S) -> None:
    """How late the loop runs a timer, every `period_s`, to `observe`: the time any
    message on the loop (an agent's report, a launch to send) waits behind the work
    queued before it. Runs until cancelled or the loop closes."""
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        await asyncio.sleep(period_s)
        observe(max(0.0, loop.time() - began - period_s))


class LoopThread:
    """An asyncio event loop running in a daemon thread; `run` waits for a coroutine on
    it from any other thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        name_os_thread()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def post(self, coro: Coroutine[Any, Any, Any]) -> futures.Future[Any] | None:
        """Start a coroutine on the loop without waiting for it: its future (cancel()
        cancels it), or None where the loop is closed."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # closed meanwhile
            coro.close()
            return None

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
