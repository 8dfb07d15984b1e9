"""Tensor datatypes: KServe V2 names, Triton config enums, numpy dtypes and ONNX type strings."""

from __future__ import annotations

import numpy as np

#: KServe V2 datatype name -> numpy dtype. BYTES tensors are numpy object arrays of ``bytes``.
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_V2: dict[np.dtype, str] = {dtype: name for name, dtype in V2_TO_NUMPY.items()}

#: Size in bytes of one element, for the fixed-size datatypes.
ITEMSIZE: dict[str, int] = {name: dtype.itemsize for name, dtype in V2_TO_NUMPY.items() if name != "BYTES"}

#: Triton ``config.pbtxt`` DataType enum names -> V2 names.
CONFIG_TO_V2: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
V2_TO_CONFIG: dict[str, str] = {v2: cfg for cfg, v2 in CONFIG_TO_V2.items()}

#: onnxruntime's ``NodeArg.type`` strings -> V2 names.
ONNX_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}


def v2_name(dtype: np.dtype) -> str:
    """The V2 datatype name of a numpy dtype (object and string arrays are BYTES)."""
    name = NUMPY_TO_V2.get(dtype)
    if name is not None:
        return name
    if dtype.kind in ("S", "U", "O"):
        return "BYTES"
    return str(dtype)


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Encode a BYTES tensor as the binary extension does: each element a 4-byte little-endian
    length followed by its bytes, in row-major order."""
    parts = []
    for item in array.ravel():
        if isinstance(item, str):
            item = item.encode()
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode()
        parts.append(len(item).to_bytes(4, "little"))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes_tensor(buffer: memoryview | bytes, count: int) -> np.ndarray:
    """Decode ``count`` length-prefixed elements; raises ValueError when the sizes don't add up."""
    view = memoryview(buffer)
    out = np.empty(count, dtype=np.object_)
    offset = 0
    end = len(view)
    for i in range(count):
        if offset + 4 > end:
            raise ValueError(f"BYTES data holds fewer than {count} elements")
        length = int.from_bytes(view[offset : offset + 4], "little")
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element length runs past the end of its data")
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != end:
        raise ValueError(f"BYTES data has {end - offset} bytes left over after {count} elements")
    return out
