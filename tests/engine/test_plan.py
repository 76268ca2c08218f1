"""The step, part by part: `schedule` names one kind of work per step (a shared component's
batch, a step of the step runners with its joins and leaves, a one-shot batch) and touches no
model; `execute` runs the plan; `update` applies it. Driven by hand with fakes (no torch)."""

from __future__ import annotations

import time

from serve_fakes import FakeVoice, RecordingSink
from step_fakes import FakeEncodedVoice, FakeEncoder, FakeStepVoice

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine.scheduler import NOW


def kind(plan) -> str:
    return "stage" if plan.stage else "batch" if plan.batch else "step"


def wait_queued(w, n: int) -> None:
    deadline = time.time() + 10
    while w.scheduler.queued + len(w.stage_queue) < n:
        assert time.time() < deadline, "the front end did not queue the sentences"
        time.sleep(0.005)


def test_schedule_plans_one_kind_of_work_and_calls_no_model():
    enc = FakeEncoder()
    voices = [FakeEncodedVoice("enc", enc, 300.0), FakeStepVoice("ar", capacity=2), FakeVoice("vits")]
    eng = Engine({v.name: v for v in voices}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start(threads=False)
    w = eng._workers["cpu"]
    sinks = {name: RecordingSink() for name in ("enc", "ar", "vits")}
    for name, s in sinks.items():
        eng.submit(name, "one. two. three.", None, s)
    wait_queued(w, 9)
    pick = (NOW,)  # whatever is queued starts now
    kinds = []
    for _ in range(200):
        with w.cond:
            before = (len(enc.batches), list(voices[2].batches), [set(h) for h in voices[1].runner.history])
            plan = w.schedule(time.monotonic(), pick)
            # deciding ran nothing: no model was called, no sequence joined a runner
            assert before == (len(enc.batches), list(voices[2].batches), [set(h) for h in voices[1].runner.history])
        if plan is None:
            break
        if plan.joins:
            assert all(key not in runner.seqs for runner, key, _ in plan.joins)
        kinds.append(kind(plan))
        w.update(plan, w.execute(plan))
    assert all(s.done.is_set() and s.error is None for s in sinks.values())
    assert kinds[0] == "stage"  # a shared component's inputs gate their voices' sentences: first
    assert {"stage", "step", "batch"} <= set(kinds)
    assert eng.in_flight == 0
    eng.shutdown(1)


def test_a_cancelled_sequence_leaves_its_runner_in_the_next_plan():
    ar = FakeStepVoice("ar", capacity=2)
    eng = Engine([ar], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start(threads=False)
    w = eng._workers["cpu"]
    rid = eng.submit("ar", "a sentence long enough for many steps of its runner.", None, RecordingSink())
    wait_queued(w, 1)
    pick = (NOW,)  # whatever is queued starts now
    with w.cond:
        plan = w.schedule(time.monotonic(), pick)
    assert len(plan.joins) == 1 and not plan.leaves
    w.update(plan, w.execute(plan))
    eng.cancel(rid)
    with w.cond:
        plan = w.schedule(time.monotonic(), pick)
    assert [key for _, key in plan.leaves] == [plan_key for plan_key in ar.runner.seqs]
    w.update(plan, w.execute(plan))
    assert ar.runner.active == 0 and ar.runner.left
    with w.cond:
        assert w.schedule(time.monotonic(), pick) is None
    eng.shutdown(1)


def test_only_work_that_had_the_device_to_itself_times_the_works_own_speed():
    """Classes and order read the work's own speed (`DeviceTime.seconds`), admission the pace
    under load: batches that overlapped time only the second, so a loaded device does not make
    every short sentence look long (the urgent class shrank under 8 clients when both were one)."""
    from dataclasses import replace

    v = FakeVoice("v", delay_s=0.02, concurrent_runs=True)
    eng = Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start(threads=False)
    w = eng._workers["cpu"]
    one = (replace(NOW, items=1),)
    for text in ("one. two.", "three. four."):
        eng.submit("v", text, None, RecordingSink())
    wait_queued(w, 4)
    with w.cond:  # two batches at once (two lanes)
        a, b = w.schedule(time.monotonic(), one), w.schedule(time.monotonic(), one)
    assert a.batch and b.batch and a.batch.items[0].request_id != b.batch.items[0].request_id
    ra, rb = w.execute(a), w.execute(b)
    w.update(a, ra)
    w.update(b, rb)
    assert w.time.speed["v"].seconds_per_cost is not None and "v" not in w.time.alone
    with w.cond:  # one batch, nothing beside it
        c = w.schedule(time.monotonic(), one)
    w.update(c, w.execute(c))
    assert w.time.alone["v"].seconds_per_cost is not None
    eng.shutdown(1)


def test_a_batch_is_spare_only_with_nothing_else_running_or_waiting():
    """`Plan.spare` lets the runner cut a short first sentence for first audio: only when the
    cut's extra work delays no one (its own request's later sentences do not count)."""
    from dataclasses import replace

    v = FakeVoice("v", concurrent_runs=True)
    eng = Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start(threads=False)
    w = eng._workers["cpu"]
    one = (replace(NOW, items=1),)
    eng.submit("v", "alone here. and more. and more.", None, RecordingSink(), streaming=True)
    wait_queued(w, 3)
    with w.cond:
        lone = w.schedule(time.monotonic(), one)
    assert lone.spare and lone.batch.early == (0,)
    w.update(lone, w.execute(lone))
    eng.submit("v", "another one.", None, RecordingSink(), streaming=True)
    wait_queued(w, 3)
    with w.cond:  # two requests wait: the first batch is not spare, nor one beside a running one
        a = w.schedule(time.monotonic(), one)
        b = w.schedule(time.monotonic(), one)
    assert a.batch and b.batch and not a.spare and not b.spare
    for p in (a, b):
        w.update(p, w.execute(p))
    assert v.spares[:3] == [True, False, False]
    eng.shutdown(1)


def test_pieces_of_a_cut_sentence_do_not_time_the_works_own_speed():
    """A head cut for first audio costs its share of the ids but carries the sentence's encoder
    and the cut's context: timed as the work's own speed it made short requests look long (the
    urgent class shrank after each idle spell's first streams)."""
    from dataclasses import replace

    v = FakeVoice("v", delay_s=0.01, concurrent_runs=True)
    eng = Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start(threads=False)
    w = eng._workers["cpu"]
    one = (replace(NOW, items=1),)
    eng.submit("v", "a first sentence long enough to be cut for its first audio.", None, RecordingSink(), streaming=True)
    wait_queued(w, 1)
    for _ in range(2):  # the head, then the rest: each alone on the device
        with w.cond:
            p = w.schedule(time.monotonic(), one)
        w.update(p, w.execute(p))
    assert v.cuts == 1 and "v" not in w.time.alone and w.time.speed["v"].seconds_per_cost is not None
    eng.submit("v", "a whole one.", None, RecordingSink())
    wait_queued(w, 1)
    with w.cond:
        p = w.schedule(time.monotonic(), one)
    w.update(p, w.execute(p))
    assert w.time.alone["v"].seconds_per_cost is not None
    eng.shutdown(1)
