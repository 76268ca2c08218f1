"""Admission by time: whether a new request may be accepted on its device (else
OverloadedError: HTTP 429 with Retry-After, Wyoming's error event).

A request is refused when the work that may go before it on its device would take longer
than `EngineConfig.max_queue_wait_s` at the device's observed speed, or when its work would
push an accepted request past its own deadline. Work is counted in the scheduler's unit (a
sentence's cost: phoneme ids for VITS) and turned into predicted device seconds by each
voice's observed speed (`Throughput`). Before a device has run anything there is no speed
to go by, and only the sentence bound (`SchedulerConfig.max_queued_sentences`: memory) applies.

The order of service (engine/scheduler.py) gives the bound used here: of two requests, the
one with less work left goes first (least work first) or they alternate (round-robin), so a
request b delays a request a by at most min(b's work left, a's work left).

Pure Python, no clock of its own (callers pass `now`), no lock: the device's worker calls it
under its own lock and feeds it the scheduler's accounting (`Accepted`, the work ahead).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from ..errors import OverloadedError

COST_PER_CHAR_PRIOR = 3.0
"""Phoneme ids per character of text before a voice's front end has finished a request: about
2 for English prose, 3 for numbers and symbols, so a request's cost is counted high, not low."""

RETRY_AFTER_S = (1.0, 60.0)
"""Bounds of the Retry-After a refusal carries (seconds)."""


class Throughput:
    """A device's speed for one voice: cost (phoneme ids) per second of busy device time, as
    exponentially weighted sums of each batch's cost and seconds. A ratio of sums, not a mean of
    per-batch rates: with several lanes a batch's busy seconds are the time since the previous
    one ended, which may be tiny, and one such sample must not read as a device of infinite speed.
    The default weight remembers about the last 20 batches (a couple of seconds under load on a
    CPU); a heavier one made the figure swing under overload."""

    def __init__(self, weight: float = 0.05):
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self.weight = weight
        self._cost = 0.0
        self._seconds = 0.0

    def add(self, cost: float, seconds: float) -> None:
        """One batch (or window of busy time): its cost and the device seconds it took."""
        if cost <= 0 or seconds < 0:
            return
        a = self.weight
        self._cost = (1 - a) * self._cost + a * float(cost)
        self._seconds = (1 - a) * self._seconds + a * float(seconds)

    @property
    def seconds_per_cost(self) -> float | None:
        """Device seconds one unit of cost takes; None before any batch was timed."""
        return self._seconds / self._cost if self._cost > 0 else None

    @property
    def cost_per_s(self) -> float | None:
        return self._cost / self._seconds if self._cost > 0 and self._seconds > 0 else None


def drain_seconds(work: Mapping[Hashable, float], speed: Mapping[Hashable, Throughput]) -> float | None:
    """Seconds a device needs for `work` (cost per voice) at the voices' observed speeds. A voice
    not timed yet is taken to be as slow as the slowest timed one (a device's voices share
    it); None if no voice of the device has been timed (then there is no figure to go by)."""
    known = [t.seconds_per_cost for t in speed.values() if t.seconds_per_cost is not None]
    if not known:
        return None
    slowest = max(known)
    total = 0.0
    for voice, cost in work.items():
        t = speed.get(voice)
        spc = t.seconds_per_cost if t is not None and t.seconds_per_cost is not None else slowest
        total += max(0.0, cost) * spc
    return total


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

    voice: str
    cost_left: float
    """Its work not yet started: queued sentences, plus what its front end has not produced
    yet (predicted from its text's length)."""
    deadline: float
    """Monotonic: admission keeps its finish before it (inf: none)."""


class DeviceAdmission:
    """One device's admission: its observed speed per voice, each voice's cost per character
    of text, and the decision for a new request."""

    def __init__(self, voices: Iterable[str], bound_s: float, lanes: int = 1):
        self.bound_s = bound_s
        self.lanes = max(1, lanes)
        self.speed: dict[str, Throughput] = {v: Throughput() for v in voices}
        self._cost_per_char: dict[str, list[float]] = {}  # voice -> [weighted cost, weighted chars]

    # ------------------------------------------------------------ what it learns
    def observe(self, voice: str, cost: float, seconds: float) -> None:
        """Work of `voice` done in `seconds` of device time."""
        self.speed.setdefault(voice, Throughput()).add(cost, seconds)

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
        t = self.speed.get(voice)
        return t.cost_per_s if t is not None else None

    # ------------------------------------------------------------ predictions
    def seconds_per_cost(self) -> dict[str, float] | None:
        """Each voice's seconds per unit of cost on this device (one not timed yet: the
        slowest timed); None before any work was timed."""
        known = {v: t.seconds_per_cost for v, t in self.speed.items() if t.seconds_per_cost is not None}
        if not known:
            return None
        slowest = max(known.values())
        return {v: known.get(v, slowest) for v in self.speed}

    def wait_s(self, work: Mapping[str, float]) -> float | None:
        """Seconds the device needs for `work` (cost per voice); None before any timing."""
        return drain_seconds(work, self.speed)

    def decide(self, voice: str, cost: float, now: float, accepted: Mapping[Hashable, Accepted],
               running: Mapping[str, float]) -> tuple[TimeAdmission, float] | None:
        """The time test for a new request of `cost` on `voice`, and its own synthesis time under
        load (its work on one lane: with its wait, its deadline); None before any timing.
        `running`: the cost of the work in flight, per voice (taken as half done)."""
        spc = self.seconds_per_cost()
        if spc is None:
            return None
        acc = {rid: (a.cost_left * spc.get(a.voice, 0.0), a.deadline) for rid, a in accepted.items()}
        in_flight = sum(0.5 * c * spc.get(v, 0.0) for v, c in running.items())
        own = cost * spc.get(voice, max(spc.values()))
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
