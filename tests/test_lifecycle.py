"""Loading (good models next to broken ones), readiness, and shutting down while busy."""

from __future__ import annotations

import shutil
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from conftest import BUNDLED_MODELS, HOST, start_server, stats_of
from models import LIFECYCLE_BAD, LIFECYCLE_GOOD, build_second_repository


@pytest.fixture(scope="module")
def second_repository(tmp_path_factory) -> Path:
    return build_second_repository(tmp_path_factory.mktemp("second") / "models")


@pytest.fixture(scope="module")
def broken_server(log_dir, lifecycle_repository, second_repository):
    """Good and broken models (strict readiness, the default)."""
    server = start_server(
        log_dir / "broken", [lifecycle_repository, second_repository], LIFECYCLE_GOOD + ["other_good"]
    )
    yield server
    code = server.stop()
    assert code == 0, server.log()


def add_request(values: np.ndarray) -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": list(values.shape), "data": values.flatten().tolist()}
        ]
    }


def slow_request(iterations: int, value: float) -> dict:
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [iterations]},
        ]
    }


# --------------------------------------------------------------------------- broken models


def test_good_models_serve_next_to_broken_ones(broken_server):
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    response = broken_server.post("/v2/models/good/infer", json=add_request(values))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == (values + 1).flatten().tolist()
    response = broken_server.post("/v2/models/other_good/infer", json=add_request(values))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == (values + 5).flatten().tolist()
    for name in LIFECYCLE_GOOD + ["other_good"]:
        assert broken_server.get(f"/v2/models/{name}/ready").status_code == 200


def test_strict_readiness(broken_server):
    assert broken_server.get("/v2/health/live").status_code == 200
    assert broken_server.get("/v2/health/ready").status_code == 503


@pytest.mark.parametrize("name", sorted(LIFECYCLE_BAD))
def test_broken_model_reported(broken_server, name):
    reason = LIFECYCLE_BAD[name]
    assert broken_server.get(f"/v2/models/{name}/ready").status_code == 503
    response = broken_server.post(f"/v2/models/{name}/infer", json=add_request(np.zeros((1, 4), np.float32)))
    assert response.status_code == 503, response.text
    message = response.json()["error"]
    assert name in message and reason in message, message
    rows = [row for row in broken_server.post("/v2/repository/index").json() if row["name"] == name]
    assert len(rows) == 1
    assert rows[0]["state"] != "READY"
    assert reason in rows[0]["reason"]
    # The server log says so too.
    assert reason in broken_server.log()


def test_kind_gpu_on_cpu_machine(broken_server):
    response = broken_server.post("/v2/models/gpu_only/infer", json=add_request(np.zeros((1, 4), np.float32)))
    assert response.status_code == 503
    message = response.json()["error"]
    assert "KIND_GPU" in message and "GPU" in message and "gpu_only" in message
    assert "KIND_CPU" in message or "KIND_AUTO" in message  # says what to do instead


def test_broken_model_other_endpoints(broken_server):
    for path in ("/v2/models/broken_file", "/v2/models/broken_file/config", "/v2/models/broken_file/stats"):
        response = broken_server.get(path)
        assert response.status_code in (400, 404, 503), (path, response.status_code)
        assert response.status_code != 200
        assert "broken_file" in response.json()["error"]
    # All-model statistics still answer (for the models that loaded).
    response = broken_server.get("/v2/models/stats")
    assert response.status_code == 200
    names = {entry["name"] for entry in response.json()["model_stats"]}
    assert {"good", "slow", "other_good"} <= names
    assert "broken_file" not in names


def test_unknown_model_ready_is_404(broken_server):
    assert broken_server.get("/v2/models/never_heard_of_it/ready").status_code == 404


def test_not_strict_readiness(log_dir, lifecycle_repository):
    server = start_server(log_dir / "lenient", [lifecycle_repository], LIFECYCLE_GOOD, ["--no-strict-readiness"])
    try:
        assert server.get("/v2/health/ready").status_code == 200
        assert server.get("/v2/models/broken_file/ready").status_code == 503
        assert server.get("/v2/models/good/ready").status_code == 200
    finally:
        assert server.stop() == 0, server.log()


def test_missing_repository_directory(log_dir, tmp_path):
    """A repository path that doesn't exist: the server must not pretend to be ready."""
    missing = tmp_path / "does-not-exist"
    log_dir.mkdir(parents=True, exist_ok=True)
    import subprocess

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferd",
            "serve",
            "--host",
            HOST,
            "--http-port",
            "0",
            "--model-repository",
            str(missing),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"the server kept running with a missing repository:\n{out.decode(errors='replace')}")
    assert proc.returncode != 0
    assert str(missing) in out.decode(errors="replace")


# --------------------------------------------------------------------------- shutdown


def test_sigterm_drains_in_flight_requests(log_dir, lifecycle_repository, slow_iterations):
    server = start_server(log_dir / "drain", [lifecycle_repository], ["slow"])
    iterations = slow_iterations(0.6)
    try:
        values = [1.0, 2.0, 3.0, 4.0, 5.0]

        def call(value: float):
            start = time.monotonic()
            response = requests.post(
                f"{server.url}/v2/models/slow/infer", json=slow_request(iterations, value), timeout=60
            )
            return response, time.monotonic() - start

        with ThreadPoolExecutor(max_workers=len(values)) as pool:
            futures = [pool.submit(call, v) for v in values]
            time.sleep(0.2)
            assert not any(f.done() for f in futures), "the slow requests finished before SIGTERM"
            server.proc.send_signal(signal.SIGTERM)
            # While draining, nobody new gets in: the listening socket is closed.
            time.sleep(0.15)
            if server.proc.poll() is None:
                with pytest.raises(OSError):
                    socket.create_connection((HOST, server.port), timeout=2).close()
            results = [f.result(timeout=60) for f in futures]
        for value, (response, _elapsed) in zip(values, results):
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [value]
        code = server.proc.wait(timeout=60)
        assert code == 0, server.log()
        log = server.log()
        assert "draining" in log or "shutting down" in log
    finally:
        server.kill()


def test_sigint_exits_cleanly(log_dir, lifecycle_repository):
    server = start_server(log_dir / "sigint", [lifecycle_repository], ["good"])
    try:
        assert server.get("/v2/models/good/ready").status_code == 200
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0, server.log()
    finally:
        server.kill()


def test_drain_timeout_still_exits_zero(log_dir, lifecycle_repository, slow_iterations):
    """A request longer than --drain-timeout does not keep the server from exiting (with 0)."""
    server = start_server(log_dir / "drain-timeout", [lifecycle_repository], ["slow"], ["--drain-timeout", "0.3"])
    try:
        iterations = slow_iterations(2.0)

        def call():
            try:
                return requests.post(
                    f"{server.url}/v2/models/slow/infer", json=slow_request(iterations, 1.0), timeout=60
                )
            except requests.RequestException as exc:
                return exc

        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(call)
            time.sleep(0.2)
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            code = server.proc.wait(timeout=60)
            elapsed = time.monotonic() - start
            future.result(timeout=60)  # answered or cut off; either way it returns
        assert code == 0, server.log()
        assert elapsed < 30, elapsed
    finally:
        server.kill()


def test_bare_inferd_command_serves_bundled_repository(log_dir):
    """``inferd`` without a subcommand or repository serves the bundled examples."""
    script = Path(sys.executable).parent / "inferd"
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "inferd"]
    server = start_server(log_dir / "bare", None, BUNDLED_MODELS, cmd_prefix=prefix)
    try:
        index = server.post("/v2/repository/index").json()
        assert sorted(row["name"] for row in index) == sorted(BUNDLED_MODELS)
        assert server.get("/v2/health/ready").status_code == 200
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
            ]
        }
        response = server.post("/v2/models/simple/infer", json=body)
        assert response.status_code == 200
        assert response.json()["outputs"][0]["data"] == [i + 1 for i in range(16)]
        assert stats_of(server, "simple", success=1)["execution_count"] == 1
    finally:
        code = server.stop()
    assert code == 0, server.log()


def test_version_and_help():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "inferd", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "inferd" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    for option in ("--model-repository", "--http-port", "--strict-readiness", "--max-request-size"):
        assert option in out.stdout


def test_empty_repository(tmp_path, log_dir):
    """An empty repository serves nothing but is live and ready (nothing failed to load)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    server = start_server(log_dir / "empty", [empty])
    try:
        assert server.get("/v2/health/ready").status_code == 200
        assert server.post("/v2/repository/index").json() == []
    finally:
        assert server.stop() == 0, server.log()
    shutil.rmtree(empty)
