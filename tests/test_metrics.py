"""Prometheus metrics on --metrics-port: counters read from the model statistics at scrape time."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from conftest import HOST, start_server
from models import add_const_model, write_model
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

CONFIG = """
name: "metered"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { all {} }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
COUNTERS = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "ts_inference_requests",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
]


@pytest.fixture(scope="module")
def metered_server(log_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("metered") / "models"
    write_model(repo, "metered", None, CONFIG, versions=())
    for version in (1, 2):
        write_model(repo, "metered", add_const_model(float(version)), None, versions=(version,))
    server = start_server(log_dir / "metrics", [repo], ["metered"])
    yield server
    assert server.stop() == 0, server.log()


def scrape(server) -> dict[tuple[str, str, str, str], float]:
    """{(family, sample name, version, le): value} for the 'metered' model, and the family types."""
    response = requests.get(server.metrics_url, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    values: dict[tuple[str, str, str, str], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.labels.get("model") == "metered":
                key = (family.name, sample.name, sample.labels["version"], sample.labels.get("le", ""))
                values[key] = sample.value
                values[(family.name, "#type", "", "")] = family.type  # type: ignore[assignment]
    return values


def counter(values: dict, name: str, version: str) -> float:
    # prometheus_client's parser names every counter sample *_total, whatever the text said
    # (test_triton_names_are_exact checks the text itself).
    return values[(name, name + "_total", version, "")]


def hist(values: dict, name: str, version: str, part: str, le: str = "") -> float:
    return values[(name, f"{name}_{part}", version, le)]


def settled(server, expect_success: dict[str, int], timeout: float = 10.0) -> dict:
    """Scrape until every version's success count reached what is expected (an answer can reach
    the client a moment before the server has recorded it); bounded."""
    deadline = time.monotonic() + timeout
    while True:
        values = scrape(server)
        if all(counter(values, "nv_inference_request_success", v) >= n for v, n in expect_success.items()):
            return values
        assert time.monotonic() < deadline, f"counters never reached {expect_success}"
        time.sleep(0.02)


def test_triton_names_are_exact(metered_server):
    """Dashboards written for Triton query nv_inference_count, not nv_inference_count_total."""
    text = requests.get(metered_server.metrics_url, timeout=10).text
    for name in COUNTERS:
        if name.startswith("nv_"):
            assert f"# TYPE {name} counter" in text, name
            assert f'{name}{{model="metered",version="1"}} ' in text, name
            assert f"{name}_total" not in text, name


def test_metrics_count_requests_exactly(metered_server):
    before = scrape(metered_server)
    for name in COUNTERS:
        assert before[(name, "#type", "", "")] == "counter", name
    assert before[("nv_inference_pending_request_count", "#type", "", "")] == "gauge"
    assert before[("inferd_batch_size", "#type", "", "")] == "histogram"
    assert before[("inferd_request_duration_seconds", "#type", "", "")] == "histogram"

    # version 1: 5 HTTP requests (batch sizes 1..5 -> 15 rows) + 3 gRPC (1 row each); 2 bad over HTTP
    # version 2: 4 HTTP requests (2 rows each) + 2 gRPC (3 rows each); 1 bad over gRPC
    sent = {"1": (8, 2, 18), "2": (6, 1, 14)}  # success, failure, rows
    url = metered_server.url + "/v2/models/metered/versions/{}/infer"

    def body(rows: int) -> dict:
        return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 4], "data": [0.5] * (rows * 4)}]}

    for rows in range(1, 6):
        assert requests.post(url.format(1), json=body(rows), timeout=30).status_code == 200
    for _ in range(4):
        assert requests.post(url.format(2), json=body(2), timeout=30).status_code == 200
    bad = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [0.5] * 3}]}
    for _ in range(2):
        assert requests.post(url.format(1), json=bad, timeout=30).status_code == 400
    client = grpcclient.InferenceServerClient(metered_server.grpc_address)
    try:
        for version, rows, count in (("1", 1, 3), ("2", 3, 2)):
            for _ in range(count):
                tensor = grpcclient.InferInput("INPUT0", [rows, 4], "FP32")
                tensor.set_data_from_numpy(np.full((rows, 4), 0.5, dtype=np.float32))
                result = client.infer("metered", [tensor], model_version=version)
                assert result.as_numpy("OUTPUT0")[0, 0] == 0.5 + int(version)
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("metered", [tensor], model_version="2")
    finally:
        client.close()

    after = settled(
        metered_server, {v: int(counter(before, "nv_inference_request_success", v)) + s[0] for v, s in sent.items()}
    )
    for version, (success, failure, rows) in sent.items():

        def moved(name: str, values_after=after, v=version) -> float:
            return counter(values_after, name, v) - counter(before, name, v)

        assert moved("nv_inference_request_success") == success
        assert moved("nv_inference_request_failure") == failure
        assert moved("ts_inference_requests") == success + failure
        assert moved("nv_inference_count") == rows
        executions = moved("nv_inference_exec_count")
        assert 1 <= executions <= success
        for name in COUNTERS[4:]:
            if name != "nv_inference_queue_duration_us" and name != "ts_queue_latency_microseconds":
                assert moved(name) > 0, name
            else:
                assert moved(name) >= 0, name
        assert values_pending(after, version) == 0

        def hmoved(name: str, part: str, le: str = "", v=version) -> float:
            return hist(after, name, v, part, le) - hist(before, name, v, part, le)

        # one observation per successful request; buckets are cumulative and end with +Inf
        duration = "inferd_request_duration_seconds"
        assert hmoved(duration, "count") == success
        assert hmoved(duration, "bucket", "+Inf") == success
        assert hmoved(duration, "sum") > 0
        les = sorted(
            (float(key[3]), value)
            for key, value in after.items()
            if key[0] == duration and key[2] == version and key[3]
        )
        assert les[0][0] == 0.0001 and les[-2][0] == 10.0 and les[-1][0] == float("inf")
        assert [v for _, v in les] == sorted(v for _, v in les)
        # one observation per execution; its sum is the rows executed
        assert hmoved("inferd_batch_size", "count") == executions
        assert hmoved("inferd_batch_size", "bucket", "+Inf") == executions
        assert hmoved("inferd_batch_size", "sum") == rows
        assert hist(after, "inferd_batch_size", version, "bucket", "128") == hist(
            after, "inferd_batch_size", version, "count"
        )


def values_pending(values: dict, version: str) -> float:
    name = "nv_inference_pending_request_count"
    return values[(name, name, version, "")]


def test_metrics_other_paths(metered_server):
    assert requests.get(metered_server.metrics_url.replace("/metrics", "/"), timeout=10).status_code == 404
    assert requests.get(metered_server.metrics_url + "x", timeout=10).status_code == 404
    assert requests.post(metered_server.metrics_url, data=b"", timeout=10).status_code == 405
    # the inference port does not answer /metrics: metrics have a port of their own
    assert requests.get(metered_server.url + "/metrics", timeout=10).status_code == 404


def test_no_allow_metrics(log_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    server = start_server(log_dir / "no-metrics", [empty], extra=["--no-allow-metrics"])
    try:
        assert server.get("/v2/health/live").status_code == 200
        with pytest.raises(OSError):
            socket.create_connection((HOST, server.metrics_port), timeout=2).close()
    finally:
        assert server.stop() == 0, server.log()
