"""The step handshake between the parent and a worker through shared memory, and how each waits.

A ``step`` is signalled through a row of counters in the shared block (:class:`Doorbell`): the
parent bumps the worker's command counter, the worker its done counter. Each side stores, fences
(:func:`memory_fence`), then loads, so a side that would rather sleep raises a flag first, and the
other side, after publishing, writes a one-byte wake-up (:data:`WAKE`) to the pipe only when that
flag is up. :class:`CommandWaiter` is how a worker waits for its next command (a brief spin when
commands usually follow its replies fast, then a sleep); :class:`ReplyWaiter` is how the parent
waits for a step's reply (a sleep through most of a typical step, a spin around its end).

Nothing here knows about envs: the rows, pipes and file descriptors come from the caller.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

#: The pipe message that only wakes a sleeping side of the shared-memory handshake.
WAKE = b"W"
#: Longest sleep of a waiting side between checks of the shared counters (with the fences below a
#: wake-up is never lost on x86; this bounds what a lost one costs where stores may pass loads):
#: the parent's slice, and the cap of a worker's doubling slices.
PARENT_SLICE_S = 0.02
WORKER_MAX_SLICE_S = 0.064
#: ``select`` takes only file descriptors below FD_SETSIZE.
_SELECT_MAX_FD = 1024
#: Longest busy-wait of a worker for its next command (see :class:`CommandWaiter`).
DEFAULT_SPIN_S = 200e-6


def memory_fence(_lock: Any = threading.Lock()) -> None:
    """A memory barrier between this process's shared-memory stores and loads: taking and
    releasing a lock are atomic read-modify-writes, on x86 locked instructions, which no load or
    store crosses (a full fence). On weaker CPUs (ARM) they only order like acquire/release, so a
    store may still pass a later load there; the sleeps of :class:`Doorbell` are sliced, which
    bounds what such a missed wake-up costs to one slice."""
    _lock.acquire()
    _lock.release()


class Doorbell:
    """One worker's step handshake through shared memory (a row of ``StepBuffers.ctrl``).

    The parent writes the actions, then the step's sequence number into ``CMD``; the worker,
    which watches ``CMD``, steps, writes the results, the reply's kind into ``REPLY``, then the
    sequence number into ``DONE``, which the parent watches. A side that stops watching to sleep on
    the pipe first raises its ``*_ASLEEP`` flag and looks once more; the other side, after
    publishing, sends a one-byte wake-up only when that flag is up. Each side stores, fences, then
    loads (Dekker's handshake), so a wake-up cannot be missed on x86; sleeps are sliced all the
    same (see :func:`memory_fence`).

    A round trip costs two stores and a few loads instead of two pipe syscalls and two wake-ups of
    a sleeping process (tens of microseconds each on a virtual machine); the pipe stays the way
    for everything that does not fit the block (``REPLY == PIPE``) and for errors.
    """

    SLOTS = 8  # 64 bytes: one cache line per worker
    CMD, DONE, PARENT_ASLEEP, WORKER_ASLEEP, REPLY = range(5)
    #: Reply kinds: everything is in the block / and the envs report success / pickled in the pipe.
    PLAIN, SUCCESS, PIPE = 0, 1, 2

    __slots__ = ("row", "conn")

    def __init__(self, row: np.ndarray, conn: Connection) -> None:
        self.row = row
        self.conn = conn

    # parent side
    def ring(self, seq: int) -> None:
        """Post step ``seq`` (the actions are written and fenced)."""
        self.row[self.CMD] = seq

    def worker_asleep(self) -> bool:
        """After ``ring`` and a fence: whether the worker sleeps on its pipe (send it a wake-up)."""
        return bool(self.row[self.WORKER_ASLEEP])

    def done(self, seq: int) -> bool:
        return bool(self.row[self.DONE] == seq)

    def parent_sleep(self, seq: int, sleep: Callable[[float], bool], seconds: float) -> bool:
        """Sleep on the pipe (``sleep(seconds)``: whether it became readable) unless step ``seq``
        is done; whether it is done or the pipe is readable (a wake-up, a pickled reply, the end)."""
        row = self.row
        row[self.PARENT_ASLEEP] = 1
        memory_fence()
        try:
            if row[self.DONE] == seq:
                return True
            return sleep(seconds)
        finally:
            row[self.PARENT_ASLEEP] = 0

    # worker side
    def command(self) -> int:
        return int(self.row[self.CMD])

    def worker_sleep(self, last: int, poller: Any) -> bool:
        """Sleep on the pipe until a step after ``last`` is posted (True) or the pipe is readable
        (False: a pickled command, a stale wake-up, or the parent's end)."""
        row = self.row
        row[self.WORKER_ASLEEP] = 1
        memory_fence()
        slice_s = 1e-3
        try:
            while row[self.CMD] == last:
                if poller.poll(int(slice_s * 1e3)):
                    return bool(row[self.CMD] != last)
                slice_s = min(2 * slice_s, WORKER_MAX_SLICE_S)
            return True
        finally:
            row[self.WORKER_ASLEEP] = 0

    def publish(self, seq: int, kind: int) -> None:
        """Step ``seq`` is done (its results written; a PIPE reply already sent): tell the parent."""
        row = self.row
        row[self.REPLY] = kind
        memory_fence()  # the results and REPLY before DONE
        row[self.DONE] = seq
        memory_fence()
        if kind != self.PIPE and row[self.PARENT_ASLEEP]:  # a PIPE reply wakes the parent itself
            self.conn.send_bytes(WAKE)


class CommandWaiter:
    """How a worker waits for its next command: spin briefly when the parent usually answers fast.

    Blocking costs a sleep and a wake-up per step (tens of microseconds each on a virtual machine,
    more when the core idles), a real share of a tight stepping loop whose parent turns a reply
    into the next command within microseconds. The worker keeps the gaps between its last
    replies and the next commands; when their median is below ``max_spin_s`` it polls (the
    shared-memory doorbell and the pipe, yielding the core to any other runnable process) for up
    to twice that median before it sleeps. A parent that runs a policy between steps (gaps of
    milliseconds) never triggers the spin, so it costs nothing there. ``max_spin_s=0`` always
    sleeps at once.
    """

    def __init__(self, fileno: int, max_spin_s: float = DEFAULT_SPIN_S, window: int = 9) -> None:
        self.poller = select.poll()
        self.poller.register(fileno, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        self.max_spin_s = max_spin_s
        self.window = window
        self.gaps: list[float] = []  # seconds from a reply to the next command, the last ``window``
        self.replied_at: float | None = None
        self.spins = 0  # waits that spun (for tests and diagnostics)

    def spin_budget(self) -> float:
        """How long the next wait spins before it blocks (0: block at once)."""
        if self.max_spin_s <= 0 or len(self.gaps) < 3:
            return 0.0
        typical = sorted(self.gaps)[len(self.gaps) // 2]
        return min(self.max_spin_s, 2.0 * typical) if typical < self.max_spin_s else 0.0

    def wait(self, bell: Doorbell | None = None, last: int = 0) -> bool:
        """Return once there is something to do: True for a step posted on ``bell`` after step
        ``last``, False when the pipe is readable (a pickled command, a wake-up, or EOF)."""
        row = bell.row if bell is not None else None
        budget = self.spin_budget()
        if budget > 0 and self.replied_at is not None:
            self.spins += 1
            deadline = self.replied_at + budget
            poll = self.poller.poll
            while True:
                if row is not None and row[Doorbell.CMD] != last:
                    return True
                if poll(0):
                    return False
                if time.perf_counter() >= deadline:
                    break
                os.sched_yield()
        if bell is None:
            self.poller.poll()
            return False
        return bell.worker_sleep(last, self.poller)

    def received(self) -> None:
        """A command came (not a wake-up): keep the gap since the last reply."""
        if self.replied_at is not None:
            self.gaps.append(time.perf_counter() - self.replied_at)
            del self.gaps[: -self.window]
            self.replied_at = None

    def replied(self) -> None:
        self.replied_at = time.perf_counter()


class ReplyWaiter:
    """How the parent waits for a step's reply: sleep through most of it, spin for its end.

    A parent blocked on the pipe is woken by the worker's reply (a wake-up of tens of microseconds
    on a virtual machine, during which the worker idles too). The parent keeps the durations of
    the last steps; for the next one it sleeps until ``spin_s`` + margin before the typical
    duration (a sleeping core wakes late), then polls (yielding the core to any other runnable
    process) until the margin after it, so a reply that comes when steps usually come is seen at
    once; an earlier one wakes the sleep as before, a later one is waited for blocking. The margin
    is ``spin_s`` or ``fraction`` of the typical step, whichever is longer (a slow step varies
    more); steps shorter than twice the margin are polled for from the start. ``spin_s=0`` always
    blocks. Only used while the parent has a core its workers do not need (fewer workers than
    cores).
    """

    def __init__(self, fileno: int, spin_s: float, fraction: float = 0.1, window: int = 9) -> None:
        self.fileno = fileno
        self.poller = select.poll()
        self.poller.register(fileno, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        self.spin_s = spin_s
        self.fraction = fraction
        self.window = window
        self.durations: list[float] = []  # seconds from sending a step to its reply, the last ``window``
        self.spins = 0  # waits that spun (for tests and diagnostics)

    def typical(self) -> float | None:
        if self.spin_s <= 0 or len(self.durations) < 3:
            return None
        return sorted(self.durations)[len(self.durations) // 2]

    def wait(
        self, sent_at: float, ready: Callable[[], bool] | None = None, sleep: Callable[[float], bool] | None = None
    ) -> None:
        """Sleep and spin as described; returns when the reply is there or the window is over
        (the caller then blocks as usual). ``ready()`` says whether the reply is there and
        ``sleep(seconds)`` sleeps until it may be (both default to the pipe being readable; the
        shared-memory path passes its :class:`Doorbell`'s)."""
        typical = self.typical()
        if typical is None:
            return
        if ready is None:
            poll = self.poller.poll

            def ready() -> bool:
                return bool(poll(0))

        margin = max(self.spin_s, self.fraction * typical)
        spin_from, spin_until = sent_at + typical - margin - self.spin_s, sent_at + typical + margin
        now = time.perf_counter()
        if now < spin_from and (sleep or self.sleep)(spin_from - now):
            return  # an early reply woke the sleep
        now = time.perf_counter()
        self.spins += 1
        while not ready() and now < spin_until:
            os.sched_yield()
            now = time.perf_counter()

    def sleep(self, seconds: float) -> bool:
        """Block up to ``seconds`` for the reply; whether it came. ``select`` sleeps to the
        microsecond but takes only descriptors below FD_SETSIZE (1024); above, ``poll`` sleeps
        whole milliseconds, rounded down (the spin then starts up to 1 ms early)."""
        seconds = max(0.0, seconds)
        if self.fileno < _SELECT_MAX_FD:
            return bool(select.select([self.fileno], [], [], seconds)[0])
        milliseconds = int(seconds * 1e3)
        return milliseconds > 0 and bool(self.poller.poll(milliseconds))

    def replied(self, sent_at: float) -> None:
        self.durations.append(time.perf_counter() - sent_at)
        del self.durations[: -self.window]
