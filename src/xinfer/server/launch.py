"""`serve(config, args)`: binds the API port (and, with --ui-server, port + 1 for the chat
page) before anything else, so a busy port fails at once and /health answers 503 "loading"
while the model loads in a background thread; then serves until a signal. SIGTERM / SIGINT
stop accepting, let open streams finish for --shutdown-grace-s seconds, then abort them; a
second signal exits at once."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import uvicorn

from xinfer import envs
from xinfer.cli_args import ServerArgs
from xinfer.config import EngineConfig
from xinfer.engine.async_engine import AsyncEngine
from xinfer.errors import UserError
from xinfer.server.app import attach_engine, build_app
from xinfer.server.page import build_ui_app

logger = logging.getLogger("xinfer")
DEFAULT_SHUTDOWN_GRACE_S = 5.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; a port in use is a `UserError` naming the fix."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}; check --host") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(
            f"cannot listen on {host}:{port} ({e.strerror}); stop what uses it or pick another "
            "port with --port"
        ) from None
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn.Server without its own signal handling: `serve` stops all servers at once."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _load_engine(config: EngineConfig) -> AsyncEngine:
    from xinfer.engine.engine import Engine

    engine = Engine(config, show_progress=True)
    if engine.tokenizer is not None:
        try:
            engine.grammar_compiler.warm_up()  # structured output's tables, before a user waits
        except UserError as e:
            logger.warning("%s; requests with response_format or forced tool calls get a 400", e)
    return AsyncEngine(engine, config.scheduler.max_waiting).start()


async def _run(
    servers: list[tuple[uvicorn.Server, socket.socket]],
    load,
    on_loaded,
    grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
) -> tuple[AsyncEngine | None, BaseException | None]:
    """Serve on the bound sockets while `load()` runs in a daemon thread (a signal during a
    long load must not wait for it); returns (the engine or None, the load's error). After a
    signal, open requests get `grace_s` seconds; then the engine stops, which ends each open
    stream with an error event and [DONE] (uvicorn cancels whatever is left a second later)."""
    loop = asyncio.get_running_loop()
    loaded: asyncio.Future = loop.create_future()
    signals_seen = 0
    engine: AsyncEngine | None = None

    def stop_engine() -> None:
        if engine is not None:
            loop.run_in_executor(None, engine.stop)

    def stop_all() -> None:
        for s, _ in servers:
            s.should_exit = True

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            logger.warning("second signal: exiting now")
            os._exit(128 + signum)
        logger.info("shutting down: open requests get %.1f s (signal again to quit now)", grace_s)
        stop_all()
        loop.call_later(grace_s, stop_engine)

    def settle(result, error) -> None:
        if not loaded.done():
            loaded.set_result((result, error))

    def load_in_thread() -> None:
        try:
            result, error = load(), None
        except BaseException as e:  # noqa: BLE001 - handed to the loop
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is gone: we are exiting
            loop.call_soon_threadsafe(settle, result, error)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
    threading.Thread(target=load_in_thread, name="xinfer-load", daemon=True).start()
    tasks = [asyncio.ensure_future(s.serve(sockets=[sock])) for s, sock in servers]
    error = None
    try:
        pending = set(tasks) | {loaded}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if loaded in done:
                engine, error = loaded.result()
                if error is not None:
                    stop_all()
                elif not any(s.should_exit for s, _ in servers):
                    on_loaded(engine)
            if any(t in done for t in tasks):  # a server stopped: stop the others too
                stop_all()
                await asyncio.gather(*tasks, return_exceptions=True)
                break
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    return engine, error


def serve(config: EngineConfig, args: ServerArgs | argparse.Namespace) -> None:
    api_key = args.value("api_key") if hasattr(args, "value") else getattr(args, "api_key", None)
    api_key = api_key or envs.XINFER_API_KEY()
    host, port = args.host, args.port
    grace = getattr(args, "shutdown_grace_s", None)
    grace = DEFAULT_SHUTDOWN_GRACE_S if grace is None else grace
    if grace < 0:
        raise UserError("--shutdown-grace-s must be >= 0")
    model_name = getattr(args, "served_model_name", None) or Path(config.model).name
    if not is_loopback(host) and not api_key:
        logger.warning(
            "listening on %s without an API key: anyone who can reach this port can use the "
            "model; pass --api-key KEY (or set XINFER_API_KEY) or --host 127.0.0.1",
            host,
        )
    with_ui = getattr(args, "ui_server", False)
    sockets = [bind_socket(host, port)]  # before the model loads: a busy port fails at once
    if with_ui:
        try:
            sockets.append(bind_socket(host, port + 1))
        except UserError:
            sockets[0].close()
            raise
    app = build_app(None, model_name, api_key)
    log_level = logging.getLevelName(logging.getLogger().level).lower()
    uv_level = log_level if log_level in ("debug", "info", "warning", "error") else "info"
    apps = [app] + ([build_ui_app(port)] if with_ui else [])
    servers = [
        (
            _Server(
                uvicorn.Config(
                    a,
                    log_level=uv_level,
                    access_log=False,
                    timeout_graceful_shutdown=grace + 1,  # a backstop: the engine stops first
                    lifespan="off",
                )
            ),
            sock,
        )
        for a, sock in zip(apps, sockets)
    ]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    logger.info("port %d open; loading %s (/health answers 503 until ready)", port, model_name)

    def on_loaded(engine: AsyncEngine) -> None:
        attach_engine(app, engine)
        logger.info("serving %s: OpenAI API on http://%s:%d/v1", model_name, shown, port)
        logger.info("chat page on http://%s:%d/", shown, port)
        if with_ui:
            logger.info("chat page also on http://%s:%d/", shown, port + 1)

    engine, error = None, None
    try:
        load = lambda: _load_engine(config)  # noqa: E731
        engine, error = asyncio.run(_run(servers, load, on_loaded, grace))
    finally:
        if engine is not None:
            engine.stop()
        for sock in sockets:
            sock.close()
    if error is not None:
        raise error
    # Everything is shut down; skip the interpreter's teardown of torch and friends, which
    # takes seconds on a busy machine and would stretch the promised grace + 2 s.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
