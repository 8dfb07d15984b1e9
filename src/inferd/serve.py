"""Run the server: the core, its front ends, signal handling and a graceful drain."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd.core.server import InferenceServer
from inferd.frontends.http import HttpServer
from inferd.frontends.kserve_http import KServeHttp

log = logging.getLogger("inferd")


@dataclass
class ServeOptions:
    repositories: list[Path] = field(default_factory=list)
    host: str = "0.0.0.0"
    http_port: int = 8000
    #: KServe V2 gRPC (Triton's GRPCInferenceService); off with allow_grpc=False
    grpc_port: int = 8001
    allow_grpc: bool = True
    #: Prometheus metrics at GET /metrics (as Triton's --metrics-port); off with allow_metrics=False
    metrics_port: int = 8002
    allow_metrics: bool = True
    strict_readiness: bool = True
    max_request_size: int = 64 * 1024 * 1024
    drain_timeout: float = 30.0
    #: Triton's --model-control-mode: none, poll or explicit
    model_control_mode: str = "none"
    #: explicit mode: the models to load at start ("*": all)
    load_models: list[str] = field(default_factory=list)
    #: poll mode: seconds between repository scans
    repository_poll_secs: float = 15.0


async def serve(options: ServeOptions, started: asyncio.Event | None = None) -> int:
    core = InferenceServer(
        options.repositories,
        strict_readiness=options.strict_readiness,
        control_mode=options.model_control_mode,
        load_models=options.load_models,
        poll_secs=options.repository_poll_secs,
        drain_timeout=options.drain_timeout,
    )
    http = HttpServer(KServeHttp(core), options.host, options.http_port, options.max_request_size)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    # Every front end listens before the models load, so liveness answers while they do
    # (readiness waits for them); HTTP last: once it answers, all of them accept.
    frontends: list[tuple[str, Any]] = []
    grpc_server: Any = None
    if options.allow_grpc:
        from inferd.frontends.kserve_grpc import KServeGrpc  # grpc is imported only when served

        grpc_server = KServeGrpc(core, options.host, options.grpc_port, options.max_request_size)
        frontends.append(("KServe V2 gRPC", grpc_server))
    metrics: HttpServer | None = None
    if options.allow_metrics:
        from inferd.frontends.metrics import MetricsHttp  # prometheus_client is imported only when served

        metrics = HttpServer(MetricsHttp(core), options.host, options.metrics_port, 64 * 1024, direct_writes=False)
        frontends.append(("Prometheus metrics", metrics))
    frontends.append(("KServe V2 HTTP", http))
    for index, (label, frontend) in enumerate(frontends):
        try:
            await frontend.start()
        except OSError as exc:
            log.error("%s cannot listen on %s:%d: %s", label, options.host, frontend.port, exc)
            for _, started_frontend in frontends[:index]:
                await started_frontend.drain(0)
            return 1
        log.info("%s listening on %s:%d", label, options.host, frontend.port)
    await core.start()
    for row in core.index():
        log.info(
            "model %-24s %-8s %s",
            row["name"] + (":" + row["version"] if "version" in row else ""),
            row["state"],
            row["reason"],
        )
    log.info("model control mode: %s", options.model_control_mode)
    log.info("server %s", "ready" if core.ready else "started, NOT ready (a model failed to load)")
    if started is not None:
        started.set()
    await stop.wait()
    log.info("shutting down: draining in-flight requests (up to %.0fs)", options.drain_timeout)
    core.accepting = False
    drains = [http.drain(options.drain_timeout)]
    if grpc_server is not None:
        drains.append(grpc_server.drain(options.drain_timeout))
    drained = all(await asyncio.gather(*drains))
    if metrics is not None:
        await metrics.drain(0)
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
