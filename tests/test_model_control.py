"""Version policies and model control (--model-control-mode none|explicit|poll), as Triton."""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from models import add_const_model, slow_config, slow_model, write_model
from tritonclient.utils import InferenceServerException

#: Longest wait for something a poll or a load should bring about.
WAIT = 20.0
ADD_CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def add_request(values: np.ndarray) -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": list(values.shape), "data": values.flatten().tolist()}
        ]
    }


def write_versions(repo: Path, name: str, versions: tuple[int, ...], config: str = ADD_CONFIG) -> Path:
    """A model whose version v adds v to its input (versions tell themselves apart)."""
    model_dir = write_model(repo, name, None, config, versions=versions)
    for v in versions:
        (model_dir / str(v) / "model.onnx").write_bytes(add_const_model(float(v)))
    return model_dir


def infer_add(server, name: str, version: str | None = None, timeout: float = 30):
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
    return server.post(path, json=add_request(values), timeout=timeout)


def added(response) -> float:
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"][0]  # input 0 + the version's constant


def index_rows(server, name: str, body: dict | None = None) -> list[dict]:
    response = (
        server.post("/v2/repository/index", json=body) if body is not None else server.post("/v2/repository/index")
    )
    assert response.status_code == 200, response.text
    return [row for row in response.json() if row["name"] == name]


def wait_for(check, what: str, server, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            server.fail(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def config_of(server, name: str) -> dict:
    response = server.get(f"/v2/models/{name}/config")
    return response.json() if response.status_code == 200 else {}


# --------------------------------------------------------------------------- version policies (mode none)


@pytest.fixture(scope="module")
def policy_server(log_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("policies") / "models"
    repo.mkdir(parents=True)
    write_versions(repo, "latest2", (1, 2, 3), ADD_CONFIG + "version_policy: { latest: { num_versions: 2 } }\n")
    write_versions(repo, "all", (1, 2), ADD_CONFIG + "version_policy: { all: {} }\n")
    write_versions(repo, "specific", (1, 2, 3), ADD_CONFIG + "version_policy: { specific: { versions: [1, 3] } }\n")
    broken = write_versions(repo, "one_broken", (1, 2, 3), ADD_CONFIG + "version_policy: { all {} }\n")
    (broken / "2" / "model.onnx").write_bytes(b"not an onnx model")
    server = start_server(log_dir / "policies", [repo], ["latest2", "all", "specific", "one_broken"])
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize(
    "name, served, absent",
    [("latest2", ["2", "3"], ["1"]), ("all", ["1", "2"], []), ("specific", ["1", "3"], ["2"])],
)
def test_version_policy(policy_server, name, served, absent):
    metadata = policy_server.get(f"/v2/models/{name}").json()
    assert metadata["versions"] == served
    for version in served:
        assert policy_server.get(f"/v2/models/{name}/versions/{version}/ready").status_code == 200
        assert added(infer_add(policy_server, name, version)) == float(version)
        assert policy_server.get(f"/v2/models/{name}/versions/{version}").json()["versions"] == served
    for version in absent:
        assert infer_add(policy_server, name, version).status_code == 404
    # unversioned: the highest served version
    assert added(infer_add(policy_server, name)) == float(served[-1])
    rows = index_rows(policy_server, name)
    assert [(r["version"], r["state"]) for r in rows] == [(v, "READY") for v in served]


def test_broken_version_next_to_good_ones(policy_server):
    rows = {r["version"]: r for r in index_rows(policy_server, "one_broken")}
    assert rows["1"]["state"] == "READY" and rows["3"]["state"] == "READY"
    assert rows["2"]["state"] == "UNAVAILABLE"
    assert "onnxruntime could not load" in rows["2"]["reason"]
    assert policy_server.get("/v2/models/one_broken/versions/2/ready").status_code == 503
    response = infer_add(policy_server, "one_broken", "2")
    assert response.status_code == 503 and "onnxruntime could not load" in response.json()["error"]
    assert added(infer_add(policy_server, "one_broken", "1")) == 1.0
    assert added(infer_add(policy_server, "one_broken")) == 3.0
    assert policy_server.get("/v2/models/one_broken").json()["versions"] == ["1", "3"]
    ready_rows = index_rows(policy_server, "one_broken", {"ready": True})
    assert [r["version"] for r in ready_rows] == ["1", "3"]


def test_none_mode_refuses_load_and_unload(policy_server):
    for action in ("load", "unload"):
        response = policy_server.post(f"/v2/repository/models/all/{action}")
        assert response.status_code == 400
        assert "model control is disabled (--model-control-mode none)" in response.json()["error"]
    assert policy_server.get("/v2/models/all/ready").status_code == 200
    client = grpcclient.InferenceServerClient(policy_server.grpc_address)
    try:
        with pytest.raises(InferenceServerException, match="model control is disabled"):
            client.load_model("all")
        with pytest.raises(InferenceServerException, match="model control is disabled"):
            client.unload_model("all")
    finally:
        client.close()


# --------------------------------------------------------------------------- explicit mode


@pytest.fixture(scope="module")
def explicit_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("explicit") / "models"
    repo.mkdir(parents=True)
    for name in ("first", "second", "reloaded", "overridden", "via_grpc"):
        write_versions(repo, name, (1,))
    write_model(repo, "slow", slow_model(), slow_config("slow", 4, "dynamic_batching { }"))
    return repo


@pytest.fixture(scope="module")
def explicit_server(log_dir, explicit_repo):
    server = start_server(
        log_dir / "explicit",
        [explicit_repo],
        ["first", "slow"],
        ["--model-control-mode", "explicit", "--load-model", "first", "--load-model", "slow"],
    )
    yield server
    assert server.stop() == 0, server.log()


def test_explicit_loads_only_named_models(explicit_server):
    assert explicit_server.get("/v2/health/ready").status_code == 200
    assert added(infer_add(explicit_server, "first")) == 1.0
    (row,) = index_rows(explicit_server, "second")
    assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded"
    assert index_rows(explicit_server, "second", {"ready": True}) == []
    assert explicit_server.get("/v2/models/second/ready").status_code == 503
    assert infer_add(explicit_server, "second").status_code == 503


def test_explicit_load_and_unload(explicit_server):
    response = explicit_server.post("/v2/repository/models/second/load")
    assert response.status_code == 200, response.text
    assert explicit_server.get("/v2/models/second/ready").status_code == 200
    assert added(infer_add(explicit_server, "second")) == 1.0
    assert [r["state"] for r in index_rows(explicit_server, "second")] == ["READY"]
    assert explicit_server.get("/v2/health/ready").status_code == 200
    response = explicit_server.post(
        "/v2/repository/models/second/unload", json={"parameters": {"unload_dependents": False}}
    )
    assert response.status_code == 200, response.text
    assert explicit_server.get("/v2/models/second/ready").status_code == 503
    (row,) = index_rows(explicit_server, "second")
    assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded"
    assert infer_add(explicit_server, "second").status_code == 503
    assert explicit_server.get("/v2/health/ready").status_code == 200  # unloaded on request: not awaited


def test_explicit_load_unknown_model(explicit_server):
    response = explicit_server.post("/v2/repository/models/nowhere/load")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "nowhere" in error and "no model named" in error


def test_explicit_reload_with_changed_config(explicit_server, explicit_repo):
    assert explicit_server.post("/v2/repository/models/reloaded/load").status_code == 200
    assert config_of(explicit_server, "reloaded")["max_batch_size"] == 4
    (explicit_repo / "reloaded" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 2\n')
    response = explicit_server.post("/v2/repository/models/reloaded/load")
    assert response.status_code == 200, response.text
    assert config_of(explicit_server, "reloaded")["max_batch_size"] == 2
    values = np.zeros((3, 4), np.float32)
    assert explicit_server.post("/v2/models/reloaded/infer", json=add_request(values)).status_code == 400
    # a reload that fails leaves the loaded version serving (as Triton)
    (explicit_repo / "reloaded" / "config.pbtxt").write_text("max_batch_size: 2\nthis is { not protobuf\n")
    response = explicit_server.post("/v2/repository/models/reloaded/load")
    assert response.status_code == 400
    assert "reloaded" in response.json()["error"] and "failed to parse" in response.json()["error"]
    assert added(infer_add(explicit_server, "reloaded")) == 1.0
    assert config_of(explicit_server, "reloaded")["max_batch_size"] == 2


def test_explicit_load_with_config_override(explicit_server):
    override = json.dumps({"name": "overridden", "platform": "onnxruntime_onnx", "max_batch_size": 3})
    response = explicit_server.post("/v2/repository/models/overridden/load", json={"parameters": {"config": override}})
    assert response.status_code == 200, response.text
    assert config_of(explicit_server, "overridden")["max_batch_size"] == 3
    assert added(infer_add(explicit_server, "overridden")) == 1.0
    # files in the request are not supported: said so
    response = explicit_server.post(
        "/v2/repository/models/overridden/load",
        json={"parameters": {"config": override, "file:1/model.onnx": "AAAA"}},
    )
    assert response.status_code == 400
    assert "file:1/model.onnx" in response.json()["error"] and "not supported" in response.json()["error"]
    bad = explicit_server.post("/v2/repository/models/overridden/load", json={"parameters": {"config": "{oops"}})
    assert bad.status_code == 400 and "overridden" in bad.json()["error"]
    assert config_of(explicit_server, "overridden")["max_batch_size"] == 3  # still serving


def test_requests_during_reload_all_succeed(explicit_server, slow_iterations):
    """A reload swaps versions while requests run: none of them fails."""
    n = slow_iterations(0.03)
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [n]},
        ]
    }
    stop_at = time.monotonic() + 30  # bound, in case the reloads hang

    def client(done: list) -> list[int]:
        statuses = []
        while not done and time.monotonic() < stop_at:
            statuses.append(explicit_server.post("/v2/models/slow/infer", json=body, timeout=30).status_code)
        return statuses

    done: list = []
    with ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(client, done) for _ in range(4)]
        time.sleep(0.3)
        for _ in range(3):
            response = explicit_server.post("/v2/repository/models/slow/load", timeout=60)
            assert response.status_code == 200, response.text
            time.sleep(0.2)
        done.append(True)
        statuses = [status for future in clients for status in future.result(timeout=60)]
    assert len(statuses) > 10
    assert set(statuses) == {200}, statuses


def test_grpc_load_unload(explicit_server):
    client = grpcclient.InferenceServerClient(explicit_server.grpc_address)
    try:
        assert not client.is_model_ready("via_grpc")
        client.load_model("via_grpc")
        assert client.is_model_ready("via_grpc")
        assert client.get_model_metadata("via_grpc").versions == ["1"]
        override = json.dumps({"name": "via_grpc", "platform": "onnxruntime_onnx", "max_batch_size": 2})
        client.load_model("via_grpc", config=override)
        assert client.get_model_config("via_grpc").config.max_batch_size == 2
        index = client.get_model_repository_index()
        assert [(m.version, m.state) for m in index.models if m.name == "via_grpc"] == [("1", "READY")]
        client.unload_model("via_grpc")
        assert not client.is_model_ready("via_grpc")
        with pytest.raises(InferenceServerException, match="no model named"):
            client.load_model("nowhere")
    finally:
        client.close()


# --------------------------------------------------------------------------- poll mode


@pytest.fixture(scope="module")
def poll_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("poll") / "models"
    repo.mkdir(parents=True)
    write_versions(repo, "steady", (1,))
    write_versions(repo, "changing", (1,))
    return repo


@pytest.fixture(scope="module")
def poll_server(log_dir, poll_repo):
    server = start_server(
        log_dir / "poll",
        [poll_repo],
        ["steady", "changing"],
        ["--model-control-mode", "poll", "--repository-poll-secs", "0.5"],
    )
    yield server
    assert server.stop() == 0, server.log()


def test_poll_adds_and_removes_models(poll_server, poll_repo, tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    write_versions(staging, "arrived", (1, 2))
    os.rename(staging / "arrived", poll_repo / "arrived")  # appears at once, complete
    wait_for(lambda: poll_server.get("/v2/models/arrived/ready").status_code == 200, "'arrived' ready", poll_server)
    assert added(infer_add(poll_server, "arrived")) == 2.0
    assert poll_server.get("/v2/health/ready").status_code == 200
    os.rename(poll_repo / "arrived", staging / "gone")
    shutil.rmtree(staging / "gone")
    wait_for(lambda: poll_server.get("/v2/models/arrived/ready").status_code == 404, "'arrived' gone", poll_server)
    assert index_rows(poll_server, "arrived") == []
    assert added(infer_add(poll_server, "steady")) == 1.0


def test_poll_reloads_changed_config(poll_server, poll_repo):
    assert config_of(poll_server, "changing")["max_batch_size"] == 4
    (poll_repo / "changing" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 2\n')
    deadline = time.monotonic() + WAIT
    statuses = []
    while config_of(poll_server, "changing").get("max_batch_size") != 2:
        if time.monotonic() > deadline:
            poll_server.fail("the changed config was not reloaded")
        statuses.append(infer_add(poll_server, "steady").status_code)
        statuses.append(infer_add(poll_server, "changing").status_code)
    assert set(statuses) <= {200}
    assert added(infer_add(poll_server, "changing")) == 1.0


def test_poll_mode_refuses_load(poll_server):
    response = poll_server.post("/v2/repository/models/steady/load")
    assert response.status_code == 400
    assert "--model-control-mode poll" in response.json()["error"]
