"""Scheduler unit tests: pure Python, a fake runner and a fake clock (no torch, no threads)."""

from __future__ import annotations

import pytest

from voxserve.engine.scheduler import NOW, Pick, Scheduler, SchedulerConfig


def run_all(s: Scheduler, now: float = 100.0, limit: int = 10_000):
    """Fake runner: schedule until empty (force: no waiting). Returns the batches as
    lists of (request, index)."""
    out = []
    for _ in range(limit):
        b = s.schedule(now, NOW)
        if b is None:
            return out
        out.append([(it.request_id, it.index) for it in b.items])
        s.complete(b)
    raise AssertionError("scheduler did not drain")


class FakeTime:
    """A device of known speed: `rate[voice]` seconds per unit of cost (1 for a voice not named),
    so the tests' costs read as seconds."""

    def __init__(self, **rate: float):
        self.rate = rate

    def seconds(self, voice, cost: float) -> float:
        return cost * self.rate.get(voice, 1.0)


def add(s: Scheduler, rid, n: int, cost: int = 10, now: float = 0.0, voice="v", streaming=False):
    s.add_request(rid, voice, streaming=streaming)
    for i in range(n):
        assert s.add_item(rid, i, cost, payload=(rid, i), now=now)


def test_batch_size_limit():
    s = Scheduler(SchedulerConfig(max_batch_size=4, max_batch_phonemes=10_000, max_wait_ms=0))
    add(s, "a", 10)
    batches = run_all(s)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert [i for b in batches for _, i in b] == list(range(10))  # in order


def test_phoneme_limit_and_oversized_item_runs_alone():
    s = Scheduler(SchedulerConfig(max_batch_size=16, max_batch_phonemes=100, max_wait_ms=0, max_length_ratio=0))
    add(s, "a", 5, cost=40)
    add(s, "big", 1, cost=500)
    batches = run_all(s)
    for b in batches:
        cost = sum(500 if r == "big" else 40 for r, _ in b)
        assert cost <= 100 or len(b) == 1
    assert ["big"] in [[r for r, _ in b] for b in batches]
    assert sum(len(b) for b in batches) == 6


def test_waits_for_companions_at_most_max_wait():
    s = Scheduler(SchedulerConfig(max_batch_size=4, max_wait_ms=50))
    add(s, "a", 1, now=10.0)
    assert s.schedule(10.0) is None  # not full, not old enough
    assert s.next_deadline(10.0) == pytest.approx(0.05)
    assert s.schedule(10.049) is None
    b = s.schedule(10.050)
    assert b is not None and len(b) == 1


def test_full_batch_starts_without_waiting():
    s = Scheduler(SchedulerConfig(max_batch_size=4, max_wait_ms=1000))
    add(s, "a", 4, now=10.0)
    assert s.next_deadline(10.0) == 0.0
    assert len(s.schedule(10.0)) == 4


def test_nothing_queued():
    s = Scheduler()
    assert s.schedule(0.0, NOW) is None
    assert s.next_deadline(0.0) is None


def test_round_robin_fairness_long_request_does_not_block_short():
    cfg = SchedulerConfig(max_batch_size=4, max_wait_ms=0, max_batch_phonemes=10_000)
    s = Scheduler(cfg)
    add(s, "long", 1000)
    first = s.schedule(0.0, NOW)  # the long request has the worker to itself
    assert [it.request_id for it in first.items] == ["long"] * 4
    s.complete(first)
    add(s, "short", 1)  # arrives while `long` has 996 queued
    nxt = s.schedule(0.0, NOW)
    assert "short" in [it.request_id for it in nxt.items]  # at most one batch of delay


def test_round_robin_interleaves_requests():
    s = Scheduler(SchedulerConfig(max_batch_size=3, max_wait_ms=0, max_batch_phonemes=10_000))
    add(s, "a", 3)
    add(s, "b", 3)
    add(s, "c", 3)
    batches = run_all(s)
    assert [sorted(r for r, _ in b) for b in batches] == [["a", "b", "c"]] * 3


def test_streaming_first_sentence_goes_ahead():
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0))
    add(s, "batch1", 2)
    add(s, "batch2", 2)
    add(s, "stream", 3, streaming=True)
    order = [b[0] for b in run_all(s, now=0.0)]  # nobody has waited max_starve_ms
    assert order[0] == ("stream", 0)
    # after its first sentence the stream takes its turn like any other request
    assert order.index(("stream", 1)) > order.index(("batch1", 0))


def test_a_new_request_joins_the_current_round_and_nothing_starves():
    # closed loop: a one-sentence request arrives after every batch; a 5-sentence request
    # must still progress every round (round-robin, not "newest first")
    s = Scheduler(SchedulerConfig(max_batch_size=2, max_wait_ms=0, max_batch_phonemes=10_000))
    add(s, "multi", 5)
    done_at = None
    for k in range(20):
        add(s, f"new{k}", 1, streaming=False)
        b = s.schedule(0.0, NOW)
        s.complete(b)
        if s.pending_items("multi") == 0:
            done_at = k
            break
    assert done_at is not None and done_at <= 5


def test_starving_request_goes_before_first_sentence_priority():
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_starve_ms=1000))
    add(s, "old", 2, now=0.0)
    b = s.schedule(0.0, NOW)
    s.complete(b)  # old served at t=0
    add(s, "stream", 1, now=0.5, streaming=True)
    assert s.schedule(0.6, NOW).items[0].request_id == "stream"  # fresh: the stream first
    add(s, "stream2", 1, now=1.5, streaming=True)
    assert s.schedule(1.6, NOW).items[0].request_id == "old"  # waited 1.6 s: it goes first


def test_items_of_a_request_leave_in_order_even_when_grouping_skips():
    s = Scheduler(SchedulerConfig(max_batch_size=4, max_wait_ms=0, max_length_ratio=2.0, max_batch_phonemes=10_000))
    s.add_request("a", "v")
    costs = [10, 100, 10, 10, 100, 10]
    for i, c in enumerate(costs):
        s.add_item("a", i, c, None, 0.0)
    add(s, "b", 4, cost=10)
    seen = {"a": [], "b": []}
    for b in run_all(s):
        for r, i in b:
            seen[r].append(i)
    assert seen["a"] == list(range(6)) and seen["b"] == list(range(4))


def test_length_aware_grouping_limits_spread():
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_wait_ms=0, max_length_ratio=2.0, max_batch_phonemes=10_000))
    costs = {"s1": 20, "L1": 200, "s2": 25, "L2": 210, "s3": 30, "L3": 190}
    for rid, c in costs.items():
        s.add_request(rid, "v")
        s.add_item(rid, 0, c, None, 0.0)
    batches = run_all(s)
    for b in batches:
        cs = [costs[r] for r, _ in b]
        assert max(cs) <= 2.0 * min(cs)
    assert len(batches) == 2


def test_grouping_does_not_starve_a_skipped_item():
    s = Scheduler(SchedulerConfig(max_batch_size=2, max_wait_ms=0, max_length_ratio=2.0, max_batch_phonemes=10_000))
    s.add_request("long", "v")
    s.add_item("long", 0, 300, None, 0.0)
    # a steady stream of short requests arriving behind it
    served_at = None
    for k in range(20):
        rid = f"s{k}"
        s.add_request(rid, "v")
        s.add_item(rid, 0, 10, None, 0.0)
        b = s.schedule(0.0, NOW)
        s.complete(b)
        if any(it.request_id == "long" for it in b.items):
            served_at = k
            break
    assert served_at is not None and served_at <= 1


def test_cancellation_drops_queued_items():
    s = Scheduler(SchedulerConfig(max_batch_size=2, max_wait_ms=0))
    add(s, "a", 5)
    add(s, "b", 2)
    b = s.schedule(0.0, NOW)
    s.complete(b)
    assert s.cancel("a") == 4
    assert not s.add_item("a", 5, 10, None, 0.0)  # late front-end output is refused
    rest = run_all(s)
    assert all(r == "b" for batch in rest for r, _ in batch)
    assert s.queued == 0 and s.queued_cost == 0


def test_back_pressure_refuses_new_requests_not_accepted_items():
    s = Scheduler(SchedulerConfig(max_queued_sentences=5, max_wait_ms=0))
    add(s, "a", 5)
    assert not s.admit()
    assert s.add_item("a", 5, 10, None, 0.0)  # an accepted request keeps adding sentences
    assert s.queued == 6
    got = run_all(s)
    assert sum(len(b) for b in got) == 6  # nothing accepted is lost
    assert s.admit()


def test_voices_take_turns_one_voice_per_batch():
    s = Scheduler(SchedulerConfig(max_batch_size=2, max_wait_ms=0))
    add(s, "a", 4, voice="v1")
    add(s, "b", 4, voice="v2")
    voices = []
    while (b := s.schedule(0.0, NOW)) is not None:
        assert len({it.request_id for it in b.items}) == 1  # one voice per batch here
        voices.append(b.voice)
        s.complete(b)
    assert voices == ["v1", "v2", "v1", "v2"]


def test_config_validation():
    with pytest.raises(ValueError):
        SchedulerConfig(max_batch_size=0).validate()
    with pytest.raises(ValueError):
        SchedulerConfig(max_wait_ms=-1).validate()
    with pytest.raises(ValueError):
        SchedulerConfig(max_length_ratio=0.5).validate()


def test_fake_runner_random_workload_every_item_once_in_order():
    import random

    rng = random.Random(0)
    s = Scheduler(SchedulerConfig(max_batch_size=5, max_batch_phonemes=300, max_wait_ms=0, max_length_ratio=3.0))
    expected = {}
    for r in range(30):
        n = rng.randint(1, 12)
        s.add_request(r, rng.choice(["v1", "v2"]), streaming=rng.random() < 0.5)
        for i in range(n):
            s.add_item(r, i, rng.randint(5, 200), None, 0.0)
        expected[r] = n
    s.cancel(3)
    expected.pop(3)
    seen: dict = {}
    for b in run_all(s):
        assert len(b) <= 5
        for r, i in b:
            seen.setdefault(r, []).append(i)
    assert seen == {r: list(range(n)) for r, n in expected.items()}


def test_shortest_remaining_first_once_known():
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0))
    add(s, "long", 6)
    add(s, "short", 2)
    s.input_done("long")
    s.input_done("short")
    order = [b[0][0] for b in run_all(s, now=0.0)]
    assert order[:2] == ["short", "short"]
    s2 = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0))
    add(s2, "long", 3)
    add(s2, "short", 2)  # their ends unknown (front ends running): round-robin
    assert [b[0][0] for b in run_all(s2, now=0.0)] == ["long", "short", "long", "short", "long"]


def test_last_sentence_of_a_short_request_is_not_starved_by_new_first_sentences():
    # steady load: a new streaming request (first sentence of 80) after every batch. A short
    # streaming request whose first sentence is done has one sentence of 60 left: it must go
    # next, not wait max_starve_ms behind every newcomer's first sentence
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_starve_ms=10_000))
    add(s, "short", 2, cost=60, streaming=True)
    s.input_done("short")
    s.complete(s.schedule(0.0, NOW))  # its first sentence
    served_at = None
    for k in range(10):
        add(s, f"new{k}", 3, cost=80, now=0.1 * k, streaming=True)
        b = s.schedule(0.1 * k, NOW)
        s.complete(b)
        if b.items[0].request_id == "short":
            served_at = k
            break
    assert served_at == 0
    # and a new stream's first sentence still goes before a long request's remainder
    s2 = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0))
    add(s2, "long", 6, cost=80, streaming=True)
    s2.input_done("long")
    s2.complete(s2.schedule(0.0, NOW))
    add(s2, "new", 3, cost=100, streaming=True)
    assert s2.schedule(0.0, NOW).items[0].request_id == "new"


def drain_timed(s: Scheduler, seconds: dict, limit: int = 10_000):
    """Fake runner with a fake device clock: a batch of voice v takes seconds[v]. Returns the
    voices of the batches in order."""
    out = []
    clock = 0.0
    for _ in range(limit):
        b = s.schedule(clock, NOW)
        if b is None:
            return out
        clock += seconds[b.voice]
        s.complete(b, seconds[b.voice])
        out.append(b.voice)
    raise AssertionError("scheduler did not drain")


def test_voices_share_the_device_by_time_not_by_batch():
    # a slow voice (Bark-like: 5 s a batch) next to a fast one (VITS-like: 0.1 s a batch), both
    # with a backlog. Strict turns would give the fast voice one batch per slow batch (its
    # throughput tied to the slow voice's); by time it gets an equal share of the device.
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_queued_sentences=10_000))
    add(s, "bark", 4, voice="slow")
    add(s, "vits", 400, voice="fast")
    order = drain_timed(s, {"slow": 5.0, "fast": 0.1})
    assert order.count("slow") == 4 and order.count("fast") == 400
    first_slow = order.index("slow")
    second_slow = order.index("slow", first_slow + 1)
    # between two slow batches the fast voice runs about one slow batch's worth (5 s / 0.1 s)
    assert 45 <= second_slow - first_slow - 1 <= 51, order[:60]
    # while both had work, neither used more than one batch over the other's device time
    assert abs(s.voice_time("slow") - 4 * 5.0) < 1e-9


def test_an_idle_voice_banks_no_device_time():
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_queued_sentences=10_000))
    add(s, "bark1", 10, voice="slow")
    seconds = {"slow": 5.0, "fast": 0.1}
    for _ in range(6):  # the slow voice runs alone for 30 s
        b = s.schedule(0.0, NOW)
        s.complete(b, seconds[b.voice])
    add(s, "vits", 200, voice="fast")
    order = drain_timed(s, seconds)
    assert order[0] == "fast"  # the newcomer goes next: it waits for the batch in flight only
    # ... but it has no 30 s of credit: the slow voice runs again after about one batch's worth
    assert order.index("slow") <= 52, order[:60]


def test_without_reported_times_voices_take_turns():
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0))
    add(s, "a", 3, voice="v1")
    add(s, "b", 3, voice="v2")
    add(s, "c", 3, voice="v3")
    assert [b for b in drain_timed(s, {"v1": 0, "v2": 0, "v3": 0})] == ["v1", "v2", "v3"] * 3


def test_batch_marks_streams_first_sentences_as_early():
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_batch_phonemes=100, max_wait_ms=0))
    add(s, "plain", 2, cost=20)
    add(s, "stream", 2, cost=60, streaming=True)  # over half the batch: may be cut, runs alone
    b = s.schedule(100.0, NOW)
    got = {(b.items[k].request_id, b.items[k].index) for k in b.early}
    assert got == {("stream", 0)}  # not the plain request's first, not the stream's second
    s.complete(b)
    add(s, "stream2", 1, streaming=True)
    b = s.schedule(100.0, NOW)
    assert [(b.items[k].request_id, b.items[k].index) for k in b.early] == [("stream2", 0)]


def test_a_short_streams_first_sentence_takes_its_successors_and_is_not_cut():
    # a two-sentence request needs one batch, not two; its first sentence, with a successor in
    # the batch, is not marked early (no head cut: its rest would come after the successor)
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_batch_phonemes=100, max_wait_ms=0))
    add(s, "stream", 2, cost=30, streaming=True)
    add(s, "alone", 1, cost=20, streaming=True)
    b = s.schedule(0.0, NOW)
    assert [(it.request_id, it.index) for it in b.items] == [("alone", 0), ("stream", 0), ("stream", 1)]
    assert [(b.items[k].request_id, b.items[k].index) for k in b.early] == [("alone", 0)]
    # at half the batch's phonemes or more, the first sentence runs without its successor
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_batch_phonemes=100, max_wait_ms=0))
    add(s, "stream", 2, cost=51, streaming=True)
    assert [len(b) for b in run_all(s)] == [1, 1]


def test_rescues_and_priority_order_take_turns():
    # every long request has waited past max_starve_ms (sustained overload); a short request
    # arriving now waits for at most one rescue batch, not one per starving request
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_starve_ms=1000))
    for k in range(4):
        add(s, f"long{k}", 3, cost=50, now=0.0)
    s.input_done("short")  # (unknown request: ignored)
    b = s.schedule(5.0, NOW)  # a rescue: long0 waited 5 s
    assert b.items[0].request_id == "long0"
    s.complete(b)
    add(s, "short", 1, cost=10, now=5.0)
    s.input_done("short")
    b = s.schedule(5.1, NOW)
    assert b.items[0].request_id == "short"  # the priority order's turn
    s.complete(b)
    got = [s.schedule(5.2, NOW) for _ in range(3)]
    assert [g.items[0].request_id for g in got] == ["long1", "long2", "long3"]  # nothing else waits: rescues in a row
    # with a request that is not starving waiting, rescues alternate with it
    s2 = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_starve_ms=1000))
    for k in range(3):
        add(s2, f"long{k}", 1, cost=50, now=0.0)
    add(s2, "fresh", 5, cost=10, now=5.0)
    s2.input_done("fresh")
    order = []
    for _ in range(5):
        b = s2.schedule(5.0, NOW)
        order.append(b.items[0].request_id)
        s2.complete(b)
    assert order == ["long0", "fresh", "long1", "fresh", "long2"]


def test_a_request_has_at_most_one_batch_in_flight():
    """With several lanes a request's next batch waits until its batch in flight completes:
    its audio (and a cut sentence's rest, queued at completion) stays in order."""
    s = Scheduler(SchedulerConfig(max_batch_size=2, max_wait_ms=0))
    add(s, "a", 4)
    b1 = s.schedule(0.0)
    assert [(it.request_id, it.index) for it in b1.items] == [("a", 0), ("a", 1)]
    assert s.schedule(0.0, NOW) is None and s.next_deadline(0.0) is None  # not due: in flight
    add(s, "b", 1)
    b2 = s.schedule(0.0)
    assert [(it.request_id, it.index) for it in b2.items] == [("b", 0)]  # another request runs meanwhile
    s.complete(b1)
    b3 = s.schedule(0.0)
    assert [(it.request_id, it.index) for it in b3.items] == [("a", 2), ("a", 3)]


def test_max_items_makes_a_smaller_batch_that_is_due_at_once():
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_wait_ms=1000))
    add(s, "a", 1, now=0.0)
    add(s, "b", 3, now=0.0)
    assert s.schedule(0.0) is None and s.next_deadline(0.0) == pytest.approx(1.0)  # waits for companions
    assert s.next_deadline(0.0, pick=Pick(items=1)) == 0.0
    b = s.schedule(0.0, pick=Pick(items=1))
    assert [(it.request_id, it.index) for it in b.items] == [("a", 0)]  # shortest work first, alone
    b = s.schedule(0.0, pick=Pick(items=2))
    assert [(it.request_id, it.index) for it in b.items] == [("b", 0), ("b", 1)]


def test_urgent_class_is_a_short_wait_in_service_order():
    """Pick.short(160) takes requests whose client waits for at most 160 s of device time (a
    short request's end, a stream's first sentence, a long request's last sentence),
    Pick.long(160) the others (and requests whose end is still unknown), a plain pick all."""
    s = Scheduler(SchedulerConfig(max_wait_ms=1000), FakeTime())
    add(s, "long", 2, cost=100)  # its end is 200 away
    add(s, "open", 1, cost=20)  # its front end is still running: end unknown
    add(s, "stream", 3, cost=150, streaming=True)  # first audio 150 away
    add(s, "short", 1, cost=50)
    for rid in ("long", "stream", "short"):
        s.input_done(rid)
    assert s.next_deadline(0.0, pick=Pick.short(160, 1)) == 0.0
    b = s.schedule(0.0, pick=Pick.short(160, 1))  # what ends a request first
    assert [(it.request_id, it.index) for it in b.items] == [("short", 0)]
    b2 = s.schedule(0.0, pick=Pick.short(160, 1))
    assert [(it.request_id, it.index) for it in b2.items] == [("stream", 0)] and b2.early == (0,)
    assert s.schedule(0.0, pick=Pick.short(160, 1)) is None  # stream's rest: 300 (in flight); long: 200
    assert s.next_deadline(0.0, pick=Pick.short(160, 1)) is None
    b3 = s.schedule(0.0, pick=Pick.long(160, 1))
    assert [(it.request_id, it.index) for it in b3.items] == [("long", 0)]  # 200 before inf
    b4 = s.schedule(0.0, pick=Pick.long(160, 1))
    assert [(it.request_id, it.index) for it in b4.items] == [("open", 0)]
    s.complete(b3)  # long's end: 100 away now
    b5 = s.schedule(0.0, pick=Pick.short(160, 1))
    assert [(it.request_id, it.index) for it in b5.items] == [("long", 1)]
    s.complete(b2)
    assert s.schedule(0.0, pick=Pick.short(160, 1)) is None  # stream's rest: 300
    b6 = s.schedule(0.0, pick=Pick(items=1))  # no class: anything
    assert [(it.request_id, it.index) for it in b6.items] == [("stream", 1)]
    assert s.queued == 1 and s.queued_cost == 150


def test_urgent_order():
    """Urgent requests go first come, first served (a slightly longer one is not held back by
    shorter newcomers), those that the urgent work finishes before streams' first sentences of
    longer requests. The other class keeps least work first."""
    s = Scheduler(SchedulerConfig(max_wait_ms=0), FakeTime())
    for rid, cost, n, streaming in (("a", 150, 1, False), ("s1", 120, 3, True), ("b", 30, 1, True),
                                    ("big", 200, 1, False), ("c", 100, 1, False), ("s2", 5, 2, True),
                                    ("bigger", 300, 1, False), ("d", 10, 1, False)):
        add(s, rid, n, cost=cost, streaming=streaming)
        s.input_done(rid)

    def order_of(urgent):
        out = []
        while (b := s.schedule(0.0, Pick.short(160, 1) if urgent else Pick.long(160, 1))) is not None:
            out.append(b.items[0].request_id)
            s.complete(b)
        return out

    # s1 (3 x 120) and s2 (2 x 5) are streams: s1's first sentence is urgent but does not end
    # it (its rest is not urgent); s2's whole stream is urgent work, so it keeps its place
    assert order_of(True) == ["a", "b", "c", "s2", "s2", "d", "s1"]
    assert order_of(False) == ["big", "s1", "bigger"]


def test_rescues_take_turns_within_a_class():
    """A starving request goes first in its class; a rescue in one class does not make the
    other class skip its own rescues."""
    s = Scheduler(SchedulerConfig(max_wait_ms=0, max_starve_ms=1000), FakeTime())
    add(s, "old", 1, cost=120, now=0.0)
    add(s, "new", 1, cost=30, now=5.0)
    add(s, "old_long", 2, cost=200, now=0.0)
    add(s, "new_long", 2, cost=150, now=5.0)
    for rid in ("old", "new", "old_long", "new_long"):
        s.input_done(rid)
    b = s.schedule(5.0, pick=Pick.long(160, 1))
    assert [it.request_id for it in b.items] == ["old_long"]  # waited 5 s > max_starve_ms
    b = s.schedule(5.0, pick=Pick.short(160, 1))
    assert [it.request_id for it in b.items] == ["old"]  # its class's rescue, not "new" (30)


def test_spill_takes_a_second_sentence_of_a_request_in_flight():
    """Only with a pick's `second`, a request with one batch in flight gives a second: never a third,
    never the rest of a cut sentence (that waits for the request's batch in flight)."""
    s = Scheduler(SchedulerConfig(max_wait_ms=0))
    add(s, "a", 4, cost=50, streaming=True)
    b1 = s.schedule(0.0, pick=Pick(items=1))
    assert [(it.request_id, it.index) for it in b1.items] == [("a", 0)]
    assert s.schedule(0.0, pick=Pick(items=1)) is None and s.next_deadline(0.0, pick=Pick(items=1)) is None
    assert s.next_deadline(0.0, pick=Pick(items=1, second=True)) == 0.0
    b2 = s.schedule(0.0, pick=Pick(items=1, second=True))
    assert [(it.request_id, it.index) for it in b2.items] == [("a", 1)]
    assert s.schedule(0.0, pick=Pick(items=1, second=True)) is None  # two in flight at most
    s.complete(b1)
    s.requeue("a", 0, 20, ("a", "rest"), 0.0)  # a's first sentence was cut: its rest is next
    assert s.schedule(0.0, pick=Pick(items=1, second=True)) is None  # a rest does not spill
    s.complete(b2)
    b3 = s.schedule(0.0, pick=Pick(items=1))
    assert b3.items[0].continues and b3.items[0].index == 0
    b4 = s.schedule(0.0, pick=Pick(items=1, second=True))  # a whole sentence may run beside a rest
    assert [(it.request_id, it.index) for it in b4.items] == [("a", 2)]
    assert s.schedule(0.0, pick=Pick(items=1, second=True)) is None  # two in flight again
    s.complete(b3)
    assert [(it.request_id, it.index) for it in s.schedule(0.0, pick=Pick(items=1, second=True)).items] == [("a", 3)]


# ---------------------------------------------------------------- admission by time (pure parts)
def test_queued_cost_per_voice_follows_add_requeue_schedule_and_cancel():
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0, max_length_ratio=0))
    add(s, "a", 3, cost=10, voice="v")
    add(s, "b", 2, cost=7, voice="w")
    assert (s.queued_cost_of("v"), s.queued_cost_of("w"), s.queued_cost_of("none")) == (30, 14, 0)
    b = s.schedule(0.0, NOW)
    assert s.queued_cost_of(b.voice) == {"v": 20, "w": 7}[b.voice]
    s.requeue(b.items[0].request_id, b.items[0].index, 4, None, 0.0)  # a cut item's rest
    assert s.queued_cost_of(b.voice) == {"v": 24, "w": 11}[b.voice]
    s.complete(b)
    s.cancel("a")
    s.cancel("b")
    assert s.queued_cost_of("v") == s.queued_cost_of("w") == 0 == s.queued_cost


def test_throughput_is_a_ratio_of_weighted_sums():
    from voxserve.engine.device_time import Throughput

    t = Throughput(weight=0.5)
    assert t.seconds_per_cost is None and t.cost_per_s is None
    t.add(100, 1.0)
    assert t.cost_per_s == pytest.approx(100.0)
    # with lanes a batch that ends right after another gets a tiny busy window: the figure
    # moves towards the pair's joint rate, not to 100 / 0.001 (a mean of per-batch rates)
    t.add(100, 0.001)
    assert t.cost_per_s == pytest.approx((0.5 * 50 + 0.5 * 100) / (0.5 * 0.5 + 0.5 * 0.001))
    t.add(0, 5.0)  # nothing done (a failed batch): no sample
    assert t.cost_per_s == pytest.approx(75 / 0.2505)
    for _ in range(40):  # the device slowed down: the old figure is forgotten
        t.add(10, 1.0)
    assert t.cost_per_s == pytest.approx(10.0, rel=1e-3)
    with pytest.raises(ValueError):
        Throughput(weight=0)


def test_device_time_uses_each_voices_speed_the_slowest_for_unmeasured_ones_and_a_prior_before():
    from voxserve.engine.device_time import DeviceTime

    t = DeviceTime(prior_s_per_cost=0.01)
    assert not t.timed and t.seconds("fast", 100) == pytest.approx(1.0)  # nothing measured: the prior
    t.observe("fast", 1000, 1.0)
    assert t.timed and t.seconds("fast", 500) == pytest.approx(0.5)
    assert t.seconds("new", 10) == pytest.approx(0.01)  # not timed: the slowest timed voice
    t.observe("slow", 10, 1.0)
    assert t.seconds("slow", 20) == pytest.approx(2.0) and t.seconds("new", 10) == pytest.approx(1.0)
    assert t.cost_per_s("fast") == pytest.approx(1000) and t.cost_per_s("new") is None
    with pytest.raises(ValueError):
        DeviceTime(prior_s_per_cost=0)


def test_time_admission_pairwise_bound():
    from voxserve.engine.admission import time_admission

    inf = float("inf")
    # nothing accepted: the wait is what is left of the batch in flight
    a = time_admission(10.0, 3.0, 5.0, {}, in_flight_s=0.5)
    assert a.admit and a.wait_s == 0.5
    # a short new request waits for at most its own length of each longer request
    acc = {"long": (20.0, inf), "short": (1.0, inf)}
    a = time_admission(10.0, 3.0, 0.5, acc)
    assert a.admit and a.wait_s == pytest.approx(0.5 + 0.5)
    a = time_admission(10.0, 3.0, 4.0, acc)  # a longer one waits for the short one and 4 s of the long
    assert not a.admit and a.wait_s == pytest.approx(1.0 + 4.0) and a.late_request is None
    assert a.excess_s == pytest.approx(2.0) and a.retry_s == pytest.approx(2.0)
    # an accepted request's deadline: it finishes by now + its work + min(others, its work)
    acc = {"long": (10.0, 10.0 + 10.0 + 1.0 + 0.8), "short": (1.0, inf)}  # 0.8 s of slack
    assert time_admission(10.0, 3.0, 0.5, acc).admit
    a = time_admission(10.0, 3.0, 0.9, acc)
    assert not a.admit and a.late_request == "long" and a.excess_s == pytest.approx(0.1)
    assert a.retry_s == pytest.approx(11.0)  # room once "long" is done, by its bound
    # with two lanes a request's own work runs on one lane (half the device's speed): its
    # deadline and its finish bound both count it twice, and others' work still delays it
    acc = {"long": (10.0, 10.0 + 2.0 + 2 * 10.0)}  # 2 s of slack + its work on one lane
    assert time_admission(10.0, 3.0, 1.5, acc, lanes=2).admit  # 10 + 1.5 + 10 <= 22
    a = time_admission(10.0, 3.0, 2.5, acc, lanes=2)
    assert not a.admit and a.late_request == "long" and a.excess_s == pytest.approx(0.5)
    assert a.retry_s == pytest.approx(20.0)


# ----------------------------------------------------------------------------- step voices
def test_room_bounds_a_step_voice_and_a_full_one_is_skipped():
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_wait_ms=50))
    add(s, "long", 4, voice="ar")
    add(s, "vits", 2, voice="tts")
    assert s.schedule(0.0, NOW, room={"ar": 0, "tts": 0}) is None  # no room anywhere
    assert s.schedule(0.0, NOW, room={"ar": 0}).voice == "tts"
    b = s.schedule(0.0, room={"ar": 3})  # due at once (no wait for companions), at most 3
    assert b.voice == "ar" and len(b) == 2  # three slots, one left free for a newcomer


def test_a_step_voice_is_due_at_once_and_leaves_a_slot_for_a_newcomer():
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_wait_ms=50))
    add(s, "a", 6, voice="ar")
    assert s.schedule(0.0) is None  # a one-shot voice would wait 50 ms for companions
    b = s.schedule(0.0, room={"ar": 4})
    assert [it.request_id for it in b.items] == ["a"] * 3  # three of four slots: one stays free
    add(s, "b", 2, voice="ar", now=0.01)
    b2 = s.schedule(0.01, room={"ar": 1})
    assert [it.request_id for it in b2.items] == ["b"]  # the newcomer took it
    for it in b.items:  # sequences complete one at a time
        s.complete(type(b)(b.voice, [it]))
    assert s.pending_items("a") == 3


def test_charge_counts_toward_fair_share():
    s = Scheduler(SchedulerConfig(max_wait_ms=0))
    add(s, "x", 2, voice="ar")
    add(s, "y", 2, voice="tts")
    s.charge("ar", 5.0)
    assert s.schedule(0.0, NOW).voice == "tts"


def test_a_step_voices_request_keeps_joining_while_its_sentences_run():
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_wait_ms=0))
    add(s, "a", 6, voice="ar")
    b = s.schedule(0.0, room={"ar": 2})
    assert [it.index for it in b.items] == [0]  # one slot stays free
    b = s.schedule(0.0, room={"ar": 3})  # "a" has a sentence in flight and still joins
    assert [it.index for it in b.items] == [1, 2]
    add(s, "new", 1, voice="ar")
    add(s, "more", 1, voice="ar")
    b = s.schedule(0.0, room={"ar": 2})  # requests with nothing in flight go first
    assert [it.request_id for it in b.items] == ["new", "more"]


# ------------------------------------------------------------- one unit: predicted device seconds
def test_a_class_of_short_waits_is_device_time_not_cost():
    """The same text is urgent on a fast voice and bulk work on a slow one: what the client
    waits for is device time (main counted cost, so a Bark-like voice's 100 ids were "short")."""
    s = Scheduler(SchedulerConfig(max_wait_ms=0), FakeTime(fast=0.001, slow=0.1))
    add(s, "f", 1, cost=100, voice="fast")  # 0.1 s
    add(s, "s", 1, cost=100, voice="slow")  # 10 s
    for rid in ("f", "s"):
        s.input_done(rid)
    short, long = Pick.short(0.5, 1), Pick.long(0.5, 1)
    assert s.next_deadline(0.0, short) == 0.0
    assert [b.voice for b in iter(lambda: s.schedule(0.0, short), None)] == ["fast"]
    assert [b.voice for b in iter(lambda: s.schedule(0.0, long), None)] == ["slow"]


def test_the_class_follows_the_speed_the_device_learns():
    """A request's wait is predicted by the device's model as it learns: before any timing by
    the prior, then by the voice's observed speed (the figures admission reads too)."""
    from voxserve.engine.device_time import DeviceTime

    t = DeviceTime(prior_s_per_cost=0.001)
    s = Scheduler(SchedulerConfig(max_wait_ms=0), t)
    add(s, "a", 1, cost=100)
    s.input_done("a")
    short = Pick.short(0.5, 1)
    assert s.next_deadline(0.0, short) == 0.0  # 100 x 1 ms: 0.1 s
    t.observe("v", 100, 1.0)  # the device turns out slower: 10 ms per unit
    assert s.next_deadline(0.0, short) is None and s.next_deadline(0.0, Pick.long(0.5, 1)) == 0.0


def test_least_predicted_time_first_within_a_voice_ties_in_round_robin():
    """Of requests whose ends are known, the one with the least device time left goes first; a
    request whose end is unknown (front end running) goes after them."""
    s = Scheduler(SchedulerConfig(max_batch_size=1, max_wait_ms=0), FakeTime())
    add(s, "open", 2, cost=1)  # cheap, but its end is not known
    add(s, "big", 1, cost=50)
    add(s, "small", 2, cost=10)
    s.input_done("big")
    s.input_done("small")
    assert [b[0][0] for b in run_all(s, now=0.0)] == ["small", "small", "big", "open", "open"]


def test_a_pick_is_a_frozen_request_of_one_shape():
    """Executors build picks once; a pick cannot be changed on its way through the scheduler."""
    import dataclasses

    p = Pick.short(0.5, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.items = 2  # type: ignore[misc]
    assert p.waits_s == (float("-inf"), 0.5) and Pick.long(0.5).waits_s == (0.5, float("inf"))
    s = Scheduler(SchedulerConfig(max_wait_ms=1000))
    add(s, "a", 1)
    assert s.schedule(0.0) is None and s.schedule(0.0, NOW) is not None  # waits for companions / starts now


def test_admission_counts_in_the_schedulers_device_seconds():
    """Admission reads the model the scheduler orders by: nothing before the device timed
    anything (only the sentence bound), then the same seconds."""
    from voxserve.engine.admission import Accepted, DeviceAdmission
    from voxserve.engine.device_time import DeviceTime

    t = DeviceTime()
    adm = DeviceAdmission(t, bound_s=1.0)
    s = Scheduler(SchedulerConfig(max_wait_ms=0), t)
    assert adm.decide("v", 100, 0.0, {}, {}) is None and adm.wait_s({"v": 100}) is None
    t.observe("v", 100, 0.5)  # 5 ms per unit
    add(s, "x", 1, cost=400)
    seconds_left = s.time.seconds("v", s.pending_cost("x"))
    a, own = adm.decide("v", 100, 0.0, {"x": Accepted(seconds_left, float("inf"))}, {"v": 40})
    assert seconds_left == pytest.approx(2.0) and own == pytest.approx(0.5)
    assert a.wait_s == pytest.approx(0.5 * 40 * 0.005 + min(2.0, 0.5)) and a.admit
    assert adm.wait_s({"v": 400}) == pytest.approx(2.0)


def test_work_is_classed_by_its_own_speed_and_waits_by_the_pace_under_load():
    """Under load the device's pace per unit grows (lanes share the cores); a 100-unit sentence
    is still 0.1 s of work, urgent, while admission's waits use the pace."""
    from voxserve.engine.device_time import DeviceTime

    t = DeviceTime()
    t.observe("v", 100, 0.1, alone=True)  # 1 ms per unit with the device to itself
    for _ in range(50):
        t.observe("v", 100, 0.3)  # 3 ms per unit while other batches ran beside it
    assert t.seconds("v", 100) == pytest.approx(0.1) and t.under_load_s("v", 100) == pytest.approx(0.3, rel=0.05)
    s = Scheduler(SchedulerConfig(max_wait_ms=0), t)
    add(s, "a", 1, cost=100)
    s.input_done("a")
    assert s.next_deadline(0.0, Pick.short(0.15, 1)) == 0.0
    t2 = DeviceTime()
    t2.observe("new", 100, 0.3)  # never alone yet: its pace under load stands in
    assert t2.seconds("new", 100) == pytest.approx(0.3)


def test_a_batch_alone_whose_overheads_outweigh_its_work_does_not_set_the_works_own_speed():
    """The engine's warm-up says "Hello." (17 ids) alone: 76 ms, 4.5 ms an id, mostly a batch's
    fixed cost. Under load no batch may run alone again, so that figure would stand and class
    only ~67 ids as urgent while the device's pace is ~1.15 ms an id (docs/benchmarks.md,
    issue 44's fifth session). Contention only slows work: the own figure is never above the pace."""
    from voxserve.engine.device_time import DeviceTime

    t = DeviceTime()
    t.observe("v", 17, 0.0762, alone=True)
    for _ in range(50):
        t.observe("v", 100, 0.115)  # the device's pace under load
    assert t.own_per_cost("v") == pytest.approx(0.00115, rel=0.05)
    assert t.seconds("v", 160) == pytest.approx(0.184, rel=0.05)  # 160 ids: short work, urgent at 0.3 s
    s = Scheduler(SchedulerConfig(max_wait_ms=0), t)
    add(s, "a", 1, cost=160)
    s.input_done("a")
    assert s.next_deadline(0.0, Pick.short(0.3, 1)) == 0.0
    t.observe("v", 200, 0.16, alone=True)  # a real sentence alone, faster than the pace: it stands
    assert t.own_per_cost("v") < 0.00115

