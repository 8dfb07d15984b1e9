"""The BLIP-captioning seed (issue 3): three inputs, a variable sequence length, big logits.

The model (``build_captioning``) has the seed's exact I/O signature and config with small random
weights; it is built into a temp dir (about 4 MB, not part of the bundled repository). Every
answer is compared with the same model run in ONNX Runtime directly, over HTTP and gRPC.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PERF_SHORT_RUN, quiet_stats, run_perf_analyzer, start_server, stats_of
from tritonclient.utils import InferenceServerException

from inferd.examples.build_models import CAPTIONING_VOCAB, _ort_session, build_captioning, captioning_inputs

MODEL = "captioning"
INPUTS = [
    ("pixel_values", "FP32", [-1, 3, 384, 384]),
    ("input_ids", "INT64", [-1, -1]),
    ("attention_mask", "INT64", [-1, -1]),
]
OUTPUTS = [("logits", "FP32", [-1, -1, CAPTIONING_VOCAB])]
PROTOCOLS = ["http", "grpc"]
# Batching several requests into one run may change the last bits of a MatMul.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def captioning_model(tmp_path_factory):
    repo = tmp_path_factory.mktemp("captioning") / "models"
    return build_captioning(repo, verbose=False)


@pytest.fixture(scope="module")
def reference(captioning_model):
    """The model run in ONNX Runtime directly: ``reference(inputs) -> logits``."""
    session = _ort_session(captioning_model.read_bytes())
    return lambda inputs: session.run(["logits"], inputs)[0]


@pytest.fixture(scope="module")
def captioning_server(log_dir, captioning_model):
    server = start_server(log_dir / "captioning", [captioning_model.parent.parent.parent], [MODEL])
    yield server
    code = server.stop()
    assert code == 0, server.log()


@pytest.fixture(scope="module")
def clients(captioning_server):
    http = httpclient.InferenceServerClient(captioning_server.address, connection_timeout=60, network_timeout=60)
    grpc = grpcclient.InferenceServerClient(captioning_server.grpc_address)
    yield {"http": http, "grpc": grpc}
    http.close()
    grpc.close()


def infer(client, protocol: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    module = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
        if protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    if protocol == "http":
        outputs = [httpclient.InferRequestedOutput("logits", binary_data=True)]
    else:
        outputs = [grpcclient.InferRequestedOutput("logits")]
    return client.infer(MODEL, tensors, outputs=outputs).as_numpy("logits")


def test_config_is_the_seeds(captioning_server):
    config = captioning_server.get(f"/v2/models/{MODEL}/config").json()
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1000
    assert [(i["name"], i["data_type"]) for i in config["input"]] == [
        ("pixel_values", "TYPE_FP32"),
        ("input_ids", "TYPE_INT64"),
        ("attention_mask", "TYPE_INT64"),
    ]
    assert [[int(d) for d in i["dims"]] for i in config["input"]] == [[3, 384, 384], [-1], [-1]]
    assert [int(d) for d in config["output"][0]["dims"]] == [-1, CAPTIONING_VOCAB]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metadata(clients, protocol):
    client = clients[protocol]
    if protocol == "http":
        meta = client.get_model_metadata(MODEL)
        inputs = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]]
        outputs = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]]
    else:
        meta = client.get_model_metadata(MODEL)
        inputs = [(t.name, t.datatype, list(t.shape)) for t in meta.inputs]
        outputs = [(t.name, t.datatype, list(t.shape)) for t in meta.outputs]
    assert inputs == INPUTS
    assert outputs == OUTPUTS


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("batch", "seq_len"), [(1, 16), (1, 7), (2, 16), (2, 7)])
def test_infer_matches_onnxruntime(clients, reference, protocol, batch, seq_len):
    inputs = captioning_inputs(batch, seq_len, seed=batch * 100 + seq_len)
    logits = infer(clients[protocol], protocol, inputs)
    assert logits.shape == (batch, seq_len, CAPTIONING_VOCAB)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, reference(inputs), **TOLERANCE)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_concurrent_sequence_lengths(captioning_server, reference, protocol):
    """Requests of different sequence lengths in flight together: the batcher may merge only
    requests of identical shapes, so each one still gets its own, correct logits."""
    lengths = [16, 7, 16, 3, 7, 12, 16, 3, 12, 7, 16, 5]
    requests = [captioning_inputs(1, t, seed=1000 + i) for i, t in enumerate(lengths)]
    before = quiet_stats(captioning_server, MODEL)["inference_count"]

    def one(inputs):
        # One client per thread: neither client is meant to be shared across threads.
        if protocol == "http":
            client = httpclient.InferenceServerClient(captioning_server.address, network_timeout=60)
        else:
            client = grpcclient.InferenceServerClient(captioning_server.grpc_address)
        try:
            return infer(client, protocol, inputs)
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, requests))
    for inputs, logits in zip(requests, results):
        assert logits.shape == (1, inputs["input_ids"].shape[1], CAPTIONING_VOCAB)
        np.testing.assert_allclose(logits, reference(inputs), **TOLERANCE)
    after = stats_of(captioning_server, MODEL)["inference_count"]
    assert after - before >= len(requests)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_max_batch_size(clients, reference, protocol):
    inputs = captioning_inputs(8, 16, seed=8)
    logits = infer(clients[protocol], protocol, inputs)
    assert logits.shape == (8, 16, CAPTIONING_VOCAB)
    np.testing.assert_allclose(logits, reference(inputs), **TOLERANCE)
    with pytest.raises(InferenceServerException) as info:
        infer(clients[protocol], protocol, captioning_inputs(9, 4, seed=9))
    assert "batch" in str(info.value).lower(), str(info.value)


def test_batch_9_is_400(captioning_server):
    """Over REST (binary tensors), a batch above max_batch_size is a client error (400)."""
    inputs = captioning_inputs(9, 4, seed=9)
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": "FP32" if array.dtype == np.float32 else "INT64",
                "parameters": {"binary_data_size": array.nbytes},
            }
            for name, array in inputs.items()
        ]
    }
    head = json.dumps(header).encode()
    response = captioning_server.post(
        f"/v2/models/{MODEL}/infer",
        data=head + b"".join(array.tobytes() for array in inputs.values()),
        headers={"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
        timeout=120,
    )
    assert response.status_code == 400, (response.status_code, response.text[:500])
    assert "batch" in response.text.lower(), response.text[:500]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_seed_command(perf_analyzer, captioning_server, protocol):
    """The seed's own command line, over HTTP and over gRPC."""
    before = quiet_stats(captioning_server, MODEL)
    output, throughputs = run_perf_analyzer(
        perf_analyzer,
        captioning_server,
        [
            "-m",
            MODEL,
            "--concurrency-range",
            "1:2",
            "--shape",
            "pixel_values:3,384,384",
            "--shape",
            "input_ids:16",
            "--shape",
            "attention_mask:16",
            *PERF_SHORT_RUN,
        ],
        protocol=protocol,
    )
    assert len(throughputs) == 2, output
    assert all(t > 0 for t in throughputs), output
    after = stats_of(captioning_server, MODEL)
    assert after["inference_count"] > before["inference_count"]
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
