"""ONNX Runtime backend (Triton's ``onnxruntime_onnx`` platform)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from inferd.backends.base import Device
from inferd.config.model_config import ModelConfig, TensorSpec
from inferd.core.datatypes import ONNX_TO_V2
from inferd.core.errors import ModelLoadError

_OPTIMIZATION_LEVELS = {
    "0": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "1": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "2": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "-1": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "99": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _int_parameter(config: ModelConfig, key: str) -> int | None:
    if key not in config.parameters:
        return None
    value = config.parameters[key].string_value
    try:
        return int(value)
    except ValueError:
        raise ModelLoadError(f"model '{config.name}': parameter {key} must be an integer, not '{value}'") from None


class OnnxRuntimeBackend:
    """One ``InferenceSession`` per instance.

    ONNX string tensors hold text: BYTES inputs reach ``run`` already decoded to ``str``
    (``bytes_as_text``), checked as UTF-8 when the request is validated.

    Threads: each instance gets its share of the cores (``device.threads``) for its intra-op pool,
    one inter-op thread, and no spinning: spinning workers would burn the core that the event loop
    needs to parse the next requests, and with several instances they would fight each other.
    Triton's ``intra_op_thread_count``/``inter_op_thread_count`` parameters override the share.
    """

    bytes_as_text = True

    def __init__(self, path: Path, config: ModelConfig, device: Device) -> None:
        options = ort.SessionOptions()
        intra = _int_parameter(config, "intra_op_thread_count")
        inter = _int_parameter(config, "inter_op_thread_count")
        options.intra_op_num_threads = intra if intra and intra > 0 else device.threads
        options.inter_op_num_threads = inter if inter and inter > 0 else 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        level = _int_parameter(config, "optimization_level")
        if config.optimization.graph.level:
            level = config.optimization.graph.level
        if level is not None:
            options.graph_optimization_level = _OPTIMIZATION_LEVELS.get(
                str(level), ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            )
        options.log_severity_level = 3
        if device.kind == "gpu":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise ModelLoadError(
                    f"model '{config.name}': a GPU instance was requested but onnxruntime has no CUDA "
                    "execution provider here (install onnxruntime-gpu, or use KIND_CPU / KIND_AUTO)"
                )
            providers: list = [("CUDAExecutionProvider", {"device_id": device.index}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types for bad files
            raise ModelLoadError(f"model '{config.name}': onnxruntime could not load {path}: {exc}") from exc

    def signature(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [_spec(arg) for arg in self._session.get_inputs()], [_spec(arg) for arg in self._session.get_outputs()]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self._session.run(None, inputs)
        return {arg.name: value for arg, value in zip(self._session.get_outputs(), outputs)}

    def close(self) -> None:
        del self._session


def _spec(arg: ort.NodeArg) -> TensorSpec:
    datatype = ONNX_TO_V2.get(arg.type)
    if datatype is None:
        raise ModelLoadError(f"tensor '{arg.name}' has type {arg.type}, which inferd does not serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, datatype, shape)
