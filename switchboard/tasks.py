"""Background tasks that stop when told: a cancellation is sent again until the task ends.

Python 3.11's ``asyncio.wait_for`` (used by libraries and, once, by a background loop of ours) returns the inner
result instead of raising when a cancellation arrives in the same loop iteration as that result, so one
``task.cancel()`` can be lost and a plain ``await task`` then waits forever. ``stop`` repeats the cancellation
and gives up, loudly, after a bound, so shutting a process or a test down never hangs on a background loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger("switchboard.tasks")

RESEND_AFTER = 0.5  # seconds between cancellations of a task that has not ended yet


async def stop(task: asyncio.Task[object], *, within: float = 10.0) -> bool:
    """Cancel ``task`` and wait for it to end, cancelling it again while it runs, at most ``within`` seconds.

    True when it ended; False (and a warning) when it still runs after ``within``. Its result or error is
    retrieved and dropped: a background loop reports its own failures.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not task.done():
        task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            log.warning("background task %s did not stop within %g s", task.get_name(), within)
            return False
        await asyncio.wait({task}, timeout=min(RESEND_AFTER, left))
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.result()
    return True
