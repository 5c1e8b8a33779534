"""Typed exceptions. The edges (HTTP, CLI) turn them into one clear message."""
from __future__ import annotations


class LlumnixError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidRequestError(LlumnixError, ValueError):
    """The request itself is malformed (bad sampling values, empty prompt...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RequestTooLongError(InvalidRequestError):
    """The prompt can never be served: longer than the context or the whole KV pool."""


class OutOfBlocksError(LlumnixError):
    """A KV allocation was attempted without checking capacity first (a bug upstream)."""


class UnknownRequestError(LlumnixError, KeyError):
    """An operation named a request the engine does not hold."""


class ModelLoadError(LlumnixError):
    """A model file or directory could not be found or understood."""


class RequestFailedError(LlumnixError):
    """The engine failed while serving this request (a step raised on it, or every
    instance it was resumed on died): the request ended with an error, nothing else did."""


class UpstreamError(LlumnixError):
    """An engine we do not own (lite mode) failed or misbehaved on this request and no
    other could take it over: the gateway's fault to report, not the request's, and not a
    bug of ours (unlike ``RequestFailedError``, never answered as a 500)."""
