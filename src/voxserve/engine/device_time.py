"""The engine's accounting unit: predicted device seconds. One model per device, learned from
the work it runs; the scheduler orders and bounds work by it and admission turns the same
figures into waits and deadlines (engine/scheduler.py, engine/admission.py). Pure Python."""

from __future__ import annotations

from collections.abc import Hashable

PRIOR_S_PER_COST = 0.001
"""Device seconds per unit of cost (a phoneme id) before a device has timed any work: a small
CPU's VITS speed (docs/benchmarks.md). It only orders and classes work until the first batch
is timed; admission waits for a timed figure."""


class Throughput:
    """A device's speed for one voice: cost per second of busy device time, as exponentially
    weighted sums of each batch's cost and seconds. A ratio of sums, not a mean of per-batch
    rates: with several lanes a batch's busy seconds are the time since the previous one ended,
    which may be tiny, and one such sample must not read as a device of infinite speed. The
    default weight remembers about the last 20 batches (a couple of seconds under load on a
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


class DeviceTime:
    """Predicted device seconds of a voice's work on one device: its cost (the voice's unit:
    phoneme ids for VITS) times the voice's observed seconds per unit. Two figures per voice:
    the work's own time (`seconds`: from batches that had the device to themselves, never above
    the pace under load), which orders and classes work, and the device's pace under its current
    load (`under_load_s`: busy time over the work done, overlapping batches counted once), which
    predicts waits. Under load the pace grows (lanes share the cores, other processes take
    some), and a sentence classed by it alone would stop being short exactly when short work
    matters most. A voice not timed yet counts as the slowest timed one (a device's voices share
    it); before any timing, `prior_s_per_cost`."""

    def __init__(self, prior_s_per_cost: float = PRIOR_S_PER_COST):
        if prior_s_per_cost <= 0:
            raise ValueError("prior_s_per_cost must be > 0")
        self.prior_s_per_cost = prior_s_per_cost
        self.speed: dict[Hashable, Throughput] = {}  # under load: every batch
        self.alone: dict[Hashable, Throughput] = {}  # batches that ran with nothing beside them

    def observe(self, voice: Hashable, cost: float, seconds: float, alone: bool = False) -> None:
        """Work of `voice` of `cost` done in `seconds` of device time; `alone`: nothing else ran
        on the device meanwhile (the seconds are the work's own)."""
        self.speed.setdefault(voice, Throughput()).add(cost, seconds)
        if alone:
            self.alone.setdefault(voice, Throughput()).add(cost, seconds)

    @property
    def timed(self) -> bool:
        """Whether any work of the device has been timed (else the prior stands)."""
        return any(t.seconds_per_cost is not None for t in self.speed.values())

    def per_cost(self, voice: Hashable) -> float:
        """Seconds one unit of the voice's cost takes on this device under its current load."""
        t = self.speed.get(voice)
        if t is not None and t.seconds_per_cost is not None:
            return t.seconds_per_cost
        known = [t.seconds_per_cost for t in self.speed.values() if t.seconds_per_cost is not None]
        return max(known) if known else self.prior_s_per_cost

    def own_per_cost(self, voice: Hashable) -> float:
        """Seconds one unit of the voice's cost takes with the device to itself, never more
        than the pace under load: contention only slows work, so a slower figure from batches
        alone comes from ones whose fixed overheads outweigh their work (the warm-up's
        "Hello.", an idle spell's one word), and it would class almost nothing as short."""
        t = self.alone.get(voice)
        load = self.per_cost(voice)
        if t is not None and t.seconds_per_cost is not None:
            return min(t.seconds_per_cost, load)
        return load

    def seconds(self, voice: Hashable, cost: float) -> float:
        """Predicted device seconds of `cost` of the voice's work: its own time, not its wait."""
        return max(0.0, cost) * self.own_per_cost(voice)

    def under_load_s(self, voice: Hashable, cost: float) -> float:
        """Seconds the device, at its pace under its current load, takes to get through `cost`
        of the voice's work (what admission predicts waits with)."""
        return max(0.0, cost) * self.per_cost(voice)

    def cost_per_s(self, voice: Hashable) -> float | None:
        """The voice's cost per second under load (None before it was timed)."""
        t = self.speed.get(voice)
        return t.cost_per_s if t is not None else None
