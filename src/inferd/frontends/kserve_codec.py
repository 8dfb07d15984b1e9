"""KServe V2 JSON + Triton binary tensor extension: wire bytes <-> named numpy arrays.

Shared by every front end that speaks V2 JSON; knows nothing of sockets or models.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
import orjson

from inferd.core.datatypes import (
    ITEMSIZE,
    NUMPY_TO_V2,
    V2_TO_NUMPY,
    deserialize_bytes_tensor,
    serialize_bytes_tensor,
)
from inferd.core.errors import InvalidRequest
from inferd.core.shared_memory import SharedMemoryRegistry
from inferd.core.types import Tensors

_NUMPY_OPTION = orjson.OPT_SERIALIZE_NUMPY


def split_body(body: bytes, header_length: bytes | None) -> tuple[dict[str, Any], memoryview | None]:
    """Parse the JSON header of an infer request; returns it and the binary part (if any)."""
    try:
        if header_length is None:
            header = orjson.loads(body)
            binary = None
        else:
            try:
                length = int(header_length)
            except ValueError:
                raise InvalidRequest(
                    f"Inference-Header-Content-Length must be an integer, not '{header_length.decode('latin-1')}'"
                ) from None
            if length < 0 or length > len(body):
                raise InvalidRequest(
                    f"Inference-Header-Content-Length {length} is outside the request body of {len(body)} bytes"
                )
            view = memoryview(body)
            header = orjson.loads(view[:length])
            binary = view[length:]
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"failed to parse the request JSON: {exc}") from None
    if type(header) is not dict:
        raise InvalidRequest("the request JSON must be an object")
    return header, binary


def decode_inputs(
    entries: Any, binary: memoryview | None, shared_memory: SharedMemoryRegistry | None = None
) -> Tensors:
    """The ``inputs`` of a request as numpy arrays (binary and shared-memory data is wrapped, not
    copied)."""
    if type(entries) is not list or not entries:
        raise InvalidRequest("the request must have a non-empty 'inputs' list")
    inputs: Tensors = {}
    offset = 0
    for entry in entries:
        if type(entry) is not dict:
            raise InvalidRequest("each entry of 'inputs' must be an object")
        name = entry.get("name")
        shape = entry.get("shape")
        datatype = entry.get("datatype")
        if type(name) is not str:
            raise InvalidRequest("each input needs a 'name' string")
        if type(shape) is not list:
            raise InvalidRequest(f"input '{name}' needs a 'shape' list of non-negative integers")
        for d in shape:
            if type(d) is not int or d < 0:
                raise InvalidRequest(f"input '{name}' needs a 'shape' list of non-negative integers")
        dtype = V2_TO_NUMPY.get(datatype)  # type: ignore[arg-type]
        if dtype is None:
            raise InvalidRequest(
                f"input '{name}' has unsupported datatype {datatype!r} (one of {', '.join(V2_TO_NUMPY)})"
            )
        if name in inputs:
            raise InvalidRequest(f"input '{name}' is given twice")
        count = prod(shape)
        params = entry.get("parameters")
        if params is not None and type(params) is not dict:
            raise InvalidRequest(f"input '{name}': 'parameters' must be an object")
        size = params.get("binary_data_size") if params else None
        if params and "shared_memory_region" in params:
            if size is not None or "data" in entry:
                raise InvalidRequest(
                    f"input '{name}' names a shared memory region and also has data; send one or the other"
                )
            array = shm_input(shared_memory, name, params, datatype, dtype, shape, count)
        elif size is not None:
            if binary is None:
                raise InvalidRequest(
                    f"input '{name}' has binary_data_size but the request has no binary part "
                    "(set the Inference-Header-Content-Length header)"
                )
            if type(size) is not int or size < 0:
                raise InvalidRequest(f"input '{name}': binary_data_size must be a non-negative integer")
            end = offset + size
            if end > len(binary):
                raise InvalidRequest(
                    f"input '{name}': binary_data_size {size} runs past the end of the binary data "
                    f"({len(binary) - offset} bytes left)"
                )
            array = raw_to_array(name, binary[offset:end], datatype, dtype, shape, count, "binary data")
            offset = end
        else:
            if "data" not in entry:
                raise InvalidRequest(f"input '{name}' has neither 'data' nor binary_data_size")
            array = json_to_array(name, entry["data"], datatype, dtype, shape, count)
        inputs[name] = array
    if binary is not None and offset != len(binary):
        raise InvalidRequest(
            f"the request has {len(binary) - offset} bytes of binary data that no input claims "
            "(check binary_data_size and Inference-Header-Content-Length)"
        )
    return inputs


def raw_to_array(name: str, data: Any, datatype: str, dtype: np.dtype, shape: Any, count: int, what: str) -> np.ndarray:
    """A tensor sent as raw bytes (REST binary extension, gRPC ``raw_input_contents``): wrapped
    without a copy; BYTES elements are 4-byte-length-prefixed. ``what`` names the field in errors."""
    if datatype == "BYTES":
        try:
            return deserialize_bytes_tensor(data, count).reshape(shape)
        except ValueError as exc:
            raise InvalidRequest(f"input '{name}': {exc}") from None
    expected = count * ITEMSIZE[datatype]
    if len(data) != expected:
        raise InvalidRequest(
            f"input '{name}' has {len(data)} bytes of {what} but shape {list(shape)} of {datatype} needs {expected}"
        )
    return np.frombuffer(data, dtype).reshape(shape)


# --------------------------------------------------------------------------- shared memory


def _shm_location(name: str, what: str, params: dict[str, Any]) -> tuple[str, int, int]:
    """The region, byte size and offset that ``params`` give for a tensor (checked)."""
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if type(region) is not str or not region:
        raise InvalidRequest(f"{what} '{name}': shared_memory_region must be a non-empty string")
    if size is None:
        raise InvalidRequest(f"{what} '{name}': shared_memory_byte_size is required with shared_memory_region")
    for label, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if type(value) is not int or value < 0:
            raise InvalidRequest(f"{what} '{name}': {label} must be a non-negative integer")
    return region, size, offset


def is_shm(params: Any) -> bool:
    """Whether a tensor's parameters put it in shared memory."""
    return bool(params) and "shared_memory_region" in params


def shm_input(
    shared_memory: SharedMemoryRegistry | None,
    name: str,
    params: dict[str, Any],
    datatype: str,
    dtype: np.dtype,
    shape: Any,
    count: int,
) -> np.ndarray:
    """An input read from a registered shared memory region: a view of the mapping, no copy."""
    region_name, size, offset = _shm_location(name, "input", params)
    if shared_memory is None:
        raise InvalidRequest(f"input '{name}': shared memory is not available here")
    data = shared_memory.get(region_name).slice(offset, size)
    return raw_to_array(name, data, datatype, dtype, shape, count, f"shared memory region '{region_name}'")


def shm_output(shared_memory: SharedMemoryRegistry | None, name: str, params: dict[str, Any]) -> tuple[str, memoryview]:
    """Where an output asked for in shared memory goes: its region's name and a writable view."""
    region_name, size, offset = _shm_location(name, "output", params)
    if shared_memory is None:
        raise InvalidRequest(f"output '{name}': shared memory is not available here")
    return region_name, shared_memory.get(region_name).slice(offset, size)


def write_shm_output(name: str, array: np.ndarray, target: memoryview) -> int:
    """Copy an output into its shared memory view; returns the bytes written."""
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        data = serialize_bytes_tensor(array)
        nbytes = len(data)
    else:
        data = None
        nbytes = array.nbytes
    if nbytes > len(target):
        raise InvalidRequest(
            f"shared memory size specified with the request for output '{name}' ({len(target)} bytes) should be "
            f"at least {nbytes} bytes to hold the results"
        )
    if data is not None:
        target[:nbytes] = data
    elif nbytes:
        np.copyto(np.frombuffer(target[:nbytes], dtype=array.dtype).reshape(array.shape), array)
    return nbytes


#: Python types JSON numbers may arrive as, per datatype kind (bool is not an int here).
_JSON_TYPES = {"b": {bool}, "i": {int}, "u": {int}, "f": {int, float}}


def json_to_array(name: str, data: Any, datatype: str, dtype: np.dtype, shape: list[int], count: int) -> np.ndarray:
    """A JSON ``data`` list as an array, checked element by element: ``1.5`` for an INT32 input,
    ``"7"`` for a number or ``true`` among integers are refused rather than silently cast."""
    try:
        flat = np.asarray(data, dtype=np.object_).reshape(-1)
        if datatype == "BYTES":
            array = np.empty(flat.shape, dtype=np.object_)
            for i, item in enumerate(flat):
                if type(item) is str:
                    array[i] = item.encode()
                else:
                    raise ValueError(f"BYTES elements must be strings, not {type(item).__name__}")
        else:
            found = set(map(type, flat))
            allowed = _JSON_TYPES[dtype.kind]
            if not found <= allowed:
                wrong = sorted(t.__name__ for t in found - allowed)
                raise ValueError(
                    f"elements must be {' or '.join(sorted(t.__name__ for t in allowed))}, not {', '.join(wrong)}"
                )
            array = flat.astype(dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidRequest(f"input '{name}': data is not valid {datatype}: {exc}") from None
    if array.size != count:
        raise InvalidRequest(f"input '{name}' has {array.size} elements in 'data' but shape {shape} needs {count}")
    return array.reshape(shape)


def encode_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Tensors,
    binary_outputs: dict[str, bool] | None,
    binary_default: bool,
    parameters: dict[str, Any] | None = None,
    shm_outputs: dict[str, tuple[str, memoryview]] | None = None,
) -> tuple[bytes, list[Any]]:
    """The JSON header of a response and the binary parts that follow it (empty if all JSON).
    Outputs in ``shm_outputs`` are written into their shared memory region and answered with
    their name, datatype and shape only."""
    entries = []
    parts: list[Any] = []
    for name, array in outputs.items():
        datatype = NUMPY_TO_V2.get(array.dtype, "BYTES")
        if shm_outputs and name in shm_outputs:
            # As Triton: no data and no parameters (Triton's C++ client reads any output that
            # has parameters as a binary part, so they would break perf_analyzer).
            write_shm_output(name, array, shm_outputs[name][1])
            entries.append({"name": name, "datatype": datatype, "shape": array.shape})
            continue
        binary = binary_outputs.get(name, binary_default) if binary_outputs else binary_default
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": array.shape}
        if binary:
            if datatype == "BYTES":
                data: Any = serialize_bytes_tensor(array)
            elif array.nbytes <= 65536 or not array.flags.c_contiguous:
                data = array.tobytes()
            else:
                data = memoryview(array).cast("B")
            entry["parameters"] = {"binary_data_size": len(data)}
            parts.append(data)
        elif datatype == "BYTES":
            entry["data"] = [_text(item) for item in array.reshape(-1)]
        else:
            entry["data"] = np.ascontiguousarray(array).reshape(-1)
        entries.append(entry)
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
    return orjson.dumps(response, option=_NUMPY_OPTION), parts


def _text(item: Any) -> str:
    if isinstance(item, bytes):
        return item.decode("utf-8", "backslashreplace")
    return item if isinstance(item, str) else str(item)
