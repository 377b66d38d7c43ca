"""HTTP statuses live in one table in api/errors.py, keyed by the stable codes the store and verbs raise."""

from __future__ import annotations

import logging

import pytest

import api.verbs  # noqa: F401 - registers every verb module, and with them their DomainErrors
from api.errors import STATUS, UNAVAILABLE_MESSAGE, public_error, status_for
from routing.rules import ERROR_CODES
from store.errors import DomainError, NotFound, RuleRejected, StoreRejected, StoreUnavailable
from tests.conftest import Stack

# The contract (DESIGN.md "Agent HTTP", SPEC-0006): what each code answers, as it did before this table existed.
CONTRACT = {
    "unauthenticated": 401,
    "forbidden": 403,
    "ceiling_exceeded": 403,
    "forbidden_source_type": 403,
    "not_found": 404,
    "rule_not_found": 404,
    "unknown_verb": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "conflict": 409,
    "too_large": 413,
    "headers_too_large": 431,
    "invalid_argument": 422,
    "too_deep": 422,
    "invalid_expression": 422,
    "forbidden_function": 422,
    "invalid_rule": 422,
    "too_many_rules": 422,
    "invalid_params": 422,
    "uncompilable": 422,
    "rule_faults_on_recent_events": 422,
    "rate_limited": 429,
    "internal": 500,
    "llm_error": 502,
    "unavailable": 503,
    "llm_timeout": 504,
    "sandbox_busy": 503,
}


def _subclasses(cls: type[DomainError]) -> list[type[DomainError]]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def test_the_table_is_the_contract() -> None:
    assert STATUS == CONTRACT


def test_every_domain_code_and_rule_code_has_a_status() -> None:
    codes = {cls.code for cls in _subclasses(DomainError)} | set(ERROR_CODES)
    # store_rejected is answered as internal; not_granted surfaces as forbidden (store/rules.py rejection).
    assert sorted(codes - set(STATUS)) == ["not_granted", "store_rejected"]


def test_a_rule_code_keeps_its_own_name_at_422() -> None:
    assert public_error(RuleRejected("rule 0: bad", code="invalid_expression")) == ("invalid_expression", "rule 0: bad")
    assert status_for("invalid_expression") == 422


def test_a_refused_statement_is_internal_and_names_nothing_of_the_schema(caplog: pytest.LogCaptureFixture) -> None:
    refused = StoreRejected("23514 new row violates check constraint humans_check", error_type="CheckViolation")
    with caplog.at_level(logging.ERROR):
        assert public_error(refused, "POST /admin/v1/create_human") == ("internal", "internal error")
    assert any("humans_check" in r.getMessage() for r in caplog.records)  # the operator sees it, the client not


def test_an_outage_is_unavailable_with_a_fixed_message() -> None:
    assert public_error(StoreUnavailable("couldn't get a connection after 10.00 sec")) == (
        "unavailable",
        UNAVAILABLE_MESSAGE,
    )


def test_a_code_without_a_row_fails_closed_as_internal() -> None:
    assert public_error(DomainError("x", code="brand_new")) == ("internal", "internal error")
    assert status_for("brand_new") == 500


async def test_over_http_a_refusal_is_500_internal_and_a_missing_row_404(stack: Stack) -> None:
    stack.sql("ALTER TABLE humans ADD CONSTRAINT test_refuses_poison CHECK (name <> 'poison')")
    headers = {"Authorization": f"Bearer {stack.settings.admin_token}"}
    resp = await stack.http.post("/admin/v1/create_human", json={"name": "poison"}, headers=headers)
    assert resp.status_code == 500
    assert resp.json() == {"error": {"code": "internal", "message": "internal error"}}
    resp = await stack.http.post(
        "/admin/v1/create_agent", json={"human_id": "hu_missing", "name": "a"}, headers=headers
    )
    assert resp.status_code == 404
    assert resp.json() == {"error": {"code": "not_found", "message": "unknown human"}}
    assert public_error(NotFound("unknown human")) == ("not_found", "unknown human")
