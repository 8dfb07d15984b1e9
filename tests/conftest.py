"""Shared fixtures: real ``inferd`` servers in subprocesses, on loopback ports only."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_REPOSITORY = ROOT / "src" / "inferd" / "examples" / "repository"
BUNDLED_MODELS = ["digits", "simple", "mixed"]
HOST = "127.0.0.1"
#: Longest wait for a server to come up (live, then its models ready).
START_TIMEOUT = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class Server:
    """One ``inferd serve`` subprocess. Its output goes to a log file (no pipe to fill up)."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        port: int,
        cmd: list[str] | None = None,
        grpc_port: int = 0,
        metrics_port: int = 0,
    ) -> None:
        self.port = port
        self.host = HOST
        self.url = f"http://{HOST}:{port}"
        self.address = f"{HOST}:{port}"
        #: KServe V2 gRPC (every test server gets a free port of its own, never the default 8001)
        self.grpc_port = grpc_port
        self.grpc_address = f"{HOST}:{grpc_port}"
        #: Prometheus metrics (a free port of its own too, never the default 8002)
        self.metrics_port = metrics_port
        self.metrics_url = f"http://{HOST}:{metrics_port}/metrics"
        self.log_path = log_path
        self.cmd = cmd or [sys.executable, "-m", "inferd", "serve", *args]
        self._log_file = open(log_path, "wb")
        # faulthandler: a crash of the server shows its Python stacks in the log.
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log_file, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env)
        self.returncode: int | None = None

    def log(self) -> str:
        self._log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def fail(self, why: str) -> None:
        self.kill()
        pytest.fail(f"{why}\ncommand: {' '.join(self.cmd)}\n--- server log ---\n{self.log()}", pytrace=False)

    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(self.url + path, timeout=kwargs.pop("timeout", 30), **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(self.url + path, timeout=kwargs.pop("timeout", 30), **kwargs)

    def wait_live(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"the server exited with code {self.proc.returncode} before it was live")
            try:
                if requests.get(self.url + "/v2/health/live", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.fail(f"the server was not live within {START_TIMEOUT:.0f}s")

    def wait_models(self, names: list[str], deadline: float) -> None:
        pending = list(names)
        while pending and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"the server exited with code {self.proc.returncode} while loading models")
            try:
                status = requests.get(f"{self.url}/v2/models/{pending[0]}/ready", timeout=2).status_code
            except requests.RequestException:
                status = None
            if status == 200:
                pending.pop(0)
                continue
            if status == 503 and self._failed_to_load(pending[0]):
                self.fail(f"model '{pending[0]}' failed to load")
            time.sleep(0.05)
        if pending:
            self.fail(f"models {pending} were not ready within {START_TIMEOUT:.0f}s")

    def _failed_to_load(self, name: str) -> bool:
        """True once the index shows ``name`` settled as UNAVAILABLE (no point in waiting on)."""
        try:
            rows = requests.post(self.url + "/v2/repository/index", timeout=2).json()
        except (requests.RequestException, ValueError):
            return False
        states = [r.get("state") for r in rows if isinstance(r, dict) and r.get("name") == name]
        return bool(states) and all(state == "UNAVAILABLE" for state in states) and self._log_has_loaded()

    def _log_has_loaded(self) -> bool:
        # Startup loading is over once the server logged its readiness line.
        return "server ready" in self.log() or "NOT ready" in self.log()

    def wait_loaded(self, deadline: float) -> None:
        """Until the repository index shows that no model is still loading."""
        while time.monotonic() < deadline:
            try:
                response = requests.post(self.url + "/v2/repository/index", timeout=2)
                if response.status_code == 200 and all(r.get("state") != "LOADING" for r in response.json()):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.fail("the server did not finish loading its models")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit code (killed and reported as -9 after ``timeout``)."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.returncode = self.proc.returncode
        self._log_file.close()
        return self.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.returncode = self.proc.returncode
        if not self._log_file.closed:
            self._log_file.close()


def start_server(
    log_dir: Path,
    repositories: list[Path] | None,
    models_ready: list[str] | None = None,
    extra: list[str] | None = None,
    cmd_prefix: list[str] | None = None,
    wait_loaded: bool = True,
) -> Server:
    """Start a server on a free port; wait until it is live and ``models_ready`` are ready.

    ``cmd_prefix`` replaces ``python -m inferd serve`` (to test the bare ``inferd`` command).
    A port taken between choosing and binding (another process won the race) is retried.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = free_port()
        grpc_port = free_port()
        for _ in range(5):
            if grpc_port != port:
                break
            grpc_port = free_port()
        metrics_port = free_port()
        for _ in range(5):
            if metrics_port not in (port, grpc_port):
                break
            metrics_port = free_port()
        args = ["--host", HOST, "--http-port", str(port), "--grpc-port", str(grpc_port)]
        args += ["--metrics-port", str(metrics_port)]
        for repo in repositories or []:
            args += ["--model-repository", str(repo)]
        args += extra or []
        log_path = log_dir / f"server-{port}.log"
        cmd = [*cmd_prefix, *args] if cmd_prefix else None
        server = Server(args, log_path, port, cmd, grpc_port, metrics_port)
        deadline = time.monotonic() + START_TIMEOUT
        # A lost port race shows up as an early exit; everything else is a real failure.
        while time.monotonic() < deadline and server.proc.poll() is None:
            try:
                if requests.get(server.url + "/v2/health/live", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.05)
        if server.proc.poll() is not None and "address already in use" in server.log().lower() and attempt < 2:
            server.kill()
            continue
        server.wait_live(deadline)
        if models_ready:
            server.wait_models(models_ready, deadline)
        if wait_loaded:
            server.wait_loaded(deadline)
        return server
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory) -> Path:
    """A repository of every test model in tests/models.py (all load)."""
    return models.build_test_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="session")
def lifecycle_repository(tmp_path_factory) -> Path:
    """Good models next to deliberately broken ones."""
    return models.build_lifecycle_repository(tmp_path_factory.mktemp("lifecycle") / "models")


def _stopped_cleanly(server: Server) -> None:
    code = server.stop()
    assert code == 0, f"server exited with {code} after SIGTERM\n--- server log ---\n{server.log()}"


@pytest.fixture(scope="session")
def bundled_server(log_dir):
    """The bundled example repository (digits, simple, mixed)."""
    server = start_server(log_dir / "bundled", [BUNDLED_REPOSITORY], BUNDLED_MODELS)
    yield server
    _stopped_cleanly(server)


@pytest.fixture(scope="session")
def models_server(log_dir, test_repository):
    """The test repository (identity per datatype, slow models, batching models, ...)."""
    server = start_server(log_dir / "models", [test_repository], models.TEST_MODELS)
    yield server
    _stopped_cleanly(server)


@pytest.fixture(scope="session")
def slow_seconds_per_iteration() -> float:
    """Cost of one loop iteration of the slow model (measured here, single-threaded)."""
    return models.calibrate_slow(models.slow_model(), threads=1)


@pytest.fixture(scope="session")
def slow_iterations(slow_seconds_per_iteration):
    """``slow_iterations(seconds)``: the loop count that makes one slow-model run take about that long."""

    def iterations(seconds: float) -> int:
        return max(1, int(seconds / slow_seconds_per_iteration))

    return iterations


def stats_of(
    server: Server, model: str, success: int | None = None, fail: int | None = None, timeout: float = 5.0
) -> dict:
    """The model's statistics entry. With ``success``/``fail``: wait (bounded) until the counts
    reach at least those numbers; an answer can reach the client a moment before the server has
    recorded it (Triton, too, reports statistics after sending the response)."""
    deadline = time.monotonic() + timeout
    while True:
        response = server.get(f"/v2/models/{model}/stats")
        assert response.status_code == 200, response.text
        (entry,) = response.json()["model_stats"]
        counts = entry["inference_stats"]
        if (success is None or counts["success"]["count"] >= success) and (
            fail is None or counts["fail"]["count"] >= fail
        ):
            return entry
        if time.monotonic() > deadline:
            raise AssertionError(
                f"statistics of '{model}' never reached success >= {success}, fail >= {fail}: {counts}"
            )
        time.sleep(0.01)


def quiet_stats(server: Server, model: str, timeout: float = 3.0) -> dict:
    """The statistics once they stopped moving (what earlier requests left has been recorded)."""
    deadline = time.monotonic() + timeout
    last = stats_of(server, model)
    while time.monotonic() < deadline:
        time.sleep(0.03)
        current = stats_of(server, model)
        if current["inference_stats"] == last["inference_stats"]:
            return current
        last = current
    return last


def success_count(entry: dict) -> int:
    return entry["inference_stats"]["success"]["count"]


def fail_count(entry: dict) -> int:
    return entry["inference_stats"]["fail"]["count"]


# --------------------------------------------------------------------------- perf_analyzer

PERF_INSTALL_TIMEOUT = 600
PERF_RUN_TIMEOUT = 180
#: Short perf_analyzer runs that finish on a busy 2-core machine.
PERF_SHORT_RUN = ["--measurement-interval", "1000", "--max-trials", "6", "--stability-percentage", "500"]


@pytest.fixture(scope="session")
def perf_analyzer() -> str:
    """The perf_analyzer wrapper from tools/get-perf-analyzer.sh (skips when it can't be had)."""
    script = ROOT / "tools" / "get-perf-analyzer.sh"
    if not script.exists():
        pytest.skip(f"{script} is missing")
    try:
        result = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=PERF_INSTALL_TIMEOUT, cwd=str(ROOT)
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"get-perf-analyzer.sh did not finish within {PERF_INSTALL_TIMEOUT}s")
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        pytest.skip(f"get-perf-analyzer.sh failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    path = lines[-1].strip()
    check = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    if "perf_analyzer" not in (check.stdout + check.stderr) and "concurrency" not in (check.stdout + check.stderr):
        pytest.skip(f"{path} does not run here: {(check.stdout + check.stderr)[-2000:]}")
    return path


def run_perf_analyzer(binary: str, server, args: list[str], protocol: str = "http") -> tuple[str, list[float]]:
    """Run perf_analyzer against a test server; fails the test on a non-zero exit. Returns its
    output and the throughputs it printed."""
    address = server.grpc_address if protocol == "grpc" else server.address
    cmd = [binary, "-u", address, "-i", protocol, *args]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=PERF_RUN_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"perf_analyzer ran past {PERF_RUN_TIMEOUT}s: {' '.join(cmd)}\n{exc.stdout}\n{server.log()[-5000:]}"
        )
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"perf_analyzer exited with {result.returncode}: {' '.join(cmd)}\n{output}\n--- server log ---\n"
        f"{server.log()[-5000:]}"
    )
    throughputs = [float(v) for v in re.findall(r"throughput: ([0-9.]+) infer/sec", output)]
    return output, throughputs
