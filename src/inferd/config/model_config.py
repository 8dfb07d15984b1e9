"""The canonical model configuration: Triton's ``ModelConfig`` protobuf.

Whatever a model's configuration is read from (a ``config.pbtxt``, a model that carries its own
signature, later a TorchServe manifest), it ends up as one ``ModelConfig`` message. Triton's schema
already has a text form (``config.pbtxt``) and a JSON form (the ``/config`` endpoint), and the
``tritonclient`` package ships its compiled protobuf classes, so we parse and print with those.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as pb

from inferd.core.datatypes import CONFIG_TO_V2, V2_TO_CONFIG
from inferd.core.errors import ModelLoadError

ModelConfig = pb.ModelConfig

#: Triton fills ``max_batch_size`` with this when it infers batching support from the model.
DEFAULT_MAX_BATCH_SIZE = 4

#: platform name -> (backend name, default model file name)
PLATFORMS: dict[str, tuple[str, str]] = {
    "onnxruntime_onnx": ("onnxruntime", "model.onnx"),
}
#: backend name -> platform name, for configs that name a backend instead of a platform.
BACKENDS: dict[str, str] = {backend: platform for platform, (backend, _) in PLATFORMS.items()}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the backend reports it: V2 datatype and full shape (-1 = any)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def read_config(model_dir: Path) -> tuple[ModelConfig, bool]:
    """Parse ``<model_dir>/config.pbtxt``. Returns the config and whether a file was there."""
    config = ModelConfig()
    path = model_dir / "config.pbtxt"
    if path.is_file():
        try:
            text_format.Parse(path.read_text(), config)
        except text_format.ParseError as exc:
            raise ModelLoadError(f"failed to parse {path}: {exc}") from exc
        if config.name and config.name != model_dir.name:
            raise ModelLoadError(
                f"model name '{config.name}' in {path} does not match the directory name '{model_dir.name}'"
            )
        found = True
    else:
        found = False
    if not config.name:
        config.name = model_dir.name
    return config, found


def parse_config_text(text: str, name: str) -> ModelConfig:
    """Parse config text (protobuf text format or JSON, as Triton accepts for load overrides)."""
    config = ModelConfig()
    try:
        if text.lstrip().startswith("{"):
            json_format.Parse(text, config)
        else:
            text_format.Parse(text, config)
    except (text_format.ParseError, json_format.ParseError) as exc:
        raise ModelLoadError(f"invalid model configuration for '{name}': {exc}") from exc
    if not config.name:
        config.name = name
    return config


def resolve_platform(config: ModelConfig, version_dir: Path | None) -> None:
    """Fill ``platform`` and ``backend`` from each other or from the files in the version folder."""
    if config.platform and config.platform not in PLATFORMS:
        raise ModelLoadError(
            f"model '{config.name}': platform '{config.platform}' is not supported "
            f"(supported: {', '.join(sorted(PLATFORMS))})"
        )
    if config.backend and not config.platform:
        platform = BACKENDS.get(config.backend)
        if platform is None:
            raise ModelLoadError(
                f"model '{config.name}': backend '{config.backend}' is not supported "
                f"(supported: {', '.join(sorted(BACKENDS))})"
            )
        config.platform = platform
    if not config.platform and version_dir is not None:
        for platform, (_, filename) in PLATFORMS.items():
            if (version_dir / (config.default_model_filename or filename)).exists():
                config.platform = platform
                break
    if not config.platform:
        raise ModelLoadError(
            f"model '{config.name}': no platform or backend given and no known model file found"
            + (f" in {version_dir}" if version_dir else "")
        )
    backend, filename = PLATFORMS[config.platform]
    config.backend = config.backend or backend
    if not config.default_model_filename:
        config.default_model_filename = filename


def complete_config(config: ModelConfig, inputs: list[TensorSpec], outputs: list[TensorSpec], filled: bool) -> None:
    """Complete a config from the model's own signature, as Triton's auto-complete does.

    ``inputs``/``outputs`` are the backend's view with full shapes (batch dimension included when
    the model has one). ``filled`` tells whether a config file was present.
    """
    name = config.name
    batch_capable = all(spec.shape and spec.shape[0] == -1 for spec in inputs + outputs)
    if config.max_batch_size == 0 and batch_capable and not config.input and not config.output:
        # Triton's rule: a model whose every tensor starts with a dynamic dimension batches.
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if not config.HasField("dynamic_batching") and not filled:
            config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    if config.max_batch_size > 0 and not batch_capable:
        bad = [s.name for s in inputs + outputs if not s.shape or s.shape[0] not in (-1,)]
        raise ModelLoadError(
            f"model '{name}': max_batch_size is {config.max_batch_size} but the model's tensors "
            f"{bad} have no dynamic first (batch) dimension"
        )
    _complete_tensors(name, "input", config.input, inputs, skip)
    _complete_tensors(name, "output", config.output, outputs, skip)


def _complete_tensors(name: str, kind: str, configured: Any, actual: list[TensorSpec], skip: int) -> None:
    by_name = {spec.name: spec for spec in actual}
    if not configured:
        for spec in actual:
            entry = configured.add()
            entry.name = spec.name
            entry.data_type = pb.DataType.Value(V2_TO_CONFIG[spec.datatype])
            entry.dims.extend(spec.shape[skip:] or ([1] if skip else []))
        return
    for entry in configured:
        spec = by_name.get(entry.name)
        if spec is None:
            raise ModelLoadError(
                f"model '{name}': configured {kind} '{entry.name}' is not a {kind} of the model "
                f"(the model has: {', '.join(by_name) or 'none'})"
            )
        want = CONFIG_TO_V2.get(pb.DataType.Name(entry.data_type))
        if entry.data_type == pb.TYPE_INVALID:
            entry.data_type = pb.DataType.Value(V2_TO_CONFIG[spec.datatype])
        elif want != spec.datatype:
            raise ModelLoadError(
                f"model '{name}': {kind} '{entry.name}' is configured as {want} but the model has {spec.datatype}"
            )
        if not entry.dims and not entry.HasField("reshape"):
            entry.dims.extend(spec.shape[skip:])
        model_dims = spec.shape[skip:]
        if not entry.HasField("reshape") and len(entry.dims) != len(model_dims):
            raise ModelLoadError(
                f"model '{name}': {kind} '{entry.name}' has dims {list(entry.dims)} in the config "
                f"but {list(model_dims)} in the model"
                + (" (the batch dimension is implicit when max_batch_size > 0)" if skip else "")
            )
        for want_dim, have_dim in zip(entry.dims, model_dims):
            if have_dim != -1 and want_dim != -1 and want_dim != have_dim:
                raise ModelLoadError(
                    f"model '{name}': {kind} '{entry.name}' has dims {list(entry.dims)} in the config "
                    f"but {list(model_dims)} in the model"
                )


def validate_config(config: ModelConfig) -> None:
    """Reject what inferd does not do, with a message that says so."""
    name = config.name
    if config.max_batch_size < 0:
        raise ModelLoadError(f"model '{name}': max_batch_size must be >= 0")
    if config.HasField("sequence_batching"):
        raise ModelLoadError(f"model '{name}': sequence batching is not supported by inferd yet")
    if config.HasField("ensemble_scheduling"):
        raise ModelLoadError(f"model '{name}': ensemble models are not supported by inferd yet")
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0 or (config.max_batch_size and size > config.max_batch_size):
            raise ModelLoadError(
                f"model '{name}': preferred batch size {size} must be between 1 and max_batch_size "
                f"({config.max_batch_size})"
            )
    for group in config.instance_group:
        if group.count < 0:
            raise ModelLoadError(f"model '{name}': instance_group count must be >= 0")


def config_to_dict(message: Any) -> dict[str, Any]:
    """The JSON form served at ``/config``: every field printed, 64-bit integers as numbers
    (protobuf's JSON mapping writes them as strings, which clients such as perf_analyzer reject)."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_to_numbers(message.DESCRIPTOR, data)
    return data


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _int64_to_numbers(descriptor: Any, data: dict[str, Any]) -> None:
    for field in descriptor.fields:
        value = data.get(field.name)
        if value is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for item in value.values():
                        _int64_to_numbers(value_field.message_type, item)
                elif value_field.type in _INT64_TYPES:
                    for key in value:
                        value[key] = int(value[key])
            elif isinstance(value, list):
                for item in value:
                    _int64_to_numbers(field.message_type, item)
            else:
                _int64_to_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
