"""Run one bench from two checkouts side by side, alternating, and print each ratio line of both.

Every bench prints its figures as ratios against a baseline it measures in the same run (a bare Temporal floor, bare
SQL, a bare jq child, no rules). This runs a bench's own script from checkout A (say, the previous main) and
checkout B (this tree), A B A B …, each with this venv and its code first on PYTHONPATH (the benches pass it on to
the processes they start), and prints every line that holds "ratio" from each run, then each ratio's mean for A and
B and B's change against A. So a change is judged on the same machine, the same hour, the same load.

    python bench/compare.py --a /path/to/old/checkout [--b .] [--runs 2] ingest.py -- --deliveries 240 --concurrency 8

Make checkout A with e.g. `git worktree add --detach /tmp/old-main <commit>` (it needs no venv of its own).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
# "throughput ratio (switchboard / floor): 0.96 …", "ratio sandboxed (text) / bare   1.16x  …"
RATIO = re.compile(r"^(?P<name>.*ratio[^:]*?):?\s+(?P<value>\d+\.\d+)x?")


def ratios(output: str) -> dict[str, float]:
    """Each ratio line of a bench's output: its name and first figure."""
    found: dict[str, float] = {}
    for line in output.splitlines():
        match = RATIO.match(line.strip())
        if match:
            found[match["name"].strip()] = float(match["value"])
    return found


def run(checkout: Path, bench: str, args: list[str]) -> str:
    """One run of ``bench`` from ``checkout``'s code, with this venv; its output."""
    env = {"PYTHONPATH": str(checkout), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(checkout / "bench" / bench), *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{bench} from {checkout} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline, e.g. the previous main)")
    parser.add_argument("--b", type=Path, default=HERE, help="checkout B (default: this tree)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each, alternating")
    parser.add_argument("bench", help="a script under bench/, e.g. ingest.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the bench's own arguments, after --")
    opts = parser.parse_args()
    bench_args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    seen: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    for n in range(opts.runs):
        for label, checkout in (("A", opts.a.resolve()), ("B", opts.b.resolve())):
            out = run(checkout, opts.bench, bench_args)
            print(f"--- {label} run {n + 1} ({checkout})")
            for name, value in ratios(out).items():
                print(f"  {name}: {value:.2f}")
                seen[label].setdefault(name, []).append(value)
            sys.stdout.flush()
    print(f"\n{opts.bench} {' '.join(bench_args)}: mean of {opts.runs} alternating runs each")
    print(f"{'ratio':<60} {'A':>6} {'B':>6} {'B/A':>7}")
    for name, values in seen["A"].items():
        b = seen["B"].get(name)
        if not b:
            continue
        a_mean, b_mean = statistics.fmean(values), statistics.fmean(b)
        print(f"{name[:60]:<60} {a_mean:>6.2f} {b_mean:>6.2f} {b_mean / a_mean:>7.3f}")


if __name__ == "__main__":
    main()
