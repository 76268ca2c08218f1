"""What streaming costs CosyVoice 2's token2wav: one sentence of N speech tokens made into audio
chunk by chunk (the request's ChunkSchedule: each chunk re-runs the flow over the prompt and
every token so far, as upstream does) against once, whole (full attention), for N of 5 to 30
seconds of speech. The ratio is the price of the O(N^2) recomputation that docs/cosyvoice2.md
discusses. Random speech tokens; the bench suite's model folder (benchmarks/bench_cosyvoice.py).

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
    from voxserve.bench.machine import machine_info
    from voxserve.families.cosyvoice2.schedule import ChunkSchedule

    voice = voxserve.load_voice(f"cosyvoice2:{bench.model_folder(args.size)}", device=args.device)
    model = voice.model
    prompt = voice.prompt(bench.SPEAKER)
    g = torch.Generator().manual_seed(0)

    def streamed(tokens: list[int]) -> int:
        """Chunk by chunk on the request's schedule -> the number of chunks."""
        from voxserve.families.cosyvoice2.voice import CosyItem

        st = model.start_stream(CosyItem("", torch.zeros(1, dtype=torch.long), prompt, 0))
        sched = ChunkSchedule(prompt_tokens=prompt.n_speech_tokens)
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
    print("| speech (s) | tokens | chunks | whole (s) | streamed (s) | streamed / whole |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    with torch.inference_mode():
        for sec in args.seconds:
            tokens = torch.randint(0, 6561, (int(sec * 25),), generator=g).tolist()
            times = {"whole": [], "streamed": []}
            for r in range(args.runs + 1):  # the first round warms up
                for name, fn in (("whole", whole), ("streamed", streamed)):
                    t0 = time.perf_counter()
                    out = fn(tokens)
                    if r:
                        times[name].append(time.perf_counter() - t0)
                    if name == "streamed":
                        chunks = out
            w, s = statistics.median(times["whole"]), statistics.median(times["streamed"])
            print(f"| {sec:g} | {len(tokens)} | {chunks} | {w:.2f} | {s:.2f} | {s / w:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
