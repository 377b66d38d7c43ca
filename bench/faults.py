"""The fault campaign with full counts: a row per fault, every count exact from the database after recovery.

Real processes on one machine: embedded PostgreSQL, the Temporal dev server, `switchboard api` and
`switchboard worker` (separate processes); 4 fake GitHub senders over localhost HTTP. Faults: worker SIGKILL
×20 mid-delivery, Temporal stopped 20 s, PostgreSQL stopped 20 s, the API restarted, a duplicate storm
(10 ids × 50 concurrent posts), and the scale-out shape (2 APIs + 2 workers, one of each SIGKILLed, an SSE
client on each API), and the API stopped 30 s while a fake GitHub sends, then the webhook's reconciler has GitHub
redeliver what was refused (reconcile). Client bounds: 5,000 slow connections (1,000 from one address), 100
producers hanging up mid-body, hostile stored bodies, hostile verb calls; stalls: 1 MiB text bodies of what grows
most when escaped as JSON, from three tenants, then poison rows in the inbox among another tenant's waiting
deliveries (textbodies), and PostgreSQL frozen (SIGSTOP) 20 s while verbs and /healthz are probed (pgfreeze); each
row with its bound measured and checked. Target: lost 0, doubled 0 and stranded 0 on every row, every bound held;
503 only while PostgreSQL is down or hung (nothing can verify a delivery then).

    python bench/faults.py [--only worker,temporal,freeze,postgres,api,storm,scaleout,reconcile,slow,hangups,bodies,
                                   calls,textbodies,pgfreeze]
                           [--kills 20] [--outage 20]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults import FULL, SCENARIOS, Outcome, fault_stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenario names")
    parser.add_argument("--kills", type=int, default=FULL.worker_kills)
    parser.add_argument("--outage", type=float, default=FULL.outage)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (process logs)")
    parser.add_argument(
        "--code",
        type=Path,
        default=None,
        help="run the service processes from another checkout, e.g. `git archive BRANCH | tar -x -C DIR`",
    )
    args = parser.parse_args()
    counts = dataclasses.replace(FULL, worker_kills=args.kills, outage=args.outage)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with fault_stack(keep=args.keep, code=args.code) as stack:
        features = f"inbox {'yes' if stack.has_inbox() else 'no'}, one ring per todo {'yes' if stack.has_shared_doorbell() else 'no'}"
        code = args.code or Path(__file__).resolve().parent.parent
        print(f"fault campaign, code {code}, scratch {stack.root} ({features})", flush=True)

        async def run() -> None:
            async with stack.supervised():
                for name in names:
                    out = await SCENARIOS[name](stack, counts)
                    outcomes.append(out)
                    print(f"  done: {out.name} ({time.monotonic() - began:.0f} s)", flush=True)

        asyncio.run(run())
    print(
        f"\nfault campaign: {counts.senders} senders (one delivery each every {counts.interval} s at most), "
        f"counts exact from the database after recovery, {time.monotonic() - began:.0f} s in all\n"
    )
    print(Outcome.header())
    for out in outcomes:
        print(out.row())
    print()
    for out in outcomes:
        print(f"{out.name}: {out.details()}")


if __name__ == "__main__":
    main()
