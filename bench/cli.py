"""CPU a `switchboard` command costs: `--version`, client commands against a running API, and the service import.

Each command runs as a child process, `--runs` times; its CPU is the user+sys time of that child
(`getrusage(RUSAGE_CHILDREN)` before and after it is reaped), so the interpreter's start, the imports, building
the parser and the HTTP exchange all count, and the API's own work does not (it runs in the stack's process).

Rows:
- `--version`, `completion bash`: no network.
- `todos list (unreachable)`: against a closed port, so only the CPU before and at the refused connection counts.
- the rest against `switchboard dev` in a scratch folder (bench/_stack.py): operator and owner listings, a
  `--export` command, a signed `send`, and `tail` following for about a second (0.2 s polls) until Ctrl-C.
- `import api.app` and `import api.verbs`: what a command costs that loads the service (the verb table
  alone imports the API stack), for scale.

    .venv/bin/python bench/cli.py            # 7 runs each
    .venv/bin/python bench/cli.py --runs 15 --no-stack
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import BIN, dev_stack

SWITCHBOARD = str(BIN / "switchboard")
BUDGET = 0.3
"""The CPU a client command may take (issue 27)."""


def child_cpu(argv: list[str], env: dict[str, str], *, follow: float | None = None) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit status) of one child; `follow`: interrupt it after that many seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    if follow is None:
        code = subprocess.run(argv, env=env, capture_output=True, check=False).returncode
    else:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(follow)
        proc.send_signal(signal.SIGINT)
        code = proc.wait()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, code


def row(name: str, argv: list[str], env: dict[str, str], runs: int, *, follow: float | None = None) -> None:
    cpus, walls, codes = [], [], set()
    for _ in range(runs):
        cpu, wall, code = child_cpu(argv, env, follow=follow)
        cpus.append(cpu)
        walls.append(wall)
        codes.add(code)
    median = statistics.median(cpus)
    verdict = "ok" if median < BUDGET else "over"
    print(
        f"{name:<40} {median * 1000:7.0f} {min(cpus) * 1000:6.0f} {max(cpus) * 1000:6.0f}"
        f" {statistics.median(walls) * 1000:8.0f}  {','.join(map(str, sorted(codes))):<5} {verdict}",
        flush=True,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-stack", action="store_true", help="only the rows that need no running API")
    args = parser.parse_args()
    base_env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    py = sys.executable
    print(f"CPU per command (user+sys of the child), {args.runs} runs; budget {BUDGET * 1000:.0f} ms for a client")
    print(f"{'command':<40} {'median':>7} {'min':>6} {'max':>6} {'wall p50':>8}  {'exit':<5} budget")
    row("python -c pass (interpreter floor)", [py, "-c", "pass"], base_env, args.runs)
    row("switchboard --version", [SWITCHBOARD, "--version"], base_env, args.runs)
    row("switchboard completion bash", [SWITCHBOARD, "completion", "bash"], base_env, args.runs)
    unreachable = {**base_env, "SWITCHBOARD_URL": f"http://127.0.0.1:{closed_port()}", "SWITCHBOARD_TOKEN": "sbk_x"}
    row("todos list (unreachable API)", [SWITCHBOARD, "todos", "list"], unreachable, args.runs)
    if not args.no_stack:
        with dev_stack() as stack:
            admin = {**base_env, "SWITCHBOARD_URL": stack.base, "SWITCHBOARD_ADMIN_TOKEN": stack.admin_token}
            human = stack.admin("create_human", {"name": "cli-bench"})["human_id"]
            agent = stack.admin("create_agent", {"human_id": human, "name": "cli-bench"})["agent_id"]
            vended = stack.admin(
                "vend_endpoint",
                {
                    "agent_id": agent,
                    "queues": ["work"],
                    "verbs": ["list_webhooks", "list_todos", "list_webhook_events", "create_webhook"],
                    "webhook_max": 5,
                    "webhook_source_types": ["github"],
                    "webhook_queues": ["work"],
                },
            )
            owner = {**base_env, "SWITCHBOARD_URL": stack.base, "SWITCHBOARD_TOKEN": str(vended["credential"])}
            made = subprocess.run(
                [SWITCHBOARD, "--json", "webhooks", "create", "github", "--queue", "work"],
                env=owner,
                capture_output=True,
                check=True,
            )
            webhook = json.loads(made.stdout)
            sender = {
                **base_env,
                "SWITCHBOARD_INGEST_URL": webhook["ingest_url"].replace("localhost", "127.0.0.1"),
                "SWITCHBOARD_WEBHOOK_SECRET": webhook["secret"],
            }
            row("human list (operator)", [SWITCHBOARD, "human", "list"], admin, args.runs)
            row("human create --export (operator)", [SWITCHBOARD, "human", "create", "--name", "b", "--export"],
                admin, args.runs)  # fmt: skip
            row("todos list (owner)", [SWITCHBOARD, "todos", "list"], owner, args.runs)
            row("events list --table (owner)", [SWITCHBOARD, "events", "list", "--table"], owner, args.runs)
            row("send github (signed delivery, 202)", [SWITCHBOARD, "send", "github"], sender, args.runs)
            row("tail, ~1 s of 0.2 s polls", [SWITCHBOARD, "tail", "--interval", "0.2"], owner, args.runs, follow=1.0)
    print("for scale, what loading the service costs:")
    row("python -c 'import api.verbs'", [py, "-c", "import api.verbs"], base_env, args.runs)
    row("python -c 'import api.app'", [py, "-c", "import api.app"], base_env, args.runs)


if __name__ == "__main__":
    main()
