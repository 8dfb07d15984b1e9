"""Every error the V2 REST front end answers: status code, a JSON message that names the culprit,
and a server that keeps serving afterwards. Raw sockets for what an HTTP library won't send."""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib

import numpy as np
import pytest
import rawhttp
import requests
from conftest import (
    BUNDLED_MODELS,
    BUNDLED_REPOSITORY,
    fail_count,
    quiet_stats,
    start_server,
    stats_of,
    success_count,
)

MAX_REQUEST_SIZE = 64 * 1024


@pytest.fixture(scope="module")
def server(log_dir):
    """The bundled models, with a small --max-request-size for the 413 tests."""
    srv = start_server(
        log_dir / "errors", [BUNDLED_REPOSITORY], BUNDLED_MODELS, ["--max-request-size", str(MAX_REQUEST_SIZE)]
    )
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()


A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def good_request() -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A.flatten().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B.flatten().tolist()},
        ]
    }


def assert_serves(server) -> None:
    """A good request still gets the right answer."""
    response = server.post("/v2/models/simple/infer", json=good_request())
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == (A + B).flatten().tolist()


@pytest.fixture(autouse=True)
def still_serving(server):
    """After every test here, the server still answers a good request."""
    yield
    assert_serves(server)


def error_of(response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    message = response.json()["error"]
    assert isinstance(message, str) and message
    return message


def post_infer(server, payload, model: str = "simple", **kwargs):
    if isinstance(payload, (bytes, str)):
        return server.post(f"/v2/models/{model}/infer", data=payload, **kwargs)
    return server.post(f"/v2/models/{model}/infer", json=payload, **kwargs)


# --------------------------------------------------------------------------- 400: the request is wrong


def test_unknown_input(server):
    request = good_request()
    request["inputs"][1]["name"] = "INPUT_X"
    message = error_of(post_infer(server, request), 400)
    assert "INPUT_X" in message


def test_missing_input(server):
    request = good_request()
    del request["inputs"][1]
    message = error_of(post_infer(server, request), 400)
    assert "INPUT1" in message


def test_no_inputs(server):
    message = error_of(post_infer(server, {"inputs": []}), 400)
    assert "inputs" in message
    message = error_of(post_infer(server, {"id": "x"}), 400)
    assert "inputs" in message


def test_duplicate_input(server):
    request = good_request()
    request["inputs"][1]["name"] = "INPUT0"
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_unknown_output(server):
    request = good_request()
    request["outputs"] = [{"name": "OUTPUT0"}, {"name": "NOPE"}]
    message = error_of(post_infer(server, request), 400)
    assert "NOPE" in message


def test_wrong_shape(server):
    request = good_request()
    request["inputs"][0]["shape"] = [1, 8]
    request["inputs"][0]["data"] = list(range(8))
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message and "16" in message


def test_wrong_rank(server):
    request = good_request()
    request["inputs"][0]["shape"] = [16]
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_data_count_does_not_match_shape(server):
    request = good_request()
    request["inputs"][0]["data"] = list(range(15))
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message and "15" in message


def test_bad_shape_values(server):
    for shape in ([1, -16], [1, "16"], "1,16", None):
        request = good_request()
        request["inputs"][0]["shape"] = shape
        message = error_of(post_infer(server, request), 400)
        assert "INPUT0" in message and "shape" in message


def test_wrong_datatype(server):
    request = good_request()
    request["inputs"][0]["datatype"] = "INT64"
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message and "INT64" in message and "INT32" in message


def test_unsupported_datatype_name(server):
    request = good_request()
    request["inputs"][0]["datatype"] = "FLOAT32"
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message and "FLOAT32" in message


def test_non_numeric_json_data(server):
    request = good_request()
    request["inputs"][0]["data"] = ["abc"] * 16
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_fractional_json_data_for_integer_tensor(server):
    """1.5 is not an INT32: refusing it beats silently running on 1."""
    request = good_request()
    request["inputs"][0]["data"] = [1.5] * 16
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_string_json_data_for_integer_tensor(server):
    """ "7" (a JSON string) is not an INT32 either."""
    request = good_request()
    request["inputs"][0]["data"] = ["7"] * 16
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_out_of_range_json_data(server):
    request = good_request()
    request["inputs"][0]["data"] = [2**40] * 16
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_bool_json_data_for_integer_tensor(server):
    request = good_request()
    request["inputs"][0]["data"] = [True] * 16
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_bool_json_data_after_the_first_element(server):
    """A JSON boolean anywhere in an INT32 tensor's data is refused, not only in first place."""
    request = good_request()
    request["inputs"][0]["data"] = [1] + [True] * 15
    message = error_of(post_infer(server, request), 400)
    assert "INPUT0" in message


def test_batch_over_max_batch_size(server):
    rows = 9  # simple has max_batch_size 8
    request = good_request()
    for entry in request["inputs"]:
        entry["shape"] = [rows, 16]
        entry["data"] = [0] * (rows * 16)
    message = error_of(post_infer(server, request), 400)
    assert "max_batch_size" in message and "9" in message and "8" in message


def test_batch_size_zero(server):
    request = good_request()
    for entry in request["inputs"]:
        entry["shape"] = [0, 16]
        entry["data"] = []
    message = error_of(post_infer(server, request), 400)
    assert "batch size" in message


def test_inputs_disagree_on_batch_size(server):
    request = good_request()
    request["inputs"][1]["shape"] = [2, 16]
    request["inputs"][1]["data"] = [0] * 32
    message = error_of(post_infer(server, request), 400)
    assert "batch size" in message


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"inputs": [', b"", b"\xff\xfe\x00garbage", b'"just a string"', b"[1, 2]"],
    ids=["broken", "truncated", "empty", "binary", "string", "list"],
)
def test_malformed_json(server, body):
    message = error_of(post_infer(server, body, headers={"Content-Type": "application/json"}), 400)
    assert "JSON" in message


def test_bad_parameters_and_outputs(server):
    request = good_request()
    request["parameters"] = ["not", "an", "object"]
    assert "parameters" in error_of(post_infer(server, request), 400)
    request = good_request()
    request["outputs"] = {"name": "OUTPUT0"}
    assert "outputs" in error_of(post_infer(server, request), 400)
    request = good_request()
    request["outputs"] = [{"nom": "OUTPUT0"}]
    assert "name" in error_of(post_infer(server, request), 400)


def test_classification_not_supported(server):
    request = good_request()
    request["outputs"] = [{"name": "OUTPUT0", "parameters": {"classification": 2}}]
    message = error_of(post_infer(server, request), 400)
    assert "classification" in message


# --------------------------------------------------------------------------- 400: binary extension


def binary_body(sizes: list[int | None], payload: bytes, header_extra: dict | None = None) -> tuple[bytes, int]:
    inputs = []
    for name, size in zip(("INPUT0", "INPUT1"), sizes):
        entry = {"name": name, "datatype": "INT32", "shape": [1, 16]}
        if size is None:
            entry["data"] = [0] * 16
        else:
            entry["parameters"] = {"binary_data_size": size}
        inputs.append(entry)
    header = json.dumps({"inputs": inputs, **(header_extra or {})}).encode()
    return header + payload, len(header)


def post_binary(server, body: bytes, header_length) -> requests.Response:
    return post_infer(
        server,
        body,
        headers={"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"},
    )


def test_binary_good(server):
    body, length = binary_body([64, 64], A.tobytes() + B.tobytes())
    response = post_binary(server, body, length)
    assert response.status_code == 200, response.text


def test_binary_truncated(server):
    body, length = binary_body([64, 64], A.tobytes() + B.tobytes()[:40])
    message = error_of(post_binary(server, body, length), 400)
    assert "INPUT1" in message and "binary" in message


def test_binary_size_does_not_match_shape(server):
    body, length = binary_body([64, 60], A.tobytes() + B.tobytes()[:60])
    message = error_of(post_binary(server, body, length), 400)
    assert "INPUT1" in message and "60" in message and "64" in message


def test_binary_unclaimed_bytes(server):
    body, length = binary_body([64, 64], A.tobytes() + B.tobytes() + b"extra")
    message = error_of(post_binary(server, body, length), 400)
    assert "5 bytes" in message


def test_binary_size_without_header_length(server):
    body, _ = binary_body([64, 64], A.tobytes() + B.tobytes())
    response = post_infer(server, body, headers={"Content-Type": "application/octet-stream"})
    # Without Inference-Header-Content-Length the whole body is (invalid) JSON.
    assert "JSON" in error_of(response, 400)
    # A JSON-only body that announces binary data that isn't there.
    only_header, _ = binary_body([64, 64], b"")
    response = post_infer(server, only_header, headers={"Content-Type": "application/json"})
    message = error_of(response, 400)
    assert "INPUT0" in message and "binary_data_size" in message


def test_header_length_larger_than_body(server):
    body, length = binary_body([64, 64], A.tobytes() + B.tobytes())
    message = error_of(post_binary(server, body, len(body) + 10), 400)
    assert "Inference-Header-Content-Length" in message


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", ""])
def test_header_length_not_a_count(server, value):
    body, _ = binary_body([64, 64], A.tobytes() + B.tobytes())
    message = error_of(post_binary(server, body, value), 400)
    assert "Inference-Header-Content-Length" in message


def test_header_length_cuts_the_json(server):
    body, length = binary_body([64, 64], A.tobytes() + B.tobytes())
    message = error_of(post_binary(server, body, length - 3), 400)
    assert "JSON" in message


def test_binary_bytes_malformed(server):
    """A BYTES element whose 4-byte length runs past the end of its data."""
    bad = (100).to_bytes(4, "little") + b"short"
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                {"name": "scale", "datatype": "FP64", "shape": [1, 1], "data": [1]},
                {"name": "k", "datatype": "INT64", "shape": [1, 1], "data": [1]},
                {"name": "text", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": len(bad)}},
            ]
        }
    ).encode()
    response = post_infer(
        server, header + bad, model="mixed", headers={"Inference-Header-Content-Length": str(len(header))}
    )
    message = error_of(response, 400)
    assert "text" in message


# --------------------------------------------------------------------------- 404 / 405


def test_unknown_model(server):
    message = error_of(post_infer(server, good_request(), model="no_such_model"), 404)
    assert "no_such_model" in message
    for path in ("/v2/models/no_such_model", "/v2/models/no_such_model/config", "/v2/models/no_such_model/stats"):
        assert "no_such_model" in error_of(server.get(path), 404)
    assert server.get("/v2/models/no_such_model/ready").status_code == 404


def test_unknown_version(server):
    response = server.post("/v2/models/simple/versions/7/infer", json=good_request())
    message = error_of(response, 404)
    assert "simple" in message and "7" in message
    assert server.get("/v2/models/simple/versions/7").status_code == 404
    assert server.get("/v2/models/simple/versions/7/ready").status_code == 404


@pytest.mark.parametrize(
    "path", ["/", "/v1/models/simple", "/v2/nothing", "/v2/models/simple/explain", "/v2/models/simple/infer/extra"]
)
def test_unknown_route(server, path):
    response = server.get(path)
    assert response.status_code == 404
    assert response.json()["error"]


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v2/models/simple/infer"),
        ("PUT", "/v2/models/simple/infer"),
        ("POST", "/v2/health/live"),
        ("POST", "/v2/health/ready"),
        ("POST", "/v2"),
        ("POST", "/v2/models/simple"),
        ("DELETE", "/v2/models/simple/config"),
        ("GET", "/v2/repository/index"),
    ],
)
def test_wrong_method(server, method, path):
    response = requests.request(method, server.url + path, timeout=30)
    message = error_of(response, 405)
    assert method in message


# --------------------------------------------------------------------------- raw sockets


def test_garbage_bytes(server):
    responses = rawhttp.exchange(server.host, server.port, b"\x16\x03\x01\x02\x00garbage that is not HTTP\r\n\r\n")
    (response,) = responses
    assert response.status == 400
    assert "malformed" in response.json()["error"].lower()
    # Another flavour: a request line with a broken version.
    (response,) = rawhttp.exchange(server.host, server.port, b"GET /v2 HTTX/9.9\r\n\r\n")
    assert response.status == 400


def test_invalid_header_line(server):
    (response,) = rawhttp.exchange(server.host, server.port, b"GET /v2 HTTP/1.1\r\nHost 127.0.0.1\r\nbroken\r\n\r\n")
    assert response.status == 400


def test_body_over_max_request_size(server):
    body = b'{"inputs": []}' + b" " * (MAX_REQUEST_SIZE + 100)
    data = rawhttp.request_bytes("POST", "/v2/models/simple/infer", body, {"Content-Type": "application/json"})
    with rawhttp.connect(server.host, server.port) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading all of it
        response = rawhttp.ResponseReader(sock).read()
    assert response.status == 413
    message = response.json()["error"]
    assert str(MAX_REQUEST_SIZE) in message
    # Through requests too.
    reply = post_infer(server, body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 413


def test_chunked_body_over_max_request_size(server):
    chunk = b"x" * 8192
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_REQUEST_SIZE // 8192 + 2)) + b"0\r\n\r\n"
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with rawhttp.connect(server.host, server.port) as sock:
        try:
            sock.sendall(head + chunks)
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = rawhttp.ResponseReader(sock).read()
    assert response.status == 413


def test_body_just_under_max_request_size(server):
    body = json.dumps(good_request()).encode()
    body += b" " * (MAX_REQUEST_SIZE - len(body))
    assert len(body) == MAX_REQUEST_SIZE
    response = post_infer(server, body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text


def test_chunked_body(server):
    body = json.dumps(good_request()).encode()
    pieces = [body[i : i + 50] for i in range(0, len(body), 50)]
    response = requests.post(server.url + "/v2/models/simple/infer", data=iter(pieces), timeout=30)
    assert response.status_code == 200, response.text


def test_gzip_and_deflate_bodies(server):
    body = json.dumps(good_request()).encode()
    for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        response = post_infer(server, data, headers={"Content-Encoding": encoding, "Content-Type": "application/json"})
        assert response.status_code == 200, (encoding, response.text)
    response = post_infer(server, body, headers={"Content-Encoding": "br"})
    assert "br" in error_of(response, 400)
    response = post_infer(server, b"not gzip at all", headers={"Content-Encoding": "gzip"})
    assert "gzip" in error_of(response, 400)


def test_gzip_bomb_over_max_request_size(server):
    data = gzip.compress(b" " * (4 * MAX_REQUEST_SIZE))
    assert len(data) < MAX_REQUEST_SIZE
    response = post_infer(server, data, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert response.status_code in (400, 413), response.text
    assert "maximum request size" in error_of(response, response.status_code)


def test_keep_alive_sequential(server):
    with rawhttp.connect(server.host, server.port) as sock:
        reader = rawhttp.ResponseReader(sock)
        for i in range(3):
            request = good_request()
            request["id"] = f"seq-{i}"
            sock.sendall(rawhttp.json_request("/v2/models/simple/infer", request))
            response = reader.read()
            assert response.status == 200
            assert response.json()["id"] == f"seq-{i}"
            assert response.headers.get("connection", "").lower() != "close"
        # An error does not close a keep-alive connection either.
        sock.sendall(rawhttp.request_bytes("GET", "/v2/models/nope"))
        assert reader.read().status == 404
        sock.sendall(rawhttp.request_bytes("GET", "/v2/health/live"))
        assert reader.read().status == 200


def test_pipelining_in_order(server):
    first, second = good_request(), good_request()
    first["id"], second["id"] = "first", "second"
    data = (
        rawhttp.json_request("/v2/models/simple/infer", first)
        + rawhttp.json_request("/v2/models/simple/infer", second)
        + rawhttp.request_bytes("GET", "/v2/models/simple")
        + rawhttp.request_bytes("GET", "/v2/models/unknown_model")
    )
    responses = rawhttp.exchange(server.host, server.port, data, responses=4)
    assert [r.status for r in responses] == [200, 200, 200, 404]
    assert responses[0].json()["id"] == "first"
    assert responses[1].json()["id"] == "second"
    assert responses[2].json()["name"] == "simple"


def test_pipelining_slow_then_fast(models_server, slow_iterations):
    """A slow request and then a fast one on one socket: the answers still come in order."""
    slow = {
        "id": "slow",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [slow_iterations(0.3)]},
        ],
    }
    fast = {"id": "fast", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    data = rawhttp.json_request("/v2/models/slow/infer", slow) + rawhttp.json_request(
        "/v2/models/identity_fp32/infer", fast
    )
    responses = rawhttp.exchange(models_server.host, models_server.port, data, responses=2)
    assert [r.status for r in responses] == [200, 200]
    assert [r.json()["id"] for r in responses] == ["slow", "fast"]


def test_many_pipelined_requests(server):
    """More pipelined requests than the server buffers before it pauses reading (flow control)."""
    count = 40
    data = b""
    for i in range(count):
        request = good_request()
        request["id"] = str(i)
        data += rawhttp.json_request("/v2/models/simple/infer", request)
    responses = rawhttp.exchange(server.host, server.port, data, responses=count)
    assert [r.json()["id"] for r in responses] == [str(i) for i in range(count)]


def test_connection_close_on_infer(server):
    with rawhttp.connect(server.host, server.port) as sock:
        sock.sendall(rawhttp.json_request("/v2/models/simple/infer", good_request(), {"Connection": "close"}))
        reader = rawhttp.ResponseReader(sock)
        response = reader.read()
        assert response.status == 200
        assert response.headers.get("connection", "").lower() == "close"
        assert reader.at_eof()


def test_http_1_0_infer(server):
    body = json.dumps(good_request()).encode()
    with rawhttp.connect(server.host, server.port) as sock:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        reader = rawhttp.ResponseReader(sock)
        response = reader.read()
        assert response.status == 200
        assert response.json()["outputs"][0]["data"] == (A + B).flatten().tolist()
        assert reader.at_eof()


def test_bytes_json_data_must_be_strings(server):
    request = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "scale", "datatype": "FP64", "shape": [1, 1], "data": [1]},
            {"name": "k", "datatype": "INT64", "shape": [1, 1], "data": [1]},
            {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [12]},
        ]
    }
    message = error_of(post_infer(server, request, model="mixed"), 400)
    assert "text" in message


def test_http_1_0(server):
    with rawhttp.connect(server.host, server.port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        reader = rawhttp.ResponseReader(sock)
        assert reader.read().status == 200
        assert reader.at_eof()


def test_connection_close_honoured(server):
    with rawhttp.connect(server.host, server.port) as sock:
        sock.sendall(rawhttp.request_bytes("GET", "/v2", headers={"Connection": "close"}))
        reader = rawhttp.ResponseReader(sock)
        response = reader.read()
        assert response.status == 200 and response.json()["name"] == "inferd"
        assert reader.at_eof()


def test_client_disconnects_mid_request(server):
    """Half a request and a hang-up must not disturb anyone else."""
    for _ in range(3):
        with rawhttp.connect(server.host, server.port) as sock:
            sock.sendall(rawhttp.request_bytes("POST", "/v2/models/simple/infer", b'{"inputs"', content_length=500))
    with rawhttp.connect(server.host, server.port) as sock:
        sock.sendall(rawhttp.json_request("/v2/models/simple/infer", good_request()))
        sock.shutdown(socket.SHUT_WR)
        # The answer may or may not be written; either way the server carries on.
        try:
            rawhttp.ResponseReader(sock).read()
        except (ConnectionError, OSError):
            pass
    time.sleep(0.1)


def test_errors_counted_as_failures(server):
    before = fail_count(quiet_stats(server, "simple"))
    request = good_request()
    request["inputs"][0]["datatype"] = "FP32"
    assert post_infer(server, request).status_code == 400
    after = stats_of(server, "simple", fail=before + 1)
    assert fail_count(after) == before + 1


def test_expect_100_continue(server):
    """HTTP/1.1 clients (curl, for bodies over 1 MB) ask before sending a body; the server must
    answer 100 Continue (or a final status) instead of leaving them to time out (curl: 1 s)."""
    body = json.dumps(good_request()).encode()
    head = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with rawhttp.connect(server.host, server.port, timeout=5) as sock:
        sock.sendall(head)
        sock.settimeout(0.8)
        try:
            interim = sock.recv(64)
        except TimeoutError:
            interim = b""
        sock.settimeout(5)
        sock.sendall(body)  # what a client does once its wait is over, either way
        reader = rawhttp.ResponseReader(sock)
        if interim.startswith(b"HTTP/1.1 100"):
            # The rest of the interim response (its blank line) may still be in flight.
            while not interim.endswith(b"\r\n\r\n"):
                interim += sock.recv(1)
            response = reader.read()
            assert response.status == 200
        else:
            # Drain the final answer so the connection is left clean, then fail.
            try:
                reader.read()
            except (ConnectionError, OSError, AssertionError):
                pass
            pytest.fail(f"no '100 Continue' within 0.8 s of 'Expect: 100-continue' (got {interim!r})")


def test_pipelined_large_responses_slow_reader(models_server):
    """Pipelined requests with multi-megabyte answers, read only after a pause: every answer
    arrives whole and in order (nothing interleaved, nothing lost while the socket was full)."""
    count = 4
    arrays = [np.full((2, 1 << 18), i + 1, np.float32) * np.arange(1 << 18, dtype=np.float32) for i in range(count)]
    data = b""
    for i, values in enumerate(arrays):
        header = json.dumps(
            {
                "id": f"big-{i}",
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "FP32",
                        "shape": list(values.shape),
                        "parameters": {"binary_data_size": values.nbytes},
                    }
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
        ).encode()
        data += rawhttp.request_bytes(
            "POST",
            "/v2/models/identity_fp32/infer",
            header + values.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))},
        )
    with rawhttp.connect(models_server.host, models_server.port, timeout=60) as sock:
        sock.sendall(data)
        time.sleep(0.5)  # let the server fill the socket and wait on us
        reader = rawhttp.ResponseReader(sock)
        for i, values in enumerate(arrays):
            response = reader.read()
            assert response.status == 200, response.body[:200]
            length = int(response.headers["inference-header-content-length"])
            header = json.loads(response.body[:length])
            assert header["id"] == f"big-{i}"
            assert response.body[length:] == values.tobytes()


def test_client_gone_before_the_answer(models_server, slow_iterations):
    """Clients that hang up while their request runs: the answer has nowhere to go, the server
    shrugs and carries on (and still counts the run)."""
    before = quiet_stats(models_server, "slow")
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [slow_iterations(0.2)]},
        ]
    }
    for _ in range(3):
        sock = rawhttp.connect(models_server.host, models_server.port)
        sock.sendall(rawhttp.json_request("/v2/models/slow/infer", body))
        time.sleep(0.05)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        sock.close()
    after = stats_of(models_server, "slow", success=success_count(before) + 3, timeout=30)
    assert success_count(after) - success_count(before) == 3
    assert models_server.proc.poll() is None, models_server.log()
    response = models_server.post("/v2/models/slow/infer", json=body)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [1.0]
