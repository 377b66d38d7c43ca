"""The one jq policy: which rule expressions may run, decided by one lexer for save time and the sandbox.

Save-time validation (routing/rules.py) and the sandbox child's engine (routing/sandbox/engine.py) both call
:func:`verdict`, so a rule accepted at save is never refused at evaluation, and the reverse. This module
imports nothing but the standard library: the child runs it with ``python -I`` and loads it by path.

The policy (SPEC-0020 "Expression sandboxing"), in the order it is checked:

1. The expression must lex as jq 1.8 lexes it: strings (with ``\\(…)`` interpolations, which are code),
   ``@format "…"`` strings, comments (a backslash continues a comment onto the next line, a CRLF pair
   included), balanced brackets, closed strings and interpolations. A comment that ends the expression
   on an odd backslash is refused too: it would swallow whatever follows the rule. → ``invalid_expression``
2. Refused builtins (:data:`REFUSED_FUNCTIONS`: environment, input stream, clock, local time, stderr,
   exit, module introspection), module-qualified names (``a::b``) and the module directives ``import``,
   ``include``, ``module`` are refused wherever they are code: a call, a ``def`` name or parameter, a
   bare word in a ``then`` branch. They are harmless, and accepted, as a field (``.env``, ``."env"``),
   an object key (``{env: 1}``) or key shorthand (``{env}``, which is ``{env: .env}``), inside a string
   outside its interpolations, in a comment, and as a format name (``@env``). ``$ENV`` is refused
   wherever it appears, bound or not (SPEC-0020 lists it with ``env``). → ``forbidden_function``
3. Variables: ``$params`` and the variables the expression binds itself (``as $x``, ``reduce``/``foreach
   … as $x``, destructuring patterns and their ``?//`` alternatives, ``def f($a)`` parameters) are
   defined; every other variable is undefined. Names starting with ``__`` are reserved, bound or not:
   libjq binds ``$__loc__`` itself and the sandbox's combined program binds its own ``$__sbx_…`` names,
   so none of them can be reached, shadowed or collided with. → ``invalid_expression``
4. The caller then compiles the rule exactly as the child runs it; a compile failure is also
   ``invalid_expression``.

Where the lexer cannot be sure how jq reads a word it treats it as code: the policy may refuse more than
strictly necessary, never less, and both sides refuse the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

PARAMS_VAR: Final = "params"
FORBIDDEN: Final = "forbidden_function"
INVALID: Final = "invalid_expression"
Code = Literal["forbidden_function", "invalid_expression"]

# Builtins that read outside the envelope (environment, input stream, clock, local time zone, files,
# modules) or act outside the evaluation (stderr, exit). libjq defines them, so compiling cannot refuse
# them; every arity is refused (debug/1, halt_error/1, strflocaltime/1 included).
REFUSED_FUNCTIONS: Final = frozenset(
    {
        "env",
        "input",
        "inputs",
        "input_filename",
        "input_line_number",
        "debug",
        "stderr",
        "halt",
        "halt_error",
        "now",
        "localtime",
        "strflocaltime",
        "get_search_list",
        "get_prog_origin",
        "get_jq_origin",
        "modulemeta",
    }
)
# Module directives: rules compile with no module loader.
REFUSED_KEYWORDS: Final = frozenset({"import", "include", "module"})
# Refused wherever the name appears as a variable, bound or not.
REFUSED_VARIABLES: Final = frozenset({"ENV"})
# Variables starting with this are reserved for libjq ($__loc__) and the sandbox's own program.
RESERVED_VARIABLE_PREFIX: Final = "__"
# jq 1.8's keywords: never calls; usable as object keys ({if: 1}) and fields (.end).
KEYWORDS: Final = frozenset(
    {
        "as",
        "def",
        "if",
        "then",
        "elif",
        "else",
        "end",
        "and",
        "or",
        "reduce",
        "foreach",
        "try",
        "catch",
        "label",
        "import",
        "include",
        "module",
        "__loc__",
    }
)

TokenKind = Literal[
    "ident", "keyword", "field", "var", "format", "number", "op", "str_start", "str_end", "interp_start", "interp_end"
]


class JqLexError(ValueError):
    """The expression does not lex as jq's (an unbalanced bracket, an unterminated string, …)."""


@dataclass(frozen=True)
class Token:
    """One jq token; string bodies and comments produce none (only interpolations inside strings do)."""

    kind: TokenKind
    value: str
    pos: int


@dataclass(frozen=True)
class Refusal:
    """Why the policy refuses an expression: a stable code and a one-line detail."""

    code: Code
    detail: str


# jq 1.8's lexical classes (src/lexer.l), ASCII only.
_IDENT: Final = re.compile(r"(?:[A-Za-z_][A-Za-z_0-9]*::)*[A-Za-z_][A-Za-z_0-9]*")
_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_NUMBER: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FORMAT: Final = re.compile(r"@[A-Za-z0-9_]+")
_WHITESPACE: Final = frozenset(" \t\r\n")
_OPERATOR: Final = re.compile(r"\?//|//=|\|=|\+=|-=|\*=|/=|%=|==|!=|<=|>=|//|\.\.|.", re.DOTALL)
# Interpolations nest by recursion; far deeper than any rule needs, far below Python's recursion limit.
MAX_INTERPOLATION_DEPTH: Final = 64
_OPENERS: Final = {"(": ")", "[": "]", "{": "}"}


class _Lexer:
    """jq 1.8's lexer where it decides what is code: strings, interpolations, comments, names, brackets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tokens: list[Token] = []
        self.interpolation_depth = 0

    def run(self) -> list[Token]:
        self._code(interpolation=False)
        return self.tokens

    def _comment(self) -> None:
        # jq 1.8: a comment runs to the next newline; a backslash escapes the character after it (a CRLF
        # pair counts as one), so "\<newline>" continues the comment and "\\<newline>" ends it.
        text = self.text
        i = self.pos + 1
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                if i + 1 >= len(text):
                    # The rule is followed by more program text in the sandbox: this would swallow it.
                    raise JqLexError("a comment at the end of the expression ends with a backslash")
                i += 3 if text.startswith("\r\n", i + 1) else 2
                continue
            if ch == "\n":
                break
            i += 1
        self.pos = min(i, len(text))

    def _code(self, *, interpolation: bool) -> None:
        text = self.text
        open_brackets: list[str] = []
        while self.pos < len(text):
            ch = text[self.pos]
            start = self.pos
            if ch in _WHITESPACE:
                self.pos += 1
            elif ch == "#":
                self._comment()
            elif ch == '"':
                self._string()
            elif ch == "$":
                # jq 1.8 reads "$name" as one token and rejects "$ name"; reading past the blanks here can
                # only refuse more, never less.
                i = self.pos + 1
                while i < len(text) and text[i] in _WHITESPACE:
                    i += 1
                match = _IDENT.match(text, i)
                if match is None:
                    raise JqLexError(f"'$' without a name at offset {start}")
                self.pos = match.end()
                self.tokens.append(Token("var", match.group(), start))
            elif ch == "@":
                match = _FORMAT.match(text, self.pos)
                if match is None:
                    raise JqLexError(f"'@' without a format name at offset {start}")
                self.pos = match.end()
                self.tokens.append(Token("format", match.group(), start))
            elif ch == "." and _FIELD_NAME.match(text, self.pos + 1):
                # ".name" is one FIELD token in jq: an index, never a call, whatever the name.
                match = _FIELD_NAME.match(text, self.pos + 1)
                assert match is not None
                self.pos = match.end()
                self.tokens.append(Token("field", match.group(), start))
            elif match := _NUMBER.match(text, self.pos):
                self.pos = match.end()
                self.tokens.append(Token("number", match.group(), start))
            elif match := _IDENT.match(text, self.pos):
                self.pos = match.end()
                word = match.group()
                self.tokens.append(Token("keyword" if word in KEYWORDS else "ident", word, start))
            else:
                op_match = _OPERATOR.match(text, self.pos)
                assert op_match is not None
                op = op_match.group()
                if op in _OPENERS:
                    open_brackets.append(_OPENERS[op])
                elif op in ")]}":
                    if op == ")" and interpolation and not open_brackets:
                        return  # the ")" that closes "\(": the caller consumes it
                    if not open_brackets or open_brackets.pop() != op:
                        raise JqLexError(f"unbalanced {op!r} at offset {start}")
                self.pos += len(op)
                self.tokens.append(Token("op", op, start))
        if interpolation:
            raise JqLexError("unterminated string interpolation")
        if open_brackets:
            raise JqLexError(f"unbalanced brackets: missing {open_brackets[-1]!r}")

    def _string(self) -> None:
        # jq rejects a backslash before a newline and unknown escapes; skipping them as escapes here
        # can only disagree on strings jq refuses to compile.
        text = self.text
        self.tokens.append(Token("str_start", '"', self.pos))
        self.pos += 1
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == '"':
                self.tokens.append(Token("str_end", '"', self.pos))
                self.pos += 1
                return
            if ch == "\\" and text.startswith("(", self.pos + 1):
                if self.interpolation_depth >= MAX_INTERPOLATION_DEPTH:
                    raise JqLexError(f"string interpolations nested more than {MAX_INTERPOLATION_DEPTH} deep")
                self.tokens.append(Token("interp_start", "\\(", self.pos))
                self.pos += 2
                self.interpolation_depth += 1
                self._code(interpolation=True)
                self.interpolation_depth -= 1
                self.tokens.append(Token("interp_end", ")", self.pos))
                self.pos += 1
                continue
            self.pos += 2 if ch == "\\" else 1
        raise JqLexError("unterminated string")


def tokenize(expr: str) -> list[Token]:
    """Lex a jq program as jq 1.8 does; raise JqLexError where jq would not lex it (or the sandbox could not
    contain it)."""
    return _Lexer(expr).run()


@dataclass(frozen=True)
class Analysis:
    """What an expression's code names: words used as code, variables bound and referenced."""

    code_words: list[Token]
    variables: list[Token]
    references: list[Token]
    bindings: frozenset[str]


def _opens(tok: Token) -> bool:
    return tok.kind in ("str_start", "interp_start") or (tok.kind == "op" and tok.value in _OPENERS)


def _closes(tok: Token) -> bool:
    return tok.kind in ("str_end", "interp_end") or (tok.kind == "op" and tok.value in ")]}")


def _group_end(tokens: Sequence[Token], i: int) -> int:
    """Index just past the bracket group opening at tokens[i] (strings and interpolations nest in it)."""
    depth = 0
    for j in range(i, len(tokens)):
        if _opens(tokens[j]):
            depth += 1
        elif _closes(tokens[j]):
            depth -= 1
            if depth == 0:
                return j + 1
    return len(tokens)


def _pattern(tokens: Sequence[Token], i: int, bound: set[int]) -> int:
    """Consume one destructuring pattern at tokens[i]; record the indexes of the variables it binds."""
    if i >= len(tokens):
        return i
    if tokens[i].kind == "var":
        bound.add(i)
        return i + 1
    if not (tokens[i].kind == "op" and tokens[i].value in "[{"):
        return i
    end = _group_end(tokens, i)
    # Only variables at pattern level bind; inside a "(key expression)", a string or an interpolation
    # they are references.
    code_groups: list[bool] = []  # per open group: is it code (not a "[" or "{" of the pattern itself)?
    in_code = 0
    for j in range(i, end):
        tok = tokens[j]
        if tok.kind == "var" and in_code == 0:
            bound.add(j)
        if _opens(tok):
            is_code = in_code > 0 or not (tok.kind == "op" and tok.value in "[{")
            code_groups.append(is_code)
            in_code += is_code
        elif _closes(tok) and code_groups:
            in_code -= code_groups.pop()
    return end


def analyse(tokens: Sequence[Token]) -> Analysis:
    """Tell words that are code (calls, def names, keywords) from keys, and bindings from references."""
    key_words: set[int] = set()
    bound: set[int] = set()
    labels: set[int] = set()
    # Open groups, innermost last: brackets, strings, interpolations and "if … end", whose "then" branch
    # may hold a bare ", word" that is code, not an object key.
    groups: list[str] = []
    after_key_separator = False
    for i, tok in enumerate(tokens):
        in_key_position = after_key_separator and tok.kind in ("ident", "keyword")
        after_key_separator = False
        if in_key_position:
            # {name: …} and {name} (= {name: .name}) index or name a key; they call nothing.
            key_words.add(i)
            continue
        if tok.kind == "keyword" and tok.value == "as":
            j = _pattern(tokens, i + 1, bound)
            while j < len(tokens) and tokens[j].kind == "op" and tokens[j].value == "?//":
                j = _pattern(tokens, j + 1, bound)
        elif tok.kind == "keyword" and tok.value == "def":
            if i + 2 < len(tokens) and tokens[i + 2].kind == "op" and tokens[i + 2].value == "(":
                for k in range(i + 3, _group_end(tokens, i + 2) - 1):
                    if tokens[k].kind == "var":
                        bound.add(k)
        elif (tok.kind == "keyword" and tok.value == "label") or (tok.kind == "ident" and tok.value == "break"):
            if i + 1 < len(tokens) and tokens[i + 1].kind == "var":
                labels.add(i + 1)  # a label's name; jq itself checks that "break $name" is in scope
        if tok.kind == "keyword" and tok.value == "if":
            groups.append("if")
        elif tok.kind == "keyword" and tok.value == "end":
            if groups and groups[-1] == "if":
                groups.pop()
        elif _opens(tok):
            groups.append(tok.value)
        elif _closes(tok) and groups:
            groups.pop()
        after_key_separator = tok.kind == "op" and (tok.value == "{" or (tok.value == "," and groups[-1:] == ["{"]))
    code_words = [t for i, t in enumerate(tokens) if t.kind in ("ident", "keyword") and i not in key_words]
    variables = [t for t in tokens if t.kind == "var"]
    references = [t for i, t in enumerate(tokens) if t.kind == "var" and i not in bound and i not in labels]
    bindings = frozenset(tokens[i].value for i in bound)
    return Analysis(code_words, variables, references, bindings)


def verdict(expr: str) -> Refusal | None:
    """None when the policy lets the expression compile, else why not (see the module docstring)."""
    try:
        tokens = tokenize(expr)
    except JqLexError as exc:
        return Refusal(INVALID, f"expression does not parse: {exc}")
    found = analyse(tokens)
    for tok in found.code_words:
        if tok.value in REFUSED_KEYWORDS:
            return Refusal(FORBIDDEN, f"{tok.value} is not allowed (rules have no module loader)")
        if "::" in tok.value:
            return Refusal(FORBIDDEN, f"{tok.value} is a module function; rules have no module loader")
        if tok.value in REFUSED_FUNCTIONS:
            return Refusal(FORBIDDEN, f"{tok.value} is a forbidden function (it reads or acts outside the envelope)")
    for tok in found.variables:
        if tok.value in REFUSED_VARIABLES:
            return Refusal(FORBIDDEN, f"${tok.value} is forbidden (it reads outside the envelope)")
        if "::" in tok.value:
            return Refusal(FORBIDDEN, f"${tok.value} is module data; rules have no module loader")
    for tok in found.references:
        if tok.value.startswith(RESERVED_VARIABLE_PREFIX):
            return Refusal(INVALID, f"${tok.value} is not defined (variables starting with __ are reserved)")
    for tok in found.variables:
        if tok.value.startswith(RESERVED_VARIABLE_PREFIX):
            return Refusal(INVALID, f"${tok.value} cannot be bound: variables starting with __ are reserved")
    for tok in found.references:
        if tok.value != PARAMS_VAR and tok.value not in found.bindings:
            return Refusal(INVALID, f"${tok.value} is not defined; $params is the only variable")
    if not tokens:
        return Refusal(INVALID, "expression is empty")
    return None
