"""The KServe V2 gRPC front end (Triton's GRPCInferenceService) with real clients:
tritonclient.grpc, the raw generated stub for what tritonclient won't send, and perf_analyzer."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import (
    BUNDLED_MODELS,
    HOST,
    PERF_SHORT_RUN,
    ROOT,
    fail_count,
    free_port,
    quiet_stats,
    run_perf_analyzer,
    start_server,
    stats_of,
    success_count,
)
from google.protobuf import json_format
from models import DATATYPES, identity_name, slow_config, slow_model, write_model
from test_kserve_http import datatype_values
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

#: What the raw stub channels accept (as tritonclient.grpc does: no client-side cap).
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]

# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def bundled_grpc(bundled_server):
    client = grpcclient.InferenceServerClient(bundled_server.grpc_address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def models_grpc(models_server):
    client = grpcclient.InferenceServerClient(models_server.grpc_address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def bundled_stub(bundled_server):
    channel = grpc.insecure_channel(bundled_server.grpc_address, options=CHANNEL_OPTIONS)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def models_stub(models_server):
    channel = grpc.insecure_channel(models_server.grpc_address, options=CHANNEL_OPTIONS)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def simple_inputs(rows: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**20), 2**20, size=(rows, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, size=(rows, 16), dtype=np.int32)
    return a, b


def infer_inputs(**arrays: tuple[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """``name=(datatype, array)`` -> tritonclient.grpc inputs (raw_input_contents)."""
    inputs = []
    for name, (datatype, array) in arrays.items():
        infer_input = grpcclient.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


def simple_grpc_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    return infer_inputs(INPUT0=("INT32", a), INPUT1=("INT32", b))


def grpc_error(call, code: str) -> str:
    """Run ``call``; it must fail with gRPC status ``code`` (e.g. 'INVALID_ARGUMENT'). The message."""
    with pytest.raises(InferenceServerException) as info:
        call()
    error = info.value
    assert error.status() == f"StatusCode.{code}", (error.status(), error.message())
    message = error.message()
    assert isinstance(message, str) and message
    return message


def stub_error(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, (info.value.code(), info.value.details())
    return info.value.details()


def raw_request(model: str, *tensors: tuple[str, str, list[int], bytes], **fields) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with ``(name, datatype, shape, raw bytes)`` inputs."""
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    for name, datatype, shape, data in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(data)
    return request


def simple_raw_request(a: np.ndarray, b: np.ndarray, model: str = "simple", **fields) -> service_pb2.ModelInferRequest:
    return raw_request(
        model,
        ("INPUT0", "INT32", list(a.shape), a.tobytes()),
        ("INPUT1", "INT32", list(b.shape), b.tobytes()),
        **fields,
    )


def assert_simple_serves(stub) -> None:
    a, b = simple_inputs(1, seed=99)
    response = stub.ModelInfer(simple_raw_request(a, b), timeout=30)
    result = grpcclient.InferResult(response)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def slow_inputs(iterations: int, value: float = 1.0) -> list[grpcclient.InferInput]:
    return infer_inputs(x=("FP32", np.array([[value]], np.float32)), n=("INT64", np.array([[iterations]], np.int64)))


def tensors_to_dict(tensors) -> list[dict]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]


# --------------------------------------------------------------------------- health, metadata, config


def test_server_live_ready_metadata(bundled_server, bundled_grpc):
    assert bundled_grpc.is_server_live()
    assert bundled_grpc.is_server_ready()
    metadata = bundled_grpc.get_server_metadata()
    rest = bundled_server.get("/v2").json()
    assert metadata.name == "inferd" == rest["name"]
    assert metadata.version == rest["version"]
    assert list(metadata.extensions) == rest["extensions"]
    assert bundled_grpc.get_server_metadata(as_json=True)["name"] == "inferd"


@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_model_ready(bundled_grpc, name):
    assert bundled_grpc.is_model_ready(name)
    assert bundled_grpc.is_model_ready(name, "1")


def test_model_ready_unknown(bundled_grpc):
    """As Triton's gRPC endpoint: an unknown model or version is not ready (no error)."""
    assert bundled_grpc.is_model_ready("no_such_model") is False
    assert bundled_grpc.is_model_ready("simple", "7") is False


@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_model_metadata_matches_rest(bundled_server, bundled_grpc, name):
    metadata = bundled_grpc.get_model_metadata(name)
    rest = bundled_server.get(f"/v2/models/{name}").json()
    got = {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": tensors_to_dict(metadata.inputs),
        "outputs": tensors_to_dict(metadata.outputs),
    }
    assert got == rest
    assert bundled_grpc.get_model_metadata(name, "1") == metadata


def test_model_metadata_digits(bundled_grpc):
    metadata = bundled_grpc.get_model_metadata("digits", as_json=True)
    assert metadata["inputs"] == [{"name": "input.1", "datatype": "FP32", "shape": ["-1", "1", "28", "28"]}]
    assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["-1", "10"]}]


def test_datatype_metadata(models_grpc):
    for datatype in DATATYPES:
        metadata = models_grpc.get_model_metadata(identity_name(datatype))
        assert tensors_to_dict(metadata.inputs) == [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
        assert tensors_to_dict(metadata.outputs) == [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, -1]}]


@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_model_config_matches_rest(bundled_server, bundled_grpc, name):
    response = bundled_grpc.get_model_config(name)
    assert isinstance(response.config, model_config_pb2.ModelConfig)
    rest = json_format.ParseDict(bundled_server.get(f"/v2/models/{name}/config").json(), model_config_pb2.ModelConfig())
    assert response.config == rest
    assert bundled_grpc.get_model_config(name, "1") == response


def test_model_config_digits(bundled_grpc):
    config = bundled_grpc.get_model_config("digits").config
    assert config.name == "digits"
    assert config.max_batch_size == 64
    assert config.platform == "onnxruntime_onnx"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input.1", model_config_pb2.TYPE_FP32, [1, 28, 28])
    ]
    assert config.instance_group[0].count == 2
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.dynamic_batching.max_queue_delay_microseconds == 150
    as_json = bundled_grpc.get_model_config("simple", as_json=True)["config"]
    assert as_json["max_batch_size"] == 8
    assert [i["name"] for i in as_json["input"]] == ["INPUT0", "INPUT1"]


def test_model_config_queue_policy(models_grpc):
    policy = models_grpc.get_model_config("slow_timeout").config.dynamic_batching.default_queue_policy
    assert policy.default_timeout_microseconds == 50000
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT


def test_repository_index(bundled_server, bundled_grpc, models_server, models_grpc):
    index = bundled_grpc.get_model_repository_index()
    rows = [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in index.models]
    rest = bundled_server.post("/v2/repository/index").json()
    assert rows == [{"reason": "", **row} for row in rest]
    assert sorted(m.name for m in index.models) == sorted(BUNDLED_MODELS)
    assert all(m.state == "READY" and m.version == "1" for m in index.models)
    as_json = models_grpc.get_model_repository_index(as_json=True)
    versioned = [m for m in as_json["models"] if m["name"] == "versioned"]
    assert [m["version"] for m in versioned] == ["3"]


def test_repository_index_ready_filter(bundled_stub):
    everything = bundled_stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=30)
    ready = bundled_stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=30)
    assert ready == everything  # every bundled model is ready


def test_metadata_errors(bundled_server, bundled_grpc):
    message = grpc_error(lambda: bundled_grpc.get_model_metadata("no_such_model"), "NOT_FOUND")
    assert message == bundled_server.get("/v2/models/no_such_model").json()["error"]
    message = grpc_error(lambda: bundled_grpc.get_model_config("simple", "2"), "NOT_FOUND")
    assert message == bundled_server.get("/v2/models/simple/versions/2/config").json()["error"]
    message = grpc_error(lambda: bundled_grpc.get_inference_statistics("no_such_model"), "NOT_FOUND")
    assert "no_such_model" in message


# --------------------------------------------------------------------------- inference: bundled models


def test_simple(bundled_grpc):
    a, b = simple_inputs(3, seed=1)
    result = bundled_grpc.infer("simple", simple_grpc_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    response = result.get_response()
    assert response.model_name == "simple"
    assert response.model_version == "1"
    assert response.id == ""
    # Triton's layout: every output in raw_output_contents, with its datatype and shape.
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [3, 16]),
        ("OUTPUT1", "INT32", [3, 16]),
    ]
    assert [len(r) for r in response.raw_output_contents] == [3 * 16 * 4] * 2
    assert not any(o.HasField("contents") for o in response.outputs)


def test_simple_versioned(bundled_grpc):
    a, b = simple_inputs(1, seed=2)
    result = bundled_grpc.infer("simple", simple_grpc_inputs(a, b), model_version="1")
    assert result.get_response().model_version == "1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_request_id_echoed(bundled_grpc):
    a, b = simple_inputs(1)
    result = bundled_grpc.infer("simple", simple_grpc_inputs(a, b), request_id="my id ✓")
    assert result.get_response().id == "my id ✓"


def test_requested_output_subset(bundled_grpc):
    a, b = simple_inputs(2, seed=4)
    result = bundled_grpc.infer(
        "simple", simple_grpc_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def test_parameters_accepted(bundled_grpc, bundled_stub):
    a, b = simple_inputs(1, seed=5)
    result = bundled_grpc.infer(
        "simple",
        simple_grpc_inputs(a, b),
        parameters={"custom": "value", "number": 3, "flag": True, "ratio": 0.5},
        priority=1,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    request = simple_raw_request(a, b)
    request.parameters["big"].uint64_param = 2**64 - 1
    request.parameters["unset"].CopyFrom(service_pb2.InferParameter())
    request.inputs[0].parameters["note"].string_param = "per-input parameter"
    response = bundled_stub.ModelInfer(request, timeout=30)
    np.testing.assert_array_equal(grpcclient.InferResult(response).as_numpy("OUTPUT0"), a + b)


def test_mixed_exact(bundled_grpc):
    x = np.array([[1.5, -2.0, 0.0, 3.25], [-1.0, -0.5, -7.0, -3.0], [2.0, 4.0, 8.0, 0.125]], np.float32)
    scale = np.array([[2.0], [-0.5], [0.1]], np.float64)
    k = np.array([[10], [-3], [2**40]], np.int64)
    text = np.array([["hello"], [""], ["wörld ✓"]], dtype=np.object_)
    inputs = infer_inputs(x=("FP32", x), scale=("FP64", scale), k=("INT64", k), text=("BYTES", text))
    result = bundled_grpc.infer("mixed", inputs)
    y = result.as_numpy("y")
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, x.astype(np.float64) * scale)
    positive = result.as_numpy("positive")
    assert positive.dtype == np.bool_
    np.testing.assert_array_equal(positive, x > 0)
    count = result.as_numpy("count")
    assert count.dtype == np.int64
    np.testing.assert_array_equal(count, (x > 0).sum(axis=1, keepdims=True) + k)
    text_out = result.as_numpy("text_out")
    assert text_out.shape == (3, 1)
    assert [t.decode() for t in text_out.flatten()] == ["hello", "", "wörld ✓"]
    datatypes = {o.name: o.datatype for o in result.get_response().outputs}
    assert datatypes == {"y": "FP64", "positive": "BOOL", "count": "INT64", "text_out": "BYTES"}


def test_digits_accuracy(bundled_grpc):
    from inferd.examples.build_models import digits_test_set

    images, labels = digits_test_set()
    predictions = []
    for start in range(0, len(images), 64):
        batch = images[start : start + 64]
        result = bundled_grpc.infer("digits", infer_inputs(**{"input.1": ("FP32", batch)}))
        logits = result.as_numpy("logits")
        assert logits.shape == (len(batch), 10) and logits.dtype == np.float32
        predictions.append(logits.argmax(axis=1))
    accuracy = float((np.concatenate(predictions) == labels).mean())
    assert accuracy > 0.9, f"accuracy {accuracy:.3f}"


def test_digits_matches_rest(bundled_server, bundled_grpc):
    from inferd.examples.build_models import digits_test_set

    images, _ = digits_test_set()
    batch = images[:3]
    grpc_logits = bundled_grpc.infer("digits", infer_inputs(**{"input.1": ("FP32", batch)})).as_numpy("logits")
    request = {"inputs": [{"name": "input.1", "datatype": "FP32", "shape": [3, 1, 28, 28], "data": batch.tolist()}]}
    body = bundled_server.post("/v2/models/digits/infer", json=request).json()
    np.testing.assert_array_equal(np.array(body["outputs"][0]["data"], np.float32).reshape(3, 10), grpc_logits)


def test_async_infer(bundled_grpc):
    answers: queue.Queue = queue.Queue()
    expected = {}
    for i in range(8):
        a, b = simple_inputs(1 + i % 3, seed=100 + i)
        expected[str(i)] = (a, b)
        bundled_grpc.async_infer(
            "simple",
            simple_grpc_inputs(a, b),
            lambda result, error: answers.put((result, error)),
            request_id=str(i),
        )
    seen = set()
    for _ in range(8):
        result, error = answers.get(timeout=60)
        assert error is None, error
        request_id = result.get_response().id
        a, b = expected[request_id]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        seen.add(request_id)
    assert seen == set(expected)


def test_async_infer_error(bundled_grpc):
    answers: queue.Queue = queue.Queue()
    a, b = simple_inputs(1)
    bundled_grpc.async_infer(
        "no_such_model", simple_grpc_inputs(a, b), lambda result, error: answers.put((result, error))
    )
    result, error = answers.get(timeout=60)
    assert result is None
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in error.message()


def test_concurrent_clients(bundled_server):
    def worker(seed: int) -> bool:
        client = grpcclient.InferenceServerClient(bundled_server.grpc_address)
        try:
            for i in range(5):
                a, b = simple_inputs(4, seed=seed * 10 + i)
                result = client.infer("simple", simple_grpc_inputs(a, b))
                if not np.array_equal(result.as_numpy("OUTPUT0"), a + b):
                    return False
            return True
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(worker, range(4), timeout=120))


# --------------------------------------------------------------------------- every datatype


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_datatype_round_trip_raw(models_grpc, datatype):
    """raw_input_contents in, raw_output_contents out: bit-exact (inf, -0.0, NUL in BYTES)."""
    values = datatype_values(datatype, binary=True)
    result = models_grpc.infer(identity_name(datatype), infer_inputs(INPUT0=(datatype, values)))
    (output,) = result.get_response().outputs
    assert output.datatype == datatype
    assert list(output.shape) == [3, 4]
    got = result.as_numpy("OUTPUT0")
    assert got.shape == values.shape
    if datatype == "BYTES":
        assert list(got.flatten()) == list(values.flatten())
    else:
        assert got.dtype == values.dtype
        assert got.tobytes() == values.tobytes(), (got, values)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "FP16"])
def test_datatype_round_trip_typed_contents(models_stub, datatype):
    """The typed InferTensorContents fields, as hand-built clients send them."""
    from inferd.frontends.kserve_grpc import CONTENTS_FIELD

    values = datatype_values(datatype, binary=True)
    request = service_pb2.ModelInferRequest(model_name=identity_name(datatype), id="typed")
    entry = request.inputs.add(name="INPUT0", datatype=datatype, shape=list(values.shape))
    getattr(entry.contents, CONTENTS_FIELD[datatype]).extend(values.flatten().tolist())
    response = models_stub.ModelInfer(request, timeout=30)
    assert response.id == "typed"
    got = grpcclient.InferResult(response).as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert list(got.flatten()) == list(values.flatten())
    else:
        assert got.dtype == values.dtype
        assert got.tobytes() == values.tobytes(), (got, values)


def test_zero_sized_variable_dim(models_grpc):
    values = np.zeros((2, 0), np.float32)
    result = models_grpc.infer(identity_name("FP32"), infer_inputs(INPUT0=("FP32", values)))
    assert result.as_numpy("OUTPUT0").shape == (2, 0)


def test_large_round_trip(models_grpc):
    """16 MiB each way: over gRPC's default 4 MiB message limit, under the server's max request size."""
    values = np.random.default_rng(11).standard_normal((8, 1 << 19)).astype(np.float32)
    result = models_grpc.infer(identity_name("FP32"), infer_inputs(INPUT0=("FP32", values)))
    assert result.as_numpy("OUTPUT0").tobytes() == values.tobytes()


def test_highest_version_served(models_grpc):
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = models_grpc.infer("versioned", infer_inputs(INPUT0=("FP32", values)))
    assert result.get_response().model_version == "3"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values + 3)
    grpc_error(
        lambda: models_grpc.infer("versioned", infer_inputs(INPUT0=("FP32", values)), model_version="1"), "NOT_FOUND"
    )


# --------------------------------------------------------------------------- errors: same messages as REST

A1, B1 = simple_inputs(1, seed=7)


def _json(name: str, datatype: str, array: np.ndarray) -> dict:
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.flatten().tolist()}


#: id -> (model, version, [(name, datatype, array)], requested outputs, gRPC status, REST status)
CORE_ERRORS = {
    "unknown-model": ("no_such_model", "", [("INPUT0", "INT32", A1)], None, "NOT_FOUND", 404),
    "unknown-version": ("simple", "5", [("INPUT0", "INT32", A1), ("INPUT1", "INT32", B1)], None, "NOT_FOUND", 404),
    "wrong-shape": (
        "simple",
        "",
        [("INPUT0", "INT32", A1[:, :15]), ("INPUT1", "INT32", B1[:, :15])],
        None,
        "INVALID_ARGUMENT",
        400,
    ),
    "wrong-rank": (
        "simple",
        "",
        [("INPUT0", "INT32", A1[0]), ("INPUT1", "INT32", B1[0])],
        None,
        "INVALID_ARGUMENT",
        400,
    ),
    "wrong-datatype": (
        "simple",
        "",
        [("INPUT0", "FP32", A1.astype(np.float32)), ("INPUT1", "INT32", B1)],
        None,
        "INVALID_ARGUMENT",
        400,
    ),
    "batch-over-max": (
        "simple",
        "",
        [("INPUT0", "INT32", np.zeros((9, 16), np.int32)), ("INPUT1", "INT32", np.zeros((9, 16), np.int32))],
        None,
        "INVALID_ARGUMENT",
        400,
    ),
    "batch-disagrees": (
        "simple",
        "",
        [("INPUT0", "INT32", np.zeros((2, 16), np.int32)), ("INPUT1", "INT32", np.zeros((3, 16), np.int32))],
        None,
        "INVALID_ARGUMENT",
        400,
    ),
    "unknown-input": (
        "simple",
        "",
        [("INPUT0", "INT32", A1), ("INPUT1", "INT32", B1), ("EXTRA", "INT32", A1)],
        None,
        "INVALID_ARGUMENT",
        400,
    ),
    "missing-input": ("simple", "", [("INPUT0", "INT32", A1)], None, "INVALID_ARGUMENT", 400),
    "unknown-output": (
        "simple",
        "",
        [("INPUT0", "INT32", A1), ("INPUT1", "INT32", B1)],
        ["NOPE"],
        "INVALID_ARGUMENT",
        400,
    ),
}


@pytest.mark.parametrize("case", list(CORE_ERRORS))
def test_errors_match_rest(bundled_server, bundled_grpc, case):
    model, version, tensors, outputs, code, rest_status = CORE_ERRORS[case]
    inputs = infer_inputs(**{name: (datatype, array) for name, datatype, array in tensors})
    requested = [grpcclient.InferRequestedOutput(o) for o in outputs] if outputs else None
    message = grpc_error(lambda: bundled_grpc.infer(model, inputs, model_version=version, outputs=requested), code)
    body = {"inputs": [_json(*t) for t in tensors]}
    if outputs:
        body["outputs"] = [{"name": o} for o in outputs]
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    response = bundled_server.post(path, json=body)
    assert response.status_code == rest_status, response.text
    assert message == response.json()["error"]
    # The stream answers the same message for the same request.
    answers: queue.Queue = queue.Queue()
    bundled_grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        bundled_grpc.async_stream_infer(model, inputs, model_version=version, outputs=requested, request_id="e")
        result, error = answers.get(timeout=60)
    finally:
        bundled_grpc.stop_stream()
    assert result is None and error.message() == message


#: id -> (request builder, a piece of the INVALID_ARGUMENT message)
def _typed(datatype: str, field: str, values: list, shape: list[int], model: str = "simple", name: str = "INPUT0"):
    request = service_pb2.ModelInferRequest(model_name=model)
    entry = request.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(entry.contents, field).extend(values)
    return request


def _raw_size_mismatch():
    return raw_request(
        "simple", ("INPUT0", "INT32", [1, 16], A1.tobytes()[:-4]), ("INPUT1", "INT32", [1, 16], B1.tobytes())
    )


def _raw_count_mismatch():
    request = simple_raw_request(A1, B1)
    del request.raw_input_contents[1]
    return request


def _raw_and_contents():
    request = simple_raw_request(A1, B1)
    request.inputs[1].contents.int_contents.extend(B1.flatten().tolist())
    return request


def _shared_memory_input():
    request = simple_raw_request(A1, B1)
    request.inputs[0].parameters["shared_memory_region"].string_param = "region0"
    return request


def _classification():
    request = simple_raw_request(A1, B1)
    request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 3
    return request


def _no_inputs():
    return service_pb2.ModelInferRequest(model_name="simple")


def _duplicate_input():
    return raw_request("simple", ("INPUT0", "INT32", [1, 16], A1.tobytes()), ("INPUT0", "INT32", [1, 16], B1.tobytes()))


def _bad_datatype():
    return raw_request("simple", ("INPUT0", "FP8", [1, 16], A1.tobytes()), ("INPUT1", "INT32", [1, 16], B1.tobytes()))


def _negative_shape():
    return raw_request(
        "simple", ("INPUT0", "INT32", [-1, 16], A1.tobytes()), ("INPUT1", "INT32", [1, 16], B1.tobytes())
    )


def _bytes_malformed():
    return raw_request("mixed", ("text", "BYTES", [1, 1], b"\x09\x00\x00\x00abc"))


def _timeout_not_a_number():
    request = raw_request(
        "slow_timeout_override",
        ("x", "FP32", [1, 1], np.ones((1, 1), np.float32).tobytes()),
        ("n", "INT64", [1, 1], np.ones((1, 1), np.int64).tobytes()),
    )
    request.parameters["timeout"].string_param = "soon"
    return request


PROTOCOL_ERRORS = {
    "raw-size-mismatch": (_raw_size_mismatch, "has 60 bytes of raw_input_contents but shape [1, 16] of INT32 needs 64"),
    "raw-count-mismatch": (_raw_count_mismatch, "2 inputs but 1 raw_input_contents"),
    "raw-and-contents": (_raw_and_contents, "input 'INPUT1' has data in 'contents'"),
    "typed-count-mismatch": (
        lambda: _typed("INT32", "int_contents", [1, 2, 3], [1, 16]),
        "3 elements in contents.int_contents",
    ),
    "typed-wrong-field": (
        lambda: _typed("INT32", "fp32_contents", [1.0] * 16, [1, 16]),
        "data goes in contents.int_contents",
    ),
    "typed-out-of-range": (
        lambda: _typed("INT8", "int_contents", [1, 300], [1, 2], model=identity_name("INT8")),
        "value 300 in contents.int_contents is out of range for INT8",
    ),
    "typed-fp16": (
        lambda: _typed("FP16", "fp32_contents", [1.0, 2.0], [1, 2], model=identity_name("FP16")),
        "FP16 data can only be sent in raw_input_contents",
    ),
    "shared-memory-with-raw": (_shared_memory_input, "every input not in shared memory needs exactly one"),
    "classification": (_classification, "classification extension is not supported"),
    "no-inputs": (_no_inputs, "at least one entry in 'inputs'"),
    "duplicate-input": (_duplicate_input, "input 'INPUT0' is given twice"),
    "unsupported-datatype": (_bad_datatype, "unsupported datatype 'FP8'"),
    "negative-shape": (_negative_shape, "non-negative"),
    "bytes-malformed": (_bytes_malformed, "input 'text'"),
    "timeout-not-a-number": (_timeout_not_a_number, "parameter 'timeout' must be a non-negative integer"),
}


@pytest.mark.parametrize("case", list(PROTOCOL_ERRORS))
def test_invalid_requests(models_server, models_stub, bundled_server, bundled_stub, case):
    build, expected = PROTOCOL_ERRORS[case]
    request = build()
    stub = models_stub if request.model_name.startswith(("identity_", "slow")) else bundled_stub
    message = stub_error(lambda: stub.ModelInfer(request, timeout=30), grpc.StatusCode.INVALID_ARGUMENT)
    assert expected in message, message
    assert_simple_serves(bundled_stub)


def test_timeout_parameter_reaches_the_scheduler(models_grpc, slow_iterations):
    """A request's own 'timeout' (microseconds, as tritonclient sends it) applies in the queue."""
    answers: queue.Queue = queue.Queue()
    model = "slow_timeout_override"
    models_grpc.async_infer(
        model, slow_inputs(slow_iterations(0.4), 1.0), lambda result, error: answers.put(("blocker", result, error))
    )
    time.sleep(0.05)  # queue behind the blocker
    models_grpc.async_infer(
        model, slow_inputs(1, 2.0), lambda result, error: answers.put(("short", result, error)), timeout=20000
    )
    got = {}
    for _ in range(2):
        name, result, error = answers.get(timeout=60)
        got[name] = (result, error)
    assert got["blocker"][1] is None, got["blocker"][1]
    error = got["short"][1]
    assert error is not None and error.status() == "StatusCode.UNAVAILABLE", error
    assert "timeout" in error.message()


def test_client_deadline(models_server, models_grpc, slow_iterations):
    """A client that gives up (gRPC deadline) gets DEADLINE_EXCEEDED; the server carries on."""
    before = success_count(quiet_stats(models_server, "slow"))
    grpc_error(
        lambda: models_grpc.infer("slow", slow_inputs(slow_iterations(0.5)), client_timeout=0.1), "DEADLINE_EXCEEDED"
    )
    # The request still ran to completion (and was counted); the next one is answered.
    stats_of(models_server, "slow", success=before + 1, timeout=30)
    result = models_grpc.infer("slow", slow_inputs(1, 5.0))
    np.testing.assert_array_equal(result.as_numpy("y"), [[5.0]])


# --------------------------------------------------------------------------- statistics


def test_statistics_count_grpc_requests(bundled_server, bundled_grpc):
    before = quiet_stats(bundled_server, "simple")
    a, b = simple_inputs(2, seed=21)
    n = 5
    for _ in range(n):
        bundled_grpc.infer("simple", simple_grpc_inputs(a, b))
    after = stats_of(bundled_server, "simple", success=success_count(before) + n)
    assert after["inference_count"] - before["inference_count"] == 2 * n
    assert after["execution_count"] - before["execution_count"] == n
    assert fail_count(after) == fail_count(before)
    # A request the core refuses counts as a failure (as over REST).
    grpc_error(lambda: bundled_grpc.infer("simple", simple_grpc_inputs(a[:, :15], b[:, :15])), "INVALID_ARGUMENT")
    final = stats_of(bundled_server, "simple", fail=fail_count(after) + 1)
    assert final["execution_count"] == after["execution_count"]

    # ModelStatistics answers what REST answers.
    rest = quiet_stats(bundled_server, "simple")
    stats = bundled_grpc.get_inference_statistics("simple")
    (entry,) = stats.model_stats
    assert (entry.name, entry.version) == ("simple", "1")
    assert entry.inference_count == rest["inference_count"]
    assert entry.execution_count == rest["execution_count"]
    assert entry.last_inference == rest["last_inference"]
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        duration = getattr(entry.inference_stats, key)
        assert (duration.count, duration.ns) == (
            rest["inference_stats"][key]["count"],
            rest["inference_stats"][key]["ns"],
        )
    assert {b.batch_size: b.compute_infer.count for b in entry.batch_stats} == {
        b["batch_size"]: b["compute_infer"]["count"] for b in rest["batch_stats"]
    }
    assert entry.batch_stats and entry.inference_stats.compute_infer.ns > 0


def test_statistics_all_models(bundled_grpc):
    stats = bundled_grpc.get_inference_statistics()
    assert sorted(m.name for m in stats.model_stats) == sorted(BUNDLED_MODELS)
    versioned = bundled_grpc.get_inference_statistics("simple", "1", as_json=True)
    assert versioned["model_stats"][0]["version"] == "1"


# --------------------------------------------------------------------------- streaming


def test_stream(bundled_server, bundled_grpc):
    """Each request answered with its id; a bad message is answered with an error and the stream
    goes on; stop_stream returns once everything was answered."""
    before = quiet_stats(bundled_server, "simple")
    answers: queue.Queue = queue.Queue()
    bundled_grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    expected = {}
    try:
        for i in range(6):
            a, b = simple_inputs(1 + i % 2, seed=200 + i)
            if i == 3:  # wrong shape: only this one fails
                bundled_grpc.async_stream_infer("simple", simple_grpc_inputs(a[:, :15], b[:, :15]), request_id="bad")
            expected[f"r{i}"] = (a, b)
            bundled_grpc.async_stream_infer("simple", simple_grpc_inputs(a, b), request_id=f"r{i}")
        got = [answers.get(timeout=60) for _ in range(7)]
    finally:
        bundled_grpc.stop_stream()
    errors = [error for result, error in got if error is not None]
    results = {result.get_response().id: result for result, error in got if error is None}
    assert len(errors) == 1
    assert "unexpected shape for input 'INPUT0'" in errors[0].message()
    assert set(results) == set(expected)
    for request_id, (a, b) in expected.items():
        np.testing.assert_array_equal(results[request_id].as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(results[request_id].as_numpy("OUTPUT1"), a - b)
    after = stats_of(bundled_server, "simple", success=success_count(before) + 6, fail=fail_count(before) + 1)
    assert after["execution_count"] - before["execution_count"] == 6
    assert answers.empty()


def test_stream_errors_carry_the_id(bundled_stub):
    """Over the raw stub: every answer names its request, errors included; the server ends the
    call once the client is done sending and everything was answered."""
    a, b = simple_inputs(1, seed=31)
    bad = simple_raw_request(a[:, :15], b[:, :15], id="bad")
    unknown = simple_raw_request(a, b, model="no_such_model", id="nobody")
    requests_ = [simple_raw_request(a, b, id="first"), bad, unknown, simple_raw_request(a, b, id="last")]
    responses = list(bundled_stub.ModelStreamInfer(iter(requests_), timeout=60))
    by_id = {r.infer_response.id: r for r in responses}
    assert sorted(by_id) == ["bad", "first", "last", "nobody"]
    assert "unexpected shape" in by_id["bad"].error_message
    assert by_id["nobody"].error_message == "unknown model: 'no_such_model'"
    for good in ("first", "last"):
        assert by_id[good].error_message == ""
        np.testing.assert_array_equal(grpcclient.InferResult(by_id[good].infer_response).as_numpy("OUTPUT0"), a + b)


def test_stream_answers_in_completion_order(models_stub, slow_iterations):
    """A slow request then a fast one on one stream: the fast answer overtakes."""
    slow = raw_request(
        "slow",
        ("x", "FP32", [1, 1], np.array([[1.0]], np.float32).tobytes()),
        ("n", "INT64", [1, 1], np.array([[slow_iterations(0.5)]], np.int64).tobytes()),
        id="slow",
    )
    fast = raw_request(
        identity_name("FP32"), ("INPUT0", "FP32", [1, 2], np.array([[1, 2]], np.float32).tobytes()), id="fast"
    )
    responses = list(models_stub.ModelStreamInfer(iter([slow, fast]), timeout=60))
    assert [r.infer_response.id for r in responses] == ["fast", "slow"]
    assert all(r.error_message == "" for r in responses)
    np.testing.assert_array_equal(grpcclient.InferResult(responses[1].infer_response).as_numpy("y"), [[1.0]])


def test_stream_final_response_flag(bundled_grpc):
    answers: queue.Queue = queue.Queue()
    a, b = simple_inputs(1, seed=41)
    bundled_grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        bundled_grpc.async_stream_infer(
            "simple", simple_grpc_inputs(a, b), request_id="f", enable_empty_final_response=True
        )
        result, error = answers.get(timeout=60)
    finally:
        bundled_grpc.stop_stream()
    assert error is None
    response = result.get_response()
    assert response.parameters["triton_final_response"].bool_param is True
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_stream_many_in_flight(models_grpc):
    answers: queue.Queue = queue.Queue()
    models_grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {}
    try:
        for i in range(40):
            values = np.full((1, 3), i, np.int64)
            sent[str(i)] = values
            models_grpc.async_stream_infer(
                identity_name("INT64"), infer_inputs(INPUT0=("INT64", values)), request_id=str(i)
            )
        got = [answers.get(timeout=60) for _ in range(40)]
    finally:
        models_grpc.stop_stream()
    for result, error in got:
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sent[result.get_response().id])
    assert {result.get_response().id for result, _ in got} == set(sent)


# --------------------------------------------------------------------------- not implemented


# (load_model / unload_model: see tests/test_model_control.py; shared memory:
# tests/test_shared_memory.py)
UNIMPLEMENTED = {
    "trace_settings": lambda c: c.get_trace_settings(),
    "update_trace_settings": lambda c: c.update_trace_settings(settings={"trace_level": ["OFF"]}),
    "log_settings": lambda c: c.get_log_settings(),
    "update_log_settings": lambda c: c.update_log_settings({"log_info": True}),
}


@pytest.mark.parametrize("call", list(UNIMPLEMENTED))
def test_unimplemented(bundled_grpc, call):
    message = grpc_error(lambda: UNIMPLEMENTED[call](bundled_grpc), "UNIMPLEMENTED")
    assert "not supported by inferd" in message


def test_cuda_shared_memory_register_refused(bundled_stub):
    request = service_pb2.CudaSharedMemoryRegisterRequest(name="region", raw_handle=b"x", device_id=0, byte_size=64)
    message = stub_error(
        lambda: bundled_stub.CudaSharedMemoryRegister(request, timeout=30), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "CUDA shared memory is not supported" in message


# --------------------------------------------------------------------------- server lifecycle


@pytest.fixture(scope="module")
def small_repository(tmp_path_factory):
    """The slow model and an FP32 identity: enough for drain and size-limit tests, quick to load."""
    from models import DATATYPES as _DT
    from models import identity_config, identity_model

    repo = tmp_path_factory.mktemp("grpc-small") / "models"
    write_model(repo, "slow", slow_model(), slow_config("slow", 4, "dynamic_batching { }"))
    fp32 = identity_name("FP32")
    write_model(repo, fp32, identity_model(_DT["FP32"][0], ["N", "D"]), identity_config(fp32, "FP32"))
    return repo


def test_max_request_size_and_sigterm_drain(log_dir, small_repository, slow_iterations):
    """--max-request-size caps gRPC messages too; SIGTERM stops accepting, lets the in-flight unary
    calls and stream messages finish, ends the open stream and exits 0 without waiting out the
    drain timeout."""
    limit = 1 << 20
    server = start_server(log_dir / "grpc-drain", [small_repository], ["slow"], ["--max-request-size", str(limit)])
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        fp32 = identity_name("FP32")
        small = np.ones((1, limit // 8), np.float32)  # half the limit
        assert client.infer(fp32, infer_inputs(INPUT0=("FP32", small))).as_numpy("OUTPUT0").shape == small.shape
        big = np.ones((1, limit // 2), np.float32)  # twice the limit
        message = grpc_error(lambda: client.infer(fp32, infer_inputs(INPUT0=("FP32", big))), "RESOURCE_EXHAUSTED")
        assert str(limit) in message, message

        iterations = slow_iterations(0.8)
        unary: queue.Queue = queue.Queue()
        streamed: queue.Queue = queue.Queue()
        for value in (1.0, 2.0, 3.0):
            client.async_infer(
                "slow", slow_inputs(iterations, value), lambda result, error, v=value: unary.put((v, result, error))
            )
        stream_client = grpcclient.InferenceServerClient(server.grpc_address)
        stream_client.start_stream(callback=lambda result, error: streamed.put((result, error)))
        stream_client.async_stream_infer("slow", slow_inputs(iterations, 4.0), request_id="in-flight")
        time.sleep(0.25)
        assert unary.empty() and streamed.empty(), "the slow requests finished before SIGTERM"
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.15)
        if server.proc.poll() is None:  # still draining: nobody new gets in
            late = grpcclient.InferenceServerClient(server.grpc_address)
            try:
                grpc_error(lambda: late.is_server_live(client_timeout=2), "UNAVAILABLE")
            finally:
                late.close()
        answers = [unary.get(timeout=60) for _ in range(3)]
        for value, result, error in answers:
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("y"), [[value]])
        result, error = streamed.get(timeout=60)
        assert error is None, error
        assert result.get_response().id == "in-flight"
        np.testing.assert_array_equal(result.as_numpy("y"), [[4.0]])
        # The client keeps its stream open: the server ends it once its requests were answered.
        code = server.proc.wait(timeout=60)
        elapsed = time.monotonic() - start
        assert code == 0, server.log()
        assert elapsed < 15, f"the open stream held the shutdown for {elapsed:.1f}s"
        stream_client.stop_stream()
        stream_client.close()
    finally:
        client.close()
        server.kill()


def test_no_allow_grpc(log_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    server = start_server(log_dir / "no-grpc", [empty], extra=["--no-allow-grpc"])
    try:
        assert server.get("/v2/health/ready").status_code == 200
        with pytest.raises(OSError):
            socket.create_connection((HOST, server.grpc_port), timeout=2).close()
        assert "gRPC listening" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_grpc_port_in_use(tmp_path):
    """A taken gRPC port is a start-up failure with the reason, not a silent HTTP-only server."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        grpc_port = taken.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "inferd",
            "serve",
            "--host",
            HOST,
            "--http-port",
            str(free_port()),
            "--grpc-port",
            str(grpc_port),
            "--model-repository",
            str(empty),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"cannot listen for gRPC on {HOST}:{grpc_port}" in output, output
    assert "address already in use" in output.lower(), output


def test_help_lists_grpc_options():
    out = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--grpc-port" in out.stdout and "--allow-grpc" in out.stdout and "--no-allow-grpc" in out.stdout


# --------------------------------------------------------------------------- perf_analyzer -i grpc


@pytest.mark.parametrize("mode", ["unary", "streaming"])
def test_perf_analyzer_grpc(perf_analyzer, bundled_server, mode):  # noqa: F811
    import re

    model, shape = ("digits", "input.1:1,28,28") if mode == "unary" else ("simple", "INPUT0:16")
    extra = ["--streaming"] if mode == "streaming" else []
    if model == "simple":
        shape_args = ["--shape", "INPUT0:16", "--shape", "INPUT1:16"]
    else:
        shape_args = ["--shape", shape]
    before = quiet_stats(bundled_server, model)
    output, _ = run_perf_analyzer(
        perf_analyzer,
        bundled_server,
        ["-m", model, "--concurrency-range", "2", *shape_args, *extra, *PERF_SHORT_RUN],
        protocol="grpc",
    )
    throughputs = [float(v) for v in re.findall(r"throughput: ([0-9.]+) infer/sec", output)]
    assert len(throughputs) == 1 and throughputs[0] > 0, output
    after = stats_of(bundled_server, model)
    assert after["inference_count"] > before["inference_count"]
    assert fail_count(after) == fail_count(before), output
