"""Admission by time: whether a new request may be accepted on its device (else
OverloadedError: HTTP 429 with Retry-After, Wyoming's error event).

A request is refused when the work that may go before it on its device would take longer
than `EngineConfig.max_queue_wait_s`, or when its work would push an accepted request past its
own deadline. Work is counted in the scheduler's unit, predicted device seconds, by the same
model the scheduler orders by (`DeviceTime`, engine/device_time.py: each voice's observed
speed on the device). Before a device has timed anything the model has only its prior, and only
the sentence bound (`SchedulerConfig.max_queued_sentences`: memory) applies.

The order of service (engine/scheduler.py) gives the bound used here: of two requests, the
one with less work left goes first (least work first) or they alternate (round-robin), so a
request b delays a request a by at most min(b's work left, a's work left).

Pure Python, no clock of its own (callers pass `now`), no lock: the device's worker calls it
under its own lock and feeds it the scheduler's accounting (`Accepted`, the work ahead).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from ..errors import OverloadedError
from .device_time import DeviceTime

COST_PER_CHAR_PRIOR = 3.0
"""Phoneme ids per character of text before a voice's front end has finished a request: about
2 for English prose, 3 for numbers and symbols, so a request's cost is counted high, not low."""

RETRY_AFTER_S = (1.0, 60.0)
"""Bounds of the Retry-After a refusal carries (seconds)."""


@dataclass(frozen=True)
class TimeAdmission:
    """`time_admission`'s answer (seconds)."""

    wait_s: float
    """The new request's wait: the work that may go before it (see "Admission by time")."""
    excess_s: float
    """How far the worse of the two tests overshoots (<= 0: admit): the new request's wait past
    the bound, or an accepted request's finish past its deadline."""
    retry_s: float = 0.0
    """When a refused request may find room: once its wait has drained to the bound, and any
    accepted request it would make late has finished (at the latest by its pairwise bound)."""
    late_request: Hashable | None = None
    """An accepted request that would be late, if that is a reason."""

    @property
    def admit(self) -> bool:
        return self.excess_s <= 0


def time_admission(now: float, bound_s: float, new_s: float, accepted: Mapping[Hashable, tuple[float, float]],
                   in_flight_s: float = 0.0, lanes: int = 1) -> TimeAdmission:
    """Whether a request with `new_s` seconds of work (at the device's whole speed) may be
    admitted. `accepted`: request -> (seconds of work left, deadline) for the requests already
    accepted (deadline inf: none); `in_flight_s`: what is left of the batches running; `lanes`:
    batches the device runs at once, each at 1 / lanes of its speed (a request's own sentences
    run one lane at a time). By the pairwise bound (module doc) the new request waits in_flight
    + sum over b of min(left_b, new), which must be <= bound_s, and an accepted a finishes by
    now + in_flight + sum over b of min(left_b, left_a) (b = a included: its own work) +
    (lanes - 1) x left_a (its own work on one lane while the others may idle; work of others
    is not assumed to fit beside it: urgent lanes preempt its lane), plus min(new, left_a) with
    the new request, which must stay <= its deadline (the engine's: arrival + bound + lanes x
    its work, so at admission its slack is the bound less its wait)."""
    lefts = sorted(left for left, _ in accepted.values())
    prefix = [0.0]
    for x in lefts:
        prefix.append(prefix[-1] + x)

    def shorter_sum(x: float) -> float:
        """sum over accepted b of min(left_b, x)"""
        k = bisect.bisect_right(lefts, x)
        return prefix[k] + (len(lefts) - k) * x

    wait = in_flight_s + shorter_sum(new_s)
    excess, late = wait - bound_s, None
    retry = max(0.0, excess)
    for rid, (left, deadline) in accepted.items():
        if deadline == float("inf"):
            continue
        delay = min(new_s, left)
        if delay <= 0:
            continue
        # shorter_sum(left) counts a itself once, as min(left, left): a's own work
        finish = in_flight_s + shorter_sum(left) + (lanes - 1) * left  # from now, without the new request
        over = now + finish + delay - deadline
        if over > 0:
            retry = max(retry, finish)
            if over > excess:
                excess, late = over, rid
    return TimeAdmission(wait, excess, retry, late)


@dataclass(frozen=True)
class Accepted:
    """An accepted request as admission sees it."""

    seconds_left: float
    """Predicted device seconds of its work not yet started: queued sentences, plus what its
    front end has not produced yet (predicted from its text's length)."""
    deadline: float
    """Monotonic: admission keeps its finish before it (inf: none)."""


class DeviceAdmission:
    """One device's admission: each voice's cost per character of text, and the decision for a
    new request in the scheduler's unit (`time`: the device's model of its voices' speed)."""

    def __init__(self, time: DeviceTime, bound_s: float, lanes: int = 1):
        self.time = time
        self.bound_s = bound_s
        self.lanes = max(1, lanes)
        self._cost_per_char: dict[str, list[float]] = {}  # voice -> [weighted cost, weighted chars]

    # ------------------------------------------------------------ what it learns
    def cost_per_char(self, voice: str) -> float:
        c = self._cost_per_char.get(voice)
        return c[0] / c[1] if c else COST_PER_CHAR_PRIOR

    def learn_cost_per_char(self, voice: str, chars: int, cost: int) -> None:
        """A request's front end ended: its text's length and the cost of its sentences."""
        if chars <= 0 or cost <= 0:
            return
        c = self._cost_per_char.setdefault(voice, [0.0, 0.0])
        c[0], c[1] = 0.8 * c[0] + 0.2 * cost, 0.8 * c[1] + 0.2 * chars  # a ratio of sums: long texts weigh more

    def cost_per_s(self, voice: str) -> float | None:
        return self.time.cost_per_s(voice)

    # ------------------------------------------------------------ predictions
    def wait_s(self, work: Mapping[str, float]) -> float | None:
        """Seconds the device needs for `work` (cost per voice); None before any timing."""
        if not self.time.timed:
            return None
        return sum(self.time.under_load_s(v, c) for v, c in work.items())

    def decide(self, voice: str, cost: float, now: float, accepted: Mapping[Hashable, Accepted],
               running: Mapping[str, float]) -> tuple[TimeAdmission, float] | None:
        """The time test for a new request of `cost` on `voice`, and its own synthesis time under
        load (its work on one lane: with its wait, its deadline); None before any timing.
        `running`: the cost of the work in flight, per voice (taken as half done)."""
        if not self.time.timed:
            return None
        acc = {rid: (a.seconds_left, a.deadline) for rid, a in accepted.items()}
        in_flight = sum(0.5 * self.time.under_load_s(v, c) for v, c in running.items())
        own = self.time.under_load_s(voice, cost)
        return time_admission(now, self.bound_s, own, acc, in_flight, self.lanes), self.lanes * own

    # ------------------------------------------------------------ refusals
    def check(self, voice: str, cost: float, now: float, accepted: Mapping[Hashable, Accepted],
              running: Mapping[str, float]) -> float:
        """Raise OverloadedError for a request that may not be accepted now; else return its
        deadline (monotonic; inf before any timing)."""
        adm = self.decide(voice, cost, now, accepted, running)
        if adm is None:
            return float("inf")
        a, own = adm
        if not a.admit:
            why = (f"its wait would be about {a.wait_s:.1f} s" if a.late_request is None
                   else "it would delay accepted requests past their deadlines")
            raise OverloadedError(f"the server is busy ({why}; the bound is {self.bound_s:g} s); retry later",
                                  retry_after_s=retry_after(a.retry_s))
        return now + self.bound_s + own


def check_memory(queued: int, waiting: int, bound: int, wait_s: Callable[[], float | None]) -> None:
    """The sentence bound (memory): refuse while `queued` sentences plus `waiting` requests
    (accepted, none of their sentences produced yet) reach `bound`; `wait_s` (called only
    then) gives the Retry-After."""
    if queued + waiting >= bound:
        raise OverloadedError(f"the server is busy ({queued} sentences queued); retry later",
                              retry_after_s=retry_after(wait_s() or 1.0))


def retry_after(seconds: float) -> float:
    lo, hi = RETRY_AFTER_S
    return min(hi, max(lo, seconds))
