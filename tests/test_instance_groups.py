"""Several instance groups: every group's instances run, in parallel, and /config shows them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import start_server
from models import slow_model, write_model

SLOW_INPUTS = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 1
input [
  {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "n" data_type: TYPE_INT64 dims: [ 1 ] }}
]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{groups}
"""
ONE = "instance_group [ { count: 1 kind: KIND_CPU } ]"
# Two groups, one of them KIND_AUTO (CPU on a machine without a GPU): three instances in all.
TWO = "instance_group [ { count: 1 kind: KIND_CPU }, { count: 2 kind: KIND_AUTO } ]"


@pytest.fixture(scope="module")
def groups_server(tmp_path_factory, log_dir):
    repo = tmp_path_factory.mktemp("groups")
    model = slow_model()
    write_model(repo, "one_group", model, SLOW_INPUTS.format(name="one_group", groups=ONE))
    write_model(repo, "two_groups", model, SLOW_INPUTS.format(name="two_groups", groups=TWO))
    server = start_server(log_dir / "groups", [repo], ["one_group", "two_groups"])
    yield server
    assert server.stop() == 0, server.log()


def test_config_lists_every_group_resolved(groups_server):
    config = groups_server.get("/v2/models/two_groups/config").json()
    groups = config["instance_group"]
    assert [(g["name"], g["count"], g["kind"]) for g in groups] == [
        ("two_groups_0", 1, "KIND_CPU"),
        ("two_groups_1", 2, "KIND_CPU"),
    ]


def _three_at_once(server, model: str, iterations: int) -> float:
    """Send three requests at once; returns their mean time in the queue (server statistics)."""
    body = {
        "inputs": [
            {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]},
            {"name": "n", "shape": [1, 1], "datatype": "INT64", "data": [iterations]},
        ]
    }

    def queue() -> tuple[int, int]:
        stats = server.get(f"/v2/models/{model}/stats").json()["model_stats"][0]["inference_stats"]["queue"]
        return stats["count"], stats["ns"]

    count0, ns0 = queue()
    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda _: server.post(f"/v2/models/{model}/infer", json=body, timeout=120), range(3)))
    for response in responses:
        assert response.status_code == 200, response.text
        assert np.isclose(response.json()["outputs"][0]["data"][0], 1.0)
    deadline = time.monotonic() + 10
    while (count := queue())[0] < count0 + 3 and time.monotonic() < deadline:
        time.sleep(0.02)  # statistics are recorded just after the answers are sent
    count1, ns1 = count
    assert count1 == count0 + 3
    return (ns1 - ns0) / 3 / 1e9


def test_every_group_runs_requests_in_parallel(groups_server, slow_iterations):
    iterations = slow_iterations(0.3)
    # With one instance the three requests queue behind each other (0, 1 and 2 runs: about one
    # run on average); with three instances none waits for another. Queue time measures that
    # whatever else loads the machine, unlike wall time.
    one = _three_at_once(groups_server, "one_group", iterations)
    three = _three_at_once(groups_server, "two_groups", iterations)
    assert one > 0.1, f"one instance: the requests should have queued, mean queue {one:.3f}s"
    assert three < 0.25 * one, f"mean queue time with 3 instances {three:.3f}s, with 1 instance {one:.3f}s"
