"""Run the server: the core, its front ends, signal handling and a graceful drain."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from inferd.core.server import InferenceServer
from inferd.frontends.http import HttpServer
from inferd.frontends.kserve_http import KServeHttp

log = logging.getLogger("inferd")


@dataclass
class ServeOptions:
    repositories: list[Path] = field(default_factory=list)
    host: str = "0.0.0.0"
    http_port: int = 8000
    strict_readiness: bool = True
    max_request_size: int = 64 * 1024 * 1024
    drain_timeout: float = 30.0


async def serve(options: ServeOptions, started: asyncio.Event | None = None) -> int:
    sys.setswitchinterval(float(__import__("os").environ.get("INFERD_SWITCH", "0.005")))
    core = InferenceServer(options.repositories, strict_readiness=options.strict_readiness)
    http = HttpServer(KServeHttp(core), options.host, options.http_port, options.max_request_size)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    # Listen first so liveness answers while models load; readiness waits for them.
    await http.start()
    log.info("KServe V2 HTTP listening on %s:%d", options.host, http.port)
    await core.start()
    for row in core.index():
        log.info("model %-24s %-8s %s", row["name"] + (":" + row["version"] if "version" in row else ""), row["state"], row["reason"])
    log.info("server %s", "ready" if core.ready else "started, NOT ready (a model failed to load)")
    if started is not None:
        started.set()
    await stop.wait()
    log.info("shutting down: draining in-flight requests (up to %.0fs)", options.drain_timeout)
    core.accepting = False
    drained = await http.drain(options.drain_timeout)
    core.stop()
    log.info("stopped%s", "" if drained else " (some requests were still running)")
    return 0


def run(options: ServeOptions) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every platform we target
        return asyncio.run(serve(options))
    if sys.version_info >= (3, 12):
        return uvloop.run(serve(options))
    uvloop.install()
    return asyncio.run(serve(options))
