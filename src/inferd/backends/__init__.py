"""Backends, selected by name and imported lazily so a model pays only for its own framework."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.backends.base import Backend

#: backend name -> "module:class"
BACKENDS: dict[str, str] = {
    "onnxruntime": "inferd.backends.onnxruntime:OnnxRuntimeBackend",
}


def backend_class(name: str) -> type[Backend]:
    """Import and return the backend class registered under ``name``."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend '{name}' (known: {', '.join(sorted(BACKENDS))})") from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
