"""The one interface every backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from inferd.config.model_config import ModelConfig, TensorSpec


@dataclass(frozen=True)
class Device:
    """Where an instance runs: ``kind`` is "cpu" or "gpu"; ``threads`` is its share of the cores."""

    kind: str
    index: int = 0
    threads: int = 1

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


class Backend(Protocol):
    """Loads one model file onto one device and runs batches on it.

    ``run`` is called from the instance's own thread, never concurrently on one object, and
    should release the GIL while the framework computes.
    """

    #: True when the framework wants BYTES tensors as Python ``str`` (UTF-8 text).
    bytes_as_text: bool

    def __init__(self, path: Path, config: ModelConfig, device: Device) -> None: ...

    def signature(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """The model's inputs and outputs with full shapes (-1 for dynamic dimensions)."""
        ...

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; returns every output of the model by name."""
        ...

    def close(self) -> None: ...
