"""The sandbox child process's main loop: hardening, then one request at a time through the rule engine.

Run as ``python -I -B routing/sandbox/child_main.py <memory_limit> <hard_deadline> <shared_fd>`` with an empty
environment (``shared_fd``: the memfd holding the progress slot and the body slot, see protocol.py). It evaluates
with :class:`~routing.sandbox.engine.RuleEngine` and imports nothing else but the standard library, ``jq``, and
the modules the engine and the wire format need (routing/jq_policy.py, routing/sandbox/jq_bytes.py,
routing/sandbox/protocol.py), all loaded by path, so a freshly executed child stays small enough for an
address-space cap to bound libjq (which aborts the process on allocation failure).

The protocol (requests, replies, the progress slot) is described in routing/sandbox/protocol.py. Before
each rule the child writes its index and start time, in wall-clock and in its own CPU time (read afresh
every ``protocol.CPU_REFRESH_NS``, an early bound in between), into the progress slot; the parent reads the
child's CPU clock itself, so the per-rule and per-event budgets count the CPU the rules used, not time the
child spent waiting for a core. While the list compiles (COMPILING) or the event is parsed (PARSING) only the
hard deadline applies: the per-rule and per-event clocks measure rule evaluation, never the producer-sized parse.

The envelope arrives as compact UTF-8 JSON; libjq parses it once per request (again only after an error
no rule's try/catch could hold), before the first rule's clock starts. At start-up, before reading any
request, the child closes every inherited descriptor but 0/1/2, caps descriptors and processes, sets
no_new_privs and installs a seccomp filter refusing fork, vfork, clone (without CLONE_THREAD), clone3,
execve and execveat, so a libjq bug reached by a hostile rule still cannot start a program.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING or __package__:
    from routing.sandbox import protocol
    from routing.sandbox.engine import RuleEngine
else:
    # Run as a script under "python -I": the script's folder is not on sys.path. Importing the project's packages
    # (where an installed copy makes them importable) would run routing/sandbox/__init__.py and load the parent's
    # side with it, far more than an address-space cap leaves libjq. The child's "routing" and "routing.sandbox"
    # are empty packages holding only the four modules it needs (the engine, the jq policy, how jq.py gets the
    # input, the wire format: standard library and jq only), each loaded by path under its own name.
    import importlib.util
    from types import ModuleType

    def _package(name: str) -> ModuleType:
        """An empty package: it holds only the modules loaded into it below."""
        package = ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
        return package

    def _load(package: ModuleType, leaf: str, path: Path) -> ModuleType:
        name = f"{package.__name__}.{leaf}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve their module through sys.modules
        setattr(package, leaf, module)
        spec.loader.exec_module(module)
        return module

    _here = Path(__file__).resolve().parent
    _routing = _package("routing")
    _routing.sandbox = _package("routing.sandbox")
    _load(_routing, "jq_policy", _here.parent / "jq_policy.py")
    _load(_routing.sandbox, "jq_bytes", _here / "jq_bytes.py")
    protocol = _load(_routing.sandbox, "protocol", _here / "protocol.py")
    RuleEngine = _load(_routing.sandbox, "engine", _here / "engine.py").RuleEngine


def _write(data: bytes) -> None:
    while data:
        data = data[os.write(1, data) :]


# Linux ABI numbers for the start-up hardening (linux/prctl.h, linux/seccomp.h, linux/audit.h, linux/filter.h).
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_SET_SECCOMP: Final = 22
_SECCOMP_MODE_FILTER: Final = 2
_SECCOMP_RET_ALLOW: Final = 0x7FFF0000
_SECCOMP_RET_ERRNO: Final = 0x00050000
_EPERM: Final = 1
_ENOSYS: Final = 38
_CLONE_THREAD: Final = 0x00010000
_X32_SYSCALL_BIT: Final = 0x40000000
# Per architecture: the audit arch, syscalls refused outright, clone, clone3.
_SYSCALLS: Final = {
    "x86_64": (0xC000003E, (57, 58, 59, 322), 56, 435),  # fork, vfork, execve, execveat
    "aarch64": (0xC00000B7, (221, 281), 220, 435),  # execve, execveat (no fork/vfork syscalls)
}
_READ_BUFFER: Final = 1 << 18
FD_LIMIT: Final = 8  # stdin, stdout, stderr and a few transient ones (a lazy import, /etc/localtime)


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The BPF filter (code, jt, jf, k) refusing new processes on ``machine``, or None if unsupported.

    A syscall from another ABI (i386 or x32 on x86_64) is refused whatever its number, since the numbers
    checked here are the native ones. clone3 answers ENOSYS, not EPERM: its flags sit in memory a filter
    cannot read, and ENOSYS makes libc fall back to clone, whose flags the filter does check.
    """
    if machine not in _SYSCALLS:
        return None
    arch, refused, clone, clone3 = _SYSCALLS[machine]
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    deny_all = (ret, 0, 0, _SECCOMP_RET_ERRNO | _EPERM)
    body: list[tuple[int, int, int, int] | tuple[int, str, str, int]] = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, "next", "deny", arch),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        body.append((jge, "deny", "next", _X32_SYSCALL_BIT))
    body += [(jeq, "deny", "next", nr) for nr in refused]
    body += [
        (jeq, "enosys", "next", clone3),
        (jeq, "next", "allow", clone),
        (ld_abs, 0, 0, 16),  # low 32 bits of args[0], clone's flags (little-endian)
        (jset, "allow", "deny", _CLONE_THREAD),
    ]
    labels = {"allow": len(body), "deny": len(body) + 1, "enosys": len(body) + 2}
    program: list[tuple[int, int, int, int]] = []
    for at, (code, jt, jf, k) in enumerate(body):
        targets = [t if isinstance(t, int) else (0 if t == "next" else labels[t] - at - 1) for t in (jt, jf)]
        program.append((code, targets[0], targets[1], k))
    return [*program, (ret, 0, 0, _SECCOMP_RET_ALLOW), deny_all, (ret, 0, 0, _SECCOMP_RET_ERRNO | _ENOSYS)]


def harden() -> None:
    """Close inherited descriptors, cap descriptors and processes, and forbid starting any program.

    Best effort beyond the rlimits: a kernel without seccomp, or another architecture, still gets
    no_new_privs and the caps. The parent's test suite reads /proc to check that all of it applied.
    """
    import resource

    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort must not spend time writing a core
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # ignored for root, hence the seccomp filter
    try:
        import ctypes
        import platform

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return
        program = seccomp_program(platform.machine())
        if program is None:
            return

        class SockFilter(ctypes.Structure):
            _fields_ = [
                ("code", ctypes.c_uint16),
                ("jt", ctypes.c_uint8),
                ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32),
            ]

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

        filters = (SockFilter * len(program))(*(SockFilter(*insn) for insn in program))
        fprog = SockFprog(len(program), filters)
        libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    except (ImportError, OSError, AttributeError):
        return


def serve(memory_limit: int, hard_deadline: float, progress_fd: int) -> None:
    """Answer requests on stdin until EOF; libjq runs with the address space capped."""
    import mmap
    import resource
    import signal

    # The mappings outlive their descriptor (and the duplicates mmap keeps, closed by harden(): these objects
    # are never resized or closed, so those descriptors are never used again).
    progress = mmap.mmap(progress_fd, protocol.PROGRESS.size)
    bodies = mmap.mmap(progress_fd, protocol.BODY_SLOT, access=mmap.ACCESS_READ, offset=protocol.BODY_OFFSET)
    os.close(progress_fd)
    harden()
    engine = RuleEngine()
    if memory_limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    # One read per request: the default 8 KiB buffer would take several system calls for a typical envelope.
    stdin = open(0, "rb", buffering=_READ_BUFFER, closefd=False)  # fd 0 lives as long as the child
    _write(protocol.reply(0, "ready"))
    while True:
        line = stdin.readline()
        if not line:
            return
        request, raw_exprs, body = protocol.read_request(line)
        seq = int(request["seq"])
        if "warm" in request:  # compile rule lists ahead of need, e.g. on a freshly started spare
            for warm_exprs in request["warm"]:
                engine.prepare(list(warm_exprs))
            _write(protocol.reply(seq, "end", None))
            continue
        if "check" in request:
            _check(progress, seq, list(request["check"]), hard_deadline)
            continue
        base, start = int(request["base"]), int(request["start"])
        size = request.get("len")
        # A body in the slot is read straight from the shared mapping (no copy through the pipe).
        text = memoryview(bodies)[: int(size)] if size is not None else body
        # A self-watchdog: SIGALRM's default action ends the child even inside libjq, even if the
        # parent is gone and can no longer kill it.
        signal.setitimer(signal.ITIMER_REAL, hard_deadline)
        protocol.PROGRESS.pack_into(progress, 0, seq, protocol.COMPILING, 0, 0, 0, 0)
        exprs, plan = engine.prepare_encoded(raw_exprs)
        clock = _RulesClock(progress, seq, base)
        matched: int | None = None
        # Only faults and the match come back here; the clock hears of each rule as the run moves on to it.
        for position, outcome, detail in engine.evaluate(
            plan,
            exprs,
            text,
            start,
            parsing=clock.parsing,
            parsed=clock.parsed,
            started=clock.rule_started,
            misses=False,
        ):
            if outcome == "match":
                matched = base + position
                break
            # At once, not with the final line: if a later rule is killed, the parent keeps this fault.
            _write(protocol.reply(seq, "r", base + position, outcome, detail))
        _write(protocol.reply(seq, "end", matched))
        signal.setitimer(signal.ITIMER_REAL, 0)


def _check(progress: Any, seq: int, exprs: list[object], hard_deadline: float) -> None:
    """Save-time compile check: each expression alone through prepare(), exactly as evaluation compiles it.

    The slot names the expression compiling, so the parent can tell which one a kill or an abort belongs to;
    a compile error is a ``compile_error`` fault line. A fresh engine per expression keeps nothing compiled.
    """
    import signal

    signal.setitimer(signal.ITIMER_REAL, hard_deadline)
    began, began_cpu = time.monotonic_ns(), _cpu_ns()
    for position, expr in enumerate(exprs):
        protocol.PROGRESS.pack_into(progress, 0, seq, position, time.monotonic_ns(), began, _cpu_ns(), began_cpu)
        error = RuleEngine().prepare([expr]).compile_errors.get(0)
        if error is not None:
            _write(protocol.reply(seq, "r", position, "compile_error", error))
    _write(protocol.reply(seq, "end", None))
    signal.setitimer(signal.ITIMER_REAL, 0)


def _cpu_ns() -> int:
    """This process's CPU time in ns: the same clock the parent reads for this pid (see protocol.PROGRESS)."""
    return time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)


class _RulesClock:
    """Writes the progress slot for one request, keeping parses out of the rules' clocks.

    A rule's CPU start is this process's CPU clock read afresh once ``protocol.CPU_REFRESH_NS`` of wall-clock
    time have passed since the last reading, and that last reading otherwise: never later than the rule's
    true start, so the parent charges a rule at most that much of the rules before it, never less than its own.
    """

    def __init__(self, progress: Any, seq: int, base: int) -> None:
        self._progress = progress
        self._seq = seq
        self._base = base
        # The list is compiled: the rules' clocks start here, on the wall and on this process's CPU.
        self._began = time.monotonic_ns()
        self._began_cpu = _cpu_ns()
        self._paused_at = self._began
        self._paused_cpu = self._began_cpu
        self._cpu = self._began_cpu  # the last CPU clock reading, taken at wall-clock time _cpu_at
        self._cpu_at = self._began

    def parsing(self, position: int) -> None:
        """libjq starts parsing the event: no rule is running, only the hard deadline applies."""
        self._paused_at = time.monotonic_ns()
        self._paused_cpu = _cpu_ns()
        protocol.PROGRESS.pack_into(self._progress, 0, self._seq, protocol.PARSING, 0, 0, 0, 0)

    def parsed(self, position: int) -> None:
        """The parse is over; the rules' clocks resume without it and rule ``position`` starts."""
        cpu = _cpu_ns()
        now = time.monotonic_ns()
        self._began += now - self._paused_at
        self._began_cpu += cpu - self._paused_cpu
        self._cpu, self._cpu_at = cpu, now
        self._write(position, now, cpu)

    def rule_started(self, position: int) -> None:
        """Rule ``position`` (of this request) starts now.

        Its start on both clocks is read afresh once ``protocol.CPU_REFRESH_NS`` have passed, and is the last
        reading otherwise, so most rules write their index alone (one store, no CPU clock read: a system call).
        """
        now = time.monotonic_ns()
        if now - self._cpu_at >= protocol.CPU_REFRESH_NS:
            self._cpu, self._cpu_at = _cpu_ns(), now
            self._write(position, now, self._cpu)
        else:
            protocol.INDEX.pack_into(self._progress, protocol.INDEX_OFFSET, self._base + position)

    def _write(self, position: int, now: int, cpu: int) -> None:
        protocol.PROGRESS.pack_into(
            self._progress, 0, self._seq, self._base + position, now, self._began, cpu, self._began_cpu
        )


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
