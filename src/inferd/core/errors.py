"""The errors the core raises; each front end maps them onto its own status codes."""

from __future__ import annotations


class InferdError(Exception):
    """Base class: ``status`` is the HTTP status a REST front end answers with."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(InferdError):
    """The request itself is wrong: unknown tensor, bad shape or datatype, malformed body."""

    status = 400


class NotFound(InferdError):
    """No such model, version or endpoint."""

    status = 404


class Unavailable(InferdError):
    """The model exists but cannot take the request now: not ready, queue full, shutting down."""

    status = 503


class InternalError(InferdError):
    """The backend failed while running a request that was valid."""

    status = 500


class ModelLoadError(Exception):
    """A model could not be loaded; the message says why and the rest of the server carries on."""
