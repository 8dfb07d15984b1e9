"""Triton's own load generator, perf_analyzer, against inferd (short, bounded runs)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import (  # noqa: F401
    BUNDLED_REPOSITORY,
    PERF_SHORT_RUN,
    quiet_stats,
    run_perf_analyzer,
    start_server,
    stats_of,
)

from inferd.examples.build_models import write_seed_repository

#: Generous bounds: a run is a few seconds; these only stop a hung run.
#: Loose stability (max/min of the last 3 windows within 6x) so that a short run on a small, busy
#: machine still completes: these tests check that the server works with perf_analyzer, not how
#: steady it is.


def test_perf_analyzer_digits(perf_analyzer, bundled_server):
    before = quiet_stats(bundled_server, "digits")
    output, throughputs = run_perf_analyzer(
        perf_analyzer,
        bundled_server,
        ["-m", "digits", "--concurrency-range", "4", "--shape", "input.1:1,28,28", *PERF_SHORT_RUN],
    )
    assert len(throughputs) == 1, output
    assert throughputs[0] > 0, output
    after = stats_of(bundled_server, "digits")
    assert after["inference_count"] > before["inference_count"]
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]


@pytest.fixture(scope="module")
def seed_repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("seed") / "models"
    write_seed_repository(repo, BUNDLED_REPOSITORY / "digits" / "1" / "model.onnx")
    return repo


@pytest.fixture(scope="module")
def seed_server(log_dir, seed_repository):
    server = start_server(log_dir / "seed", [seed_repository], ["onnx-mnist-cpu"])
    yield server
    code = server.stop()
    assert code == 0, server.log()


def test_seed_model_config(seed_server):
    """The colon form parses, the instances are there, and the tensors came from the model."""
    config = seed_server.get("/v2/models/onnx-mnist-cpu/config").json()
    assert config["instance_group"][0]["count"] == 5
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 150
    assert config["max_batch_size"] == 0  # fixed batch dimension: no batching
    assert [i["name"] for i in config["input"]] == ["input.1"]
    assert config["input"][0]["dims"] == [1, 1, 28, 28]
    assert config["output"][0]["dims"] == [1, 10]
    metadata = seed_server.get("/v2/models/onnx-mnist-cpu").json()
    assert metadata["inputs"] == [{"name": "input.1", "datatype": "FP32", "shape": [1, 1, 28, 28]}]


def test_seed_model_answers_like_digits(seed_server, bundled_server):
    from inferd.examples.build_models import digits_test_set

    images, labels = digits_test_set()
    seed = httpclient.InferenceServerClient(seed_server.address, network_timeout=60.0)
    digits = httpclient.InferenceServerClient(bundled_server.address, network_timeout=60.0)
    try:
        infer_input = httpclient.InferInput("input.1", [8, 1, 28, 28], "FP32")
        infer_input.set_data_from_numpy(images[:8])
        reference = digits.infer("digits", [infer_input]).as_numpy("logits")
        for i in range(8):
            one = httpclient.InferInput("input.1", [1, 1, 28, 28], "FP32")
            one.set_data_from_numpy(images[i : i + 1])
            logits = seed.infer("onnx-mnist-cpu", [one]).as_numpy("logits")
            assert logits.shape == (1, 10)
            np.testing.assert_allclose(logits[0], reference[i], rtol=1e-4, atol=1e-4)
    finally:
        seed.close()
        digits.close()


def test_perf_analyzer_seed_journey(perf_analyzer, seed_server):
    output, throughputs = run_perf_analyzer(
        perf_analyzer,
        seed_server,
        [
            "-m",
            "onnx-mnist-cpu",
            "--concurrency-range",
            "1:3",
            "--shape",
            "input.1:1,1,28,28",
            "--measurement-interval",
            "500",
            "--max-trials",
            "6",
            "--stability-percentage",
            "500",
        ],
    )
    assert len(throughputs) == 3, output
    assert all(t > 0 for t in throughputs), output
    stats = stats_of(seed_server, "onnx-mnist-cpu")
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["execution_count"] == stats["inference_count"] > 0
