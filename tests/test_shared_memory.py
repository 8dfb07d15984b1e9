"""Triton's system shared memory extension over REST and gRPC, with tritonclient's own helpers
and perf_analyzer --shared-memory system."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import BUNDLED_REPOSITORY, PERF_SHORT_RUN, run_perf_analyzer, start_server
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from inferd.core.errors import InvalidRequest
from inferd.core.shared_memory import SharedMemoryRegistry

PROTOCOLS = ["http", "grpc"]
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def server(log_dir):
    server = start_server(log_dir / "shared_memory", [BUNDLED_REPOSITORY], ["simple", "mixed"])
    yield server
    assert server.stop() == 0, server.log()[-5000:]


def _client(server, protocol):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.address)
    return grpcclient.InferenceServerClient(server.grpc_address)


@pytest.fixture(params=PROTOCOLS)
def protocol(request):
    return request.param


@pytest.fixture
def client(server, protocol):
    client = _client(server, protocol)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions():
    """Creates shared memory regions (unique keys) and destroys them after the test."""
    made = []

    def make(byte_size):
        tag = uuid.uuid4().hex[:10]
        handle = shm.create_shared_memory_region(f"r_{tag}", f"/inferd_test_{tag}", byte_size)
        made.append(handle)
        return handle, f"r_{tag}", f"/inferd_test_{tag}"

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _status(client, protocol, name=""):
    """The status as a list of {name, key, offset, byte_size}, whatever the protocol."""
    if protocol == "http":
        return sorted(client.get_system_shared_memory_status(name), key=lambda r: r["name"])
    response = client.get_system_shared_memory_status(name)
    return sorted(
        (
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in response.regions.values()
        ),
        key=lambda r: r["name"],
    )


def _module(protocol):
    return httpclient if protocol == "http" else grpcclient


def _error(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value)


# --------------------------------------------------------------------------- registry


def test_register_status_unregister(client, protocol, regions):
    handle, name, key = regions(128)
    client.register_system_shared_memory(name, key, 128)
    client.register_system_shared_memory(name + "_half", key, 64, offset=64)
    assert _status(client, protocol) == [
        {"name": name, "key": key, "offset": 0, "byte_size": 128},
        {"name": name + "_half", "key": key, "offset": 64, "byte_size": 64},
    ]
    assert _status(client, protocol, name + "_half") == [
        {"name": name + "_half", "key": key, "offset": 64, "byte_size": 64}
    ]
    client.unregister_system_shared_memory(name)
    assert [r["name"] for r in _status(client, protocol)] == [name + "_half"]
    client.unregister_system_shared_memory(name)  # unknown now: still fine (idempotent, as Triton)
    client.unregister_system_shared_memory()
    assert _status(client, protocol) == []
    assert "Unable to find system shared memory region" in _error(
        lambda: client.get_system_shared_memory_status("nope")
    )


def test_register_errors(client, protocol, regions):
    handle, name, key = regions(64)
    client.register_system_shared_memory(name, key, 64)
    assert "already registered" in _error(lambda: client.register_system_shared_memory(name, key, 64))
    missing = f"/inferd_missing_{uuid.uuid4().hex[:8]}"
    assert f"Unable to open shared memory region: '{missing}'" in _error(
        lambda: client.register_system_shared_memory("other", missing, 64)
    )
    assert "past the end" in _error(lambda: client.register_system_shared_memory("other", key, 64, offset=8))
    assert [r["name"] for r in _status(client, protocol)] == [name]


def test_cuda_shared_memory(server):
    rest = requests.get(server.url + "/v2/cudasharedmemory/status", timeout=10)
    assert rest.status_code == 200 and rest.json() == []
    rest = requests.post(server.url + "/v2/cudasharedmemory/region/x/register", json={}, timeout=10)
    assert rest.status_code == 400 and "CUDA shared memory is not supported" in rest.json()["error"]
    assert requests.post(server.url + "/v2/cudasharedmemory/unregister", timeout=10).status_code == 200
    assert requests.get(server.url + "/v2/systemsharedmemory/bogus", timeout=10).status_code == 404
    assert requests.post(server.url + "/v2/systemsharedmemory/status", timeout=10).status_code == 405
    client = grpcclient.InferenceServerClient(server.grpc_address)
    assert list(client.get_cuda_shared_memory_status().regions) == []
    client.unregister_cuda_shared_memory()
    message = _error(lambda: client.register_cuda_shared_memory("x", b"aGFuZGxl", 0, 64))
    assert "CUDA shared memory is not supported" in message
    client.close()


def test_unregister_while_in_use(regions):
    """A request's views keep the mapping alive after its region is unregistered."""
    handle, name, key = regions(64)
    shm.set_shared_memory_region(handle, [A])
    registry = SharedMemoryRegistry()
    registry.register(name, key, 0, 64)
    view = registry.get(name).slice(0, 64)
    array = np.frombuffer(view, np.int32)
    registry.unregister(name)
    assert registry.status() == []
    np.testing.assert_array_equal(array, A.reshape(-1))  # still mapped
    view[:4] = np.int32(99).tobytes()  # an output written after unregistering lands in the segment
    assert shm.get_contents_as_numpy(handle, np.int32, [1])[0] == 99
    del array, view
    registry.register(name, key, 0, 64)  # the name is free again
    registry.close()


# --------------------------------------------------------------------------- inference


def _shm_input(protocol, name, datatype, shape, region, byte_size, offset=0):
    entry = _module(protocol).InferInput(name, shape, datatype)
    entry.set_shared_memory(region, byte_size, offset)
    return entry


def _input(protocol, name, datatype, array):
    entry = _module(protocol).InferInput(name, list(array.shape), datatype)
    if protocol == "http":
        entry.set_data_from_numpy(array, binary_data=True)
    else:
        entry.set_data_from_numpy(array)
    return entry


def _shm_output(protocol, name, region, byte_size, offset=0):
    entry = _module(protocol).InferRequestedOutput(name)
    entry.set_shared_memory(region, byte_size, offset)
    return entry


def _output_parameters(result, protocol, name):
    output = result.get_output(name)
    if protocol == "http":
        return output.get("parameters", {}), "data" in output
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in output.parameters.items()}
    return params, False


def test_simple_all_in_shared_memory(client, protocol, regions):
    inputs_handle, inputs_name, inputs_key = regions(128)
    outputs_handle, outputs_name, outputs_key = regions(128)
    shm.set_shared_memory_region(inputs_handle, [A, B])
    client.register_system_shared_memory(inputs_name, inputs_key, 128)
    client.register_system_shared_memory(outputs_name, outputs_key, 128)
    inputs = [
        _shm_input(protocol, "INPUT0", "INT32", [1, 16], inputs_name, 64),
        _shm_input(protocol, "INPUT1", "INT32", [1, 16], inputs_name, 64, 64),
    ]
    outputs = [
        _shm_output(protocol, "OUTPUT0", outputs_name, 64),
        _shm_output(protocol, "OUTPUT1", outputs_name, 64, 64),
    ]
    result = client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16]), A + B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16], 64), A - B)
    for name in ("OUTPUT0", "OUTPUT1"):
        params, has_data = _output_parameters(result, protocol, name)
        assert not has_data
        if protocol == "grpc":
            assert params == {"shared_memory_region": outputs_name, "shared_memory_byte_size": 64}
        else:  # as Triton: Triton's C++ client takes any output with parameters for a binary part
            assert params == {}
    if protocol == "grpc":
        # As Triton: one (empty) raw entry per output, so the entries stay aligned with 'outputs'.
        assert list(result.get_response().raw_output_contents) == [b"", b""]
    # The region is read at each request: new contents, new answer.
    shm.set_shared_memory_region(inputs_handle, [B], offset=0)
    client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16]), B + B)


def test_mixing_shared_memory_and_data(client, protocol, regions):
    handle, name, key = regions(256)
    shm.set_shared_memory_region(handle, [A], offset=32)
    client.register_system_shared_memory(name, key, 256)
    inputs = [
        _shm_input(protocol, "INPUT0", "INT32", [1, 16], name, 64, 32),
        _input(protocol, "INPUT1", "INT32", B),
    ]
    # OUTPUT0 in shared memory, listed first: OUTPUT1's data must still be found.
    outputs = [_shm_output(protocol, "OUTPUT0", name, 64, 128), _module(protocol).InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], 128), A + B)
    # Input from shared memory, every output as data.
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_bytes_in_shared_memory(client, protocol, regions):
    handle, name, key = regions(1024)
    text = np.array([["hello"], [""], ["wörld ✓"]], dtype=np.object_)
    serialized = serialize_byte_tensor(text)
    size = len(serialized.item())
    shm.set_shared_memory_region(handle, [serialized])
    client.register_system_shared_memory(name, key, 1024)
    x = np.array([[1.5, -2.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [-1.0, 1.0, 0.0, 0.0]], np.float32)
    inputs = [
        _input(protocol, "x", "FP32", x),
        _input(protocol, "scale", "FP64", np.ones((3, 1), np.float64)),
        _input(protocol, "k", "INT64", np.zeros((3, 1), np.int64)),
        _shm_input(protocol, "text", "BYTES", [3, 1], name, size),
    ]
    outputs = [
        _shm_output(protocol, "text_out", name, 512, 512),
        _module(protocol).InferRequestedOutput("count"),
    ]
    result = client.infer("mixed", inputs, outputs=outputs)
    if protocol == "grpc":
        params, _ = _output_parameters(result, protocol, "text_out")
        assert params["shared_memory_byte_size"] == size
    got = shm.get_contents_as_numpy(handle, np.object_, [3, 1], 512)
    assert [t.decode() if isinstance(t, bytes) else t for t in got.flatten()] == ["hello", "", "wörld ✓"]
    np.testing.assert_array_equal(result.as_numpy("count"), [[1], [1], [1]])


def test_inference_errors(client, protocol, regions):
    handle, name, key = regions(128)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory(name, key, 128)
    good = [
        _shm_input(protocol, "INPUT0", "INT32", [1, 16], name, 64),
        _shm_input(protocol, "INPUT1", "INT32", [1, 16], name, 64, 64),
    ]
    cases = {
        "unregistered": (
            [_shm_input(protocol, "INPUT0", "INT32", [1, 16], "nope", 64), good[1]],
            None,
            "Unable to find shared memory region: 'nope'",
        ),
        "offset past the end": (
            [good[0], _shm_input(protocol, "INPUT1", "INT32", [1, 16], name, 64, 100)],
            None,
            "Invalid offset + byte size for shared memory region",
        ),
        "wrong size": (
            [good[0], _shm_input(protocol, "INPUT1", "INT32", [1, 16], name, 32, 64)],
            None,
            "input 'INPUT1' has 32 bytes of shared memory region",
        ),
        "output too small": (
            good,
            [_shm_output(protocol, "OUTPUT0", name, 32)],
            "for output 'OUTPUT0' (32 bytes) should be at least 64 bytes",
        ),
        "output past the end": (
            good,
            [_shm_output(protocol, "OUTPUT0", name, 64, 96)],
            "Invalid offset + byte size for shared memory region",
        ),
    }
    for case, (inputs, outputs, expected) in cases.items():
        message = _error(lambda i=inputs, o=outputs: client.infer("simple", i, outputs=o))
        assert expected in message, (case, message)
    # The region was not touched by the refused output; the server still answers.
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16]), A)
    result = client.infer("simple", good)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_unregister_then_infer(client, protocol, regions):
    handle, name, key = regions(128)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory(name, key, 128)
    inputs = [
        _shm_input(protocol, "INPUT0", "INT32", [1, 16], name, 64),
        _shm_input(protocol, "INPUT1", "INT32", [1, 16], name, 64, 64),
    ]
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), A + B)
    client.unregister_system_shared_memory(name)
    assert f"Unable to find shared memory region: '{name}'" in _error(lambda: client.infer("simple", inputs))
    client.register_system_shared_memory(name, key, 128)
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT1"), A - B)


# --------------------------------------------------------------------------- perf_analyzer


@pytest.mark.parametrize("perf_protocol", PROTOCOLS)
def test_perf_analyzer_system_shared_memory(perf_analyzer, server, perf_protocol):
    output, throughputs = run_perf_analyzer(
        perf_analyzer,
        server,
        ["-m", "simple", "--shared-memory", "system", "--concurrency-range", "1:2", *PERF_SHORT_RUN],
        protocol=perf_protocol,
    )
    assert throughputs and all(t > 0 for t in throughputs), output
    # perf_analyzer cleans up after itself.
    assert requests.get(server.url + "/v2/systemsharedmemory/status", timeout=10).json() == []


def test_keys_cannot_reach_outside_dev_shm(tmp_path):
    """A key is a name in /dev/shm: no path, no symbolic link to some other file."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for clients" * 8)
    link = f"inferd_link_{uuid.uuid4().hex[:8]}"
    link_path = f"/dev/shm/{link}"
    os.symlink(secret, link_path)
    registry = SharedMemoryRegistry()
    try:
        for key in (link, f"/{link}", "../" + str(secret), str(secret), "..", "."):
            with pytest.raises(InvalidRequest, match="Unable to open shared memory region"):
                registry.register("r", key, 0, 8)
        assert registry.status() == []
    finally:
        os.unlink(link_path)
        registry.close()
