"""The engine behind the server: one background thread owns the (not thread-safe) `Engine`
and loops `step()` while there is work. Requests, aborts and snapshot calls arrive through a
thread-safe command list and are applied at step boundaries; outputs go back to each
caller's asyncio queue via `loop.call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from xinfer.engine.engine import Engine
from xinfer.engine.prefix_cache import PrefixCacheStats
from xinfer.engine.request import RequestMetrics, RequestOutput
from xinfer.errors import UserError
from xinfer.sampling import SamplingParams

logger = logging.getLogger("xinfer")


class QueueFullError(RuntimeError):
    """The bounded waiting queue is full; the server answers 503."""


class EngineError(RuntimeError):
    """An internal error in the engine step failed this request; the server answers 500."""


class EngineStopped(EngineError):
    """The engine was stopped (server shutdown) before this request finished: 503."""


class EngineObserver(Protocol):
    """Receives per-request timings (the server's Prometheus metrics implement it)."""

    def on_first_token(self, seconds: float) -> None: ...
    def on_inter_token(self, seconds: float) -> None: ...
    def on_finish(self, num_prompt: int, num_output: int, reason: str | None) -> None: ...
    def on_request_metrics(self, metrics: RequestMetrics) -> None: ...


@dataclass
class EngineSnapshot:
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks in use
    offload: dict | None  # offload_manager.stats(), or None without offload
    prefix_cache: PrefixCacheStats | None = None  # None when prefix caching is off
    num_preemptions: int = 0  # since start


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    def __init__(
        self, engine: Engine, max_waiting: int | None = None, observer: EngineObserver | None = None
    ) -> None:
        self.engine = engine
        self.max_waiting = max_waiting or engine.config.scheduler.max_waiting
        self.observer = observer
        self._cv = threading.Condition()
        self._commands: list[tuple[str, Any]] = []  # guarded by _cv
        self._streams: dict[str, _Stream] = {}  # guarded by _cv
        self._num_pending_adds = 0  # submitted, not yet in the scheduler; guarded by _cv
        self._num_waiting = 0  # scheduler.waiting after the last step (engine thread writes)
        self._is_stopped = False
        self._thread = threading.Thread(target=self._run, name="xinfer-engine", daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cv:
            self._is_stopped = True
            self._cv.notify()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.engine.close()  # tensor parallel: stop the other ranks (else a no-op)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._is_stopped

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_tokens(self) -> int:
        return self.engine.kv_tokens

    @property
    def num_state_slots(self) -> int:
        return self.engine.num_state_slots

    # ---- the caller side (asyncio) ---------------------------------------------------------
    def _submit(self, kind: str, payload: Any) -> None:
        with self._cv:
            self._commands.append((kind, payload))
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone); its KV blocks are freed at the next step boundary."""
        with self._cv:
            self._streams.pop(request_id, None)
        self._submit("abort", request_id)

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run `fn(engine)` on the engine thread at a step boundary and return its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit("call", (fn, loop, future))
        return await future

    async def snapshot(self) -> EngineSnapshot:
        def take(e: Engine) -> EngineSnapshot:
            s = e.scheduler
            prefix = e.prefix_cache_stats()
            return EngineSnapshot(
                len(s.running),
                len(s.waiting),
                e.allocator.usage,
                e.offload_stats(),
                None if prefix is None else replace(prefix),  # a copy: the engine counts on
                s.num_preemptions,
            )

        snap = await self.call(take)
        with self._cv:
            snap.num_waiting += self._num_pending_adds
        return snap

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Stream the output deltas of one sequence (params.n is ignored here)."""
        outputs = self.generate_choices([prompt], [params], request_id)
        try:
            async for _, out in outputs:
                yield out
        finally:
            await outputs.aclose()  # closing this generator must abort at once, not at GC

    async def generate_choices(
        self, prompts: list[str | list[int]], params: list[SamplingParams], request_id: str
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Run one sub-request per (prompt, params) pair, yielding (index, delta) as they
        come. Leaving early (client disconnect, cancellation) aborts the unfinished ones."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        index = {rid: i for i, rid in enumerate(ids)}
        with self._cv:
            if self._num_waiting + self._num_pending_adds + len(ids) > self.max_waiting:
                raise QueueFullError(
                    f"the server's waiting queue is full ({self.max_waiting}); retry later"
                )
            if self._is_stopped:
                raise EngineError("the engine is shutting down")
            for rid in ids:
                self._streams[rid] = _Stream(loop, queue)
            self._num_pending_adds += len(ids)
            self._commands.append(("add", (ids, prompts, params)))
            self._cv.notify()
        unfinished = set(ids)
        start = time.perf_counter()
        last: dict[str, float] = {}
        counts: dict[str, tuple[int, int]] = {}  # (prompt, output) tokens seen per request
        try:
            while unfinished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                now = time.perf_counter()
                if self.observer is not None and item.new_token_ids:
                    if item.request_id in last:
                        self.observer.on_inter_token(now - last[item.request_id])
                    else:
                        self.observer.on_first_token(now - start)
                last[item.request_id] = now
                counts[item.request_id] = (item.num_prompt_tokens, item.num_output_tokens)
                if item.finished:
                    unfinished.discard(item.request_id)
                    if self.observer is not None:
                        self.observer.on_finish(
                            item.num_prompt_tokens, item.num_output_tokens, item.finish_reason
                        )
                        if item.metrics is not None:
                            self.observer.on_request_metrics(item.metrics)
                yield index[item.request_id], item
        finally:
            for rid in unfinished:
                self.abort(rid)
                if self.observer is not None:
                    self.observer.on_finish(*counts.get(rid, (0, 0)), "abort")

    # ---- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._commands and not self._is_stopped and not self._has_work():
                    self._cv.wait()
                if self._is_stopped:
                    self._fail_all(EngineStopped("the server is shutting down"))
                    return
                commands, self._commands = self._commands, []
            for kind, payload in commands:
                self._apply(kind, payload)
            if not self._has_work():
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - fail in-flight requests, keep serving
                logger.exception("engine step failed; failing all in-flight requests")
                self._recover(e)
                continue
            self._num_waiting = len(self.engine.scheduler.waiting)
            self._deliver([(o.request_id, o) for o in outputs])

    def _has_work(self) -> bool:
        return self.engine.has_unfinished()

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "abort":
            self.engine.abort_request(payload)
        elif kind == "call":
            fn, loop, future = payload
            try:
                result, error = fn(self.engine), None
            except Exception as e:  # noqa: BLE001 - handed to the caller
                result, error = None, e
            loop.call_soon_threadsafe(_settle, future, result, error)
        elif kind == "add":
            ids, prompts, params = payload
            added: list[str] = []
            try:
                for rid, prompt, p in zip(ids, prompts, params):
                    with self._cv:
                        if rid not in self._streams:  # aborted before it was added
                            continue
                    self.engine.add_request(prompt, p, rid)
                    added.append(rid)
            except Exception as e:  # noqa: BLE001 - UserError → 400, others → 500
                for rid in added:
                    self.engine.abort_request(rid)
                error = e if isinstance(e, UserError) else EngineError(str(e))
                self._deliver([(rid, error) for rid in ids])
            finally:
                with self._cv:
                    self._num_pending_adds -= len(ids)
                self._num_waiting = len(self.engine.scheduler.waiting)

    def _deliver(self, items: list[tuple[str, Any]]) -> None:
        """Hand outputs (or exceptions) to their callers, one loop callback per loop."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        with self._cv:
            for rid, item in items:
                stream = self._streams.get(rid)
                if stream is None:  # aborted meanwhile
                    continue
                if isinstance(item, BaseException) or item.finished:
                    del self._streams[rid]
                batches.setdefault(stream.loop, []).append((stream.queue, item))
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the caller's loop is closed
                pass

    def _recover(self, error: Exception) -> None:
        for rid in list(self.engine.requests):
            try:
                self.engine.abort_request(rid)
            except Exception:  # noqa: BLE001
                logger.exception("could not abort %s after a failed step", rid)
        self._fail_all(EngineError(f"internal engine error: {error}"))

    def _fail_all(self, error: Exception) -> None:
        with self._cv:
            ids = list(self._streams)
        self._deliver([(rid, error) for rid in ids])


def _put_all(batch: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


def _settle(future: asyncio.Future, result: Any, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
