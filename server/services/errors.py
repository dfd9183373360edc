"""Domain errors: what a service raises when a request cannot be done. The API maps them to HTTP
in one place (server/api/errors.py), so routes do not catch and translate them one by one."""

from __future__ import annotations


class DomainError(Exception):
    """Base of the errors services raise on purpose; its message is safe to show the caller."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class NotFound(DomainError, LookupError):
    """The thing asked for does not exist (404)."""


class Invalid(DomainError, ValueError):
    """The request is well-formed but asks for something that cannot be done as asked, e.g. two
    experiments with nothing comparable (422, the message says what does not fit)."""


class Forbidden(DomainError):
    """The caller's token may not do this to this thing (403; the message names the rule)."""


class StateConflict(DomainError):
    """The request does not fit the current state (409 `{reason, message, previous_state}`)."""

    def __init__(self, reason: str, message: str, previous_state: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.previous_state = None if previous_state is None else str(previous_state)
