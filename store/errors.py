"""Domain errors raised by the store; each boundary maps them to its own shape once."""

from __future__ import annotations


class DomainError(Exception):
    """A failure with a stable machine code and a client-safe message."""

    code = "internal"
    status = 500

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.code.replace("_", " ")
        if code is not None:
            self.code = code


class NotFound(DomainError):
    code = "not_found"
    status = 404


class Conflict(DomainError):
    code = "conflict"
    status = 409


class Forbidden(DomainError):
    code = "forbidden"
    status = 403


class InvalidArgument(DomainError):
    code = "invalid_argument"
    status = 422


class CeilingExceeded(DomainError):
    code = "ceiling_exceeded"
    status = 403


class ForbiddenSourceType(DomainError):
    code = "forbidden_source_type"
    status = 403


class Unauthenticated(DomainError):
    code = "unauthenticated"
    status = 401


class RuleRejected(DomainError):
    """A rule list failed save-time validation; the code is routing's, verbatim (422)."""

    code = "invalid_rule"
    status = 422


class RuleNotFound(DomainError):
    code = "rule_not_found"
    status = 404
