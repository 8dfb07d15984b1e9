"""Serving benchmark: inferd under perf_analyzer, against the raw ONNX Runtime ceiling.

One command, one run::

    python benchmarks/bench_serving.py            # full run (~20 min on 2 cores)
    python benchmarks/bench_serving.py --quick    # smoke run (~1 min)
    # HTTP vs gRPC (digits-i1, captioning-seed), with and without system shared memory:
    python benchmarks/bench_serving.py --variants captioning-seed,digits-i1 --shared-memory none,system

For each model it measures, in this order:

1. the raw ONNX Runtime ceiling: an ``InferenceSession`` (CPU EP, ORT's default thread
   count, graph optimisation ALL) in a tight loop at each batch size for a fixed time (in
   slices taken in turn across batch sizes; the median slice counts); the best inferences/s
   is the ceiling. Plus the raw batch-1 latency (median of many runs);
2. every server variant of that model (a Triton model repository written to a temp dir),
   each served by every target (by default inferd, plus any other target whose executable
   is on PATH), loaded by perf_analyzer over HTTP with binary tensors (and over gRPC, for the
   variants of the protocol comparison or with --protocols) at each concurrency, with
   --shared-memory none (or each mode of --shared-memory);
3. the raw ceiling again, so that drift of the (shared, noisy) machine during the run shows.

Results (JSON, markdown table, perf_analyzer CSVs and output, server logs) go to
``benchmarks/results/`` (gitignored). See ``benchmarks/README.md`` for what each number means.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from models import (  # noqa: E402
    CAPTIONING_CACHE,
    RESNET18_CACHE,
    build_resnet18,
    write_captioning_repository,
    write_digits_repository,
    write_resnet18_repository,
)

HOST = "127.0.0.1"


# --------------------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class ModelSpec:
    name: str
    # (tensor name, datatype FP32 | INT64, one sample's shape without the batch dimension)
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    batch_sizes: tuple[int, ...]  # raw-ceiling sweep
    max_batch_size: int  # what the server variants are configured with (used for warm-up)
    output_bytes: int = 0  # one sample's outputs (perf_analyzer's --output-shared-memory-size)
    int_high: int = 1  # INT64 inputs are drawn from [0, int_high) (token ids; a mask is all ones)


MODELS: dict[str, ModelSpec] = {
    "digits": ModelSpec("digits", (("input.1", "FP32", (1, 28, 28)),), (1, 2, 4, 8, 16, 32, 64), 64, 10 * 4),
    "resnet18": ModelSpec("resnet18", (("input", "FP32", (3, 224, 224)),), (1, 2, 4, 8), 8, 1000 * 4),
    # The BLIP-captioning seed (issue 3): its perf_analyzer shapes, sequence length 16.
    "captioning": ModelSpec(
        "captioning",
        (
            ("pixel_values", "FP32", (3, 384, 384)),
            ("input_ids", "INT64", (16,)),
            ("attention_mask", "INT64", (16,)),
        ),
        (1, 2, 4, 8),
        8,
        16 * 30524 * 4,
        30524,
    ),
}


def sample_inputs(spec: ModelSpec, batch: int, rng) -> dict[str, Any]:
    """Random inputs of ``batch`` samples (FP32 in [0, 1); INT64 ids; masks all ones)."""
    import numpy as np

    feeds = {}
    for name, dtype, shape in spec.inputs:
        if dtype == "FP32":
            feeds[name] = rng.random((batch, *shape), dtype=np.float32)
        elif "mask" in name:
            feeds[name] = np.ones((batch, *shape), np.int64)
        else:
            feeds[name] = rng.integers(0, spec.int_high, size=(batch, *shape), dtype=np.int64)
    return feeds


@dataclass(frozen=True)
class Variant:
    name: str
    model: str
    description: str
    write: Callable[[Path], Path]  # writes <repo>/<model>, returns the model directory
    # Default perf_analyzer concurrencies (None: the run's default); --concurrency overrides.
    concurrency: tuple[int, ...] | None = None
    # Default protocols (--protocols overrides): the HTTP/gRPC comparison runs both.
    protocols: tuple[str, ...] = ("http",)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "digits-tuned",
            "digits",
            "seed's tuned config: 5 instances KIND_CPU, max_batch_size 64, dynamic batching 150 us",
            lambda repo: write_digits_repository(repo, instance_count=5, max_batch_size=64, max_queue_delay_us=150),
        ),
        Variant(
            "digits-i2-d0",
            "digits",
            "2 instances, max_batch_size 64, dynamic batching 0 us",
            lambda repo: write_digits_repository(repo, instance_count=2, max_batch_size=64, max_queue_delay_us=0),
        ),
        Variant(
            "digits-i1",
            "digits",
            "1 instance, max_batch_size 64, dynamic batching 150 us",
            lambda repo: write_digits_repository(repo, instance_count=1, max_batch_size=64, max_queue_delay_us=150),
            protocols=("http", "grpc"),
        ),
        Variant(
            "resnet18-i1",
            "resnet18",
            "1 instance, max_batch_size 8, dynamic batching 0 us",
            lambda repo: write_resnet18_repository(repo, instance_count=1, max_batch_size=8, max_queue_delay_us=0),
        ),
        Variant(
            "resnet18-i2",
            "resnet18",
            "2 instances, max_batch_size 8, dynamic batching 0 us",
            lambda repo: write_resnet18_repository(repo, instance_count=2, max_batch_size=8, max_queue_delay_us=0),
        ),
        Variant(
            "resnet18-i4",
            "resnet18",
            "4 instances (more than the cores), max_batch_size 8, dynamic batching 0 us",
            lambda repo: write_resnet18_repository(repo, instance_count=4, max_batch_size=8, max_queue_delay_us=0),
        ),
        Variant(
            "captioning-seed",
            "captioning",
            "BLIP-captioning seed's config: 1 instance, max_batch_size 8, preferred 1/2/4/8, 1000 us",
            write_captioning_repository,
            concurrency=(1, 2, 4, 8),
            protocols=("http", "grpc"),
        ),
    )
}


@dataclass(frozen=True)
class Target:
    """A server to benchmark: a command template; ``{python} {host} {http_port} {grpc_port}
    {metrics_port} {repo}`` are filled in. ``requires`` is the executable that must exist for the
    target to be available (None: always available)."""

    name: str
    command: tuple[str, ...]
    requires: str | None = None
    stop_timeout: float = 20.0
    # Options added only when the server's --help lists them: (option, arguments to add).
    if_supported: tuple[tuple[str, tuple[str, ...]], ...] = ()
    help_command: tuple[str, ...] = ()

    def full_command(self, values: dict[str, Any]) -> list[str]:
        command = [part.format(**values) for part in self.command]
        if self.if_supported:
            help_text = _help_text(tuple(part.format(**values) for part in self.help_command))
            for option, args in self.if_supported:
                if re.search(rf"(^|\s){re.escape(option)}[\s=,]", help_text):
                    command += [part.format(**values) for part in args]
        return command


_HELP_CACHE: dict[tuple[str, ...], str] = {}


def _help_text(command: tuple[str, ...]) -> str:
    if command not in _HELP_CACHE:
        try:
            out = subprocess.run(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, env=_server_env()
            )
            _HELP_CACHE[command] = out.stdout
        except (OSError, subprocess.TimeoutExpired):
            _HELP_CACHE[command] = ""
    return _HELP_CACHE[command]


def _server_env() -> dict[str, str]:
    """The servers run this checkout's inferd."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "inferd",
            (
                "{python}",
                "-m",
                "inferd",
                "serve",
                "--host",
                "{host}",
                "--http-port",
                "{http_port}",
                "--model-repository",
                "{repo}",
                "--log-level",
                "warning",
                "--drain-timeout",
                "5",
            ),
            # gRPC and metrics get free ports instead of the fixed defaults (8001, 8002).
            if_supported=(
                ("--grpc-port", ("--grpc-port", "{grpc_port}")),
                ("--metrics-port", ("--metrics-port", "{metrics_port}")),
            ),
            help_command=("{python}", "-m", "inferd", "serve", "--help"),
        ),
        # A comparison server, used when present on PATH (the same repositories are valid Triton ones).
        Target(
            "tritonserver",
            (
                "tritonserver",
                "--model-repository={repo}",
                "--http-address={host}",
                "--http-port={http_port}",
                "--grpc-address={host}",
                "--grpc-port={grpc_port}",
                "--allow-metrics=false",
                "--log-warning=true",
                "--log-info=false",
                "--exit-timeout-secs=5",
            ),
            requires="tritonserver",
        ),
    )
}

# The targets of the README, checked at the end: (variant, concurrency, what, threshold).
CHECKS: list[tuple[str, int, str, float]] = [
    ("digits-tuned", 64, "fraction_of_ceiling", 0.30),
    ("digits-tuned", 16, "fraction_of_ceiling", 0.20),
    ("resnet18-i1", 8, "fraction_of_ceiling", 0.95),
    ("resnet18-i2", 8, "fraction_of_ceiling", 0.95),
    ("resnet18-i4", 8, "fraction_of_ceiling", 0.95),
    # Not for captioning: 1.8 MB in and 2 MB out per request cost more than 0.3 ms on any wire.
    *[(v, 1, "overhead_ms", 0.3) for v in VARIANTS if VARIANTS[v].model != "captioning"],
]
#: Checks are about the default way of serving: HTTP, no shared memory.
CHECK_PROTOCOL, CHECK_SHM = "http", "none"


@dataclass
class Settings:
    raw_seconds: float
    raw_warmup_seconds: float
    latency_seconds: float
    measurement_interval_ms: dict[str, int]  # per model: a window must hold many requests
    max_trials: int
    stability: float  # perf_analyzer --stability-percentage
    unstable_fallback: bool  # when never stable: one more run that takes 3 windows whatever they say
    ready_timeout: float
    raw_attempts: int  # a raw sweep flagged noisy by its best slice is repeated, up to this many in all


FULL = Settings(2.0, 0.5, 2.0, {"digits": 2000, "resnet18": 4000, "captioning": 3000}, 6, 10, True, 180, 3)
NO_STABILITY = 1e5  # a --stability-percentage that any three windows meet
# A smoke run: three windows per point whatever they say (no stability check, no retry).
QUICK = Settings(0.25, 0.1, 0.3, {"digits": 250, "resnet18": 750, "captioning": 500}, 3, NO_STABILITY, False, 120, 1)
QUICK_CONCURRENCY = "1,8,64"
NOISY_SLICE = 1.25  # raw ceiling flagged noisy when its best slice beats it by this factor ...
NOISY_DRIFT = 0.10  # ... or when before and after differ by more than this
RAW_SLICES = 8  # the raw ceiling's fixed time per batch size is measured as this many slices


# --------------------------------------------------------------------------- raw ONNX Runtime


def model_file(model: str) -> Path:
    """The ONNX file that the server variants of ``model`` serve."""
    if model == "resnet18":
        return build_resnet18(RESNET18_CACHE)
    if model == "captioning":
        return write_captioning_repository(CAPTIONING_CACHE) / "1" / "model.onnx"
    with tempfile.TemporaryDirectory(prefix="inferd-bench-") as tmp:
        src = write_digits_repository(Path(tmp), instance_count=1) / "1" / "model.onnx"
        dst = HERE / ".cache" / "digits.onnx"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return dst


def raw_session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # 0: ORT's default, one thread per physical core
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def raw_measure(spec: ModelSpec, path: Path, s: Settings, threads: int) -> dict[str, Any]:
    """Raw ceiling sweep and batch-1 latency of one model, in this process.

    Each batch size runs for ``s.raw_seconds`` in all, cut into RAW_SLICES slices taken in turn
    (batch 1, 2, 4, ..., then again), and its rate is the median slice: every batch size sees
    the same stretch of time, and a burst of other work on the machine moves the median little
    (ORT's spinning thread pool loses up to 10x while another process holds a core).
    """
    import numpy as np

    loadavg = os.getloadavg()[0]
    session = raw_session(path, threads)
    rng = np.random.default_rng(0)
    feeds = {b: sample_inputs(spec, b, rng) for b in spec.batch_sizes}
    rates: dict[int, list[float]] = {b: [] for b in spec.batch_sizes}
    runs_total = dict.fromkeys(spec.batch_sizes, 0)
    time_total = dict.fromkeys(spec.batch_sizes, 0.0)
    try:
        for feed in feeds.values():
            deadline = time.perf_counter() + s.raw_warmup_seconds
            while time.perf_counter() < deadline:
                session.run(None, feed)
        for _ in range(RAW_SLICES):
            for batch, feed in feeds.items():
                runs = 0
                t0 = time.perf_counter()
                deadline = t0 + s.raw_seconds / RAW_SLICES
                while True:
                    session.run(None, feed)
                    runs += 1
                    t1 = time.perf_counter()
                    if t1 >= deadline:
                        break
                rates[batch].append(runs * batch / (t1 - t0))
                runs_total[batch] += runs
                time_total[batch] += t1 - t0
        feed = feeds[1] if 1 in feeds else sample_inputs(spec, 1, rng)
        for _ in range(5):
            session.run(None, feed)
        samples: list[float] = []
        deadline = time.perf_counter() + s.latency_seconds
        while len(samples) < 20 or (time.perf_counter() < deadline and len(samples) < 50_000):
            t0 = time.perf_counter()
            session.run(None, feed)
            samples.append(time.perf_counter() - t0)
    finally:
        del session  # stop ORT's (spinning) thread pool before the servers run
    sweep = {b: statistics.median(r) for b, r in rates.items()}
    mean = {b: runs_total[b] * b / time_total[b] for b in rates}
    spread = {b: (min(r), max(r)) for b, r in rates.items()}
    samples.sort()
    best = max(sweep, key=sweep.get)
    return {
        "infer_per_s_by_batch": {str(b): round(v, 2) for b, v in sweep.items()},
        "mean_infer_per_s_by_batch": {str(b): round(v, 2) for b, v in mean.items()},
        "slice_range_by_batch": {str(b): [round(lo, 2), round(hi, 2)] for b, (lo, hi) in spread.items()},
        "ceiling_infer_per_s": round(sweep[best], 2),
        "ceiling_batch": best,
        "best_slice_infer_per_s": round(max(hi for _, hi in spread.values()), 2),
        "loadavg_1min": round(loadavg, 2),
        "batch1_latency_ms": {
            "median": round(statistics.median(samples) * 1e3, 4),
            "p90": round(samples[int(0.90 * (len(samples) - 1))] * 1e3, 4),
            "p99": round(samples[int(0.99 * (len(samples) - 1))] * 1e3, 4),
            "min": round(samples[0] * 1e3, 4),
            "runs": len(samples),
        },
    }


# --------------------------------------------------------------------------- perf_analyzer


def _works(path: str) -> bool:
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--concurrency-range" in (out.stdout + out.stderr)


def find_perf_analyzer(explicit: str | None) -> str:
    """--perf-analyzer, $PERF_ANALYZER, the tools/get-perf-analyzer.sh install, PATH; else install it."""
    if explicit:
        if not _works(explicit):
            sys.exit(f"error: --perf-analyzer {explicit} does not run")
        return explicit
    candidates = [
        os.environ.get("PERF_ANALYZER"),
        str(Path.home() / ".cache" / "perf_analyzer" / "bin" / "perf_analyzer"),
        shutil.which("perf_analyzer"),  # may be PyPI's binary-less placeholder: checked below
    ]
    for c in candidates:
        if c and Path(c).exists() and _works(c):
            return c
    print("perf_analyzer not found: installing it with tools/get-perf-analyzer.sh", flush=True)
    try:
        out = subprocess.run(
            ["bash", str(ROOT / "tools" / "get-perf-analyzer.sh")], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        sys.exit("error: tools/get-perf-analyzer.sh took more than 10 minutes")
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not path or not _works(path):
        sys.exit(f"error: could not install perf_analyzer:\n{out.stderr[-2000:]}")
    return path


_STDOUT_COUNTS = {
    "server_inference_count": re.compile(r"Inference count:\s*(\d+)"),
    "server_execution_count": re.compile(r"Execution count:\s*(\d+)"),
    "client_request_count": re.compile(r"Request count:\s*(\d+)"),
}


def run_perf_analyzer(
    pa: str,
    spec: ModelSpec,
    port: int,
    concurrency: int,
    s: Settings,
    work: Path,
    stem: str,
    protocol: str = "http",
    shared_memory: str = "none",
) -> dict[str, Any]:
    """One perf_analyzer run at one concurrency, over ``protocol`` (``port`` is that protocol's),
    with ``--shared-memory`` ``shared_memory``.

    When perf_analyzer finds no three stable windows within --max-trials (it then writes no CSV),
    it is run once more with no stability bound, and the row is marked "unstable"."""
    csv_path = work / f"{stem}.csv"
    log_path = work / f"{stem}.log"
    shapes = [a for name, _, shape in spec.inputs for a in ("--shape", f"{name}:{','.join(map(str, shape))}")]
    wire = (
        # binary is perf_analyzer's default for HTTP; said explicitly so it never changes under us
        ["--input-tensor-format=binary", "--output-tensor-format=binary"] if protocol == "http" else []
    )
    if shared_memory != "none":
        wire += ["--shared-memory", shared_memory]
        wire += ["--output-shared-memory-size", str(max(102400, spec.output_bytes))]
    attempts = [s.stability, NO_STABILITY] if s.unstable_fallback else [s.stability]
    interval_ms = s.measurement_interval_ms[spec.name]
    result: dict[str, Any] = {"status": "error"}
    logs = []
    for stability in attempts:
        csv_path.unlink(missing_ok=True)
        cmd = [
            pa,
            "-m",
            spec.name,
            "-u",
            f"{HOST}:{port}",
            "-i",
            protocol,
            "--concurrency-range",
            str(concurrency),
            *shapes,
            "--input-data",
            "random",
            *wire,
            "--measurement-interval",
            str(interval_ms),
            "--max-trials",
            str(s.max_trials),
            "--stability-percentage",
            str(stability),
            "-f",
            str(csv_path),
        ]
        # Bound: every trial's window, the wait for in-flight requests (a few latencies), start-up.
        timeout = s.max_trials * interval_ms / 1000 * 2 + 60
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)
            out, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            out += f"\n[bench] perf_analyzer killed after {timeout:.0f} s"
            rc = None
        elapsed = time.monotonic() - t0
        logs.append(f"$ {' '.join(cmd)}\n{out}\n[bench] rc={rc} elapsed={elapsed:.1f}s\n")
        result = {"status": "error", "rc": rc, "stability_percentage": stability, "elapsed_s": round(elapsed, 1)}
        if rc == 0 and csv_path.exists():
            with csv_path.open() as f:
                rows = list(csv.DictReader(f))
            if rows:
                result.update(parse_csv_row(rows[0]))
                for key, rx in _STDOUT_COUNTS.items():
                    m = rx.search(out)
                    if m:
                        result[key] = int(m.group(1))
                m = re.search(r"Avg latency:\s*(\d+)\s*usec", out)
                if m:
                    result["avg_ms"] = round(int(m.group(1)) / 1e3, 4)
                if result.get("server_execution_count"):
                    result["avg_server_batch"] = round(
                        result.get("server_inference_count", 0) / result["server_execution_count"], 2
                    )
                result["status"] = "ok" if stability == s.stability else "unstable"
                break
        result["error"] = _last_lines(out, 3)
        if rc is not None and rc < 0:  # killed by a signal: its output says nothing about why
            result["error"] = f"perf_analyzer died of signal {-rc} | " + result["error"]
        if rc is None or "stable" not in out:
            break  # a timeout or a real failure: a looser stability bound would not help
    warnings = list(
        dict.fromkeys(ln.strip() for ln in "\n".join(logs).splitlines() if re.search(r"warning|error|fail", ln, re.I))
    )
    if warnings:
        result["perf_analyzer_messages"] = warnings[:10]
    log_path.write_text("\n".join(logs))
    return result


def parse_csv_row(row: dict[str, str]) -> dict[str, Any]:
    """perf_analyzer's CSV: throughput in infer/s, every time in microseconds."""

    def us(col: str) -> float | None:
        v = row.get(col)
        return float(v) if v not in (None, "") else None

    out: dict[str, Any] = {"infer_per_s": float(row["Inferences/Second"])}
    for pct in (50, 90, 95, 99):
        v = us(f"p{pct} latency")
        out[f"p{pct}_ms"] = None if v is None else round(v / 1e3, 4)
    out["breakdown_us"] = {
        k: us(k)
        for k in (
            "Client Send",
            "Network+Server Send/Recv",
            "Server Queue",
            "Server Compute Input",
            "Server Compute Infer",
            "Server Compute Output",
            "Client Recv",
        )
        if us(k) is not None
    }
    return out


def _last_lines(text: str, n: int) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return 0


def infer_once(port: int, spec: ModelSpec, batch: int) -> None:
    """One binary-tensor infer request (warm-up and sanity check); raises on failure."""
    import numpy as np

    feeds = sample_inputs(spec, batch, np.random.default_rng(batch))
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(feeds[name].shape),
                    "datatype": dtype,
                    "parameters": {"binary_data_size": feeds[name].nbytes},
                }
                for name, dtype, _ in spec.inputs
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{HOST}:{port}/v2/models/{spec.name}/infer",
        data=header + b"".join(feeds[name].tobytes() for name, _, _ in spec.inputs),
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


@dataclass
class Server:
    target: Target
    repo: Path
    log_path: Path
    extra_args: list[str]
    port: int = 0
    grpc_port: int = 0
    proc: subprocess.Popen | None = None
    log_file: Any = None
    command: list[str] = field(default_factory=list)

    def start(self, model: str, timeout: float) -> None:
        self.port = free_port()
        self.grpc_port = free_port()
        values = {
            "python": sys.executable,
            "host": HOST,
            "http_port": self.port,
            "repo": str(self.repo),
            "grpc_port": self.grpc_port,
            "metrics_port": free_port(),
        }
        self.command = self.target.full_command(values) + self.extra_args
        self.log_file = self.log_path.open("w")
        self.proc = subprocess.Popen(
            self.command, stdout=self.log_file, stderr=subprocess.STDOUT, env=_server_env(), start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before it was ready: {self.tail()}")
            if http_get(self.port, f"/v2/models/{model}/ready") == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"model {model} not ready after {timeout:.0f} s: {self.tail()}")

    def stop(self) -> int | None:
        """SIGTERM, bounded wait, then SIGKILL of its process group; returns the exit status."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=self.target.stop_timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
                rc = "killed"
        # Anything the server left in its process group (it should leave nothing).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.log_file:
            self.log_file.close()
        return rc

    def tail(self, n: int = 5) -> str:
        try:
            self.log_file.flush()
            return _last_lines(self.log_path.read_text(errors="replace"), n)
        except OSError:
            return ""

    def log_problems(self) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        lines = [ln.strip() for ln in text.splitlines() if re.search(r"error|warning|traceback|exception", ln, re.I)]
        return lines[:20]


# --------------------------------------------------------------------------- the run


def machine_info(pa: str) -> dict[str, Any]:
    import numpy
    import onnxruntime

    try:
        import inferd

        inferd_version = inferd.__version__
    except ImportError:
        inferd_version = None
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None

    try:
        pa_version = subprocess.run(  # it writes this to stderr when stdout is a pipe
            [pa, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pa_version = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "numpy": numpy.__version__,
        "inferd": inferd_version,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "git_modified": (git("status", "--porcelain", "--untracked-files=no") or "").splitlines()[:30],
        "perf_analyzer": pa_version,
        "perf_analyzer_path": pa,
        "loadavg_start": list(os.getloadavg()),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: %s" % ",".join(MODELS))
    p.add_argument(
        "--variants", default=None, help="comma-separated: %s (default: all of --models)" % ",".join(VARIANTS)
    )
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"comma-separated perf_analyzer concurrencies (default: 1,4,8,16,64; --quick: {QUICK_CONCURRENCY}; "
        "captioning-seed: 1,2,4,8)",
    )
    p.add_argument(
        "--protocols",
        default=None,
        help="comma-separated perf_analyzer protocols, http,grpc, for every variant (default: each variant's own: "
        "http and grpc for %s, http for the others)" % ", ".join(v for v in VARIANTS if len(VARIANTS[v].protocols) > 1),
    )
    p.add_argument(
        "--shared-memory",
        default="none",
        help="comma-separated perf_analyzer --shared-memory modes to measure: none,system (default: none)",
    )
    p.add_argument(
        "--targets",
        default="auto",
        help="comma-separated: %s; 'auto' = inferd plus every other one on PATH" % ",".join(TARGETS),
    )
    p.add_argument("--quick", action="store_true", help="short windows and loops: a smoke run of about a minute")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the server command, repeatable; write --server-arg=--log-level=info",
    )
    p.add_argument("--out", type=Path, default=HERE / "results", help="results directory (default: benchmarks/results)")
    p.add_argument(
        "--perf-analyzer", default=None, metavar="PATH", help="perf_analyzer to use (default: found or installed)"
    )
    p.add_argument(
        "--measurement-interval",
        type=int,
        default=None,
        metavar="MS",
        help="perf_analyzer window for every model (default: digits 2000, resnet18 4000; --quick: 250, 750)",
    )
    p.add_argument("--max-trials", type=int, default=None, help="perf_analyzer windows before giving up on stability")
    p.add_argument("--stability", type=float, default=None, metavar="PCT", help="perf_analyzer stability percentage")
    p.add_argument("--raw-seconds", type=float, default=None, help="time per batch size in the raw ceiling sweep")
    p.add_argument("--raw-threads", type=int, default=0, help="raw session intra-op threads (default 0: ORT default)")
    return p.parse_args(argv)


def _csv_list(text: str, known: dict | None, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if known is not None:
        unknown = [x for x in items if x not in known]
        if unknown:
            sys.exit(f"error: unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return items


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    s = QUICK if args.quick else FULL
    s = Settings(**vars(s))
    s.measurement_interval_ms = dict(s.measurement_interval_ms)
    if args.measurement_interval:
        s.measurement_interval_ms = {m: args.measurement_interval for m in MODELS}
    if args.max_trials:
        s.max_trials = args.max_trials
    if args.stability:
        s.stability = args.stability
    if args.raw_seconds:
        s.raw_seconds = args.raw_seconds
    models = _csv_list(args.models, MODELS, "model")
    if args.variants:
        variants = _csv_list(args.variants, VARIANTS, "variant")
        models = [m for m in models if any(VARIANTS[v].model == m for v in variants)] or sorted(
            {VARIANTS[v].model for v in variants}
        )
    else:
        variants = [v for v in VARIANTS if VARIANTS[v].model in models]
    explicit_concurrency = args.concurrency is not None
    if args.concurrency is None:
        args.concurrency = QUICK_CONCURRENCY if args.quick else "1,4,8,16,64"
    concurrencies = [int(c) for c in _csv_list(args.concurrency, None, "concurrency")]
    protocols = _csv_list(args.protocols, {"http": 1, "grpc": 1}, "protocol") if args.protocols else None
    shm_modes = _csv_list(args.shared_memory, {"none": 1, "system": 1}, "shared memory mode")
    if args.targets == "auto":
        targets = [t for t in TARGETS if t == "inferd" or (TARGETS[t].requires and shutil.which(TARGETS[t].requires))]
    else:
        targets = _csv_list(args.targets, TARGETS, "target")
        missing = [t for t in targets if TARGETS[t].requires and not shutil.which(TARGETS[t].requires)]
        if missing:
            sys.exit(f"error: not on PATH: {', '.join(TARGETS[t].requires for t in missing)}")

    pa = find_perf_analyzer(args.perf_analyzer)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out
    work = out_dir / f"run-{stamp}"  # CSVs, perf_analyzer output, server logs
    work.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"bench-{stamp}.json"
    md_path = out_dir / f"bench-{stamp}.md"

    report: dict[str, Any] = {
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv] if argv is None else ["bench_serving.py", *argv],
        "mode": "quick" if args.quick else "full",
        "settings": vars(s)
        | {
            "raw_threads": args.raw_threads,
            "server_args": args.server_arg,
            "protocols": args.protocols or "per variant",
            "shared_memory": shm_modes,
        },
        "machine": machine_info(pa),
        "targets": {t: list(TARGETS[t].command) for t in targets},
        "variants": {v: {"model": VARIANTS[v].model, "description": VARIANTS[v].description} for v in variants},
        "raw": {},
        "serving": [],
    }

    def save() -> None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"machine: {report['machine']['cpu_count']} cpus, onnxruntime {report['machine']['onnxruntime']}, "
        f"inferd {report['machine']['inferd']}, {report['machine']['perf_analyzer']}"
    )
    print(f"writing {json_path}", flush=True)
    t_start = time.monotonic()
    for model in models:
        spec = MODELS[model]
        path = model_file(model)
        print(f"[{model}] raw onnxruntime ceiling ({path.name}) ...", flush=True)
        raw = {"model_file": str(path), "before": raw_phase(model, spec, path, s, args.raw_threads)}
        report["raw"][model] = raw
        _summarise_raw(raw)
        save()
        _print_raw(model, raw["before"])
        for variant in [v for v in variants if VARIANTS[v].model == model]:
            v = VARIANTS[variant]
            plan = {
                "concurrencies": list(v.concurrency) if v.concurrency and not explicit_concurrency else concurrencies,
                "protocols": protocols or list(v.protocols),
                "shared_memory": shm_modes,
            }
            for target in targets:
                run_variant(report, TARGETS[target], v, spec, plan, pa, s, work, args, save)
        print(f"[{model}] raw onnxruntime ceiling, again ...", flush=True)
        raw["after"] = raw_phase(model, spec, path, s, args.raw_threads)
        _summarise_raw(raw)
        _print_raw(model, raw["after"])
        _fill_ratios(report)
        save()

    report["machine"]["loadavg_end"] = list(os.getloadavg())
    report["elapsed_s"] = round(time.monotonic() - t_start, 1)
    _fill_ratios(report)
    report["checks"] = evaluate_checks(report)
    save()
    md_path.write_text(render_markdown(report))
    shutil.copyfile(json_path, out_dir / "latest.json")
    shutil.copyfile(md_path, out_dir / "latest.md")
    print()
    print(render_text(report))
    print(f"saved {json_path}\n      {md_path}\n      {work}/ (perf_analyzer CSVs and output, server logs)")
    return 0 if all(r["status"] in ("ok", "unstable") for r in report["serving"]) else 1


def raw_phase(model: str, spec: ModelSpec, path: Path, s: Settings, threads: int) -> dict[str, Any]:
    """A raw sweep, repeated (up to ``s.raw_attempts`` sweeps in all) while its best slice says that
    other work held the cores. The sweep with the highest ceiling is kept (and the lowest batch-1
    median): a ceiling measured too low would flatter the server."""
    attempts = []
    for i in range(s.raw_attempts):
        r = raw_measure(spec, path, s, threads)
        attempts.append(r)
        if r["best_slice_infer_per_s"] <= NOISY_SLICE * r["ceiling_infer_per_s"] or i == s.raw_attempts - 1:
            break
        print(
            f"[{model}]   noisy sweep (ceiling {r['ceiling_infer_per_s']:.0f}/s, best slice "
            f"{r['best_slice_infer_per_s']:.0f}/s): measuring again",
            flush=True,
        )
    best = max(attempts, key=lambda r: r["ceiling_infer_per_s"])
    best = dict(best)
    best["batch1_latency_ms"] = min((r["batch1_latency_ms"] for r in attempts), key=lambda x: x["median"])
    best["best_slice_infer_per_s"] = max(r["best_slice_infer_per_s"] for r in attempts)
    best["attempts"] = len(attempts)
    if len(attempts) > 1:
        best["attempt_ceilings"] = [r["ceiling_infer_per_s"] for r in attempts]
    return best


def _summarise_raw(raw: dict[str, Any]) -> None:
    """The ratios' denominators: the best ceiling and the lowest median batch-1 latency seen."""
    runs = [raw[k] for k in ("before", "after") if k in raw]
    raw["ceiling_infer_per_s"] = max(r["ceiling_infer_per_s"] for r in runs)
    raw["batch1_latency_ms"] = min(r["batch1_latency_ms"]["median"] for r in runs)
    if len(runs) == 2:
        raw["ceiling_drift"] = round(runs[1]["ceiling_infer_per_s"] / runs[0]["ceiling_infer_per_s"] - 1, 4)
    # Other work on the machine during the raw measurement: the ratios against it mean little.
    best_slice = max(r["best_slice_infer_per_s"] for r in runs)
    reasons = []
    if best_slice > NOISY_SLICE * raw["ceiling_infer_per_s"]:
        reasons.append(f"best slice {best_slice:.0f}/s is {best_slice / raw['ceiling_infer_per_s']:.1f}x the ceiling")
    if abs(raw.get("ceiling_drift", 0)) > NOISY_DRIFT:
        reasons.append(f"ceiling drifted {raw['ceiling_drift']:+.0%} between before and after")
    raw["noisy"] = "; ".join(reasons) or None


def _print_raw(model: str, r: dict[str, Any]) -> None:
    sweep = "  ".join(f"b{b}:{v:.0f}" for b, v in r["infer_per_s_by_batch"].items())
    print(
        f"[{model}]   {sweep}  -> ceiling {r['ceiling_infer_per_s']:.0f}/s at batch {r['ceiling_batch']}; "
        f"batch-1 latency median {r['batch1_latency_ms']['median']:.3f} ms ({r['batch1_latency_ms']['runs']} runs)",
        flush=True,
    )


def run_variant(report, target, variant, spec, plan, pa, s, work, args, save) -> None:
    """One server for the variant; every (shared memory mode, concurrency, protocol) point in turn,
    the protocols of one concurrency back to back so that they see the same machine."""
    label = f"{target.name}/{variant.name}"
    points = [
        (shm, c, proto) for shm in plan["shared_memory"] for c in plan["concurrencies"] for proto in plan["protocols"]
    ]
    with tempfile.TemporaryDirectory(prefix="inferd-bench-repo-") as tmp:
        repo = Path(tmp)
        variant.write(repo)
        server = Server(target, repo, work / f"server-{target.name}-{variant.name}.log", list(args.server_arg))
        rows = []
        try:
            print(f"[{label}] starting {target.name} ...", flush=True)
            server.start(spec.name, s.ready_timeout)
            for batch in sorted({1, spec.max_batch_size}):
                for _ in range(3):
                    infer_once(server.port, spec, batch)
            for shm, c, proto in points:
                if server.proc.poll() is not None:
                    raise RuntimeError(f"server died (rc {server.proc.returncode}): {server.tail()}")
                port = server.grpc_port if proto == "grpc" else server.port
                stem = f"pa-{target.name}-{variant.name}-{proto}-shm{shm}-c{c}"
                r = run_perf_analyzer(pa, spec, port, c, s, work, stem, protocol=proto, shared_memory=shm)
                row = {
                    "target": target.name,
                    "model": spec.name,
                    "variant": variant.name,
                    "protocol": proto,
                    "shared_memory": shm,
                    "concurrency": c,
                    **r,
                }
                rows.append(row)
                report["serving"].append(row)
                _fill_ratios(report)
                save()
                print(f"[{label}] {proto:<4} shm={shm:<6} c={c:<3} " + _row_text(row), flush=True)
        except Exception as exc:  # noqa: BLE001 - one broken variant must not end the run
            print(f"[{label}] FAILED: {exc}", flush=True)
            done = {(r["shared_memory"], r["concurrency"], r["protocol"]) for r in rows}
            for shm, c, proto in points:
                if (shm, c, proto) not in done:
                    report["serving"].append(
                        {
                            "target": target.name,
                            "model": spec.name,
                            "variant": variant.name,
                            "protocol": proto,
                            "shared_memory": shm,
                            "concurrency": c,
                            "status": "error",
                            "error": str(exc)[:500],
                        }
                    )
        finally:
            rc = server.stop()
            problems = server.log_problems()
            report.setdefault("servers", []).append(
                {
                    "target": target.name,
                    "variant": variant.name,
                    "command": server.command,
                    "exit_status": rc,
                    "log": str(server.log_path),
                    "log_problems": problems,
                }
            )
            if rc not in (0, None) or problems:
                print(f"[{label}] server exit status {rc}; log: {len(problems)} error/warning lines", flush=True)
            save()


def _fill_ratios(report: dict[str, Any]) -> None:
    for row in report["serving"]:
        raw = report["raw"].get(row["model"])
        if not raw or "infer_per_s" not in row:
            continue
        row["fraction_of_ceiling"] = round(row["infer_per_s"] / raw["ceiling_infer_per_s"], 4)
        if row["concurrency"] == 1 and row.get("p50_ms") is not None:
            row["overhead_ms"] = round(row["p50_ms"] - raw["batch1_latency_ms"], 4)
    # gRPC infer/s over HTTP infer/s at the same point, on both rows of the pair.
    pairs: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in report["serving"]:
        key = (row["target"], row["variant"], row.get("shared_memory", "none"), row["concurrency"])
        pairs.setdefault(key, {})[row.get("protocol", "http")] = row
    for pair in pairs.values():
        h, g = pair.get("http", {}), pair.get("grpc", {})
        if h.get("infer_per_s") and g.get("infer_per_s"):
            h["grpc_http_ratio"] = g["grpc_http_ratio"] = round(g["infer_per_s"] / h["infer_per_s"], 4)


def _row_text(row: dict[str, Any]) -> str:
    if "infer_per_s" not in row:
        return f"ERROR {row.get('error', '')}"
    text = f"{row['infer_per_s']:9.1f} infer/s  p50 {row['p50_ms']:8.3f} ms  p99 {row['p99_ms']:8.3f} ms"
    if "fraction_of_ceiling" in row:
        text += f"  {row['fraction_of_ceiling']:6.1%} of ceiling"
    if row["status"] != "ok":
        text += f"  ({row['status']})"
    return text


def evaluate_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for variant, conc, what, threshold in CHECKS:
        for target in report["targets"]:
            row = next(
                (
                    r
                    for r in report["serving"]
                    if r["variant"] == variant
                    and r["concurrency"] == conc
                    and r["target"] == target
                    and r.get("protocol", "http") == CHECK_PROTOCOL
                    and r.get("shared_memory", "none") == CHECK_SHM
                ),
                None,
            )
            if row is None:
                continue
            value = row.get(what)
            if value is None:
                ok = None
            else:
                ok = value >= threshold if what == "fraction_of_ceiling" else value <= threshold
            out.append(
                {
                    "target": target,
                    "variant": variant,
                    "concurrency": conc,
                    "metric": what,
                    "threshold": threshold,
                    "value": value,
                    "pass": ok,
                }
            )
    return out


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


Section = tuple[str, list[str], list[list[str]], set[int]]  # title, header, rows, right-aligned columns


def sections(report: dict[str, Any]) -> tuple[str, list[Section], list[str]]:
    """The report as tables: a summary line, the tables, and trailing notes."""
    m = report["machine"]
    summary = (
        f"{m['cpu_count']} CPUs ({m['cpu_model']}), onnxruntime {m['onnxruntime']}, inferd {m['inferd']} "
        f"(git {str(m['git_commit'])[:10]}{', dirty' if m['git_dirty'] else ''}), {m['perf_analyzer']}; "
        f"load average {m['loadavg_start'][0]:.2f} at start, {m.get('loadavg_end', [0])[0]:.2f} at end; "
        f"{report.get('elapsed_s', 0):.0f} s."
    )
    out: list[Section] = []
    rows = []
    for model, raw in report["raw"].items():
        before, after = raw["before"], raw.get("after", {})
        rows.append(
            [
                model,
                " ".join(f"{b}:{v:.0f}" for b, v in before["infer_per_s_by_batch"].items()),
                f"{before['ceiling_infer_per_s']:.0f}",
                _fmt(after.get("ceiling_infer_per_s"), ".0f"),
                _fmt(raw.get("ceiling_drift"), "+.1%"),
                f"{max(r['best_slice_infer_per_s'] for r in (before, after) if r):.0f}",
                f"{raw['ceiling_infer_per_s']:.0f}",
                f"{raw['batch1_latency_ms']:.3f}",
            ]
        )
    out.append(
        (
            "Raw ONNX Runtime (in-process InferenceSession, CPU EP, default threads, graph opt ALL)",
            ["model", "infer/s by batch", "before", "after", "drift", "best slice", "ceiling", "batch-1 ms"],
            rows,
            {2, 3, 4, 5, 6, 7},
        )
    )
    multi = len(report["targets"]) > 1
    shm_modes = sorted({r.get("shared_memory", "none") for r in report["serving"]})
    show_shm = shm_modes != ["none"]
    head = (
        (["target"] if multi else [])
        + ["model", "variant", "proto"]
        + (["shm"] if show_shm else [])
        + [
            "conc",
            "infer/s",
            "p50 ms",
            "p99 ms",
            "of-ceiling",
            "p50-raw ms",
            "avg batch",
            "note",
        ]
    )
    rows = []
    for r in report["serving"]:
        note = ""
        if r["status"] == "unstable":
            note = "unstable"
        elif r["status"] != "ok":
            note = "ERROR: " + str(r.get("error", ""))[:80]
        rows.append(
            ([r["target"]] if multi else [])
            + [r["model"], r["variant"], r.get("protocol", "http")]
            + ([r.get("shared_memory", "none")] if show_shm else [])
            + [
                str(r["concurrency"]),
                _fmt(r.get("infer_per_s"), ".1f"),
                _fmt(r.get("p50_ms"), ".3f"),
                _fmt(r.get("p99_ms"), ".3f"),
                _fmt(r.get("fraction_of_ceiling"), ".1%"),
                _fmt(r.get("overhead_ms"), "+.3f"),
                _fmt(r.get("avg_server_batch"), ".2f"),
                note,
            ]
        )
    off = (1 if multi else 0) + (1 if show_shm else 0) + 1
    out.append(
        (
            "Serving (perf_analyzer; HTTP with binary tensors, or gRPC)",
            head,
            rows,
            {off + i for i in range(2, 9)},
        )
    )
    comparison = protocol_comparison(report, multi, show_shm)
    if comparison:
        out.append(comparison)
    if report.get("checks"):
        rows = []
        for c in report["checks"]:
            frac = c["metric"] == "fraction_of_ceiling"
            rows.append(
                [
                    f"{c['target']}/{c['variant']}" if multi else c["variant"],
                    str(c["concurrency"]),
                    "of-ceiling" if frac else "p50-raw ms",
                    f">= {c['threshold']:.0%}" if frac else f"<= {c['threshold']:.1f}",
                    _fmt(c["value"], ".1%" if frac else "+.3f"),
                    {True: "PASS", False: "FAIL", None: "n/a"}[c["pass"]],
                ]
            )
        out.append(("Targets", ["variant", "conc", "metric", "target", "value", "result"], rows, {1, 3, 4}))
    notes = [
        f"NOISY raw {model} measurement ({raw['noisy']}): the machine was busy, ratios against it are unreliable"
        for model, raw in report["raw"].items()
        if raw.get("noisy")
    ]
    for srv in report.get("servers", []):
        notes += [f"server {srv['target']}/{srv['variant']}: {p[:200]}" for p in srv["log_problems"][:5]]
        if srv["exit_status"] not in (0, None):
            notes.append(f"server {srv['target']}/{srv['variant']}: exit status {srv['exit_status']}")
    for r in report["serving"]:
        for msg in r.get("perf_analyzer_messages", [])[:3]:
            where = f"{r['target']}/{r['variant']} {r.get('protocol', 'http')}"
            if r.get("shared_memory", "none") != "none":
                where += f" shm={r['shared_memory']}"
            notes.append(f"perf_analyzer {where} c={r['concurrency']}: {msg[:200]}")
    return summary, out, notes


def protocol_comparison(report: dict[str, Any], multi: bool, show_shm: bool) -> Section | None:
    """gRPC next to HTTP for every point measured over both: throughput, p50/p99 and the ratio
    gRPC infer/s / HTTP infer/s (above 1: gRPC serves more)."""
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in report["serving"]:
        key = (r["target"], r["model"], r["variant"], r.get("shared_memory", "none"), r["concurrency"])
        by_key.setdefault(key, {})[r.get("protocol", "http")] = r
    rows = []
    for (target, model, variant, shm, conc), pair in by_key.items():
        if set(pair) != {"http", "grpc"}:
            continue
        h, g = pair["http"], pair["grpc"]
        ratio = g["infer_per_s"] / h["infer_per_s"] if h.get("infer_per_s") and g.get("infer_per_s") else None
        rows.append(
            ([target] if multi else [])
            + [model, variant]
            + ([shm] if show_shm else [])
            + [
                str(conc),
                _fmt(h.get("infer_per_s"), ".1f"),
                _fmt(g.get("infer_per_s"), ".1f"),
                _fmt(ratio, ".2f"),
                f"{_fmt(h.get('p50_ms'), '.3f')} / {_fmt(g.get('p50_ms'), '.3f')}",
                f"{_fmt(h.get('p99_ms'), '.3f')} / {_fmt(g.get('p99_ms'), '.3f')}",
            ]
        )
    if not rows:
        return None
    head = (
        (["target"] if multi else [])
        + ["model", "variant"]
        + (["shm"] if show_shm else [])
        + ["conc", "HTTP infer/s", "gRPC infer/s", "gRPC/HTTP", "p50 ms HTTP / gRPC", "p99 ms HTTP / gRPC"]
    )
    first = (1 if multi else 0) + 2 + (1 if show_shm else 0)
    return ("HTTP vs gRPC (same server, same run)", head, rows, {first + i for i in range(6)})


def render_markdown(report: dict[str, Any]) -> str:
    summary, tables, notes = sections(report)
    lines = [f"# inferd serving benchmark ({report['mode']}, {report['started']})", "", summary]
    for title, head, rows, right in tables:
        lines += ["", f"## {title}", "", "| " + " | ".join(head) + " |"]
        lines.append("|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|")
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    if notes:
        lines += ["", "## Messages", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def render_text(report: dict[str, Any]) -> str:
    summary, tables, notes = sections(report)
    lines = [summary]
    for title, head, rows, right in tables:
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]

        def line(cells: list[str], right: set[int] = right, widths: list[int] = widths) -> str:
            return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        lines += ["", title, line(head).rstrip()] + [line(r).rstrip() for r in rows]
    if notes:
        lines += ["", "Messages:"] + [f"  {n}" for n in notes]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
