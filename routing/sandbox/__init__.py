"""Rule evaluation in warm, memory-capped jq child processes (SPEC-0020 "Out-of-process evaluation").

A delivery's rule list goes to one warm child as a single request line; the child answers with one line
per rule, so the parent can tell which rule is running, kill the child when that rule overruns, and
carry on with the remaining rules on a spare child. Children are the same interpreter re-executed with
an empty environment, stderr discarded and an address-space cap; they return only indexes and faults.
The envelope travels as compact UTF-8 JSON and the child's rule clocks start only once libjq has parsed
it, so a large body costs the hard deadline some milliseconds but never a rule its 50 ms.

The per-rule timeout and the per-event budget count the child's CPU time in rules, read from the kernel's
per-process CPU clock, so a child that waits for a core on a loaded machine is not killed for it: routing
does not depend on load. A jq rule cannot sleep or block (it has no I/O), so CPU time is its whole cost.
Wall-clock bounds stay for a child that is descheduled or stopped: a rule gets at most 20 times its
timeout of wall-clock time, and the hard deadline ends every request, whatever the CPU clock says.

Modules, parent side: :mod:`~routing.sandbox.pool` (slots, warm children and the spare),
:mod:`~routing.sandbox.handle` (the parent's handle on one child: its lifecycle and budgets),
:mod:`~routing.sandbox.faults` (how faults are named). Child side: :mod:`~routing.sandbox.child_main` (the child
process's main loop, run as a script: hardening, requests, the progress clock) and :mod:`~routing.sandbox.engine`
(the rule engine it runs). Both: :mod:`~routing.sandbox.protocol` (the wire format, stdlib only). See
docs/architecture.md "Sandbox".
"""

from __future__ import annotations

from routing.sandbox.pool import CHILD_SCRIPT, SandboxPool
from routing.sandbox.protocol import ProtocolViolation, Reply, encode_input, parse_reply

__all__ = ["CHILD_SCRIPT", "ProtocolViolation", "Reply", "SandboxPool", "encode_input", "parse_reply"]
