"""The fault campaign: a stack of real OS processes, fake GitHub senders, faults, and counts read from the database.

Used by `tests/test_faults.py` (small counts), `tests/test_reroute_faults.py` and `bench/faults.py` (full counts):

* `stack` — `FaultStack` runs embedded PostgreSQL, the Temporal dev server, and any number of `switchboard api`
  and `switchboard worker` processes (`processes`: each its own process group, killable, freezable and restartable
  by pid). A supervisor restarts a process that dies on its own (as a container restart policy would) and counts
  it as a crash.
* `producers` — fake GitHub senders under load, a duplicate storm, SSE clients that count doorbell rings.
* `tally` — `Outcome`: the exact counts from the database after recovery.
* `counts` — how hard each scenario pushes: `FULL` (bench/faults.py) and `SMALL` (the suite).
* `scenarios` (the outages), `bounds` (the client-bound rows), `reconcile` (the reconciler's row) — one function
  per fault, registered by name in `campaign.SCENARIOS`.
"""

from __future__ import annotations

from tests.faults.campaign import SCENARIOS
from tests.faults.counts import FULL, SMALL, Counts
from tests.faults.producers import issue_body
from tests.faults.stack import FaultStack, Hook, fault_stack
from tests.faults.tally import Outcome

__all__ = ["FULL", "SCENARIOS", "SMALL", "Counts", "FaultStack", "Hook", "Outcome", "fault_stack", "issue_body"]
