"""The parent's handle on one sandbox child process: start-up, one request at a time, budgets, kill and reap.

The child is the same interpreter re-executed as ``python -I -B routing/sandbox/child_main.py`` with an empty
environment, stderr discarded and a memfd for the progress slot (routing/sandbox/protocol.py). Its stdin
and stdout are plain non-blocking pipes the parent drives itself (a request is one write, a reply is read
by a reader callback on the event loop, with no transport or extra loop turn in between); asyncio's
subprocess transport only starts the child and reports its exit. A request's run is driven by that reader
and one timer: the timer reads the progress slot and the child's CPU clock and kills the child when the
running rule overruns its timeout, the request its event budget, or either its wall-clock bounds. The result
is a :class:`Run`, never an exception; what to do next (resume on a spare, fault the rule, fail closed) is the
pool's decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from routing.sandbox.protocol import (
    BODY_OFFSET,
    BODY_SLOT,
    COMPILING,
    PARSING,
    PROGRESS,
    READY,
    SHARED_SIZE,
    ProtocolViolation,
    parse_reply,
)

log = logging.getLogger(__name__)

SPAWN_TIMEOUT: Final = 10.0
_REAP_TIMEOUT: Final = 5.0
_MAX_LINE: Final = 64 * 1024
_READ_SIZE: Final = 65536
_RULE_WALL_FACTOR: Final = 20  # a rule's wall-clock bound, in rule timeouts (1 s at the 50 ms default)

Ending = Literal[
    "complete", "timeout", "budget", "hard_deadline", "died", "died_compiling", "died_parsing", "violation", "gone"
]


@dataclass(frozen=True)
class _Progress:
    """The running rule as the parent reads it: CPU figures in ns of the child's CPU clock."""

    index: int
    rule_at: float  # loop time the rule started (for the wall-clock bound)
    rule_cpu: int  # the child's CPU clock when the rule started
    began_cpu: int  # the child's CPU clock when the rules' clock started, moved on by every parse
    cpu: int  # the child's CPU clock now


def cpu_clock_id(pid: int) -> int:
    """Linux's id for another process's CPU clock (CPUCLOCK_SCHED of the whole process; see clock_getcpuclockid)."""
    return (~pid << 3) | 2


@dataclass
class Run:
    """One request on one child: rules ``next_index`` to ``end``, and what is known of them so far."""

    seq: int
    next_index: int  # the first rule not known to be finished
    end: int
    rule_timeout: float
    budget_left: float
    hard_at: float
    sent_at: float
    sent_cpu: int  # the child's CPU clock when the request was sent (ns; the wall clock if unreadable)
    future: asyncio.Future[Run]
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
    """asyncio's callbacks for one child, handed to its Child: the transport (for the pid) and the exit."""

    def __init__(self, child: Child) -> None:
        self._child = child

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._child.transport = transport

    def process_exited(self) -> None:
        self._child.process_exited()


class Child:
    """One sandbox child process and the request it is answering, driven by protocol callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.SubprocessTransport | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.dead = False  # killed, or stdout closed: never reused
        self._buffer = b""
        self._run: Run | None = None
        self._killed = False
        self._progress: mmap.mmap | None = None
        self._bodies: mmap.mmap | None = None  # the body slot (protocol.py "shared memory"), written by the parent
        self._cpu_clock: int | None = None  # the child's CPU clock id; None: rules are timed on the wall clock
        self._stdin: int | None = None  # the parent's ends of the child's stdin and stdout (non-blocking)
        self._stdout: int | None = None
        self._pending = b""  # the rest of a request the pipe could not take at once

    @property
    def pid(self) -> int | None:
        """The child's process id, once it has been started."""
        return self.transport.get_pid() if self.transport else None

    @property
    def usable(self) -> bool:
        """Alive, never killed, and not answering a request: the pool may hand it one."""
        return not self.dead and not self.exited.done() and self._run is None

    async def start(self, argv: Sequence[str]) -> None:
        """Start the child with its progress slot and wait for its ready line; raises when it cannot start."""
        progress_fd = os.memfd_create("sandbox-progress", os.MFD_CLOEXEC)
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)  # the child's ends are dup'ed onto 0 and 1 without the flag
        stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
        try:
            os.ftruncate(progress_fd, SHARED_SIZE)
            self._progress = mmap.mmap(progress_fd, PROGRESS.size)
            self._bodies = mmap.mmap(progress_fd, BODY_SLOT, offset=BODY_OFFSET)
            await self.loop.subprocess_exec(
                lambda: _Protocol(self),
                *argv,
                str(progress_fd),
                stdin=stdin_r,
                stdout=stdout_w,
                stderr=asyncio.subprocess.DEVNULL,
                env={},
                pass_fds=(progress_fd,),
                start_new_session=True,  # a terminal's ^C goes to the parent, which reaps its children
            )
        except BaseException:
            os.close(stdin_w)
            os.close(stdout_r)
            raise
        finally:
            os.close(progress_fd)
            os.close(stdin_r)
            os.close(stdout_w)
        os.set_blocking(stdin_w, False)
        os.set_blocking(stdout_r, False)
        self._stdin, self._stdout = stdin_w, stdout_r
        self.loop.add_reader(stdout_r, self._readable)
        async with asyncio.timeout(SPAWN_TIMEOUT):
            await self.ready
        pid = self.pid
        if pid is not None:
            try:
                time.clock_gettime_ns(cpu_clock_id(pid))
                self._cpu_clock = cpu_clock_id(pid)
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

    def _cpu_now(self, run: Run) -> int:
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
        body: bytes | None = None,
    ) -> asyncio.Future[Run]:
        """Send one request; the future resolves (never fails) when the child answers or is killed.

        ``body``: the body of a request framed with ``shared=True``, copied into the body slot before sending.
        """
        sent_at = self.loop.time()
        sent_cpu = self._cpu_ns() if self._cpu_clock is not None else None
        if sent_cpu is None:
            sent_cpu = int(sent_at * 1e9)
        run = Run(
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
        if self.dead or self.transport is None or self._stdin is None or self._bodies is None:
            self._finish(run, "gone", detail="sandbox child gone before the request")
            return run.future
        if body is not None:
            # The child reads the slot only while it answers a request, and this child answers one at a time.
            self._bodies[: len(body)] = body
        self._send(request)
        self._arm(run, min(self.loop.time() + rule_timeout, hard_at))
        return run.future

    def _send(self, data: bytes) -> None:
        """Write a request: at once if the pipe takes it (the usual case), the rest when it has room."""
        stdin = self._stdin
        if stdin is None:
            return
        try:
            written = os.write(stdin, data)
        except BlockingIOError:
            written = 0
        except OSError:  # the child is gone: its stdout's EOF (or the timer) ends the run
            return
        if written < len(data):
            self._pending = data[written:]
            self.loop.add_writer(stdin, self._writable)

    def _writable(self) -> None:
        try:
            written = os.write(self._stdin, self._pending) if self._stdin is not None else len(self._pending)
        except BlockingIOError:
            return
        except OSError:
            written = len(self._pending)
        self._pending = self._pending[written:]
        if not self._pending and self._stdin is not None:
            self.loop.remove_writer(self._stdin)

    def _readable(self) -> None:
        """The child's stdout is readable: reply bytes, or its EOF (the child died or was killed)."""
        if self._stdout is None:
            return
        try:
            data = os.read(self._stdout, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.data_received(data)
        else:
            self._close_pipes()
            self.eof_received()

    def _close_pipes(self) -> None:
        if self._stdout is not None:
            self.loop.remove_reader(self._stdout)
            os.close(self._stdout)
            self._stdout = None
        if self._stdin is not None:
            if self._pending:
                self.loop.remove_writer(self._stdin)
                self._pending = b""
            os.close(self._stdin)
            self._stdin = None

    def _slot(self, run: Run) -> tuple[int, int, int, int, int] | None:
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

    def _read_progress(self, run: Run) -> _Progress | None:
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

    def _arm(self, run: Run, when: float) -> None:
        # Never re-arm in the past: a timer that cannot decide yet must not spin the loop.
        run.timer = self.loop.call_at(max(when, self.loop.time() + 0.0005), self._on_timer, run)

    def _on_timer(self, run: Run) -> None:
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

    def _kill_run(self, run: Run, ending: Ending, index: int, detail: str) -> None:
        """Kill the child, keep the fault lines it wrote before the kill, and finish the run."""
        run.killing = (ending, index, detail)
        self._cpu_now(run)  # the last reading the dead child's CPU time can be charged from
        self.kill()
        # Read what is already in the pipe now rather than wait for the kernel to tear the child down.
        if self._stdout is not None:
            with contextlib.suppress(OSError):
                while chunk := os.read(self._stdout, _READ_SIZE):
                    self.data_received(chunk)
        self._drained(run)

    def _drained(self, run: Run) -> None:
        if run.killing is not None:
            ending, index, detail = run.killing
            self._finish(run, ending, index, detail)

    def _finish(self, run: Run, ending: Ending, stopped_at: int = -1, detail: str = "") -> None:
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
        """Bytes from the child's stdout: whole lines are read as replies, an oversized one is a violation."""
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
            if line == READY:
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
        """The child's stdout closed: it died, and a request in flight ends by where it was then."""
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
        """The child's exit status was collected."""
        if not self.exited.done():
            self.exited.set_result(None)
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("sandbox child exited during start-up"))

    def kill(self) -> None:
        """SIGKILL the child once (never after it was reaped: its pid may be another process's by then)."""
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
        self._close_pipes()
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self._bodies is not None:
            self._bodies.close()
            self._bodies = None
        if self.ready.done() and not self.ready.cancelled():
            self.ready.exception()  # retrieved, so a failed start-up is not reported as never retrieved
