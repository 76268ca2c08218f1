"""First audio of a late arrival on Bark: the step runner against the one-shot runner (CPU).

Eight 1-sentence requests start generating; a ninth arrives while they run (after
--join-after steps of the step runner). Both runners are driven directly, no engine:

  step      BarkStepRunner: the late one joins at the next step and runs beside the eight
            (the eight's fine + EnCodec stages still run inside steps, one sentence each)
  one-shot  BarkRunner.run (today's behaviour without a step runner): the late one waits
            until the eight's batch has ended, then runs alone

The arrival moment is the same in both arms: the wall time at which the step arm had done
--join-after steps. Weights are random with suno/bark-small's sizes (benchmarks/bark_random.py),
so the semantic stage never picks EOS and every sentence runs to --semantic-tokens (a fixed
amount of work: about 3 coarse tokens per semantic token, then one fine pass per sentence).
Short limits keep the run to minutes: few semantic tokens, and a fine window of --fine-window
frames instead of Bark's 1024 (a sentence's fine stage pads to its window: at 1024 frames it
costs as much as ~100 decode steps, which real sentences of ~700 semantic tokens dwarf, these
short ones do not).

    .venv/bin/python benchmarks/bark_step_late_arrival.py
    .venv/bin/python benchmarks/bark_step_late_arrival.py --semantic-tokens 48 --join-after 16
    .venv/bin/python benchmarks/bark_step_late_arrival.py --late-tokens 8   # a shorter late sentence

--late-tokens gives the late sentence a smaller semantic budget than the eight's (its runner's
semantic max_new_tokens while it is admitted): random weights never pick EOS, so this is how a
shorter sentence is simulated; a real model stops each sentence at its EOS.
"""

from __future__ import annotations

import argparse
import time

TEXTS = ["hello my name is suno.", "i like pizza.", "the cat is on the mat.", "this one two three.",
         "a dog on a mat.", "i like reading.", "hello the cat.", "but also pizza."]
LATE = "hello i like the dog."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--semantic-tokens", type=int, default=32, help="semantic tokens per sentence")
    ap.add_argument("--join-after", type=int, default=8, help="step-runner steps before the late one arrives")
    ap.add_argument("--late-tokens", type=int, default=None, help="the late sentence's semantic tokens "
                    "(default: --semantic-tokens)")
    ap.add_argument("--fine-window", type=int, default=128, help="fine window in frames (Bark's: 1024)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args()

    import torch

    from voxserve import SynthesisOptions
    from bark_random import random_bark_model  # benchmarks/bark_random.py, beside this script
    from lean_server import cpu_model  # (not the harness: its package imports the product's current API)
    from voxserve.families.bark.step import BarkStepRunner
    from voxserve.families.bark.voice import bark_voice_from_model

    torch.set_num_threads(args.threads)
    model, processor = random_bark_model("small", max_semantic_tokens=args.semantic_tokens)
    gc = model.generation_config
    gc.fine_acoustics_config = {**gc.fine_acoustics_config, "max_fine_input_length": args.fine_window,
                                "max_fine_history_length": args.fine_window // 2}
    voice = bark_voice_from_model(model, processor, "random-bark-small", device="cpu")
    units = [next(iter(voice.units(t, SynthesisOptions(seed=k)))) for k, t in enumerate(TEXTS)]
    late = next(iter(voice.units(LATE, SynthesisOptions(seed=99))))
    voice.runner.run([late.payload])  # warm-up (first calls allocate)
    sc = voice.runner.semantic_config
    late_tokens = args.late_tokens or args.semantic_tokens

    def run_late(fn):  # the late sentence's semantic budget while it is admitted or run
        sc.max_new_tokens = late_tokens
        try:
            return fn()
        finally:
            sc.max_new_tokens = args.semantic_tokens

    def step():  # a joiner is admitted (its stop rule made) inside the next step
        return list(runner.step())

    # step arm
    runner = BarkStepRunner(voice.runner, capacity=len(units) + 1)
    done: dict = {}
    cpu: dict = {}  # process CPU seconds, less sensitive than wall time to other load on the machine
    c0, t0 = time.process_time(), time.perf_counter()
    for k, u in enumerate(units):
        runner.join(k, u)
    steps = 0
    arrive = None
    while runner.active or arrive is None:
        if steps == args.join_after:
            arrive = time.perf_counter() - t0
            runner.join("late", late)
            results = run_late(step)
        else:
            results = step()
        for res in results:
            if res.error is not None:
                raise res.error
            done[res.key] = time.perf_counter() - t0
            cpu[res.key] = time.process_time() - c0
        steps += 1
    step_late = done["late"] - arrive
    step_eight = max(v for k, v in done.items() if k != "late")
    step_cpu = (cpu["late"], max(v for k, v in cpu.items() if k != "late"))

    # one-shot arm: the eight's batch to its end, then the late one
    c0, t0 = time.process_time(), time.perf_counter()
    voice.runner.run([u.payload for u in units])
    shot_eight = time.perf_counter() - t0
    shot_cpu8 = time.process_time() - c0
    run_late(lambda: voice.runner.run([late.payload]))
    shot_late = time.perf_counter() - t0 - arrive
    shot_cpu = (time.process_time() - c0, shot_cpu8)

    print(f"CPU: {cpu_model()}; torch threads {args.threads}; bark-small sizes, random weights; "
          f"{args.semantic_tokens} semantic tokens a sentence (the late one {late_tokens}); fine window {args.fine_window}; late one arrives after {args.join_after} steps "
          f"({arrive:.2f} s); {steps} steps in all")
    print("wall seconds from the late one's arrival to its audio, and from the start to the eight's last;")
    print("CPU seconds (this process) from the start to the late one's audio and to the eight's last")
    print(f"{'runner':<10} {'late first audio':>17} {'eight done':>11} {'CPU to late':>12} {'CPU to eight':>13}")
    for name, late_s, eight_s, (cl, c8) in [("step", step_late, step_eight, step_cpu),
                                            ("one-shot", shot_late, shot_eight, shot_cpu)]:
        print(f"{name:<10} {late_s:>17.2f} {eight_s:>11.2f} {cl:>12.2f} {c8:>13.2f}")


if __name__ == "__main__":
    main()
