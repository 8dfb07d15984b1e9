"""The ``inferd`` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from inferd import __version__


def bundled_repository() -> Path:
    """The example model repository shipped inside the package."""
    return Path(__file__).resolve().parent / "examples" / "repository"


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve model repositories (the default command)")
    p.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        action="append",
        type=Path,
        metavar="DIR",
        help="Triton-layout model repository; repeat for several (default: the bundled examples)",
    )
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0, as Triton)")
    p.add_argument("--http-port", type=int, default=8000, help="KServe V2 REST port (default: 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="KServe V2 gRPC port (default: 8001, as Triton)")
    p.add_argument(
        "--allow-grpc",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="serve KServe V2 gRPC (Triton's GRPCInferenceService) next to REST (default: on, as Triton)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        help="Prometheus metrics port, GET /metrics (default: 8002, as Triton)",
    )
    p.add_argument(
        "--allow-metrics",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="serve Prometheus metrics on --metrics-port (default: on, as Triton)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity")
    p.add_argument(
        "--strict-readiness",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="ready only when every model loaded (default: on, as Triton)",
    )
    p.add_argument(
        "--max-request-size", type=int, default=64 * 1024 * 1024, metavar="BYTES", help="largest request body accepted"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/Ctrl-C, how long in-flight requests may take to finish",
    )
    _control_parser(p)


def _poll_secs(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _control_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-control-mode",
        default="none",
        choices=["none", "poll", "explicit"],
        help="none: load every model at start (default); poll: also rescan the repositories and "
        "load/reload/unload what changed; explicit: load only --load-model models, then what "
        "the repository API (load/unload) asks for (as Triton)",
    )
    p.add_argument(
        "--load-model",
        dest="load_models",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start; repeatable; '*' loads every model",
    )
    p.add_argument(
        "--repository-poll-secs",
        type=_poll_secs,
        default=15.0,
        metavar="SECONDS",
        help="poll mode: seconds between repository scans (default: 15, as Triton; fractions allowed)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferd", description="Model inference server.")
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    sub = parser.add_subparsers(dest="command")
    _serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "serve")
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from inferd.serve import ServeOptions, run

        logging.basicConfig(
            level=getattr(logging, args.log_level.upper()),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        repositories = args.model_repository or [bundled_repository()]
        options = ServeOptions(
            repositories=repositories,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            allow_grpc=args.allow_grpc,
            metrics_port=args.metrics_port,
            allow_metrics=args.allow_metrics,
            strict_readiness=args.strict_readiness,
            max_request_size=args.max_request_size,
            drain_timeout=args.drain_timeout,
            model_control_mode=args.model_control_mode,
            load_models=args.load_models,
            repository_poll_secs=args.repository_poll_secs,
        )
        return run(options)
    build_parser().print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
