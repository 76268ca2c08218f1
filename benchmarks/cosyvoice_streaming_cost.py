"""What streaming costs CosyVoice 2's token2wav: one sentence of N speech tokens made into audio
chunk by chunk on the request's ChunkSchedule, against once, whole (full attention), for N of 5
to 30 seconds of speech. Two streamed arms: through the flow's cache (each chunk's new frames
only, voxserve's path) and recomputing the prefix every chunk (upstream's O(N^2)). Random speech
tokens; the bench suite's model folder (benchmarks/bench_cosyvoice.py).

    python benchmarks/cosyvoice_streaming_cost.py [--size small] [--runs 3] [--seconds 5 10 20 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small", choices=["tiny", "small", "real"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, nargs="+", default=[5, 10, 20, 30])
    args = ap.parse_args(argv)

    import torch

    import bench_cosyvoice as bench
    import voxserve
    from harness.machine import machine_info

    voice = voxserve.load_voice(f"cosyvoice2:{bench.model_folder(args.size)}", device=args.device)
    model = voice.model
    prompt = voice.prompt(bench.SPEAKER)
    g = torch.Generator().manual_seed(0)

    def streamed(tokens: list[int]) -> int:
        """Chunk by chunk on the request's schedule -> the number of chunks."""
        from voxserve.families.cosyvoice2.voice import CosyItem

        st = model.start_stream(CosyItem("", torch.zeros(1, dtype=torch.long), prompt, 0))
        sched = model.chunk_schedule(prompt.n_speech_tokens)
        while True:
            end, final = sched.ready(len(tokens), True)
            model.token2wav([(st, tokens, sched.offset, end, final, True)])
            sched.advance(end)
            if final:
                return sched.chunks_done

    def whole(tokens: list[int]) -> None:
        from voxserve.families.cosyvoice2.voice import CosyItem

        st = model.start_stream(CosyItem("", torch.zeros(1, dtype=torch.long), prompt, 0))
        model.token2wav([(st, tokens, 0, len(tokens), True, False)])

    cpu = machine_info().get("cpu", "?")
    print(f"# token2wav: streamed chunks vs whole, model {args.size}, {args.device}, "
          f"{torch.get_num_threads()} threads, {cpu}; prompt {prompt.n_speech_tokens} tokens\n")
    if not model.cached_streaming:
        print("(this model's encoder is not chunk-masked: both streamed arms recompute)\n")

    def recomputed(tokens: list[int]) -> int:
        model.cached_streaming = False
        try:
            return streamed(tokens)
        finally:
            model.cached_streaming = cached

    cached = model.cached_streaming
    arms = (("whole", whole), ("cached", streamed), ("recompute", recomputed))
    print("| speech (s) | tokens | chunks | whole (s) | streamed, cached (s) | streamed, recomputed (s) "
          "| cached / whole | recomputed / whole |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with torch.inference_mode():
        for sec in args.seconds:
            tokens = torch.randint(0, 6561, (int(sec * 25),), generator=g).tolist()
            times = {name: [] for name, _ in arms}
            for r in range(args.runs + 1):  # the first round warms up
                for name, fn in arms:
                    t0 = time.perf_counter()
                    out = fn(tokens)
                    if r:
                        times[name].append(time.perf_counter() - t0)
                    if name == "cached":
                        chunks = out
            w, c, u = (statistics.median(times[name]) for name, _ in arms)
            print(f"| {sec:g} | {len(tokens)} | {chunks} | {w:.2f} | {c:.2f} | {u:.2f} | {c / w:.2f} | {u / w:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
