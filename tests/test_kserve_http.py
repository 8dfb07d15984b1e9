"""The KServe V2 REST endpoints with real clients (requests and tritonclient.http)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import fail_count, quiet_stats, stats_of, success_count
from models import DATATYPES, identity_name

# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def bundled_client(bundled_server):
    client = httpclient.InferenceServerClient(bundled_server.address, network_timeout=60.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def models_client(models_server):
    client = httpclient.InferenceServerClient(models_server.address, network_timeout=60.0)
    yield client
    client.close()


def split_binary_response(response) -> tuple[dict, bytes]:
    """The JSON header and the binary tail of a V2 response."""
    length = response.headers.get("Inference-Header-Content-Length")
    if length is None:
        return response.json(), b""
    length = int(length)
    return json.loads(response.content[:length]), response.content[length:]


def simple_inputs(rows: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**20), 2**20, size=(rows, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, size=(rows, 16), dtype=np.int32)
    return a, b


def simple_json_request(a: np.ndarray, b: np.ndarray, **extra) -> dict:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": list(a.shape), "data": a.flatten().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": list(b.shape), "data": b.flatten().tolist()},
        ]
    }
    body.update(extra)
    return body


# --------------------------------------------------------------------------- server-level endpoints


def test_server_metadata(bundled_server):
    response = bundled_server.get("/v2")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["name"] == "inferd"
    assert isinstance(body["version"], str) and body["version"]
    assert isinstance(body["extensions"], list)
    for extension in ("binary_tensor_data", "statistics", "model_configuration"):
        assert extension in body["extensions"]


def test_server_metadata_through_tritonclient(bundled_client):
    metadata = bundled_client.get_server_metadata()
    assert metadata["name"] == "inferd"
    assert bundled_client.is_server_live()
    assert bundled_client.is_server_ready()


def test_health(bundled_server):
    live = bundled_server.get("/v2/health/live")
    assert live.status_code == 200
    ready = bundled_server.get("/v2/health/ready")
    assert ready.status_code == 200


@pytest.mark.parametrize("name", ["digits", "simple", "mixed"])
def test_model_ready(bundled_server, bundled_client, name):
    assert bundled_server.get(f"/v2/models/{name}/ready").status_code == 200
    assert bundled_server.get(f"/v2/models/{name}/versions/1/ready").status_code == 200
    assert bundled_client.is_model_ready(name)
    assert bundled_client.is_model_ready(name, "1")


def test_model_metadata_digits(bundled_server):
    response = bundled_server.get("/v2/models/digits")
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == "digits"
    assert body["versions"] == ["1"]
    assert body["platform"] == "onnxruntime_onnx"
    assert body["inputs"] == [{"name": "input.1", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    assert body["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    # The versioned route answers the same.
    assert bundled_server.get("/v2/models/digits/versions/1").json() == body


def test_model_metadata_mixed(bundled_client):
    body = bundled_client.get_model_metadata("mixed")
    inputs = {t["name"]: (t["datatype"], t["shape"]) for t in body["inputs"]}
    outputs = {t["name"]: (t["datatype"], t["shape"]) for t in body["outputs"]}
    assert inputs == {
        "x": ("FP32", [-1, 4]),
        "scale": ("FP64", [-1, 1]),
        "k": ("INT64", [-1, 1]),
        "text": ("BYTES", [-1, 1]),
    }
    assert outputs == {
        "y": ("FP64", [-1, 4]),
        "positive": ("BOOL", [-1, 4]),
        "count": ("INT64", [-1, 1]),
        "text_out": ("BYTES", [-1, 1]),
    }


def test_model_config_json(bundled_server):
    response = bundled_server.get("/v2/models/digits/config")
    assert response.status_code == 200
    config = response.json()
    assert config["name"] == "digits"
    assert config["max_batch_size"] == 64
    assert config["platform"] == "onnxruntime_onnx"
    (entry,) = config["input"]
    assert entry["name"] == "input.1"
    assert entry["data_type"] == "TYPE_FP32"
    # int64 fields are JSON numbers (protobuf's JSON mapping would make them strings).
    assert entry["dims"] == [1, 28, 28]
    assert all(type(d) is int for d in entry["dims"])
    assert config["output"][0]["dims"] == [10]
    assert config["instance_group"][0]["count"] == 2
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 150
    assert type(config["dynamic_batching"]["max_queue_delay_microseconds"]) is int
    # The versioned route answers the same.
    assert bundled_server.get("/v2/models/digits/versions/1/config").json() == config


def test_model_config_through_tritonclient(bundled_client):
    config = bundled_client.get_model_config("simple")
    assert config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert "dynamic_batching" not in config or not config["dynamic_batching"]


def test_config_queue_policy_numbers(models_server):
    config = models_server.get("/v2/models/slow_timeout/config").json()
    policy = config["dynamic_batching"]["default_queue_policy"]
    assert policy["default_timeout_microseconds"] == 50000
    assert type(policy["default_timeout_microseconds"]) is int
    assert policy["timeout_action"] == "REJECT"
    config = models_server.get("/v2/models/slow_queue/config").json()
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 2


def test_repository_index(bundled_server):
    response = bundled_server.post("/v2/repository/index")
    assert response.status_code == 200
    rows = response.json()
    assert sorted(r["name"] for r in rows) == ["digits", "mixed", "simple"]
    for row in rows:
        assert row["state"] == "READY"
        assert row["version"] == "1"


def test_repository_index_through_tritonclient(models_client):
    index = models_client.get_model_repository_index()
    names = {row["name"] for row in index}
    assert identity_name("FP32") in names and "versioned" in names
    versioned = [row for row in index if row["name"] == "versioned"]
    assert [row.get("version") for row in versioned] == ["3"]


# --------------------------------------------------------------------------- inference: simple / mixed


def test_simple_json(bundled_server):
    a, b = simple_inputs(3, seed=1)
    response = bundled_server.post("/v2/models/simple/infer", json=simple_json_request(a, b))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["model_name"] == "simple"
    assert body["model_version"] == "1"
    assert "id" not in body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert set(outputs) == {"OUTPUT0", "OUTPUT1"}
    for name, expected in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        assert outputs[name]["datatype"] == "INT32"
        assert outputs[name]["shape"] == [3, 16]
        assert outputs[name]["data"] == expected.flatten().tolist()


def test_simple_versioned_route(bundled_server):
    a, b = simple_inputs(1, seed=2)
    response = bundled_server.post("/v2/models/simple/versions/1/infer", json=simple_json_request(a, b))
    assert response.status_code == 200, response.text
    assert response.json()["model_version"] == "1"


def test_simple_tritonclient_binary(bundled_client):
    a, b = simple_inputs(8, seed=3)
    inputs = [httpclient.InferInput("INPUT0", [8, 16], "INT32"), httpclient.InferInput("INPUT1", [8, 16], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    result = bundled_client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32


def test_request_id_echoed(bundled_server, bundled_client):
    a, b = simple_inputs(1)
    body = bundled_server.post("/v2/models/simple/infer", json=simple_json_request(a, b, id="req-42")).json()
    assert body["id"] == "req-42"
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = bundled_client.infer("simple", inputs, request_id="my id ✓")
    assert result.get_response()["id"] == "my id ✓"


def test_parameters_accepted(bundled_server):
    a, b = simple_inputs(1)
    request = simple_json_request(a, b, parameters={"custom": "value", "number": 3, "flag": True})
    request["inputs"][0]["parameters"] = {"note": "per-input parameter"}
    response = bundled_server.post("/v2/models/simple/infer", json=request)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == (a + b).flatten().tolist()


def test_requested_output_subset(bundled_server, bundled_client):
    a, b = simple_inputs(2)
    request = simple_json_request(a, b, outputs=[{"name": "OUTPUT1"}])
    body = bundled_server.post("/v2/models/simple/infer", json=request).json()
    assert [o["name"] for o in body["outputs"]] == ["OUTPUT1"]
    assert body["outputs"][0]["data"] == (a - b).flatten().tolist()

    inputs = [httpclient.InferInput("INPUT0", [2, 16], "INT32"), httpclient.InferInput("INPUT1", [2, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = bundled_client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert result.as_numpy("OUTPUT1") is None


def test_binary_data_per_output(bundled_server):
    a, b = simple_inputs(2, seed=5)
    request = simple_json_request(
        a,
        b,
        outputs=[
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
            {"name": "OUTPUT1", "parameters": {"binary_data": False}},
        ],
    )
    response = bundled_server.post("/v2/models/simple/infer", json=request)
    assert response.status_code == 200, response.text
    assert "Inference-Header-Content-Length" in response.headers
    assert response.headers["content-type"].startswith("application/octet-stream")
    header, tail = split_binary_response(response)
    outputs = {o["name"]: o for o in header["outputs"]}
    assert outputs["OUTPUT0"]["parameters"]["binary_data_size"] == 2 * 16 * 4
    assert "data" not in outputs["OUTPUT0"]
    assert len(tail) == 2 * 16 * 4
    np.testing.assert_array_equal(np.frombuffer(tail, np.int32).reshape(2, 16), a + b)
    assert outputs["OUTPUT1"]["data"] == (a - b).flatten().tolist()


def test_binary_data_output_parameter(bundled_server):
    a, b = simple_inputs(1, seed=6)
    request = simple_json_request(a, b, parameters={"binary_data_output": True})
    response = bundled_server.post("/v2/models/simple/infer", json=request)
    assert response.status_code == 200
    header, tail = split_binary_response(response)
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes == [64, 64]
    assert len(tail) == 128
    by_name = {}
    offset = 0
    for output, size in zip(header["outputs"], sizes):
        by_name[output["name"]] = np.frombuffer(tail[offset : offset + size], np.int32)
        offset += size
    np.testing.assert_array_equal(by_name["OUTPUT0"], (a + b).flatten())
    np.testing.assert_array_equal(by_name["OUTPUT1"], (a - b).flatten())
    # An explicit per-output choice overrides the request-wide default.
    request["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT1"}]
    response = bundled_server.post("/v2/models/simple/infer", json=request)
    header, tail = split_binary_response(response)
    outputs = {o["name"]: o for o in header["outputs"]}
    assert outputs["OUTPUT0"]["data"] == (a + b).flatten().tolist()
    assert outputs["OUTPUT1"]["parameters"]["binary_data_size"] == 64
    assert len(tail) == 64


def test_binary_input_raw_http(bundled_server):
    """A hand-built binary request: JSON header, then the raw tensors, with the header length."""
    a, b = simple_inputs(2, seed=7)
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [2, 16], "parameters": {"binary_data_size": 128}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "parameters": {"binary_data_size": 128}},
            ]
        }
    ).encode()
    response = bundled_server.post(
        "/v2/models/simple/infer",
        data=header + a.tobytes() + b.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == (a + b).flatten().tolist()


def test_mixed_exact(bundled_client):
    x = np.array([[1.5, -2.0, 0.0, 3.25], [-1.0, -0.5, -7.0, -3.0], [2.0, 4.0, 8.0, 0.125]], np.float32)
    scale = np.array([[2.0], [-0.5], [0.1]], np.float64)
    k = np.array([[10], [-3], [2**40]], np.int64)
    text = np.array([["hello"], [""], ["wörld ✓"]], dtype=np.object_)
    for binary in (True, False):
        inputs = [
            httpclient.InferInput("x", [3, 4], "FP32"),
            httpclient.InferInput("scale", [3, 1], "FP64"),
            httpclient.InferInput("k", [3, 1], "INT64"),
            httpclient.InferInput("text", [3, 1], "BYTES"),
        ]
        for infer_input, value in zip(inputs, (x, scale, k, text)):
            infer_input.set_data_from_numpy(value, binary_data=binary)
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "positive", "count", "text_out")
        ]
        result = bundled_client.infer("mixed", inputs, outputs=outputs)
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
        got = [t.decode() if isinstance(t, bytes) else t for t in text_out.flatten()]
        assert got == ["hello", "", "wörld ✓"]


def test_mixed_json_wire_format(bundled_server):
    request = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [[1.0, -1.0, 2.5, 0.0]]},
            {"name": "scale", "datatype": "FP64", "shape": [1, 1], "data": [3.0]},
            {"name": "k", "datatype": "INT64", "shape": [1, 1], "data": [5]},
            {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["abc"]},
        ]
    }
    response = bundled_server.post("/v2/models/mixed/infer", json=request)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["y"] == {"name": "y", "datatype": "FP64", "shape": [1, 4], "data": [3.0, -3.0, 7.5, 0.0]}
    assert outputs["positive"] == {
        "name": "positive",
        "datatype": "BOOL",
        "shape": [1, 4],
        "data": [True, False, True, False],
    }
    assert outputs["count"] == {"name": "count", "datatype": "INT64", "shape": [1, 1], "data": [7]}
    assert outputs["text_out"] == {"name": "text_out", "datatype": "BYTES", "shape": [1, 1], "data": ["abc"]}


def test_digits_accuracy(bundled_client):
    from inferd.examples.build_models import digits_test_set

    images, labels = digits_test_set()
    assert images.shape[1:] == (1, 28, 28) and images.dtype == np.float32
    predictions = []
    for start in range(0, len(images), 64):
        batch = images[start : start + 64]
        infer_input = httpclient.InferInput("input.1", list(batch.shape), "FP32")
        infer_input.set_data_from_numpy(batch, binary_data=True)
        result = bundled_client.infer(
            "digits", [infer_input], outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)]
        )
        logits = result.as_numpy("logits")
        assert logits.shape == (len(batch), 10) and logits.dtype == np.float32
        predictions.append(logits.argmax(axis=1))
    accuracy = float((np.concatenate(predictions) == labels).mean())
    assert accuracy > 0.9, f"accuracy {accuracy:.3f}"


def test_digits_json_matches_binary(bundled_server, bundled_client):
    from inferd.examples.build_models import digits_test_set

    images, _ = digits_test_set()
    batch = images[:2]
    infer_input = httpclient.InferInput("input.1", [2, 1, 28, 28], "FP32")
    infer_input.set_data_from_numpy(batch, binary_data=True)
    binary_logits = bundled_client.infer("digits", [infer_input]).as_numpy("logits")
    request = {"inputs": [{"name": "input.1", "datatype": "FP32", "shape": [2, 1, 28, 28], "data": batch.tolist()}]}
    body = bundled_server.post("/v2/models/digits/infer", json=request).json()
    json_logits = np.array(body["outputs"][0]["data"], np.float32).reshape(2, 10)
    np.testing.assert_array_equal(json_logits, binary_logits)


# --------------------------------------------------------------------------- every datatype


def datatype_values(datatype: str, binary: bool) -> np.ndarray:
    """A [3, 4] tensor of ``datatype`` with its edge values (JSON can't carry NaN/inf)."""
    if datatype == "BOOL":
        flat = [True, False, True, True, False, False, True, False, False, True, True, False]
        return np.array(flat, np.bool_).reshape(3, 4)
    if datatype == "BYTES":
        items = [
            "",
            "a",
            "hello world",
            "wörld ✓",
            "🙂",
            "with\nnewline",
            'quote"and\\',
            "x" * 300,
            "tab\tchar",
            "0",
            "end",
            "ünï",
        ]
        values = [s.encode() for s in items]
        if binary:
            values[1] = b"nul\x00inside"
        return np.array(values, dtype=np.object_).reshape(3, 4)
    dtype = np.dtype(DATATYPES[datatype][1])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = [info.min, info.max, 0, 1, info.max - 1, info.min + 1, 7, 42, info.max // 3, info.min // 3, 100, 3]
        return np.array(flat, dtype).reshape(3, 4)
    finfo = np.finfo(dtype)
    flat = [
        0.0,
        -0.0,
        1.0,
        -1.5,
        float(finfo.max),
        float(finfo.min),
        float(finfo.tiny),
        float(finfo.eps),
        0.1,
        1 / 3,
        65504.0 if dtype == np.float16 else 1e30,
        -2.5e-5,
    ]
    array = np.array(flat, dtype)
    if binary:
        array[1] = np.inf
        array[2] = -np.inf
    return array.reshape(3, 4)


@pytest.mark.parametrize("output_binary", [True, False], ids=["out-binary", "out-json"])
@pytest.mark.parametrize("input_binary", [True, False], ids=["in-binary", "in-json"])
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_datatype_round_trip(models_client, datatype, input_binary, output_binary):
    values = datatype_values(datatype, binary=input_binary and output_binary)
    infer_input = httpclient.InferInput("INPUT0", list(values.shape), datatype)
    infer_input.set_data_from_numpy(values, binary_data=input_binary)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=output_binary)
    result = models_client.infer(identity_name(datatype), [infer_input], outputs=[output])
    response = result.get_response()
    (entry,) = response["outputs"]
    assert entry["datatype"] == datatype
    assert entry["shape"] == [3, 4]
    assert ("binary_data_size" in entry.get("parameters", {})) == output_binary
    got = result.as_numpy("OUTPUT0")
    assert got.shape == values.shape
    if datatype == "BYTES":
        got_list = [g if isinstance(g, bytes) else str(g).encode() for g in got.flatten()]
        assert got_list == list(values.flatten())
    else:
        assert got.dtype == values.dtype
        # Bit-exact (also tells -0.0 from 0.0).
        assert got.tobytes() == values.tobytes(), (got, values)


def test_bytes_non_utf8_binary(models_server):
    """Non-UTF-8 BYTES sent in binary to an ONNX string tensor: either they round-trip unchanged
    (as Triton's ONNX Runtime backend does) or the request is refused as a client error (400) that
    says the data must be UTF-8. A 500 'failed to run' blames the server for the client's data."""
    values = [b"\xff\xferaw", b"\x80\x81", b"plain"]
    payload = b"".join(len(v).to_bytes(4, "little") + v for v in values)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, 3],
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    response = models_server.post(
        f"/v2/models/{identity_name('BYTES')}/infer",
        data=header + payload,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    if response.status_code == 200:
        body, tail = split_binary_response(response)
        assert tail == payload
    else:
        assert response.status_code == 400, (response.status_code, response.text)
        message = response.json()["error"]
        assert "INPUT0" in message and "UTF-8" in message.upper(), message
    # The model still serves good requests.
    good = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": ["ok"]}]}
    assert models_server.post(f"/v2/models/{identity_name('BYTES')}/infer", json=good).status_code == 200


def test_datatype_metadata(models_client):
    for datatype in DATATYPES:
        metadata = models_client.get_model_metadata(identity_name(datatype))
        assert metadata["inputs"] == [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
        assert metadata["outputs"] == [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, -1]}]


def test_zero_sized_variable_dim(models_server):
    """A wildcard dimension may be 0 (an empty row)."""
    request = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 0], "data": []}]}
    response = models_server.post(f"/v2/models/{identity_name('FP32')}/infer", json=request)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["shape"] == [2, 0] and output["data"] == []


# --------------------------------------------------------------------------- statistics


def test_stats_count_requests(bundled_server, bundled_client):
    before = quiet_stats(bundled_server, "simple")
    a, b = simple_inputs(2)
    n = 5
    for _ in range(n):
        response = bundled_server.post("/v2/models/simple/infer", json=simple_json_request(a, b))
        assert response.status_code == 200
    after = stats_of(bundled_server, "simple", success=success_count(before) + n)
    assert after["name"] == "simple" and after["version"] == "1"
    # simple has no dynamic batching: one execution per request, 2 rows each.
    assert after["inference_count"] - before["inference_count"] == 2 * n
    assert after["execution_count"] - before["execution_count"] == n
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - old["success"]["count"] == n
    assert stats["fail"]["count"] == old["fail"]["count"]
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[key]["count"] - old[key]["count"] == n, key
        assert stats[key]["ns"] >= old[key]["ns"], key
    assert stats["success"]["ns"] > old["success"]["ns"]
    assert stats["compute_infer"]["ns"] > old["compute_infer"]["ns"]
    batch = {b["batch_size"]: b for b in after["batch_stats"]}
    old_batch = {b["batch_size"]: b for b in before["batch_stats"]}
    done = batch[2]["compute_infer"]["count"] - (old_batch[2]["compute_infer"]["count"] if 2 in old_batch else 0)
    assert done == n
    assert after["last_inference"] > 0

    # A failed request counts as a failure, not as a success or an execution.
    bad = simple_json_request(a, b)
    bad["inputs"][0]["shape"] = [2, 15]
    bad["inputs"][0]["data"] = a[:, :15].flatten().tolist()
    assert bundled_server.post("/v2/models/simple/infer", json=bad).status_code == 400
    final = stats_of(bundled_server, "simple", fail=fail_count(after) + 1)
    assert final["inference_stats"]["fail"]["count"] == stats["fail"]["count"] + 1
    assert final["execution_count"] == after["execution_count"]
    assert final["inference_stats"]["success"]["count"] == stats["success"]["count"]


def test_stats_all_models(bundled_server, bundled_client):
    response = bundled_server.get("/v2/models/stats")
    assert response.status_code == 200
    names = sorted(entry["name"] for entry in response.json()["model_stats"])
    assert names == ["digits", "mixed", "simple"]
    stats = bundled_client.get_inference_statistics("simple")
    assert stats["model_stats"][0]["name"] == "simple"
    versioned = bundled_server.get("/v2/models/simple/versions/1/stats")
    assert versioned.status_code == 200
    assert versioned.json()["model_stats"][0]["version"] == "1"


# --------------------------------------------------------------------------- versions and auto-complete


def _add_request(values: np.ndarray) -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": list(values.shape), "data": values.flatten().tolist()}
        ]
    }


def test_highest_version_served(models_server):
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    response = models_server.post("/v2/models/versioned/infer", json=_add_request(values))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_version"] == "3"
    assert body["outputs"][0]["data"] == (values + 3).flatten().tolist()
    explicit = models_server.post("/v2/models/versioned/versions/3/infer", json=_add_request(values))
    assert explicit.status_code == 200
    assert explicit.json()["outputs"][0]["data"] == (values + 3).flatten().tolist()
    metadata = models_server.get("/v2/models/versioned").json()
    assert metadata["versions"] == ["3"]
    assert models_server.get("/v2/models/versioned/versions/3/ready").status_code == 200


@pytest.mark.parametrize("suffix", ["", "/ready", "/config", "/stats"])
def test_lower_version_not_served(models_server, suffix):
    response = models_server.get(f"/v2/models/versioned/versions/1{suffix}")
    assert response.status_code == 404
    if suffix != "/ready":
        assert "versioned" in response.json()["error"]
        assert "1" in response.json()["error"]


def test_lower_version_infer_404(models_server):
    values = np.zeros((1, 4), np.float32)
    response = models_server.post("/v2/models/versioned/versions/1/infer", json=_add_request(values))
    assert response.status_code == 404
    assert "version 1" in response.json()["error"]


def test_auto_complete_dynamic(models_server):
    config = models_server.get("/v2/models/auto_dynamic/config").json()
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert config["platform"] == "onnxruntime_onnx"
    assert config["input"][0]["name"] == "INPUT0"
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [4]
    assert config["output"][0]["name"] == "OUTPUT0"
    assert config["output"][0]["dims"] == [4]
    metadata = models_server.get("/v2/models/auto_dynamic").json()
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    values = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 0, 0], [-1, -2, -3, -4]], np.float32)
    response = models_server.post("/v2/models/auto_dynamic/infer", json=_add_request(values))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == (values + 0.5).flatten().tolist()
    # Batch 5 is over the auto-completed max_batch_size of 4.
    five = np.zeros((5, 4), np.float32)
    assert models_server.post("/v2/models/auto_dynamic/infer", json=_add_request(five)).status_code == 400


def test_auto_complete_fixed_shape(models_server):
    config = models_server.get("/v2/models/auto_fixed/config").json()
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [2, 3]
    assert not config.get("dynamic_batching")
    metadata = models_server.get("/v2/models/auto_fixed").json()
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3]}]
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    response = models_server.post("/v2/models/auto_fixed/infer", json=_add_request(values))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == (values + 2).flatten().tolist()


def test_partial_config_completed(models_server):
    config = models_server.get("/v2/models/partial_config/config").json()
    assert config["max_batch_size"] == 8
    assert config["instance_group"][0]["count"] == 2
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert config["input"][0]["dims"] == [4]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0"]
    values = np.ones((3, 4), np.float32)
    response = models_server.post("/v2/models/partial_config/infer", json=_add_request(values))
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [0.0] * 12


# --------------------------------------------------------------------------- large payloads


def test_large_binary_round_trip(models_client):
    """16 MiB in and out in binary: larger than any socket buffer, so the answer is written in parts."""
    values = np.random.default_rng(11).standard_normal((8, 1 << 19)).astype(np.float32)
    infer_input = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    infer_input.set_data_from_numpy(values, binary_data=True)
    result = models_client.infer(
        identity_name("FP32"), [infer_input], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    )
    got = result.as_numpy("OUTPUT0")
    assert got.shape == values.shape
    assert got.tobytes() == values.tobytes()


def test_large_json_response(models_server):
    values = np.arange(8 * 40000, dtype=np.int64).reshape(8, 40000) * 7919
    request = {
        "inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [8, 40000], "data": values.flatten().tolist()}]
    }
    response = models_server.post(f"/v2/models/{identity_name('INT64')}/infer", json=request)
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == values.flatten().tolist()


def test_concurrent_large_responses(models_server):
    """Several clients at once, each getting multi-megabyte answers: none is mixed up or cut."""
    from concurrent.futures import ThreadPoolExecutor

    def worker(seed: int) -> bool:
        client = httpclient.InferenceServerClient(models_server.address, network_timeout=60.0)
        try:
            for i in range(3):
                values = np.random.default_rng(seed * 10 + i).integers(0, 2**31, (4, 1 << 18), dtype=np.int32)
                infer_input = httpclient.InferInput("INPUT0", list(values.shape), "INT32")
                infer_input.set_data_from_numpy(values, binary_data=True)
                result = client.infer(identity_name("INT32"), [infer_input])
                if result.as_numpy("OUTPUT0").tobytes() != values.tobytes():
                    return False
            return True
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(worker, range(4), timeout=120))


def test_tuning_parameters(models_server):
    config = models_server.get("/v2/models/tuned/config").json()
    assert config["parameters"]["intra_op_thread_count"] == {"string_value": "1"}
    assert config["optimization"]["graph"]["level"] == 1
    values = np.ones((2, 4), np.float32)
    response = models_server.post("/v2/models/tuned/infer", json=_add_request(values))
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [5.0] * 8


def test_kind_auto_falls_back_to_cpu(models_server):
    config = models_server.get("/v2/models/kind_auto/config").json()
    assert config["instance_group"][0]["count"] == 2
    values = np.ones((1, 4), np.float32)
    response = models_server.post("/v2/models/kind_auto/infer", json=_add_request(values))
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [7.0] * 4


def test_content_type_not_required(bundled_server):
    """curl -d sends application/x-www-form-urlencoded; the body is still V2 JSON."""
    a, b = simple_inputs(1, seed=8)
    body = json.dumps(simple_json_request(a, b))
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = bundled_server.post("/v2/models/simple/infer", data=body, headers=headers)
        assert response.status_code == 200, (content_type, response.text)
        assert response.json()["outputs"][0]["data"] == (a + b).flatten().tolist()


def test_query_string_and_trailing_slash(bundled_server):
    a, b = simple_inputs(1, seed=9)
    response = bundled_server.post("/v2/models/simple/infer?verbose=1", json=simple_json_request(a, b))
    assert response.status_code == 200, response.text
    assert bundled_server.get("/v2/health/ready?probe=k8s").status_code == 200
    assert bundled_server.get("/v2/models/simple/").json()["name"] == "simple"
