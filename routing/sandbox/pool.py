"""The sandbox pool: at most ``max_children`` rule lists evaluated at once, each in a warm child, plus a spare.

A delivery takes a slot, then a child; its whole rule list goes to that child as one request. When the
child is killed or dies (a rule overran, or libjq aborted at the memory cap) the pool records that rule's
fault and resumes the list after it on the spare, which has compiled the recently used lists already, so
the resumed list pays no compile. A list that kills the compiler itself is retried one rule at a time to
find the rule to blame. After too many lost children, or when no child is had by the hard deadline, the
rest of the list fails closed as a sandbox_failure. The save-time compile check runs on the same children.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Final

from routing.models import Evaluation, Fault
from routing.rules import COMPILE_LIMIT, CompileCheckUnavailable, compile_failure
from routing.sandbox.faults import rule_fault, rule_fields, sandbox_failure
from routing.sandbox.handle import SPAWN_TIMEOUT, Child
from routing.sandbox.protocol import (
    BODY_SLOT,
    check_request,
    encode_exprs,
    encode_input,
    evaluate_request,
    warm_request,
)

log = logging.getLogger(__name__)

CHILD_SCRIPT: Final = Path(__file__).with_name("child_main.py")
_WARM_LISTS: Final = 16  # recently evaluated rule lists a new child compiles before joining the pool
_MAX_REPLACEMENTS: Final = 4  # children killed or lost for one delivery before the rest fails closed


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
        # (switchboard/metrics.py sandbox_observer), kept out of this package so routing/ imports no exporter.
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
        self._children: set[Child] = set()  # every child not yet reaped, for close()
        self._live: set[Child] = set()  # started children not discarded: idle or evaluating
        self._idle: list[Child] = []
        self._waiters: deque[asyncio.Future[Child]] = deque()
        self._spawning = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._seq = 0
        self._closed = False
        # Rule lists to pre-compile, each with its encoded exprs field (encoded once per list, not per request).
        self._recent: OrderedDict[tuple[object, ...], bytes] = OrderedDict()

    @property
    def slots(self) -> int:
        """How many rule lists this pool evaluates at once (its evaluate worker's activity slots)."""
        return self._max_children

    async def evaluate(
        self,
        rules: list[dict[str, Any]],
        params: dict[str, Any] | None,
        envelope: dict[str, Any],
        *,
        wait: float | None = None,
    ) -> Evaluation:
        """First-match-wins evaluation of ``rules``; faults are recorded, never raised.

        ``wait`` bounds the wait for a slot (default: the pool's acquire timeout), past which it is sandbox_busy.
        """
        if not rules:
            return Evaluation()
        try:
            text = encode_input(params, envelope)
        except (TypeError, ValueError) as exc:
            return sandbox_failure(f"event not JSON-encodable: {type(exc).__name__}")
        return await self.evaluate_text(rules, text, wait=wait)

    async def evaluate_if_free(
        self, rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
    ) -> Evaluation | None:
        """``evaluate`` if a slot is free now and nobody waits for one, else None at once (it never waits).

        The fast path's admission: it takes only capacity nobody asked for, so it never overtakes an evaluation
        already waiting for a slot (one admitted through the fair evaluate queue).
        """
        if not rules:
            return Evaluation()
        if self._closed or self._slots.locked():  # locked: no slot free, or someone waits for one
            return None
        await self._slots.acquire()  # returns at once (not locked): nothing else runs between the check and this
        try:
            try:
                text = encode_input(params, envelope)
            except (TypeError, ValueError) as exc:
                return sandbox_failure(f"event not JSON-encodable: {type(exc).__name__}")
            exprs, rule_ids = rule_fields(rules)
            encoded = self._remember(exprs)
            return await self._evaluate_in_slot(exprs, encoded, rule_ids, text)
        finally:
            self._slots.release()
            self._replenish()

    async def evaluate_text(self, rules: list[dict[str, Any]], text: bytes, *, wait: float | None = None) -> Evaluation:
        """``evaluate`` over an input already encoded by ``encode_input``: a caller that evaluates one event more
        than once (several rule lists, a backtest) encodes it once, and the child gets the same bytes."""
        if not rules:
            return Evaluation()
        if self._closed:
            return sandbox_failure("sandbox pool is closed")
        exprs, rule_ids = rule_fields(rules)
        encoded = self._remember(exprs)
        bound = self._acquire_timeout if wait is None else wait
        if not await self._acquire_slot(bound):
            return Evaluation(
                faults=[
                    Fault(rule_index=-1, cause="sandbox_busy", detail=f"no sandbox slot within {bound * 1000:.0f} ms")
                ]
            )
        try:
            return await self._evaluate_in_slot(exprs, encoded, rule_ids, text)
        finally:
            self._slots.release()
            self._replenish()

    async def _acquire_slot(self, bound: float) -> bool:
        """Take a slot, waiting up to ``bound`` seconds; False (and noted as busy) if none came in time."""
        if not self._slots.locked():  # free: taken at once, without arming a timeout
            await self._slots.acquire()
            return True
        try:
            async with asyncio.timeout(bound):
                await self._slots.acquire()
        except TimeoutError:
            self._note("busy")
            return False
        return True

    async def _evaluate_in_slot(
        self, exprs: list[object], encoded: bytes, rule_ids: list[str | None], text: bytes
    ) -> Evaluation:
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
                    rule_fault(i, rule_ids, "budget_exhausted", "event budget spent") for i in range(index, count)
                )
                break
            if replacements > _MAX_REPLACEMENTS:
                faults.append(rule_fault(-1, rule_ids, "sandbox_failure", f"too many child failures; rules {index}.."))
                break
            child = await self._take(hard_at)
            if child is None:
                faults.append(rule_fault(-1, rule_ids, "sandbox_failure", f"no sandbox child; rules {index}.."))
                break
            end = index + 1 if one_at_a_time else count
            self._seq += 1
            # The whole list (a resumed list reuses the child's compiled program), or the one suspect rule.
            shared = len(text) <= BODY_SLOT  # the body goes in the child's body slot, not through the pipe
            request = (
                evaluate_request(
                    self._seq, base=index, start=0, exprs=encode_exprs(exprs[index:end]), body=text, shared=shared
                )
                if one_at_a_time
                else evaluate_request(self._seq, base=0, start=index, exprs=encoded, body=text, shared=shared)
            )
            try:
                run = await child.run(
                    request,
                    body=text if shared else None,
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
            faults.extend(rule_fault(i, rule_ids, cause, detail) for i, cause, detail in run.faults)
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
                faults.append(rule_fault(stopped, rule_ids, "timeout", run.detail))
                index = stopped + 1
            elif run.ending == "died" or (run.ending == "died_compiling" and one_at_a_time):
                # libjq aborts the process when the address-space cap refuses an allocation.
                faults.append(rule_fault(stopped, rule_ids, "error", "sandbox child died (memory limit?)"))
                index = stopped + 1
            elif run.ending == "died_parsing":
                # Not a rule's doing: the event itself (bounded by the body cap) did not fit the child.
                faults.append(rule_fault(-1, rule_ids, "sandbox_failure", f"{run.detail}; rules {index}.."))
                break
            elif run.ending == "died_compiling":
                one_at_a_time = True
                self._recent.pop(tuple(exprs), None)  # never warm a new child with a list that kills it
            elif run.ending == "gone":
                continue
            elif run.ending == "budget":
                faults.extend(rule_fault(i, rule_ids, "budget_exhausted", run.detail) for i in range(stopped, count))
                break
            else:
                faults.append(rule_fault(-1, rule_ids, "sandbox_failure", f"{run.detail}; rules {index}.."))
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
        if not await self._acquire_slot(self._acquire_timeout):
            raise CompileCheckUnavailable(f"no sandbox slot within {self._acquire_timeout * 1000:.0f} ms")
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
            try:
                run = await child.run(
                    check_request(self._seq, exprs[index:]),
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

    def _remember(self, exprs: list[object]) -> bytes:
        """Remember a list of string expressions for warming new children; the list's encoded exprs field."""
        key = tuple(exprs)
        encoded = self._recent.get(key)  # only lists of strings are remembered
        if encoded is not None:
            self._recent.move_to_end(key)
            return encoded
        if not all(isinstance(expr, str) for expr in exprs):
            return encode_exprs(exprs)
        encoded = self._recent[key] = encode_exprs(exprs)
        if len(self._recent) > _WARM_LISTS:
            self._recent.popitem(last=False)
        return encoded

    async def _warm(self, child: Child) -> bool:
        """Compile the recently used rule lists on a new child, so a spare resumes a list without compiling."""
        if not self._recent or self._waiters:
            return True
        self._seq += 1
        loop = asyncio.get_running_loop()
        run = await child.run(
            warm_request(self._seq, [list(key) for key in self._recent]),
            seq=self._seq,
            start=0,
            end=0,
            rule_timeout=SPAWN_TIMEOUT,
            budget_left=SPAWN_TIMEOUT,
            hard_at=loop.time() + SPAWN_TIMEOUT,
        )
        return run.ending == "complete"

    async def _take(self, hard_at: float) -> Child | None:
        while self._idle:
            child = self._idle.pop()
            if child.usable:
                return child
            self._discard(child)
        waiter: asyncio.Future[Child] = asyncio.get_running_loop().create_future()
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

    def _unclaim(self, waiter: asyncio.Future[Child]) -> None:
        """A child handed to a waiter that gave up goes back to the pool."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled() and waiter.exception() is None:
            self._release(waiter.result())

    def _offer(self, child: Child) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(child)
                return
        self._idle.append(child)

    def _release(self, child: Child) -> None:
        if child.usable and not self._closed:
            self._offer(child)
        else:
            self._discard(child)

    def _discard(self, child: Child, *, replace: bool = True) -> None:
        self._live.discard(child)
        child.kill()
        self._background(self._reap(child))
        if replace:
            self._replenish()

    async def _reap(self, child: Child) -> None:
        await child.reap()
        self._children.discard(child)

    def _replenish(self) -> None:
        while not self._closed and len(self._live) + self._spawning < self._target:
            self._spawning += 1
            self._background(self._spawn())

    async def _spawn(self) -> None:
        child = Child(asyncio.get_running_loop())
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
