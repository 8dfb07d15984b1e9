"""The dynamic batcher and queue policies under real concurrent load (bounded in count and time)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from conftest import fail_count, quiet_stats, stats_of, success_count

#: Upper bound for any one load test's requests to finish.
LOAD_TIMEOUT = 60.0


def batch_counts(stats: dict) -> dict[int, int]:
    """batch size -> number of executions of that size."""
    return {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}


def batch_delta(before: dict, after: dict) -> dict[int, int]:
    old = batch_counts(before)
    return {size: count - old.get(size, 0) for size, count in batch_counts(after).items() if count - old.get(size, 0)}


def run_concurrently(fn, jobs: list, threads: int) -> list:
    """``fn(job)`` for every job on ``threads`` threads; results in job order; bounded in time."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(fn, job) for job in jobs]
        deadline = time.monotonic() + LOAD_TIMEOUT
        return [f.result(timeout=max(0.1, deadline - time.monotonic())) for f in futures]


def together(count: int, fn) -> list:
    """Run ``fn(i)`` on ``count`` threads released at the same moment; returns results by i."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def worker(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[i] = fn(i)
        except Exception as exc:  # surfaced by the caller's asserts
            results[i] = exc

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=LOAD_TIMEOUT)
    assert not any(w.is_alive() for w in workers), "requests did not finish in time"
    return results


_local = threading.local()


def session() -> requests.Session:
    """One keep-alive HTTP session per thread."""
    if not hasattr(_local, "session"):
        _local.session = requests.Session()
    return _local.session


def fp32_request(values: np.ndarray, request_id: str | None = None) -> dict:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": list(values.shape), "data": values.flatten().tolist()}
        ]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def slow_request(iterations: int, value: float = 1.0, parameters: dict | None = None) -> dict:
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [iterations]},
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


# --------------------------------------------------------------------------- dynamic batching


def test_digits_concurrent_load_batches(bundled_server):
    from inferd.examples.build_models import digits_test_set

    images, _ = digits_test_set()
    threads, per_thread = 8, 50
    total = threads * per_thread
    # The expected class of each image, from one plain request.
    client = httpclient.InferenceServerClient(bundled_server.address, network_timeout=60.0)
    infer_input = httpclient.InferInput("input.1", [16, 1, 28, 28], "FP32")
    infer_input.set_data_from_numpy(images[:16])
    expected = client.infer("digits", [infer_input]).as_numpy("logits").argmax(axis=1)
    client.close()

    before = quiet_stats(bundled_server, "digits")

    def worker(t: int) -> list[int]:
        client = httpclient.InferenceServerClient(bundled_server.address, network_timeout=60.0)
        predictions = []
        try:
            for i in range(per_thread):
                index = (t * per_thread + i) % 16
                infer_input = httpclient.InferInput("input.1", [1, 1, 28, 28], "FP32")
                infer_input.set_data_from_numpy(images[index : index + 1])
                logits = client.infer("digits", [infer_input]).as_numpy("logits")
                predictions.append(int(logits.argmax()) == int(expected[index]))
        finally:
            client.close()
        return predictions

    results = together(threads, worker)
    for r in results:
        assert not isinstance(r, Exception), r
    assert all(all(r) for r in results), "a batched answer differs from the unbatched one"
    after = stats_of(bundled_server, "digits", success=success_count(before) + total)
    executions = after["execution_count"] - before["execution_count"]
    assert after["inference_count"] - before["inference_count"] == total
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == total
    delta = batch_delta(before, after)
    assert sum(size * count for size, count in delta.items()) == total
    assert sum(delta.values()) == executions
    assert executions < total, f"{executions} executions for {total} requests: nothing was batched"
    assert max(delta) > 1, delta


@pytest.mark.parametrize("model", ["no_batching_dyn", "simple"])
def test_without_dynamic_batching_each_request_runs_alone(bundled_server, models_server, model):
    server = bundled_server if model == "simple" else models_server
    threads, per_thread = 4, 25
    total = threads * per_thread
    before = quiet_stats(server, model)

    def call(i: int) -> bool:
        if model == "simple":
            a = np.full((1, 16), i, np.int32)
            body = {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.flatten().tolist()},
                    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": a.flatten().tolist()},
                ]
            }
            response = session().post(f"{server.url}/v2/models/simple/infer", json=body, timeout=30)
            return response.status_code == 200 and response.json()["outputs"][0]["data"] == [2 * i] * 16
        values = np.full((1, 3), i, np.float32)
        response = session().post(f"{server.url}/v2/models/{model}/infer", json=fp32_request(values), timeout=30)
        return response.status_code == 200 and response.json()["outputs"][0]["data"] == [float(i)] * 3

    assert all(run_concurrently(call, list(range(total)), threads))
    after = stats_of(server, model, success=success_count(before) + total)
    assert after["execution_count"] - before["execution_count"] == total
    assert after["inference_count"] - before["inference_count"] == total
    assert batch_delta(before, after) == {1: total}


def behind_blocker(server, model: str, blocker_seconds: float, slow_iterations, follower, count: int) -> list:
    """Occupy ``model``'s single instance with a long run, then send ``count`` followers at once
    (``follower(i)``) so they all queue behind it. Returns the followers' results."""

    def blocker() -> requests.Response:
        return requests.post(
            f"{server.url}/v2/models/{model}/infer", json=slow_request(slow_iterations(blocker_seconds)), timeout=60
        )

    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(blocker)
        time.sleep(min(0.15, blocker_seconds / 3))
        assert not running.done(), "the blocking request finished too early to block anything"
        results = together(count, follower)
        response = running.result(timeout=LOAD_TIMEOUT)
        assert response.status_code == 200, response.text
    return results


def test_multi_row_requests_batch_together(models_server, slow_iterations):
    """Four requests of 3 rows each, queued behind a long run, execute together as one batch of
    12 rows; each request gets its own rows back."""
    before = quiet_stats(models_server, "slow_batching")
    count, rows = 4, 3

    def follower(i: int):
        values = (np.arange(rows, dtype=np.float32) + 10 * i).reshape(rows, 1)
        body = {
            "id": f"r{i}",
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [rows, 1], "data": values.flatten().tolist()},
                {"name": "n", "datatype": "INT64", "shape": [rows, 1], "data": [1] * rows},
            ],
        }
        return values, requests.post(f"{models_server.url}/v2/models/slow_batching/infer", json=body, timeout=60)

    results = behind_blocker(models_server, "slow_batching", 0.5, slow_iterations, follower, count)
    for i, result in enumerate(results):
        assert not isinstance(result, Exception), result
        values, response = result
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["id"] == f"r{i}"
        assert body["outputs"][0]["shape"] == [rows, 1]
        assert body["outputs"][0]["data"] == values.flatten().tolist()
    after = stats_of(models_server, "slow_batching", success=success_count(before) + 1 + count)
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_count"] - before["inference_count"] == 1 + count * rows
    assert batch_delta(before, after) == {1: 1, count * rows: 1}


def test_preferred_batch_size(models_server, slow_iterations):
    """preferred_batch_size [2]: four requests queued behind a long run leave as two batches of 2
    (without a preferred size they would leave as one batch of 4, as above)."""
    before = quiet_stats(models_server, "slow_preferred")

    def follower(i: int):
        return requests.post(
            f"{models_server.url}/v2/models/slow_preferred/infer", json=slow_request(1, float(i)), timeout=60
        )

    results = behind_blocker(models_server, "slow_preferred", 0.5, slow_iterations, follower, 4)
    for i, response in enumerate(results):
        assert not isinstance(response, Exception), response
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [float(i)]
    after = stats_of(models_server, "slow_preferred", success=success_count(before) + 5)
    assert batch_delta(before, after) == {1: 1, 2: 2}


def test_different_shapes_do_not_share_a_batch(models_server):
    """Requests whose variable dimension differs can't be concatenated: each runs, each is right."""
    before = quiet_stats(models_server, "batching")
    widths = [3, 5, 3, 7]

    def call(i: int):
        values = np.full((1, widths[i]), i, np.float32)
        return values, requests.post(
            f"{models_server.url}/v2/models/batching/infer", json=fp32_request(values), timeout=30
        )

    for result in together(len(widths), call):
        assert not isinstance(result, Exception), result
        values, response = result
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == values.flatten().tolist()
    after = stats_of(models_server, "batching", success=success_count(before) + len(widths))
    executions = after["execution_count"] - before["execution_count"]
    assert 3 <= executions <= 4  # the two width-3 requests may share one


# --------------------------------------------------------------------------- queue policy


def test_max_queue_size(models_server, slow_iterations):
    """max_queue_size 2, one instance, batch 1: of 8 simultaneous slow requests some are refused."""
    before = quiet_stats(models_server, "slow_queue")
    count = 8
    iterations = slow_iterations(0.3)

    def call(i: int):
        return requests.post(
            f"{models_server.url}/v2/models/slow_queue/infer", json=slow_request(iterations, float(i)), timeout=60
        )

    results = together(count, call)
    statuses = []
    for i, response in enumerate(results):
        assert not isinstance(response, Exception), response
        statuses.append(response.status_code)
        if response.status_code == 200:
            assert response.json()["outputs"][0]["data"] == [float(i)]
        else:
            assert response.status_code == 503, response.text
            message = response.json()["error"]
            assert "queue" in message and "slow_queue" in message, message
    ok, refused = statuses.count(200), statuses.count(503)
    assert ok + refused == count
    assert ok >= 3, statuses  # one running + max_queue_size queued
    assert refused >= 1, statuses
    after = stats_of(models_server, "slow_queue", success=success_count(before) + ok, fail=fail_count(before) + refused)
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == refused
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == ok
    # Still serving.
    response = requests.post(f"{models_server.url}/v2/models/slow_queue/infer", json=slow_request(1, 5.0), timeout=30)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [5.0]


def test_default_timeout(models_server, slow_iterations):
    """default_timeout_microseconds 50 ms: requests queued behind a 300 ms run expire with 503."""
    count = 4
    iterations = slow_iterations(0.3)

    def call(i: int):
        return requests.post(
            f"{models_server.url}/v2/models/slow_timeout/infer", json=slow_request(iterations), timeout=60
        )

    results = together(count, call)
    statuses = []
    for response in results:
        assert not isinstance(response, Exception), response
        statuses.append(response.status_code)
        if response.status_code != 200:
            assert response.status_code == 503, response.text
            message = response.json()["error"]
            assert "timeout" in message and "slow_timeout" in message, message
    assert statuses.count(200) >= 1, statuses
    assert statuses.count(503) >= 2, statuses
    response = requests.post(f"{models_server.url}/v2/models/slow_timeout/infer", json=slow_request(1), timeout=30)
    assert response.status_code == 200


def test_timeout_override(models_server, slow_iterations):
    """allow_timeout_override: a request's own 'timeout' parameter (microseconds) applies."""
    blocker_iterations = slow_iterations(0.4)

    def call(i: int):
        if i == 0:
            body = slow_request(blocker_iterations)
        else:
            time.sleep(0.05)  # queue behind the blocker
            body = slow_request(1, parameters={"timeout": 20000} if i == 1 else None)
        return requests.post(f"{models_server.url}/v2/models/slow_timeout_override/infer", json=body, timeout=60)

    blocker, short, patient = together(3, call)
    assert blocker.status_code == 200, blocker.text
    assert short.status_code == 503, short.text
    assert "timeout" in short.json()["error"]
    assert patient.status_code == 200, patient.text


def test_timeout_override_must_be_a_number(models_server):
    """A 'timeout' parameter that is not an integer is the client's mistake: 400, naming it."""
    body = slow_request(1, parameters={"timeout": "soon"})
    response = requests.post(f"{models_server.url}/v2/models/slow_timeout_override/infer", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "timeout" in response.json()["error"]
    response = requests.post(
        f"{models_server.url}/v2/models/slow_timeout_override/infer", json=slow_request(1), timeout=30
    )
    assert response.status_code == 200


def test_queue_time_in_stats(models_server, slow_iterations):
    """Requests that waited behind a slow run show queue time in the statistics."""
    before = quiet_stats(models_server, "slow")
    iterations = slow_iterations(0.2)

    def call(i: int):
        time.sleep(0.05 * i)  # the second arrives while the first runs, and queues
        return requests.post(f"{models_server.url}/v2/models/slow/infer", json=slow_request(iterations), timeout=60)

    for response in together(2, call):
        assert not isinstance(response, Exception), response
        assert response.status_code == 200, response.text
    after = stats_of(models_server, "slow", success=success_count(before) + 2)
    queue_ns = after["inference_stats"]["queue"]["ns"] - before["inference_stats"]["queue"]["ns"]
    infer_ns = after["inference_stats"]["compute_infer"]["ns"] - before["inference_stats"]["compute_infer"]["ns"]
    assert queue_ns > 50_000_000, queue_ns  # the second one waited for most of the first's run
    assert infer_ns > 100_000_000, infer_ns


def test_batch_over_max_batch_size(bundled_server):
    images = np.zeros((65, 1, 28, 28), np.float32)
    client = httpclient.InferenceServerClient(bundled_server.address, network_timeout=60.0)
    try:
        infer_input = httpclient.InferInput("input.1", list(images.shape), "FP32")
        infer_input.set_data_from_numpy(images)
        with pytest.raises(Exception) as excinfo:
            client.infer("digits", [infer_input])
        assert "max_batch_size" in str(excinfo.value) and "65" in str(excinfo.value)
        assert excinfo.value.status() == "400"
        # 64 is fine.
        infer_input = httpclient.InferInput("input.1", [64, 1, 28, 28], "FP32")
        infer_input.set_data_from_numpy(images[:64])
        assert client.infer("digits", [infer_input]).as_numpy("logits").shape == (64, 10)
    finally:
        client.close()
