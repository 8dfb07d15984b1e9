"""Where a request's CPU time goes: server threads vs the load generator, per request.

Throughput on a shared 2-core machine swings with whatever else runs; CPU time per request
barely does. This starts inferd on a repository, drives it with perf_analyzer for a while, and
reads the CPU time (user + system, from /proc) that each server thread and perf_analyzer spent,
divided by the requests served::

    python benchmarks/cpu_per_request.py --repo DIR --model digits --concurrency 64

The event loop thread's figure is the one that bounds throughput (every request passes through
it); the instance threads' and perf_analyzer's share the remaining core.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def thread_times(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / TICK
        if task.name == str(pid):
            name = "event-loop"
        elif name.startswith("inferd-"):
            name = "instances"
        out[name] = out.get(name, 0.0) + seconds
    return out


def process_time(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICK


def stats(port: int, model: str) -> int:
    with urllib.request.urlopen(f"http://{HOST}:{port}/v2/models/{model}/stats", timeout=5) as response:
        data = json.load(response)
    return sum(s["inference_stats"]["success"]["count"] for s in data["model_stats"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--shape", default="input.1:1,28,28")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--perf-analyzer", default=os.path.expanduser("~/.cache/perf_analyzer/bin/perf_analyzer"))
    parser.add_argument("--protocol", default="http", choices=["http", "grpc"])
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args()

    port = free_port()
    grpc_port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "inferd",
        "serve",
        "--host",
        HOST,
        "--http-port",
        str(port),
        "--model-repository",
        str(args.repo),
        "--log-level",
        "warning",
        *args.server_arg,
    ]
    help_text = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--help"], capture_output=True, text=True
    ).stdout
    if "--grpc-port" in help_text:
        cmd += ["--grpc-port", str(grpc_port)]
    if "--metrics-port" in help_text:
        cmd += ["--metrics-port", str(free_port())]
    server = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{HOST}:{port}/v2/models/{args.model}/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        url = f"{HOST}:{grpc_port if args.protocol == 'grpc' else port}"
        # perf_analyzer runs for much longer than the window we sample; we stop it ourselves.
        load = subprocess.Popen(
            [
                args.perf_analyzer,
                "-m",
                args.model,
                "-u",
                url,
                "-i",
                args.protocol,
                "--concurrency-range",
                str(args.concurrency),
                "--shape",
                args.shape,
                "--measurement-interval",
                "60000",
                "--max-trials",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(2.0)  # warm up
        before_threads, before_pa, before_n, t0 = (
            thread_times(server.pid),
            process_time(load.pid),
            stats(port, args.model),
            time.monotonic(),
        )
        time.sleep(args.seconds)
        after_threads, after_pa, after_n, t1 = (
            thread_times(server.pid),
            process_time(load.pid),
            stats(port, args.model),
            time.monotonic(),
        )
        load.send_signal(signal.SIGINT)
        try:
            load.wait(timeout=10)
        except subprocess.TimeoutExpired:
            load.kill()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    n = after_n - before_n
    wall = t1 - t0
    print(f"{args.model} c={args.concurrency} {args.protocol}: {n / wall:.0f} infer/s over {wall:.1f}s ({n} requests)")
    print("CPU microseconds per request:")
    total = 0.0
    for name in sorted(after_threads, key=lambda k: -(after_threads[k] - before_threads.get(k, 0))):
        spent = after_threads[name] - before_threads.get(name, 0.0)
        if spent > 0:
            total += spent
            print(f"  server {name:<16} {spent / n * 1e6:8.1f}   ({spent / wall * 100:5.1f}% of a core)")
    pa = after_pa - before_pa
    print(f"  server total           {total / n * 1e6:8.1f}   ({total / wall * 100:5.1f}% of a core)")
    print(f"  perf_analyzer          {pa / n * 1e6:8.1f}   ({pa / wall * 100:5.1f}% of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
