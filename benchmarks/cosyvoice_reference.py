"""The CosyVoice 2 REFERENCE pipeline's side of bench_cosyvoice.py, in the reference venv
(scripts/cosyvoice-reference), never in voxserve's: a child process that reads one JSON command
a line on stdin and answers one JSON line on stdout.

First line: the spec (model folder: the same random weights voxserve runs; device; threads;
the prompt's speech tokens, mel, embedding and transcript ids; the texts as token ids, from
voxserve's tokenizer, since the reference's text front end needs packages we do not install).
Answer: {"ready_s": ...}. Then {"op": "stream", "n": N, "round": r}: N clients at once, each
`CosyVoice2Model.tts(stream=True)` on a thread of its own (as the reference's server serves
them; its LLM job runs on a thread of its own too); {"op": "offline", "n": B, "round": r}: B
`tts(stream=False)` calls one after another (it has no batch > 1). Answers carry each request's
first chunk, end and audio seconds.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path


def build(model_dir: Path, device: str):
    import torch
    from hyperpyyaml import load_hyperpyyaml

    from cosyvoice.cli.model import CosyVoice2Model

    with open(model_dir / "cosyvoice2.yaml") as f:
        configs = load_hyperpyyaml(f, overrides={"qwen_pretrain_path": str(model_dir / "CosyVoice-BlankEN")})
    model = CosyVoice2Model(configs["llm"], configs["flow"], configs["hift"], fp16=False)
    model.device = torch.device(device)
    model.load(str(model_dir / "llm.pt"), str(model_dir / "flow.pt"), str(model_dir / "hift.pt"))
    return model


class Runner:
    def __init__(self, spec: dict):
        import torch

        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        self.spec = spec
        p = spec["prompt"]
        self.prompt = dict(
            flow_embedding=torch.tensor([p["embedding"]], dtype=torch.float32),
            llm_embedding=torch.zeros(0, 192),
            prompt_text=torch.tensor([p["text_ids"]], dtype=torch.int32),
            llm_prompt_speech_token=torch.tensor([p["speech_tokens"]], dtype=torch.int32),
            flow_prompt_speech_token=torch.tensor([p["speech_tokens"]], dtype=torch.int32),
            prompt_speech_feat=torch.tensor([p["speech_feat"]], dtype=torch.float32))
        t0 = time.perf_counter()
        self.model = build(Path(spec["model_dir"]), spec["device"])
        self.ready_s = time.perf_counter() - t0
        self.device = spec["device"]

    def one(self, text_ids: list[int], stream: bool, t0: float) -> tuple[float, float, float]:
        import torch

        first, samples = None, 0
        for out in self.model.tts(text=torch.tensor([text_ids], dtype=torch.int32), stream=stream, **self.prompt):
            if first is None:
                if self.device == "cuda":
                    torch.cuda.synchronize()
                first = time.perf_counter() - t0
            samples += out["tts_speech"].shape[-1]
        if self.device == "cuda":
            torch.cuda.synchronize()
        return first, time.perf_counter() - t0, samples / 24000

    def stream(self, n: int, round_: int) -> dict:
        texts = self.spec["texts"]
        per: list = [None] * n
        errors: list[BaseException] = []
        t0 = time.perf_counter()

        def client(k: int) -> None:
            try:
                per[k] = self.one(texts[(round_ * n + k) % len(texts)], True, t0)
            except BaseException as e:  # reported to the bench
                errors.append(e)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        wall = time.perf_counter() - t0
        return {"first_s": [p[0] for p in per], "rtf": [p[1] / p[2] for p in per],
                "audio_s": sum(p[2] for p in per), "wall_s": wall}

    def offline(self, n: int, round_: int) -> dict:
        texts = self.spec["texts"]
        t0 = time.perf_counter()
        audio = 0.0
        for k in range(n):
            audio += self.one(texts[k % len(texts)], False, time.perf_counter())[2]
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "audio_s": audio, "rtf": wall / audio}


def main() -> int:
    import torch

    out = sys.stdout
    sys.stdout = sys.stderr  # the reference's own prints must not corrupt the protocol
    torch.manual_seed(0)
    runner = None
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            if runner is None:
                runner = Runner(cmd)
                answer = {"ready_s": runner.ready_s, "torch": torch.__version__}
            else:
                answer = getattr(runner, cmd["op"])(int(cmd["n"]), int(cmd["round"]))
        except Exception as e:
            traceback.print_exc()
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
