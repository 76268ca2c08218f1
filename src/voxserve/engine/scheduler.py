"""Sentence-level dynamic batching across requests. Pure Python: no torch, no threads, no clock
of its own (callers pass `now` in seconds), so it is unit-tested with a fake runner.

One call, one meaning: `schedule(now, pick, room)` returns the next batch that `pick` (a frozen
`Pick`: which requests qualify, the size budget, whether it may wait for companions) may take;
`next_deadline(now, pick)` says when one will be due. Executors build their picks once.

Accounting unit
---------------
Everything that compares work across requests or voices, or against time, is in predicted
device seconds (`DeviceTime`, engine/device_time.py: a sentence's cost times its voice's
seconds per unit on this device, timed on batches that had the device to themselves): the order
of service, the classes of `Pick.waits_s`, fairness between voices, starvation and max_wait
bounds; admission (engine/admission.py) reads the same model's pace under load for waits. Only a batch's shape is bounded in the runner's unit (phoneme ids:
`max_batch_phonemes`, `max_length_ratio`: padding and cut sizes).

Model of the queue
------------------
Each request is a FIFO of sentences ("items") that its text front end appends as it goes.
Items of one request are always taken in order, so its audio comes back in order.
A batch holds items of one voice only. Voices share the device by time (fair queueing between
voices): the caller reports each batch's seconds to `complete`, and of the voices with a batch
due, the one that has used the least device time goes next (ties: the least recently served).
A voice whose batches are slow (Bark: seconds a sentence) thus cannot hold a fast one (VITS) to
one batch per slow batch; each gets an equal share while both have work. A voice that had
nothing to do banks no credit: it rejoins at the level of the least-served busy voice, so its
next batch follows the batch in flight. Without reported times every voice stays at 0 and they
simply take turns.

Order of service (who goes first)
---------------------------------
Requests are served round-robin (fair queueing): each request counts the sentences it has had
scheduled, and a new request starts at the count of the least-served active request, so it
joins the current round instead of jumping every queue. Sentences are taken lowest count first
(ties: the earlier request), so a 1,000-sentence request delays a one-sentence request by about
one batch. Before that order:
1. a request whose next sentence has waited `max_starve_ms` (since it arrived or since the
   request's last service) - nothing starves, whatever else arrives. A batch led by such a
   request (a rescue) is not followed by another while a request that is not starving waits:
   rescues and the order below take turns. Under sustained overload every long request's
   sentences wait past the bound, and without the turns the order would collapse into
   oldest-first, a one-sentence request waiting behind one rescue batch per starving request;
2. the least predicted device time between a client and what it waits for (`_left_s`): a
   streaming request's first sentence counts alone (time to first audio), any other request counts all it has queued
   (once its front end is done; unknown ends go last). So a first sentence goes ahead of long
   requests' remainders, and a short request's last sentence is not starved by the stream of
   new requests' first sentences.
Within one round each request gives one sentence; if the batch still has room after a full
round, later rounds follow (a lone long request fills whole batches).

When a batch starts
-------------------
A voice's batch starts as soon as it is full (`max_batch_size` items or `max_batch_phonemes`
cost) or its oldest item has waited `max_wait_ms`, whichever comes first. With max_wait_ms = 0
a free worker takes whatever is queued at once (Triton's max_queue_delay semantics).

Length-aware grouping
---------------------
The first item in service order anchors the batch; an item is added only if its cost stays
within `max_length_ratio` of the batch's shortest and longest items, so one long sentence does
not make short ones pay for its padding. A skipped item keeps its place in line while the
requests that were served move back a round, so it anchors (or joins) one of the next batches:
grouping cannot starve anything.

Cut sentences
-------------
The runner may cut a long item (`Voice.run_pieces`): a stream's first sentence after a short
head (first audio sooner), any item over about 1.25 x max_batch_phonemes into pieces of about
max_batch_phonemes (no batch holds the device much longer than a full one). The rest comes back
through `requeue` and runs in a later batch, ahead of its request's later sentences. So that a
request's audio stays in order, an item that may be cut never shares a batch with its request's
later items: a stream's first sentence runs without them (unless it is short, at most
max_batch_phonemes / 2, and then it is not marked for a head cut: a two-sentence request then
needs one batch, not two), and an item over 1.25 x max_batch_phonemes runs alone anyway.

In flight
---------
A request has at most one batch in flight (but see "Spill"): its items are not scheduled (nor
counted as due) while a batch holding one of them runs. With one worker thread this never binds (a batch is
completed before the next is scheduled); with several (the engine's CPU lanes) it keeps a
request's audio in order and puts a cut sentence's rest back before its successors can run.

Spill
-----
A pick with `second=True` also takes a second item of a request with one batch in flight:
a whole sentence after its first (not a stream's first audio, not the rest of a cut sentence).
The engine asks for it only when a CPU lane and a core would otherwise idle (a lone request's
sentences, the end of a load), and puts the audio back in order before delivery.

Urgent work
-----------
A request is urgent while its client waits for little: `Pick.short(max_s)` takes requests whose
wait (`_left_s`: a short request's end, a stream's short first sentence, a long request's last
sentence) is at most max_s predicted device seconds, `Pick.long(max_s)` the others: the CPU
executor runs the two classes on threads of different OS priority (engine/executors.py).
Within a class the order above holds, rescues included (they take turns within the class),
except within a class of short waits: requests that its work finishes (a short request, a
long one's last sentence) go before streams' first sentences of longer requests, each group in
arrival order. All of them wait for little, and least-work-first would let a stream of
slightly shorter newcomers hold one back; a client whose request ends with the work waits for
all of it, one whose stream starts with it hears audio and then waits for the rest anyway.

Step voices
-----------
A voice run by a step runner (autoregressive: its sequences advance a step at a time) takes
its items as sequences that join the running ones between steps. The caller passes `room`, how
many more each such voice may take now (data that changes every step, not a mode); a batch
of one is then due at once (nothing is gained by waiting for companions: the runner batches
what is active at every step), and its items stay in flight (`complete` per item, as each sequence finishes). The caller charges the steps' time
to the voice (`charge`), so voices still share the device by time. A request's later sentences
may join while earlier ones run, but never take the last free slot: a newcomer (a request with
nothing in flight, which also goes first) joins at the next step.

Cancellation drops a request's queued items at once (they are never run). Back-pressure:
`admit()` refuses new requests while `max_queued_sentences` items are queued; items of accepted
requests are always accepted.

Admission by time
-----------------
The engine refuses a request whose wait would pass a bound; that decision lives in
`engine/admission.py`. The scheduler gives it the queued cost per voice and per request
(`queued_cost_of`, `pending_cost`) and the model (`time`) that turns them into device seconds. The order of service above gives the bound it uses: of
two requests, the one with less work left goes first (least work first) or they alternate
(round-robin), so a request b delays a request a by at most min(b's work left, a's work left).
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .device_time import DeviceTime


@dataclass(frozen=True)
class Pick:
    """What one `schedule` call may take. An executor builds its picks once (the serial one
    `ANY`; the CPU one, per lane, its class and its spill), so no scheduler method takes a
    mode flag: `_takers` reads the pick once, the rest works on the requests it gave."""

    items: int | None = None
    """Size budget: items per batch (None: `max_batch_size`). A smaller budget is due as soon
    as it is full (the CPU lanes: 1)."""
    wait: bool = True
    """A batch that is not full waits up to `max_wait_ms` for companions; False: it starts now
    (a step's joins, shutdown, a caller stepping by hand)."""
    waits_s: tuple[float, float] = (float("-inf"), float("inf"))
    """Which requests qualify, by the predicted device seconds their client waits for
    (`_left_s`): lo < wait <= hi. A finite hi is a class of short waits ("Urgent work")."""
    second: bool = False
    """A request with one batch in flight may give a second one (see "Spill")."""

    @staticmethod
    def short(max_s: float, items: int | None = None) -> "Pick":
        """Requests whose client waits for at most `max_s` ("Urgent work")."""
        return Pick(items=items, waits_s=(float("-inf"), max_s))

    @staticmethod
    def long(max_s: float, items: int | None = None) -> "Pick":
        """The others (and requests whose end is not known yet)."""
        return Pick(items=items, waits_s=(max_s, float("inf")))


ANY = Pick()
"""Every request; a batch that is not full waits for companions (the serial executor)."""
NOW = Pick(wait=False)
"""Every request; whatever is queued starts now."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 8
    """Sentences per batch."""
    max_batch_phonemes: int = 256
    """Phoneme ids per batch (sum of item costs; Bark sentences cost 2 per character, about
    what a Piper voice's do). An item over 1.25x it runs alone, cut into pieces of about this
    cost by a VITS voice (exact joins; see "Cut sentences"); a Bark one runs whole.
    A batch cannot be interrupted, so this bounds how long a new request waits for the batch in
    flight: 256 ids (about 3 s of audio) keeps that short on a small CPU (docs/serving.md,
    "Figures behind the engine's defaults"). On a
    GPU, where a batch costs little more than one sentence, raise it (e.g. 4096)."""
    max_wait_ms: float = 2.0
    """Longest an item waits for companions before its batch starts anyway."""
    max_queued_sentences: int = 256
    """New requests are refused (HTTP 429) while this many sentences are queued."""
    max_length_ratio: float = 4.0
    """Length-aware grouping: longest / shortest item cost allowed in one batch (0 = off)."""
    max_starve_ms: float = 4000.0
    """A request waiting this long for its next sentence goes before first-sentence priority."""

    def validate(self) -> "SchedulerConfig":
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if self.max_batch_phonemes < 1:
            raise ValueError("max_batch_phonemes must be at least 1")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        if self.max_queued_sentences < 1:
            raise ValueError("max_queued_sentences must be at least 1")
        if self.max_starve_ms < 0:
            raise ValueError("max_starve_ms must be >= 0")
        if self.max_length_ratio != 0 and self.max_length_ratio < 1:
            raise ValueError("max_length_ratio must be 0 (off) or >= 1")
        return self


@dataclass
class Item:
    """One sentence waiting to be synthesised."""

    request_id: Hashable
    index: int
    cost: int
    payload: Any
    arrival: float
    """Seconds (caller's clock) when it was queued."""
    continues: bool = False
    """The rest of a sentence whose first piece has been delivered (see `requeue`)."""


@dataclass
class Batch:
    voice: Hashable
    items: list[Item]
    early: tuple[int, ...] = ()
    """Positions of items that are a streaming request's first sentence (its client waits for
    first audio): the runner may deliver their audio's head before the batch ends."""

    @property
    def cost(self) -> int:
        return sum(it.cost for it in self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class _Request:
    id: Hashable
    voice: Hashable
    seq: int
    streaming: bool
    queue: deque = field(default_factory=deque)
    served: int = 0
    """Sentences scheduled so far."""
    vserved: int = 0
    """Round-robin position: starts at the least-served active request's, +1 per sentence."""
    last_service: float = float("-inf")
    running: int = 0
    """Items in batches that have started and not been reported done."""
    input_done: bool = False
    """The front end has given every sentence: the remaining work is known."""


class Scheduler:
    def __init__(self, config: SchedulerConfig | None = None, time: DeviceTime | None = None):
        self.config = (config or SchedulerConfig()).validate()
        self.time = time or DeviceTime()  # the accounting unit: predicted device seconds
        self._requests: dict[Hashable, _Request] = {}
        self._seq = itertools.count()
        self._voice_turn: deque[Hashable] = deque()  # voices in order of arrival
        self._voice_time: dict[Hashable, float] = {}  # device seconds used, per voice (see module doc)
        self._voice_served: dict[Hashable, int] = {}  # batch number of each voice's last batch
        self._batches = itertools.count()
        self._rescued: set[tuple] = set()  # (voice, class) whose last batch was led by a starving request
        self.queued = 0  # items waiting (not started)
        self.queued_cost = 0
        self._voice_queued_cost: Counter = Counter()  # queued_cost, per voice

    # ---------------------------------------------------------------- requests
    def admit(self) -> bool:
        """Whether a new request may be accepted now (back-pressure)."""
        return self.queued < self.config.max_queued_sentences

    def add_request(self, request_id: Hashable, voice: Hashable, streaming: bool = False) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already exists")
        active = [r.vserved for r in self._requests.values() if r.voice == voice and (r.queue or r.running)]
        if not active:  # the voice was idle: it rejoins at the least-served busy voice's level
            busy = [self._voice_time.get(v, 0.0) for v in self._voice_turn if v != voice and self._busy(v)]
            self._voice_time[voice] = max(self._voice_time.get(voice, 0.0), min(busy, default=0.0))
        self._requests[request_id] = _Request(request_id, voice, next(self._seq), streaming,
                                              vserved=min(active, default=0))
        if voice not in self._voice_turn:
            self._voice_turn.append(voice)

    def add_item(self, request_id: Hashable, index: int, cost: int, payload: Any, now: float) -> bool:
        """Queue one sentence of an accepted request. False if the request is gone (cancelled)."""
        r = self._requests.get(request_id)
        if r is None:
            return False
        r.queue.append(Item(request_id, index, max(int(cost), 1), payload, now))
        self.queued += 1
        self.queued_cost += max(int(cost), 1)
        self._voice_queued_cost[r.voice] += max(int(cost), 1)
        return True

    def requeue(self, request_id: Hashable, index: int, cost: int, payload: Any, now: float) -> bool:
        """Put the rest of a sentence that was cut (its first piece delivered) at the front of
        its request's queue: it is that request's next item. For a stream it counts as the
        stream's first audio did (its own cost alone), so a client that has started playing a
        sentence gets the rest before longer work. False if the request is gone."""
        r = self._requests.get(request_id)
        if r is None:
            return False
        r.queue.appendleft(Item(request_id, index, max(int(cost), 1), payload, now, continues=True))
        self.queued += 1
        self.queued_cost += max(int(cost), 1)
        self._voice_queued_cost[r.voice] += max(int(cost), 1)
        return True

    def cancel(self, request_id: Hashable) -> int:
        """Forget a request; its queued items are dropped. Returns how many were dropped."""
        r = self._requests.pop(request_id, None)
        if r is None:
            return 0
        dropped = len(r.queue)
        cost = sum(it.cost for it in r.queue)
        self.queued -= dropped
        self.queued_cost -= cost
        self._voice_queued_cost[r.voice] -= cost
        r.queue.clear()
        return dropped

    def input_done(self, request_id: Hashable) -> None:
        """The request will add no more items (its remaining work is what is queued)."""
        r = self._requests.get(request_id)
        if r is not None:
            r.input_done = True

    def finish_request(self, request_id: Hashable) -> None:
        """The request needs nothing more (all its audio delivered)."""
        self.cancel(request_id)

    def has_request(self, request_id: Hashable) -> bool:
        return request_id in self._requests

    def pending_items(self, request_id: Hashable) -> int:
        r = self._requests.get(request_id)
        return len(r.queue) if r else 0

    def pending_cost(self, request_id: Hashable) -> int:
        """The cost of a request's queued items (not started)."""
        r = self._requests.get(request_id)
        return sum(it.cost for it in r.queue) if r else 0

    def queued_cost_of(self, voice: Hashable) -> int:
        """The cost of a voice's queued items (not started)."""
        return self._voice_queued_cost.get(voice, 0)

    def waiting_requests(self) -> int:
        """Requests with queued items and no batch in flight (that a batch may come from)."""
        return sum(1 for r in self._requests.values() if r.queue and not r.running)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # ---------------------------------------------------------------- scheduling
    @staticmethod
    def _waited(r: _Request, now: float) -> float:
        """Seconds the request's next sentence has waited (since it arrived or since the
        request's last service)."""
        return now - max(r.queue[0].arrival, r.last_service)

    def _starving(self, r: _Request, now: float) -> bool:
        return self._waited(r, now) >= self.config.max_starve_ms / 1000.0

    @staticmethod
    def _first(r: _Request) -> bool:
        """The request's next item is (the rest of) a stream's first sentence."""
        return r.streaming and (r.served == 0 or r.queue[0].continues)

    def _left_s(self, r: _Request) -> float:
        """Predicted device seconds between the client and what it waits for: a stream's first
        audio (its first sentence), else the end of the request (all it has queued, known once
        its front end is done; inf before). Ordering by it, a short request's last sentence
        competes with new requests' first sentences instead of waiting behind all of them:
        under steady load there always is a new one."""
        return self.time.seconds(r.voice, r.queue[0].cost) if self._first(r) else self._queued_s(r)

    def _queued_s(self, r: _Request) -> float:
        """Predicted device seconds of all the request has left (inf until its front end is done)."""
        return self.time.seconds(r.voice, sum(it.cost for it in r.queue)) if r.input_done else float("inf")

    @staticmethod
    def _spillable(r: _Request) -> bool:
        """A second item of a request with one in flight may run (see "Spill"): a whole
        sentence, not the rest of a cut one (a stream's first sentence never qualifies: nothing
        of its request is in flight before it)."""
        return r.running == 1 and not r.queue[0].continues

    def _takers(self, voice: Hashable, pick: Pick, step: bool = False) -> list[_Request]:
        """The voice's requests that `pick` may take from: queued items, no batch in flight
        (unless a second may spill; a step voice's sequences run side by side: any), and a
        wait within the pick's class."""
        lo, hi = pick.waits_s
        return [r for r in self._requests.values()
                if r.voice == voice and r.queue
                and (not r.running or step or (pick.second and self._spillable(r)))
                and lo < self._left_s(r) <= hi]

    def _order(self, voice: Hashable, rs: list[_Request], now: float, pick: Pick, step: bool) -> list[_Request]:
        """`rs` in service order (a step voice's: those with nothing in flight first)."""
        starving = {r.id for r in rs if self._starving(r, now)}
        if (voice, pick.waits_s) in self._rescued and len(starving) < len(rs):
            starving = set()  # the last batch was a rescue: the others' turn (module doc)
        short = pick.waits_s[1] < float("inf")

        def key(r: _Request):
            if r.id in starving:
                return (0, 0, r.vserved, r.seq)
            if short:  # arrival order bounds each one's wait; requests that end with this work first
                return (1, int(self._first(r) and self._queued_s(r) > pick.waits_s[1]), r.seq, 0)
            return (1, self._left_s(r), r.vserved, r.seq)

        return sorted(rs, key=(lambda r: (r.running > 0, key(r))) if step else key)

    @staticmethod
    def _candidates(rs: list[_Request]) -> Iterable[Item]:
        """Items of requests in service order: round 0 takes each request's next item, round 1
        the one after, ... (a request's items stay in order)."""
        depth = 0
        while rs:
            nxt = []
            for r in rs:
                if depth < len(r.queue):
                    yield r.queue[depth]
                    nxt.append(r)
            rs = nxt
            depth += 1

    def _size(self, pick: Pick) -> int:
        return self.config.max_batch_size if pick.items is None else min(pick.items, self.config.max_batch_size)

    def next_deadline(self, now: float, pick: Pick = ANY) -> float | None:
        """Seconds until a batch that `pick` may take is due (0 = now), or None if none is
        queued (requests with a batch in flight wait)."""
        best = None
        for voice in self._voice_turn:
            d = self._due_in(self._takers(voice, pick), self._size(pick), now)
            if d is not None and (best is None or d < best):
                best = d
        return best

    def _due_in(self, rs: list[_Request], size: int, now: float) -> float | None:
        """Seconds until a batch of `size` items from `rs` is due: at once when full (by items
        or phonemes), else when its oldest item has waited max_wait_ms."""
        c = self.config
        count = cost = 0
        oldest = None
        for r in rs:
            count += len(r.queue)
            if cost < c.max_batch_phonemes:
                cost += sum(it.cost for it in r.queue)
            a = r.queue[0].arrival  # items of a request arrive in order: its head is its oldest
            oldest = a if oldest is None else min(oldest, a)
        if oldest is None:
            return None
        if count >= size or cost >= c.max_batch_phonemes:
            return 0.0
        return max(0.0, oldest + c.max_wait_ms / 1000.0 - now)

    def _busy(self, voice: Hashable) -> bool:
        return any(r.voice == voice and (r.queue or r.running) for r in self._requests.values())

    def voice_time(self, voice: Hashable) -> float:
        """Device seconds the voice's batches have used (as reported to `complete`)."""
        return self._voice_time.get(voice, 0.0)

    def schedule(self, now: float, pick: Pick = ANY, room: Mapping[Hashable, int] | None = None) -> Batch | None:
        """The next batch that `pick` may take, or None if none is due yet (see `next_deadline`).
        room: step voices (see "Step voices"): items each may take now; such a voice is due at
        once when it has room and anything queued (its sequences join the running ones)."""
        best = None  # least device time used first; among equals, the least recently served
        for voice in self._voice_turn:
            size, step = self._size(pick), room is not None and voice in room
            if step:
                if room[voice] <= 0:
                    continue
                size = min(size, room[voice])
            rs = self._takers(voice, pick, step)
            due = self._due_in(rs, size, now)
            if due is None or (due > 0 and pick.wait and not step):
                continue
            key = (self._voice_time.get(voice, 0.0), self._voice_served.get(voice, -1))
            if best is None or key < best[0]:
                best = (key, voice, rs, size, step)
        if best is None:
            return None
        _, voice, rs, size, step = best
        self._voice_served[voice] = next(self._batches)
        batch = self._build(voice, self._order(voice, rs, now, pick, step), now, size, int(step), pick.waits_s)
        return batch if batch.items else None

    def _build(self, voice: Hashable, rs: list[_Request], now: float, size: int, reserve: int,
               cls: tuple[float, float]) -> Batch:
        """A batch of at most `size` items from `rs` (in service order); `reserve`: slots of a
        step voice left for a newcomer; `cls`: the pick's class (rescues take turns within it)."""
        c = self.config
        # a stream's first item takes no successor of its request into the batch unless it is
        # short (<= max_batch_phonemes / 2): a longer one may be cut (see "Cut sentences") and
        # its rest must come before them; a short one with successors is not marked early
        chosen: list[Item] = []
        cost = 0
        lo = hi = 0
        blocked: set = set()  # requests with a skipped item: their later items must wait too
        for it in self._candidates(rs):
            if len(chosen) >= size:
                break
            if it.request_id in blocked:
                continue
            r = self._requests[it.request_id]
            if (r.streaming and r.served == 0 and it.index != r.queue[0].index
                    and r.queue[0].cost > c.max_batch_phonemes // 2):
                continue
            if reserve and len(chosen) >= size - reserve and (
                    r.running or any(x.request_id == it.request_id for x in chosen)):
                blocked.add(it.request_id)  # a request's later sentences leave a slot for a newcomer
                continue
            if reserve:  # sequences join running ones: no batch cost or padding to bound
                pass
            elif chosen and cost + it.cost > c.max_batch_phonemes:
                blocked.add(it.request_id)
                continue
            elif chosen and c.max_length_ratio:
                if max(hi, it.cost) > c.max_length_ratio * min(lo, it.cost):
                    blocked.add(it.request_id)
                    continue
            chosen.append(it)
            cost += it.cost
            lo = it.cost if len(chosen) == 1 else min(lo, it.cost)
            hi = max(hi, it.cost)
        # a rescue (the batch's lead is starving) gives the next batch to the others
        if chosen and self._starving(self._requests[chosen[0].request_id], now):
            self._rescued.add((voice, cls))
        else:
            self._rescued.discard((voice, cls))
        early = []
        several = {rid for rid, n in Counter(it.request_id for it in chosen).items() if n > 1}
        for k, it in enumerate(chosen):
            r = self._requests[it.request_id]
            if r.streaming and r.served == 0 and it.request_id not in several:
                early.append(k)  # (with its successors in the batch it must not be cut)
            head = r.queue.popleft()
            assert head is it, "items of a request must leave in order"
            r.served += 1
            r.vserved += 1
            r.last_service = now
            r.running += 1
        self.queued -= len(chosen)
        self.queued_cost -= cost
        self._voice_queued_cost[voice] -= cost
        return Batch(voice, chosen, tuple(early))

    def charge(self, voice: Hashable, seconds: float) -> None:
        """Device seconds a voice used outside a batch's `complete` (a step voice's steps, its
        share of a shared component's batch): its fair share between voices."""
        if seconds > 0:
            self._voice_time[voice] = self._voice_time.get(voice, 0.0) + float(seconds)

    def complete(self, batch: Batch, seconds: float | None = None) -> None:
        """The batch has run (its results are delivered by the caller); `seconds`: how long it
        took on the device, charged to its voice (fair share between voices)."""
        if seconds is not None and seconds > 0:
            self._voice_time[batch.voice] = self._voice_time.get(batch.voice, 0.0) + float(seconds)
        for it in batch.items:
            r = self._requests.get(it.request_id)
            if r is not None:
                r.running -= 1

