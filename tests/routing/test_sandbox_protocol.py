"""The sandbox's wire protocol: one module both sides read, loadable by the child as it runs (python -I)."""

from __future__ import annotations

import json
import subprocess
import sys

from routing.sandbox import protocol


def test_the_protocol_module_imports_only_the_standard_library() -> None:
    """The child loads routing/sandbox/protocol.py by path under -I: it must not pull in a third-party import."""
    code = (
        "import importlib.util, sys\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('routing.sandbox.protocol', {protocol.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module\n"
        "spec.loader.exec_module(module)\n"
        "assert module.parse_reply(module.reply(3, 'end', None), seq=3, expected_index=0, rule_count=1)\n"
        "new = set(sys.modules) - before\n"
        "extra = sorted(n for n in new if n.split('.')[0] not in sys.stdlib_module_names)\n"
        "print(extra)\n"
        "sys.exit(0 if extra == ['routing.sandbox.protocol'] else 1)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True, text=True, env={})
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_request_reads_back_as_the_header_exprs_and_body_it_was_framed_from() -> None:
    body = protocol.encode_input({"k": 1}, {"t": "tab\there", "n": 2})
    exprs = protocol.encode_exprs(['.t == "tab\there\n"', 7])
    line = protocol.evaluate_request(4, base=1, start=2, exprs=exprs, body=body)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one line, whatever the payload holds
    assert line.count(b"\t") == 2  # the two field separators: tabs inside the JSON are escaped
    assert protocol.read_request(line) == ({"seq": 4, "base": 1, "start": 2}, exprs, body)
    assert json.loads(exprs) == ['.t == "tab\there\n"', 7]
    shared = protocol.evaluate_request(4, base=1, start=2, exprs=exprs, body=body, shared=True)
    assert protocol.read_request(shared) == ({"seq": 4, "base": 1, "start": 2, "len": len(body)}, exprs, b"")
    assert protocol.read_request(protocol.check_request(5, [".a"])) == ({"seq": 5, "check": [".a"]}, b"", b"")
    assert protocol.read_request(protocol.warm_request(6, [["true"]])) == ({"seq": 6, "warm": [["true"]]}, b"", b"")


def test_every_reply_the_child_writes_parses_as_the_parent_reads_it() -> None:
    assert protocol.reply(0, "ready") == protocol.READY + b"\n"
    fault = protocol.reply(9, "r", 1, "error", "boom")
    assert protocol.parse_reply(fault.rstrip(b"\n"), seq=9, expected_index=0, rule_count=2) == protocol.Reply(
        kind="fault", rule_index=1, cause="error", detail="boom"
    )
    end = protocol.reply(9, "end", 1)
    assert protocol.parse_reply(end.rstrip(b"\n"), seq=9, expected_index=0, rule_count=2) == protocol.Reply(
        kind="end", rule_index=1
    )
