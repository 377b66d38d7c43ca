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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
import os
import signal
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from routing.models import Evaluation, Fault
from routing.rules import COMPILE_LIMIT, CompileCheckUnavailable, compile_failure
from routing.sandbox_child import COMPILING, PARSING, PREFIX, PROGRESS, RuleEngine, input_text

log = logging.getLogger(__name__)

CHILD_SCRIPT: Final = Path(__file__).with_name("sandbox_child.py")
_SPAWN_TIMEOUT: Final = 10.0
_REAP_TIMEOUT: Final = 5.0
_MAX_LINE: Final = 64 * 1024
_WARM_LISTS: Final = 16  # recently evaluated rule lists a new child compiles before joining the pool
_MAX_REPLACEMENTS: Final = 4  # children killed or lost for one delivery before the rest fails closed
_DETAIL_MAX: Final = 200
_FAULT_CAUSES: Final = frozenset({"error", "compile_error"})
_RULE_WALL_FACTOR: Final = 20  # a rule's wall-clock bound, in rule timeouts (1 s at the 50 ms default)

Ending = Literal[
    "complete", "timeout", "budget", "hard_deadline", "died", "died_compiling", "died_parsing", "violation", "gone"
]


class ProtocolViolation(Exception):
    """A child line carried the protocol prefix but not a reply the parent asked for."""


@dataclass(frozen=True)
class Reply:
    """One parsed child reply: a faulted rule, or the end of the request with the matching rule if any."""

    kind: Literal["fault", "end"]
    rule_index: int | None = None
    cause: str = ""
    detail: str | None = None


def parse_reply(line: bytes, *, seq: int, expected_index: int, rule_count: int) -> Reply | None:
    """Parse one child line for request ``seq``; None means ignore it, ProtocolViolation means fail closed.

    Lines without the prefix and replies to other requests are ignored. A prefixed reply naming a rule
    outside ``[expected_index, rule_count)`` (e.g. a forged match) is a violation: the parent then
    records no match and a sandbox_failure.
    """
    if not line.startswith(PREFIX):
        return None
    try:
        fields = json.loads(line[len(PREFIX) :])
    except ValueError as exc:
        raise ProtocolViolation("unparseable reply") from exc
    if not isinstance(fields, list) or len(fields) < 2 or type(fields[0]) is not int:
        raise ProtocolViolation("malformed reply")
    if fields[0] != seq:
        return None
    if fields[1] == "end" and len(fields) == 3:
        index = fields[2]
        if index is not None and (type(index) is not int or not expected_index <= index < rule_count):
            raise ProtocolViolation(f"matched index {index!r} out of range")
        return Reply(kind="end", rule_index=index)
    if fields[1] != "r" or len(fields) != 5:
        raise ProtocolViolation("malformed reply")
    _, _, index, cause, detail = fields
    if type(index) is not int or not expected_index <= index < rule_count:
        raise ProtocolViolation(f"rule index {index!r} out of range")
    if cause not in _FAULT_CAUSES or not (detail is None or isinstance(detail, str)):
        raise ProtocolViolation("malformed fault")
    return Reply(kind="fault", rule_index=index, cause=cause, detail=detail and detail[:_DETAIL_MAX])


@dataclass(frozen=True)
class _Progress:
    """The running rule as the parent reads it: CPU figures in ns of the child's CPU clock."""

    index: int
    rule_at: float  # loop time the rule started (for the wall-clock bound)
    rule_cpu: int  # the child's CPU clock when the rule started
    began_cpu: int  # the child's CPU clock when the rules' clock started, moved on by every parse
    cpu: int  # the child's CPU clock now


def _cpu_clock_id(pid: int) -> int:
    """Linux's id for another process's CPU clock (CPUCLOCK_SCHED of the whole process; see clock_getcpuclockid)."""
    return (~pid << 3) | 2


@dataclass
class _Run:
    """One request on one child: rules ``next_index`` to ``end``, and what is known of them so far."""

    seq: int
    next_index: int  # the first rule not known to be finished
    end: int
    rule_timeout: float
    budget_left: float
    hard_at: float
    sent_at: float
    sent_cpu: int  # the child's CPU clock when the request was sent (ns; the wall clock if unreadable)
    future: asyncio.Future[_Run]
    faults: list[tuple[int, str, str | None]] = field(default_factory=list)
    matched: int | None = None
    ending: Ending = "complete"
    stopped_at: int = -1  # the rule running when the child was killed or died
    detail: str = ""
    began_cpu: int | None = None  # the rules' CPU clock start (the child had compiled the list)
    elapsed: float = 0.0  # CPU seconds spent in rules
    cpu_mark: tuple[int, float] = (0, 0.0)  # the last CPU clock reading and its loop time
    killing: tuple[Ending, int, str] | None = None  # decided; waiting for the pipe to drain
    timer: asyncio.TimerHandle | None = None


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, child: _Child) -> None:
        self._child = child

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._child.transport = transport

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if fd == 1 and isinstance(data, bytes):
            self._child.data_received(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._child.eof_received()

    def process_exited(self) -> None:
        self._child.process_exited()


class _Child:
    """One sandbox child process and the request it is answering, driven by protocol callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.SubprocessTransport | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.dead = False  # killed, or stdout closed: never reused
        self._buffer = b""
        self._run: _Run | None = None
        self._killed = False
        self._progress: mmap.mmap | None = None
        self._cpu_clock: int | None = None  # the child's CPU clock id; None: rules are timed on the wall clock

    @property
    def pid(self) -> int | None:
        return self.transport.get_pid() if self.transport else None

    @property
    def usable(self) -> bool:
        return not self.dead and not self.exited.done() and self._run is None

    async def start(self, argv: Sequence[str]) -> None:
        progress_fd = os.memfd_create("sandbox-progress", os.MFD_CLOEXEC)
        try:
            os.ftruncate(progress_fd, PROGRESS.size)
            self._progress = mmap.mmap(progress_fd, PROGRESS.size)
            await self.loop.subprocess_exec(
                lambda: _Protocol(self),
                *argv,
                str(progress_fd),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env={},
                pass_fds=(progress_fd,),
                start_new_session=True,  # a terminal's ^C goes to the parent, which reaps its children
            )
        finally:
            os.close(progress_fd)
        async with asyncio.timeout(_SPAWN_TIMEOUT):
            await self.ready
        pid = self.pid
        if pid is not None:
            try:
                time.clock_gettime_ns(_cpu_clock_id(pid))
                self._cpu_clock = _cpu_clock_id(pid)
            except (OSError, OverflowError) as exc:  # no per-process CPU clocks: the wall clock, stricter
                log.warning("no CPU clock for sandbox child %d (%s); rule budgets use wall-clock time", pid, exc)

    def _cpu_ns(self) -> int | None:
        """The child's CPU time in ns (all its threads), or None once it has exited or if unreadable."""
        if self._cpu_clock is None or self.exited.done():  # reaped: the pid (and its clock) may be another's
            return None
        try:
            return time.clock_gettime_ns(self._cpu_clock)
        except OSError:
            return None

    def _cpu_now(self, run: _Run) -> int:
        """The child's CPU clock now; once unreadable, an upper bound (a thread's CPU cannot outrun the wall)."""
        now = self.loop.time()
        if self._cpu_clock is None:
            return int(now * 1e9)
        cpu = self._cpu_ns()
        if cpu is not None:
            run.cpu_mark = (cpu, now)
            return cpu
        mark_cpu, mark_at = run.cpu_mark
        return mark_cpu + int((now - mark_at) * 1e9)

    def run(
        self,
        request: bytes,
        *,
        seq: int,
        start: int,
        end: int,
        rule_timeout: float,
        budget_left: float,
        hard_at: float,
    ) -> asyncio.Future[_Run]:
        """Send one request; the future resolves (never fails) when the child answers or is killed."""
        sent_at = self.loop.time()
        sent_cpu = self._cpu_ns() if self._cpu_clock is not None else None
        if sent_cpu is None:
            sent_cpu = int(sent_at * 1e9)
        run = _Run(
            seq=seq,
            next_index=start,
            end=end,
            rule_timeout=rule_timeout,
            budget_left=budget_left,
            hard_at=hard_at,
            sent_at=sent_at,
            sent_cpu=sent_cpu,
            future=self.loop.create_future(),
            cpu_mark=(sent_cpu, sent_at),
        )
        self._run = run
        if self.dead or self.transport is None:
            self._finish(run, "gone", detail="sandbox child gone before the request")
            return run.future
        stdin = self.transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        stdin.write(request)
        self._arm(run, min(self.loop.time() + rule_timeout, hard_at))
        return run.future

    def _slot(self, run: _Run) -> tuple[int, int, int, int, int] | None:
        """The progress slot's (index, rule ns, rules' clock ns, rule CPU ns, rules' CPU ns) for this run.

        None if unread, torn or another request's.
        """
        if self._progress is None:
            return None
        first = PROGRESS.unpack_from(self._progress)
        if PROGRESS.unpack_from(self._progress) != first:  # caught mid-write: the child is not stuck here
            return None
        seq, index, rule_ns, began_ns, rule_cpu, began_cpu = first
        return (index, rule_ns, began_ns, rule_cpu, began_cpu) if seq == run.seq else None

    def _read_progress(self, run: _Run) -> _Progress | None:
        """The running rule and the child's CPU clock now; None while compiling or parsing."""
        slot = self._slot(run)
        if slot is None or slot[0] in (COMPILING, PARSING):
            return None
        index, rule_ns, began_ns, rule_cpu, began_cpu = slot
        now = self.loop.time()
        cpu = self._cpu_now(run)
        if self._cpu_clock is None:  # timed on the wall clock: the child's wall figures stand in for CPU
            rule_cpu, began_cpu = rule_ns, began_ns
        # The child's word is only trusted within bounds: the budgets and deadlines are the parent's.
        began_cpu = min(max(began_cpu, run.sent_cpu), cpu)
        rule_cpu = min(max(rule_cpu, began_cpu), cpu)
        began_at = min(max(began_ns / 1e9, run.sent_at), now)
        rule_at = min(max(rule_ns / 1e9, began_at), now)
        return _Progress(
            index=max(run.next_index, min(index, run.end)),
            rule_at=rule_at,
            rule_cpu=rule_cpu,
            began_cpu=began_cpu,
            cpu=cpu,
        )

    def _arm(self, run: _Run, when: float) -> None:
        # Never re-arm in the past: a timer that cannot decide yet must not spin the loop.
        run.timer = self.loop.call_at(max(when, self.loop.time() + 0.0005), self._on_timer, run)

    def _on_timer(self, run: _Run) -> None:
        if run.future.done() or run.killing is not None:
            return
        now = self.loop.time()
        progress = self._read_progress(run)
        if now >= run.hard_at:
            self._kill_run(run, "hard_deadline", progress.index if progress else run.next_index, "hard deadline")
            return
        if progress is None:  # compiling the rule list or parsing the event: only the hard deadline applies
            self._arm(run, min(now + run.rule_timeout, run.hard_at))
            return
        run.began_cpu = progress.began_cpu
        running = progress.index < run.end  # else the list is done and the child is writing its answer
        budget_left = run.budget_left - (progress.cpu - progress.began_cpu) / 1e9
        rule_left = run.rule_timeout - (progress.cpu - progress.rule_cpu) / 1e9
        wall_bound = run.rule_timeout * _RULE_WALL_FACTOR
        timeout_ms = f"{run.rule_timeout * 1000:.0f} ms"
        if budget_left <= 0:
            self._kill_run(run, "budget", progress.index, "event budget spent")
        elif running and rule_left <= 0:
            spent = f"used {timeout_ms} of CPU" if self._cpu_clock is not None else f"ran past {timeout_ms}"
            self._kill_run(run, "timeout", progress.index, f"rule {spent}; child killed")
        elif running and now >= progress.rule_at + wall_bound:
            # Descheduled or stopped: the rule did not finish within its wall-clock bound, CPU or not.
            used = (progress.cpu - progress.rule_cpu) / 1e6
            self._kill_run(
                run,
                "timeout",
                progress.index,
                f"rule unfinished after {wall_bound * 1000:.0f} ms of wall-clock time"
                f" ({used:.0f} ms of CPU, limit {timeout_ms}); child killed",
            )
        else:
            # CPU time cannot outrun the wall clock, so nothing can be due before the smallest remainder.
            wake = min(now + budget_left, run.hard_at)
            if running:
                wake = min(wake, now + rule_left, progress.rule_at + wall_bound)
            else:
                wake = min(wake, now + run.rule_timeout)
            self._arm(run, wake)

    def _kill_run(self, run: _Run, ending: Ending, index: int, detail: str) -> None:
        """Kill the child, keep the fault lines it wrote before the kill, and finish the run."""
        run.killing = (ending, index, detail)
        self._cpu_now(run)  # the last reading the dead child's CPU time can be charged from
        self.kill()
        # Read what is already in the pipe now rather than wait for the kernel to tear the child down.
        pipe = self.transport.get_pipe_transport(1) if self.transport is not None else None
        stream = pipe.get_extra_info("pipe") if pipe is not None else None
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                while chunk := os.read(stream.fileno(), 65536):
                    self.data_received(chunk)
        self._drained(run)

    def _drained(self, run: _Run) -> None:
        if run.killing is not None:
            ending, index, detail = run.killing
            self._finish(run, ending, index, detail)

    def _finish(self, run: _Run, ending: Ending, stopped_at: int = -1, detail: str = "") -> None:
        if run.future.done():
            return
        if run.timer is not None:
            run.timer.cancel()
        self._run = None
        run.ending, run.stopped_at, run.detail = ending, stopped_at, detail
        if (progress := self._read_progress(run)) is not None:
            run.began_cpu = progress.began_cpu  # the freshest: a re-parse since the last timer moved it on
            run.elapsed = (progress.cpu - progress.began_cpu) / 1e9
        elif run.began_cpu is not None:
            run.elapsed = (self._cpu_now(run) - run.began_cpu) / 1e9
        if ending != "complete":
            self.kill()
        run.future.set_result(run)

    def data_received(self, data: bytes) -> None:
        if self._killed and self._run is None:
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            self._line(line)
        if len(self._buffer) > _MAX_LINE:
            self._buffer = b""
            self._violation("oversized reply line")

    def _violation(self, detail: str) -> None:
        if self._run is not None:
            self._finish(self._run, "violation", detail=detail)
        else:
            self.kill()

    def _line(self, line: bytes) -> None:
        if not self.ready.done():
            if line == PREFIX + b'[0,"ready"]':
                self.ready.set_result(None)
            return
        run = self._run
        if run is None:
            return
        try:
            reply = parse_reply(line, seq=run.seq, expected_index=run.next_index, rule_count=run.end)
        except ProtocolViolation as exc:
            self._finish(run, "violation", detail=str(exc))
            return
        if reply is None:
            return
        assert reply.rule_index is not None or reply.kind == "end"
        if run.killing is not None:  # draining after a kill: keep faults of rules that finished before it
            if reply.kind == "fault" and reply.rule_index is not None and reply.rule_index < run.killing[1]:
                run.faults.append((reply.rule_index, reply.cause, reply.detail))
                run.next_index = reply.rule_index + 1
            return
        if reply.kind == "fault":
            assert reply.rule_index is not None
            run.faults.append((reply.rule_index, reply.cause, reply.detail))
            run.next_index = reply.rule_index + 1
            return
        run.matched = reply.rule_index
        run.next_index = run.end if reply.rule_index is None else reply.rule_index + 1
        self._finish(run, "complete")

    def eof_received(self) -> None:
        self.dead = True
        run = self._run
        if run is not None:
            if run.killing is not None:
                self._drained(run)
            elif (slot := self._slot(run)) is not None and slot[0] == PARSING:
                self._finish(run, "died_parsing", run.next_index, "sandbox child died parsing the event")
            elif (progress := self._read_progress(run)) is None:
                self._finish(run, "died_compiling", run.next_index, "sandbox child died while compiling")
            else:
                self._finish(run, "died", progress.index, "sandbox child died")
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("sandbox child exited during start-up"))

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("sandbox child exited during start-up"))

    def kill(self) -> None:
        self.dead = True
        pid = self.pid
        if pid is not None and not self.exited.done() and not self._killed:
            self._killed = True
            # os.kill, not Popen.kill: Popen polls first and would reap the zombie behind asyncio's watcher.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def reap(self) -> None:
        """Kill if still running, wait for the exit status (no zombie) and close the transport."""
        self.kill()
        if self.transport is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REAP_TIMEOUT):
                    await self.exited
            self.transport.close()
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self.ready.done() and not self.ready.cancelled():
            self.ready.exception()  # retrieved, so a failed start-up is not reported as never retrieved


def _fault(index: int, rule_ids: list[str | None], cause: str, detail: str | None) -> Fault:
    return Fault.model_validate(
        {
            "rule_index": index,
            "rule_id": rule_ids[index] if index >= 0 else None,
            "cause": cause,
            "detail": detail,
        }
    )


def _rule_fields(rules: list[dict[str, Any]]) -> tuple[list[object], list[str | None]]:
    exprs: list[object] = []
    ids: list[str | None] = []
    for rule in rules:
        rule_map = rule if isinstance(rule, dict) else {}
        exprs.append(rule_map.get("expr"))
        rule_id = rule_map.get("id")
        ids.append(None if rule_id is None else str(rule_id))
    return exprs, ids


def encode_input(params: dict[str, Any] | None, envelope: dict[str, Any]) -> bytes:
    """The child's input line body: compact UTF-8 JSON, about a third of the ASCII-escaped size to parse."""
    # Python ints of any size encode exactly and libjq keeps integer literals, so >2^53 ids compare right.
    text = input_text(params, json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False))
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate (the receiver should never let one through): libjq refuses its \ud800 escape as
        # well, and a parse failure would fault every rule, so it becomes U+FFFD; a paired one is rejoined.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


def _failure(detail: str) -> Evaluation:
    return Evaluation(faults=[Fault(rule_index=-1, cause="sandbox_failure", detail=detail)])


class SandboxPool:
    """Evaluates rule lists in at most ``max_children`` concurrent children, kept warm plus one spare."""

    def __init__(
        self,
        *,
        max_children: int = 2,
        rule_timeout: float = 0.05,
        event_budget: float = 0.25,
        hard_deadline: float = 2.0,
        memory_limit: int = 128 * 1024 * 1024,
        acquire_timeout: float = 1.0,
        observer: Callable[[str], None] | None = None,
    ) -> None:
        self._max_children = max_children
        # Told "busy" (no slot in time) and why each child was killed or lost mid-request: the metrics hook
        # (switchboard/metrics.py sandbox_observer), kept out of this module so routing/ imports no exporter.
        self._observer = observer
        self._rule_timeout = rule_timeout
        self._event_budget = event_budget
        self._hard_deadline = hard_deadline
        self._acquire_timeout = acquire_timeout
        self._argv: list[str] = [
            sys.executable,
            "-I",
            "-B",
            str(CHILD_SCRIPT),
            str(memory_limit),
            repr(hard_deadline),
        ]
        self._slots = asyncio.Semaphore(max_children)
        self._target = max_children + 1  # a spare replaces a killed child without waiting for a spawn
        self._children: set[_Child] = set()  # every child not yet reaped, for close()
        self._live: set[_Child] = set()  # started children not discarded: idle or evaluating
        self._idle: list[_Child] = []
        self._waiters: deque[asyncio.Future[_Child]] = deque()
        self._spawning = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._seq = 0
        self._closed = False
        self._recent: OrderedDict[tuple[object, ...], None] = OrderedDict()  # rule lists to pre-compile

    @property
    def slots(self) -> int:
        """How many rule lists this pool evaluates at once (its evaluate worker's activity slots)."""
        return self._max_children

    async def evaluate(
        self, rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
    ) -> Evaluation:
        """First-match-wins evaluation of ``rules``; faults are recorded, never raised."""
        if not rules:
            return Evaluation()
        if self._closed:
            return _failure("sandbox pool is closed")
        try:
            text = encode_input(params, envelope)
        except (TypeError, ValueError) as exc:
            return _failure(f"event not JSON-encodable: {type(exc).__name__}")
        exprs, rule_ids = _rule_fields(rules)
        self._remember(exprs)
        try:
            async with asyncio.timeout(self._acquire_timeout):
                await self._slots.acquire()
        except TimeoutError:
            self._note("busy")
            return Evaluation(
                faults=[
                    Fault(
                        rule_index=-1,
                        cause="sandbox_busy",
                        detail=f"no sandbox slot within {self._acquire_timeout * 1000:.0f} ms",
                    )
                ]
            )
        try:
            return await self._evaluate_in_slot(exprs, rule_ids, text)
        finally:
            self._slots.release()
            self._replenish()

    async def _evaluate_in_slot(self, exprs: list[object], rule_ids: list[str | None], text: bytes) -> Evaluation:
        loop = asyncio.get_running_loop()
        hard_at = loop.time() + self._hard_deadline
        budget_left = self._event_budget  # spent only while rules run, not while a child compiles or spawns
        faults: list[Fault] = []
        count = len(exprs)
        index = 0
        replacements = 0
        one_at_a_time = False  # after a child dies compiling a list: find the rule that kills the compiler
        while index < count:
            if budget_left <= 0:
                faults.extend(
                    _fault(i, rule_ids, "budget_exhausted", "event budget spent") for i in range(index, count)
                )
                break
            if replacements > _MAX_REPLACEMENTS:
                faults.append(_fault(-1, rule_ids, "sandbox_failure", f"too many child failures; rules {index}.."))
                break
            child = await self._take(hard_at)
            if child is None:
                faults.append(_fault(-1, rule_ids, "sandbox_failure", f"no sandbox child; rules {index}.."))
                break
            end = index + 1 if one_at_a_time else count
            self._seq += 1
            # The whole list (a resumed list reuses the child's compiled program), or the one suspect rule.
            request = (
                {"seq": self._seq, "base": index, "start": 0, "exprs": exprs[index:end]}
                if one_at_a_time
                else {"seq": self._seq, "base": 0, "start": index, "exprs": exprs}
            )
            header = json.dumps(request, separators=(",", ":"))
            try:
                run = await child.run(
                    header.encode() + b"\t" + text + b"\n",
                    seq=self._seq,
                    start=index,
                    end=end,
                    rule_timeout=self._rule_timeout,
                    budget_left=budget_left,
                    hard_at=hard_at,
                )
            except BaseException:
                self._discard(child, replace=True)  # cancelled mid-request: the child's state is unknown
                raise
            budget_left -= run.elapsed
            faults.extend(_fault(i, rule_ids, cause, detail) for i, cause, detail in run.faults)
            if run.ending == "complete":
                self._release(child)
                if run.matched is not None:
                    return Evaluation(matched_index=run.matched, faults=faults)
                index = end
                continue
            # Replaced after this delivery: a child starting now would compete with the spare for CPU.
            self._discard(child, replace=False)
            replacements += 1
            if run.ending != "gone":
                self._note(run.ending)
            stopped = run.stopped_at
            if run.ending == "timeout":
                faults.append(_fault(stopped, rule_ids, "timeout", run.detail))
                index = stopped + 1
            elif run.ending == "died" or (run.ending == "died_compiling" and one_at_a_time):
                # libjq aborts the process when the address-space cap refuses an allocation.
                faults.append(_fault(stopped, rule_ids, "error", "sandbox child died (memory limit?)"))
                index = stopped + 1
            elif run.ending == "died_parsing":
                # Not a rule's doing: the event itself (bounded by the body cap) did not fit the child.
                faults.append(_fault(-1, rule_ids, "sandbox_failure", f"{run.detail}; rules {index}.."))
                break
            elif run.ending == "died_compiling":
                one_at_a_time = True
                self._recent.pop(tuple(exprs), None)  # never warm a new child with a list that kills it
            elif run.ending == "gone":
                continue
            elif run.ending == "budget":
                faults.extend(_fault(i, rule_ids, "budget_exhausted", run.detail) for i in range(stopped, count))
                break
            else:
                faults.append(_fault(-1, rule_ids, "sandbox_failure", f"{run.detail}; rules {index}.."))
                break
        return Evaluation(matched_index=None, faults=faults)

    async def check(self, exprs: Sequence[str]) -> list[str | None]:
        """Save-time compile check in the children: per expression None, or why it cannot be saved.

        Each expression compiles alone through the child's RuleEngine.prepare, as evaluation compiles it, so
        libjq's constant folding (``"x" * 2e8``) spends a capped child's memory, never this process's. A child
        killed or dead while compiling one expression refuses that one and the rest go on a spare; the whole
        check is bounded by the hard deadline. Raises CompileCheckUnavailable when no slot or child is had in
        time (and no expression is to blame).
        """
        verdicts: list[str | None] = [None] * len(exprs)
        if not exprs:
            return verdicts
        if self._closed:
            raise CompileCheckUnavailable("the rule sandbox is closed")
        try:
            async with asyncio.timeout(self._acquire_timeout):
                await self._slots.acquire()
        except TimeoutError:
            self._note("busy")
            raise CompileCheckUnavailable(f"no sandbox slot within {self._acquire_timeout * 1000:.0f} ms") from None
        try:
            await self._check_in_slot(list(exprs), verdicts)
        finally:
            self._slots.release()
            self._replenish()
        return verdicts

    async def _check_in_slot(self, exprs: list[str], verdicts: list[str | None]) -> None:
        hard_at = asyncio.get_running_loop().time() + self._hard_deadline
        index = 0
        replacements = 0
        while index < len(exprs):
            lost = replacements > _MAX_REPLACEMENTS
            child = None if lost else await self._take(hard_at)
            if child is None:  # fail closed: what was not checked cannot be saved
                if not lost and all(verdict is None for verdict in verdicts[:index]):
                    # No rule is to blame yet (a child could not start in time): the sandbox is, not the save.
                    raise CompileCheckUnavailable("no sandbox child started within the hard deadline")
                # An earlier expression is refused already, and validation names it first.
                why = "too many sandbox children lost" if lost else "no sandbox child in time"
                verdicts[index:] = [f"{COMPILE_LIMIT} (not checked: {why})"] * (len(exprs) - index)
                return
            self._seq += 1
            header = json.dumps({"seq": self._seq, "check": exprs[index:]}, separators=(",", ":"))
            try:
                run = await child.run(
                    header.encode() + b"\t\n",
                    seq=self._seq,
                    start=0,
                    end=len(exprs) - index,
                    # Only the hard deadline bounds a compile: the per-rule clocks measure evaluation.
                    rule_timeout=self._hard_deadline,
                    budget_left=self._hard_deadline,
                    hard_at=hard_at,
                )
            except BaseException:
                self._discard(child, replace=True)
                raise
            for position, _cause, detail in run.faults:
                verdicts[index + position] = compile_failure(detail or "compile error")
            if run.ending == "complete":
                self._release(child)
                return
            self._discard(child, replace=False)
            replacements += 1
            if run.ending == "gone":
                continue
            self._note(run.ending)
            if run.ending == "violation":
                unchecked = f"expression could not be compile-checked: sandbox failure ({run.detail})"
                verdicts[index:] = [unchecked] * (len(exprs) - index)
                return
            # Killed past the hard deadline, or aborted by libjq at the memory cap: that expression's doing.
            culprit = index + max(run.stopped_at, run.next_index)
            if culprit < len(exprs):
                verdicts[culprit] = COMPILE_LIMIT
            index = culprit + 1

    def _note(self, event: str) -> None:
        if self._observer is not None:
            try:
                self._observer(event)
            except Exception:  # a metrics hook never changes an evaluation's outcome
                log.exception("sandbox observer failed")

    def _remember(self, exprs: list[object]) -> None:
        if all(isinstance(expr, str) for expr in exprs):
            key = tuple(exprs)
            self._recent[key] = None
            self._recent.move_to_end(key)
            if len(self._recent) > _WARM_LISTS:
                self._recent.popitem(last=False)

    async def _warm(self, child: _Child) -> bool:
        """Compile the recently used rule lists on a new child, so a spare resumes a list without compiling."""
        if not self._recent or self._waiters:
            return True
        self._seq += 1
        header = json.dumps({"seq": self._seq, "warm": [list(key) for key in self._recent]}, separators=(",", ":"))
        loop = asyncio.get_running_loop()
        run = await child.run(
            header.encode() + b"\t\n",
            seq=self._seq,
            start=0,
            end=0,
            rule_timeout=_SPAWN_TIMEOUT,
            budget_left=_SPAWN_TIMEOUT,
            hard_at=loop.time() + _SPAWN_TIMEOUT,
        )
        return run.ending == "complete"

    async def _take(self, hard_at: float) -> _Child | None:
        while self._idle:
            child = self._idle.pop()
            if child.usable:
                return child
            self._discard(child)
        waiter: asyncio.Future[_Child] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._replenish()
        try:
            async with asyncio.timeout_at(hard_at):
                return await waiter
        except (TimeoutError, RuntimeError):  # no child in time, or none could start
            self._unclaim(waiter)
            return None
        except BaseException:
            self._unclaim(waiter)
            raise

    def _unclaim(self, waiter: asyncio.Future[_Child]) -> None:
        """A child handed to a waiter that gave up goes back to the pool."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled() and waiter.exception() is None:
            self._release(waiter.result())

    def _offer(self, child: _Child) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(child)
                return
        self._idle.append(child)

    def _release(self, child: _Child) -> None:
        if child.usable and not self._closed:
            self._offer(child)
        else:
            self._discard(child)

    def _discard(self, child: _Child, *, replace: bool = True) -> None:
        self._live.discard(child)
        child.kill()
        self._background(self._reap(child))
        if replace:
            self._replenish()

    async def _reap(self, child: _Child) -> None:
        await child.reap()
        self._children.discard(child)

    def _replenish(self) -> None:
        while not self._closed and len(self._live) + self._spawning < self._target:
            self._spawning += 1
            self._background(self._spawn())

    async def _spawn(self) -> None:
        child = _Child(asyncio.get_running_loop())
        self._children.add(child)
        try:
            await child.start(self._argv)
        except Exception as exc:  # any start-up failure: the waiting delivery fails closed
            if not self._closed:
                log.warning("sandbox child failed to start: %r", exc)
            self._spawning -= 1
            await self._reap(child)
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(RuntimeError("sandbox child failed to start"))
                    break
            return
        warmed = await self._warm(child)
        self._spawning -= 1
        if self._closed or not warmed:
            await self._reap(child)
            if not warmed and not self._closed:
                # A remembered list kills the compiler: forget them all and start one child without warming.
                self._recent.clear()
                self._replenish()
            return
        self._live.add(child)
        self._offer(child)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def child_pids(self) -> list[int]:
        """Process ids of the children not yet reaped (for tests and diagnostics)."""
        return [pid for child in self._children if (pid := child.pid) is not None]

    async def close(self) -> None:
        """Kill and reap every child; later evaluations fail closed."""
        self._closed = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(RuntimeError("sandbox pool closed"))
        self._waiters.clear()
        self._idle.clear()
        self._live.clear()
        while self._children or self._tasks:
            for child in list(self._children):
                child.kill()
            await asyncio.gather(*self._tasks, *(self._reap(child) for child in list(self._children)))


_ENGINE = RuleEngine()


def evaluate_in_process(
    rules: list[dict[str, Any]],
    params: dict[str, Any] | None,
    envelope: dict[str, Any],
    *,
    rule_timeout: float = 0.05,
    event_budget: float = 0.25,
) -> Evaluation:
    """The sandbox's semantics with libjq in this process and no kill (tests and benchmarks only).

    Rules are timed on this thread's CPU clock, as the sandbox times its children's.
    """
    if not rules:
        return Evaluation()
    try:
        text = encode_input(params, envelope).decode()
    except (TypeError, ValueError) as exc:
        return _failure(f"event not JSON-encodable: {type(exc).__name__}")
    exprs, rule_ids = _rule_fields(rules)
    faults: list[Fault] = []
    plan = _ENGINE.prepare(exprs)  # compiling is not evaluation: the sandbox times rules after it too
    budget_left = event_budget
    started = time.thread_time()

    def parsed(position: int) -> None:  # parsing is not evaluation either: the rule's clock starts after it
        nonlocal started
        started = time.thread_time()

    for index, outcome, detail in _ENGINE.evaluate(plan, exprs, text, parsed=parsed):
        finished = time.thread_time()
        spent, started = finished - started, finished
        budget_left -= spent
        if spent > rule_timeout:
            faults.append(_fault(index, rule_ids, "timeout", f"rule used over {rule_timeout * 1000:.0f} ms of CPU"))
        elif outcome == "match":
            return Evaluation(matched_index=index, faults=faults)
        elif outcome != "nomatch":
            faults.append(_fault(index, rule_ids, outcome, detail))
        if budget_left <= 0 and index + 1 < len(exprs):
            faults.extend(
                _fault(i, rule_ids, "budget_exhausted", "event budget spent") for i in range(index + 1, len(exprs))
            )
            break
    return Evaluation(matched_index=None, faults=faults)


def check_in_process(exprs: Sequence[str]) -> list[str | None]:
    """SandboxPool.check's verdicts compiled in this process, unbounded (tests only: never on a server)."""
    verdicts: list[str | None] = []
    for expr in exprs:
        error = RuleEngine().prepare([expr]).compile_errors.get(0)
        verdicts.append(None if error is None else compile_failure(error))
    return verdicts
