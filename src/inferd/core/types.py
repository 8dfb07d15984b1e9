"""The request and response types that every front end translates to and from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from inferd.core.errors import InferdError

Tensors = dict[str, np.ndarray]
#: Called once per request, on the instance thread that ran it (or on the event loop for requests
#: that never ran): (outputs, None) on success, (None, error) on failure. It must be thread-safe:
#: encode and send the answer, touch no event-loop state.
Completion = Callable[["InferRequest", "Tensors | None", "InferdError | None"], None]
#: Called afterwards on the event loop, once the answer was given: the front end's bookkeeping.
Finish = Callable[["InferRequest"], None]


class InferRequest:
    """One inference request: named input arrays plus what the client asked for.

    A plain slotted class rather than a dataclass or a validation model: it is built once per
    request on the hot path. ``context`` is the front end's own (its connection, its encoding
    choices); the core never looks at it.
    """

    __slots__ = (
        "inputs",
        "requested_outputs",
        "id",
        "parameters",
        "done",
        "finish",
        "context",
        "rows",
        "signature",
        "received_ns",
        "enqueued_ns",
        "deadline_ns",
        "priority",
    )

    def __init__(
        self,
        inputs: Tensors,
        done: Completion,
        context: Any = None,
        requested_outputs: list[str] | None = None,
        request_id: str | None = None,
        parameters: dict[str, Any] | None = None,
        received_ns: int = 0,
        finish: Finish | None = None,
    ) -> None:
        self.inputs = inputs
        self.done = done
        self.finish = finish
        self.context = context
        self.requested_outputs = requested_outputs
        self.id = request_id
        self.parameters = parameters
        self.received_ns = received_ns
        self.rows = 1
        self.signature: Any = None
        self.enqueued_ns = 0
        self.deadline_ns = 0
        self.priority = 0
