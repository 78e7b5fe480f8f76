"""How a model call fails for good: :class:`ModelError`, apart from the model seam in
:mod:`.base` so that what only reads runs and catches it does not load the
``anthropic`` client."""

from __future__ import annotations


class ModelError(Exception):
    """A model call failed for good (after retries); ``retryable`` says if a later
    attempt of the whole member may succeed (overload) or not (bad request)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        status: int | None = None,
        error_type: str = "",
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.error_type = error_type
        """The API's own word for the error (``invalid_request_error``), or the client's
        exception class when no answer came; empty when neither is known."""
