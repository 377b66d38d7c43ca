"""Save-time rule validation: every limit and code, the offending rule named, forbidden functions."""

from __future__ import annotations

from typing import Any

import pytest

from routing.jq_policy import REFUSED_FUNCTIONS, tokenize
from routing.models import Grant, Target
from routing.rules import (
    MAX_RULES,
    NOT_CHECKED,
    RuleValidationError,
    mint_rule_id,
    parse_action,
    validate_default_action,
    validate_params,
)
from routing.rules import validate_config as validate_config_with
from routing.rules import validate_rules as validate_rules_with
from tests.helpers import check_here as check_expression
from tests.helpers import compiled_here


def validate_rules(rules: Any, default: Any, params: Any, g: Grant, **kw: Any) -> list[dict[str, Any]]:
    """validate_rules with the compile verdicts the sandbox child would give (computed in this process)."""
    return validate_rules_with(rules, default, params, g, compiled=compiled_here(rules), **kw)


def validate_config(rules: Any, default: Any, params: Any, g: Grant) -> Any:
    """validate_config with the compile verdicts the sandbox child would give (computed in this process)."""
    return validate_config_with(rules, default, params, g, compiled=compiled_here(rules))


def grant(**overrides: Any) -> Grant:
    """Owner A (scope: router) plus routes B (lane-m) and C (lane-m, lane-l)."""
    base: dict[str, Any] = {
        "webhook_id": "wh_1",
        "owner_endpoint_id": "ep_a",
        "human_id": "hu_1",
        "source": "gitea",
        "target_queue": "router",
        "allowed_queues": ["lane-m", "lane-l", "hold"],
        "targets": [
            Target(endpoint_id="ep_a", scope_queues=["router"]),
            Target(endpoint_id="ep_b", scope_queues=["lane-m"]),
            Target(endpoint_id="ep_c", scope_queues=["lane-m", "lane-l"]),
        ],
    }
    base.update(overrides)
    return Grant(**base)


def rule(rid: str | None = "r1", expr: str = '.kind == "issues"', **extra: Any) -> dict[str, Any]:
    """A valid queue rule."""
    out: dict[str, Any] = {"expr": expr, "action": {"queue": "lane-m"}}
    if rid is not None:
        out["id"] = rid
    out.update(extra)
    return out


def reject(rules: Any, default: Any = None, params: Any = None, g: Grant | None = None) -> RuleValidationError:
    """Validate and return the error it must raise."""
    with pytest.raises(RuleValidationError) as info:
        validate_rules(rules, default, params, g or grant())
    return info.value


# --- happy path and normalization ------------------------------------------------------------------


def test_valid_rules_normalized() -> None:
    rules = [
        {"id": "a", "name": "first", "expr": ".verified", "action": {"queue": "lane-m", "exclusive": True}},
        {"id": "b", "expr": "$params.x == 1", "action": {"drop": True}},
        {
            "id": "c",
            "expr": "true",
            "action": {"queue": "lane-l", "endpoints": ["ep_c"], "once": True, "work_order": False},
        },
    ]
    out = validate_rules(rules, {"drop": True}, {"x": 1}, grant())
    assert out == [
        {"id": "a", "name": "first", "expr": ".verified", "action": {"queue": "lane-m", "exclusive": True}},
        {"id": "b", "expr": "$params.x == 1", "action": {"drop": True}},
        {
            "id": "c",
            "expr": "true",
            "action": {"queue": "lane-l", "endpoints": ["ep_c"], "once": True, "work_order": False},
        },
    ]


def test_empty_rules_ok() -> None:
    assert validate_rules([], None, None, grant()) == []


def test_ids_minted_when_omitted_without_collision() -> None:
    minted = iter(["taken", "taken", "fresh"])
    out = validate_rules([rule(None), rule("taken")], None, None, grant(), mint_id=lambda: next(minted))
    assert [r["id"] for r in out] == ["fresh", "taken"]
    rid = mint_rule_id()
    assert 1 <= len(rid) <= 64
    assert validate_rules([rule(rid)], None, None, grant())[0]["id"] == rid
    assert mint_rule_id() != mint_rule_id()


def test_validate_config_returns_all_three() -> None:
    rules, default, params = validate_config([rule()], {"queue": "hold"}, None, grant())
    assert rules[0]["id"] == "r1"
    assert default == {"queue": "hold"}
    assert params == {}


# --- limits ------------------------------------------------------------------------------------------


def test_too_many_rules_names_the_first_extra_rule() -> None:
    rules = [rule(f"r{i}") for i in range(MAX_RULES + 1)]
    err = reject(rules)
    assert err.code == "too_many_rules"
    assert err.rule_index == MAX_RULES
    assert err.rule_id == f"r{MAX_RULES}"
    assert validate_rules(rules[:MAX_RULES], None, None, grant())


@pytest.mark.parametrize("bad", ["", "a" * 65, "has space", "dot.id", "ümlaut", 5, True])
def test_bad_ids(bad: Any) -> None:
    err = reject([rule("ok"), {"id": bad, "expr": "true", "action": {"drop": True}}])
    assert err.code == "invalid_rule"
    assert err.rule_index == 1
    assert "rule index 1" in err.message


def test_id_bounds_ok() -> None:
    assert validate_rules([rule("a"), rule("A_-9" + "x" * 60)], None, None, grant())


def test_duplicate_ids() -> None:
    err = reject([rule("dup"), rule("dup", name="second")])
    assert err.code == "invalid_rule"
    assert (err.rule_index, err.rule_id, err.rule_name) == (1, "dup", "second")
    assert err.message.startswith('rule index 1 (id "dup", name "second"): ')


def test_name_limit_in_bytes() -> None:
    assert validate_rules([rule(name="é" * 64)], None, None, grant())
    err = reject([rule(name="é" * 65)])
    assert err.code == "invalid_rule"
    err = reject([rule(name=3)])
    assert err.code == "invalid_rule"


def test_expr_limit_in_bytes() -> None:
    expr_ok = '"' + "é" * 2040 + '" | length > 0'
    assert len(expr_ok.encode()) <= 4096
    assert validate_rules([rule(expr=expr_ok)], None, None, grant())
    long_expr = '"' + "é" * 2048 + '"'
    assert len(long_expr.encode()) > 4096
    err = reject([rule(expr=long_expr)])
    assert err.code == "invalid_rule"
    assert "4096" in err.message


def test_endpoint_limit() -> None:
    many = [f"ep_{i}" for i in range(17)]
    err = reject([{"id": "x", "expr": "true", "action": {"queue": "lane-m", "endpoints": many}}])
    assert err.code == "invalid_rule"
    targets = [Target(endpoint_id=f"ep_{i}", scope_queues=["lane-m"]) for i in range(16)]
    ok = {"id": "x", "expr": "true", "action": {"queue": "lane-m", "endpoints": many[:16]}}
    assert validate_rules([ok], None, None, grant(targets=targets))


def test_params_limit() -> None:
    assert validate_params(None) == {}
    big = {"k": "x" * (16 * 1024 - 8)}  # {"k":"…"} is 8 bytes of framing
    assert validate_rules([], None, big, grant()) == []
    err = reject([], params={"k": "x" * (16 * 1024 - 7)})
    assert err.code == "invalid_params"
    for bad in (["list"], "s", 5, {"nan": float("nan")}, {"set": {1}}):
        assert reject([], params=bad).code == "invalid_params"


def test_rules_must_be_list_of_objects() -> None:
    assert reject({"id": "x"}).code == "invalid_rule"
    err = reject([rule("a"), "not a rule"])
    assert (err.code, err.rule_index) == ("invalid_rule", 1)


def test_unknown_rule_field_and_missing_parts() -> None:
    assert reject([rule(exp="typo")]).code == "invalid_rule"
    assert reject([{"id": "x", "action": {"drop": True}}]).code == "invalid_rule"
    assert reject([{"id": "x", "expr": "true"}]).code == "invalid_rule"


# --- expressions ---------------------------------------------------------------------------------------


def test_typo_rejected_naming_the_rule() -> None:
    err = reject([rule("ok"), rule("typo", expr=".kind ==", name="broken")])
    assert err.code == "invalid_expression"
    assert (err.rule_index, err.rule_id, err.rule_name) == (1, "typo", "broken")
    assert err.message.startswith('rule index 1 (id "typo", name "broken"): ')


@pytest.mark.parametrize(
    "expr",
    [".kind ==", "foo(", "undefined_fn", "$x", "def f: $y; 1", "", "   ", '"unterminated', "(1", "true # \\"],
)
def test_invalid_expressions(expr: str) -> None:
    assert reject([rule(expr=expr)]).code == "invalid_expression"


@pytest.mark.parametrize(
    "expr",
    [
        "$__loc__",
        "{$__loc__}",
        "$__loc__.line",
        "$__prog_args",
        "$__sbx_start",
        ". as $__tmp | true",
        "def f($__a): 1; f(1)",
    ],
)
def test_libjq_and_reserved_variables_are_undefined(expr: str) -> None:
    """SPEC-0020: undefined variables (e.g. $__loc__) fail to compile; libjq binds $__loc__ itself, so the
    policy refuses every $__ name (bound or not) rather than leave it to the compiler."""
    err = reject([rule("x", expr=expr)])
    assert err.code == "invalid_expression", (expr, err.message)
    assert "reserved" in err.message


@pytest.mark.parametrize(
    "expr",
    [
        "env",
        "env.HOME",
        "$ENV",
        "$ENV.HOME",
        "{$ENV}",
        ". as {$ENV} | 1",
        "input",
        "inputs",
        "[inputs]",
        "debug",
        'debug("x")',
        "stderr",
        "halt",
        "halt_error",
        "halt_error(1)",
        "input_filename",
        "input_line_number",
        "now",
        "now | localtime",
        'strflocaltime("%Y")',
        "localtime",
        "get_search_list",
        "get_prog_origin",
        "get_jq_origin",
        "modulemeta",
        'import "a" as a; .',
        'include "a"; .',
        "module {}; .",
        "foo::bar",
        '"\\(env)"',
        '"nested \\("x\\(input)")"',
        '@base64 "\\(env)"',
        '@json "\\($ENV)"',
        "{a: env}",
        "{(env): 1}",
        '{"\\(env)": 1}',
        ".a | env",
        ".env | env",
        ". as {(env): $v} | $v",
        "# comment\nenv",
        "1 # continued comment \\\\\nenv",
        "[.[] | env]",
        "1 as $ENV | $ENV",
        "reduce inputs as $x (0; . + 1)",
        "$ ENV",
        "if true then env else 1 end",
        "try env catch 1",
        ".a as $x | $x | debug",
    ],
)
def test_forbidden_in_every_disguise(expr: str) -> None:
    err = reject([rule("x", expr=expr, name="sneaky")])
    assert err.code == "forbidden_function", (expr, err.message)
    assert err.message.startswith('rule index 0 (id "x", name "sneaky"): ')


@pytest.mark.parametrize(
    "expr",
    [
        ".env",
        '."env"',
        '.["env"]',
        "{env: 1}",
        "{env}",
        "{a: 1, env: 2}",
        "{input: .a, now: .b}",
        '"env"',
        '"input inputs now $ENV $__loc__"',
        '"\\\\(env)"',
        '@base64 "env"',
        '@text "\\(.env)"',
        "# env input $ENV\n.",
        ". # env",
        "1 # continued comment \\\nenv",
        '.payload.env == "x"',
        '[.[]? | select(.name == "env")]',
        ". as $x | $x",
        ". as [$a, {b: $c, $d}] | [$a, $c, $d]",
        ".a as [$x] ?// $x | $x",
        "reduce .[]? as $x (0; . + 1)",
        "foreach .[]? as $x (0; . + 1)",
        "def f($a): $a + 1; f(2)",
        "def f(g): g; f(.a)",
        "label $out | 1, break $out",
        "$params.allow | arrays",
        'getpath(["a"])',
        'splits("a")',
        'ltrimstr("a")',
        "{if: 1, then: 2, end: 3} | .end",
        ".a.input",
        "{$params}",
        '"\\(.a) and \\("\\(.b)")"',
    ],
)
def test_allowed_expressions(expr: str) -> None:
    assert check_expression(expr) is None, expr
    assert validate_rules([rule(expr=expr)], None, None, grant())


def test_forbidden_beats_compile_error() -> None:
    err = reject([rule(expr="env | (")])
    assert err.code == "invalid_expression"  # unbalanced: the tokenizer cannot lex it
    err = reject([rule(expr="env | .a ==")])
    assert err.code == "forbidden_function"


def test_forbidden_list_covers_the_spec() -> None:
    spec = {"env", "input", "inputs", "input_filename", "debug", "stderr", "halt", "halt_error", "now"}
    spec |= {"localtime", "strflocaltime"}
    assert spec <= REFUSED_FUNCTIONS


def test_tokenizer_tracks_interpolation_and_comments() -> None:
    kinds = [(t.kind, t.value) for t in tokenize('.a # x\n| "s\\(.b)t" | @base64 "u"')]
    assert kinds == [
        ("field", "a"),
        ("op", "|"),
        ("str_start", '"'),
        ("interp_start", "\\("),
        ("field", "b"),
        ("interp_end", ")"),
        ("str_end", '"'),
        ("op", "|"),
        ("format", "@base64"),
        ("str_start", '"'),
        ("str_end", '"'),
    ]


def test_comment_continuation_matches_installed_jq() -> None:
    """Pin the tokenizer's comment rule against libjq's own: a mismatch would hide a call."""
    import jq

    for text, env_is_code in [
        ("1 # c \\\nenv", False),
        ("1 # c \\\\\nenv", True),
        ("1 # c \\\r\nenv", False),
        ("1 # c\renv", False),
        ("1 # c \\\\\\\nenv", False),
    ]:
        try:
            jq.compile(text.replace("env", 'error("code")'), args={"params": {}}).input_value(None).first()
            jq_runs_it = False
        except ValueError:
            jq_runs_it = True
        assert jq_runs_it is env_is_code, text
        assert (check_expression(text) is not None) is env_is_code, text


# --- actions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        None,
        "lane-m",
        {},
        {"queue": "lane-m", "drop": True},
        {"drop": False},
        {"drop": "yes"},
        {"drop": True, "endpoints": ["ep_b"]},
        {"drop": True, "exclusive": True},
        {"drop": True, "once": True},
        {"drop": True, "work_order": True},
        {"queue": ""},
        {"queue": 5},
        {"queue": "lane-m", "exclusive": "yes"},
        {"queue": "lane-m", "once": 1},
        {"queue": "lane-m", "endpoints": "ep_b"},
        {"queue": "lane-m", "endpoints": []},
        {"queue": "lane-m", "endpoints": ["ep_b", "ep_b"]},
        {"queue": "lane-m", "endpoints": [1]},
        {"queue": "lane-m", "priority": 1},
    ],
)
def test_malformed_actions(action: Any) -> None:
    err = reject([{"id": "x", "name": "n", "expr": "true", "action": action}])
    assert (err.code, err.rule_index, err.rule_id, err.rule_name) == ("invalid_rule", 0, "x", "n")
    with pytest.raises(ValueError):
        parse_action(action)


def test_queue_not_granted() -> None:
    err = reject([rule("ok"), {"id": "x", "expr": "true", "action": {"queue": "elsewhere"}}])
    assert (err.code, err.rule_index, err.rule_id) == ("not_granted", 1, "x")


def test_endpoint_must_be_a_delivery_target() -> None:
    # Including the owner's own unrouted endpoint: only targets count.
    err = reject([{"id": "x", "expr": "true", "action": {"queue": "lane-m", "endpoints": ["ep_other"]}}])
    assert err.code == "not_granted"
    assert "ep_other" in err.message


def test_exclusive_needs_a_scoped_candidate() -> None:
    ok = {"id": "x", "expr": "true", "action": {"queue": "lane-l", "exclusive": True}}
    assert validate_rules([ok], None, None, grant())
    narrowed = {"id": "x", "expr": "true", "action": {"queue": "lane-l", "exclusive": True, "endpoints": ["ep_b"]}}
    assert reject([narrowed]).code == "not_granted"
    hold = {"id": "x", "expr": "true", "action": {"queue": "hold", "exclusive": True}}
    assert reject([hold]).code == "not_granted"


def test_no_targets_is_not_granted() -> None:
    assert reject([rule()], g=grant(targets=[])).code == "not_granted"


def test_default_action_validated_the_same_way() -> None:
    assert validate_default_action(None, grant()) is None
    assert validate_default_action({"drop": True}, grant()) == {"drop": True}
    err = reject([rule()], default={"queue": "nope"})
    assert err.code == "not_granted"
    assert err.message.startswith("default_action: ")
    assert err.rule_index is None
    assert reject([], default={"drop": True, "once": True}).code == "invalid_rule"
    assert reject([], default={"queue": "lane-m", "endpoints": ["ep_x"]}).code == "not_granted"


def test_error_to_dict() -> None:
    err = reject([rule("a"), rule("b", expr="env", name="n")])
    assert err.to_dict() == {
        "code": "forbidden_function",
        "message": err.message,
        "rule_index": 1,
        "rule_id": "b",
        "rule_name": "n",
    }


def test_unnamed_rule_message() -> None:
    err = reject([rule("only", expr="input")])
    assert err.message.startswith('rule index 0 (id "only"): ')
    assert err.rule_name is None


# --- the compile verdict comes from the sandbox, never skipped ------------------------------------------


def test_an_expression_without_a_sandbox_verdict_is_refused_not_saved_unchecked() -> None:
    rules = [rule("ok", expr="true"), rule("new", name="fresh", expr=".verified")]
    with pytest.raises(RuleValidationError) as info:
        validate_rules_with(rules, None, None, grant(), compiled={"true": None})
    err = info.value
    assert (err.code, err.rule_index, err.rule_id, err.rule_name) == ("invalid_expression", 1, "new", "fresh")
    assert err.message == f'rule index 1 (id "new", name "fresh"): {NOT_CHECKED}'
    with pytest.raises(RuleValidationError) as info:
        validate_config_with([rule()], None, None, grant())  # no verdicts at all: fails closed
    assert info.value.code == "invalid_expression" and info.value.rule_index == 0


def test_the_policy_still_answers_first_without_a_sandbox_verdict() -> None:
    with pytest.raises(RuleValidationError) as info:
        validate_rules_with([rule(expr="env | .a")], None, None, grant())
    assert info.value.code == "forbidden_function"


def test_a_sandbox_refusal_names_the_rule() -> None:
    expr = '"x" * 1e9 | length > 0'
    verdict = "compiling exceeds the sandbox's memory or time limit"
    with pytest.raises(RuleValidationError) as info:
        validate_rules_with(
            [rule("a"), rule("big", expr=expr)],
            None,
            None,
            grant(),
            compiled={'.kind == "issues"': None, expr: verdict},
        )
    err = info.value
    assert (err.code, err.rule_index, err.rule_id) == ("invalid_expression", 1, "big")
    assert err.message == f'rule index 1 (id "big"): {verdict}'


def test_compile_candidates_skip_what_validation_refuses_first() -> None:
    from routing.rules import MAX_EXPR_BYTES, compile_candidates

    rules = [rule(expr="true"), rule(expr="true"), rule(expr="env"), rule(expr=" " * (MAX_EXPR_BYTES + 1)), 3]
    assert compile_candidates(rules) == ["true"]
    assert compile_candidates([rule()] * (MAX_RULES + 1)) == []
    assert compile_candidates("not a list") == []
