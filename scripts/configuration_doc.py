"""docs/configuration.md's tables, generated from the settings tree (voxserve.serve.config) and
the families' options types (runtime and synthesis), so that the doc cannot drift from them.

    .venv/bin/python scripts/configuration_doc.py          # rewrite the generated blocks
    .venv/bin/python scripts/configuration_doc.py --check  # exit 1 if the doc is stale

The doc's prose is written by hand; each table sits between `<!-- generated: NAME -->` and
`<!-- end generated -->` and is replaced by `render`. The "When to change" texts are here:
tests/test_configuration_doc.py checks that every setting and field has one.
"""

from __future__ import annotations

import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from voxserve.engine import EngineConfig
from voxserve.engine.scheduler import SchedulerConfig
from voxserve.families import families
from voxserve.limits import Limits
from voxserve.options import SynthesisOptions, option_rules
from voxserve.serve.config import DEPRECATED, settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

SECTIONS = {
    "server": "Where it listens",
    "load": "Voices and device",
    "engine": "Batching, order of service and admission",
    "limits": "Limits",
    "http": "HTTP",
}
"""The tree's sections, in the doc's order, with their headings."""

WHEN = {
    "stream_max_connections": "Each open text-streaming WebSocket holds text, audio and an encoder: lower on a "
                              "small box, raise for many voice-agent sessions.",
    "stream_idle_timeout_s": "Raise for a client (an LLM) that pauses long between pieces of text; lower to free "
                             "sessions of clients that went away sooner.",
    "max_upload_bytes": "Raise only for prompt recordings in an uncompressed format at a high rate (8 MiB holds "
                        "30 s of 48 kHz 16-bit stereo WAV).",
    "voice_dir": "To keep voices cloned over HTTP apart from those `voxserve voices add` saves for this user "
                 "(the server then finds them only if the folder is on VOXSERVE_VOICES_PATH).",
    "host": "To serve other machines (`0.0.0.0`); set `--api-key` too.",
    "port": "Another port.",
    "wyoming": "`tcp://127.0.0.1:10200` also serves Home Assistant's Wyoming protocol from the same process and "
               "engine (docs/serving.md, \"Home Assistant (Wyoming)\"); needs the `wyoming` extra. The protocol has "
               "no authentication: keep it on loopback or a trusted network.",
    "voices": "The voices to load (`--voice [NAME=]SOURCE`, repeatable; `VOXSERVE_VOICES=a,b`): a registry name, "
              "`bark:DIR`, `sbv2:DIR`, `cosyvoice2:DIR`, a Piper `.onnx` path (or `piper:PATH`); `NAME=` chooses the name requests "
              "use. The first is the default voice.",
    "device": "`auto` is CUDA if present, else CPU. `cpu` to keep a GPU free, `cuda:N` to choose a GPU.",
    "dtype": "None is fp32. `bf16` on a CPU with AVX512-BF16 or AMX, or on CUDA (more throughput; see "
             "precision.md); `fp16` on CUDA.",
    "api_key": "Set whenever the server is reachable by others: every route but `/health` then needs "
               "`Authorization: Bearer KEY`. Prefer the environment variable (a flag shows in `ps`).",
    "max_input_chars": "Raise to accept longer texts in one request (413 beyond; 4096 is OpenAI's limit). Wyoming: "
                       "the text of one request, for a streamed one all its chunks together.",
    "max_body_bytes": "Raise with `--max-input-chars` if bodies grow past 1 MiB (413 beyond).",
    "shutdown_timeout_s": "How long in-flight requests get to finish on shutdown.",
    "request_timeout_s": "A request still running after this long is cancelled (504); raise for very long texts "
                         "synthesised in one request.",
    "header_timeout_s": "Seconds a connection has to send a request's head (408 and closed beyond); raise for "
                        "slow links.",
    "body_timeout_s": "Seconds a client has to send a request's body after its head, else 408; raise for slow "
                      "links. Wyoming: to send the rest of an event it has begun, or to take one the server sends.",
    "max_connections": "Open connections beyond this get 503; raise behind a proxy that holds many idle ones.",
    "max_held_audio_mb": "The audio whole (not streamed) answers in flight may hold together, silence included "
                         "(429 beyond; 413 for one answer alone over it). Lower on a small machine; raise with much "
                         "memory and many long whole answers.",
    "unload_after": "Seconds after which a voice no request has used releases its weights (GPU memory too) and "
                    "loads again on its next request, which waits for it (docs/serving.md, \"Idle unload\"). Set on "
                    "a server holding several voices that are used now and then (every family; an SBV2 BERT or a "
                    "CosyVoice 2 model shared by several voices goes with the last of them).",
    "max_batch_size": "Raise on a GPU, with `--max-batch-phonemes`, where a batch costs little more than one "
                      "sentence.",
    "max_batch_phonemes": "Raise on a GPU (e.g. 4096). On a CPU it bounds how long a new request waits for the "
                          "batch in flight; lower only if short requests' latency matters more than throughput.",
    "max_wait_ms": "Raise (a few ms) on a GPU under steady load to fill batches; 0 starts every batch at once.",
    "max_queued_sentences": "A memory bound on queued sentences (429 beyond); raise only with much memory and "
                            "long texts.",
    "max_starve_ms": "The longest a request's next sentence waits before it goes ahead of any priority; lower if "
                     "long requests must never pause long, at some cost to short ones.",
    "executor": "`auto`: a CPU runs two batches at once, each on its share of the threads, where its voices "
                "allow it (VITS voices in eager mode on 2 or more threads), short work on urgent lanes at a "
                "higher OS priority; GPUs, step runners, offload and `torch.compile` run one batch at a time. "
                "`serial` runs one batch at a time on every thread, with no reniced threads (under outside load "
                "`auto` already stops using the reniced lanes: docs/benchmarks.md, \"A lean server\").",
    "max_queue_wait_s": "The longest a new request may wait for the work ahead of it (0.1..3600 s) before it gets "
                        "429 with Retry-After. Lower for interactive clients that would rather retry elsewhere; "
                        "raise for batch jobs.",
    "max_audio_seconds": "The audio one request may make (413 beyond; up to 86400, None: no limit); lower to bound "
                         "each request's work and memory.",
    "max_sentence_audio_seconds": "The audio one sentence may make (413 beyond; up to 3600); rarely.",
    # the families' runtime options
    "threads": "CPU intra-op threads (default: PyTorch's, the cores): to leave cores to other processes.",
    "offload": "Keep the weights in host memory, on the GPU only while a stage runs: for GPUs short of memory "
               "(no effect on a CPU).",
    "cuda_graphs": "None is on for CUDA. Off to debug; not with `offload`.",
    "compile": "`torch.compile` each stage (its first runs are slow; lanes then run one batch at a time).",
    "memory_fraction": "CUDA: cap this process's share of device memory (0..1), when it shares the GPU.",
    "max_decode_frames": "Latent frames per decoder call (~47 s at 22 kHz); lower to cap the decoder's activation "
                         "memory on a GPU (at least 64). A CPU caps it at 512 anyway.",
    "bert_batch": "Sentences per BERT forward, across requests and voices (1..64): raise on a GPU with many "
                  "concurrent requests, lower to bound the BERT's memory.",
    "attention": "`eager` for transformers' reference path; `flash_attention_2` on CUDA with fp16/bf16 and the "
                 "flash-attn package.",
    "max_sequences": "Sentences generated at once (continuous batching, 1..256): a request arriving while fewer "
                     "run starts at the next step. Raise it on a GPU (each costs its KV cache); lower it on a small "
                     "CPU for faster single requests.",
    "streaming": "Off: each sentence's audio at once (full attention in the flow) instead of chunks as tokens "
                 "come (first audio after about a second of speech).",
}

SYNTHESIS = {
    # (class, option): (default, when to change)
    ("SynthesisOptions", "speaker"): ("the voice's default speaker", "Multi-speaker voices: one of its `speakers` (Bark: a preset; CosyVoice 2: a saved voice or prompt)."),
    ("SynthesisOptions", "speed"): ("1 (the voice's rate)", "Faster or slower speech. Bark voices take only 1 (another value is a 400)."),
    ("SynthesisOptions", "sentence_silence"): ("0", "A pause after each sentence in joined output."),
    ("SynthesisOptions", "seed"): ("random", "Reproducible audio (alone or in any batch)."),
    ("PiperOptions", "noise_scale"): ("the voice's config (usually 0.667)", "Less or more variation in the voice; 0 with `noise_w` 0 is deterministic."),
    ("PiperOptions", "noise_w"): ("the voice's config (usually 0.8)", "Less or more variation in phoneme durations (they go through an exponential: at 2 a sentence can come out several times its length)."),
    ("PiperOptions", "normalize"): ("true", "False reads the text as written (no numbers, dates, units, abbreviations or URLs turned into words; English voices)."),
    ("PiperOptions", "input_format"): ("auto: `ssml` if the input starts with `<speak`", "`ssml` to refuse (400) input that is not an SSML `<speak>` document, `text` to read a text that starts with `<speak` as written (another value is a 400). SSML: README, \"SSML\"."),
    ("Sbv2Options", "noise_scale"): ("0.6", "As for Piper; 0 with `noise_w` 0 and `sdp_ratio` 0 is deterministic."),
    ("Sbv2Options", "noise_w"): ("0.8", "As for Piper."),
    ("Sbv2Options", "style"): ("\"Neutral\" if the voice has it, else style 0", "One of the voice's `styles`."),
    ("Sbv2Options", "style_weight"): ("1", "How strongly the style is applied (0 = the voice's mean style)."),
    ("Sbv2Options", "sdp_ratio"): ("0.2", "Share of the stochastic duration predictor."),
    ("Sbv2Options", "language"): ("the voice's", "Multilingual voices: `JP` or `EN` (`ja`, `en` accepted); another is a 400."),
    ("BarkOptions", "temperature"): ("the voice's (0.7)", "Sampling of the semantic and coarse stages; 0 is greedy (deterministic)."),
    ("CosyOptions", "normalize"): ("true", "False sends English text to the model as written (numbers and the like not read out)."),
    ("CosyOptions", "instructions"): ("none", "A spoken-style prompt (\"Speak slowly and calmly.\"): the language model reads it in place of the speaker's transcript and prompt speech tokens (upstream's instruct mode); the flow keeps the speaker's voice. The OpenAI route's `instructions`."),
    ("CosyOptions", "cross_lingual"): ("false", "The language model reads the text alone (no prompt transcript or speech tokens: upstream's cross-lingual mode), for text in another language than the speaker's prompt. Not with `instructions`."),
}
"""The synthesis options' defaults and "When to change" texts, per class (a knob two families
share has a row in each: their defaults differ)."""

ENGINE_ONLY = {
    "frontend_lookahead": "How far a request's text front end runs ahead of its synthesis (sentences).",
    "frontend_threads": "Text front-end threads (espeak-ng runs one call at a time).",
    "max_length_ratio": "Longest / shortest sentence in one batch (0: any); rarely.",
    "scheduler": "The `SchedulerConfig` below.",
}
"""EngineConfig / SchedulerConfig fields that are no server setting (INTERNAL): for a program
that embeds the engine."""


def _value(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, tuple):
        return "`" + ",".join(map(str, v)) + "`"
    if isinstance(v, float) and v == int(v):
        v = int(v)
    return f"`{v}`"


def _settings_tables() -> str:
    out = []
    tree = [s for s in settings() if s.path[0] != "runtime"]
    for section, title in SECTIONS.items():
        out += [f"### {title}", "", "| Flag | Environment | Default | When to change |", "| :--- | :--- | :--- | :--- |"]
        for s in tree:
            if s.path[0] == section:
                out.append(f"| `{s.flag}` | `{s.env}` | {_value(s.default)} | {WHEN[s.name]} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _runtime_tables() -> str:
    flags = {s.name: s for s in settings() if s.path[0] == "runtime"}
    out = []
    for fam in families().values():
        cls = fam.options_type
        out += [f"### `{cls.__name__}`: {fam.name} voices (`{cls.__module__.replace('.', '/')}.py`)", "",
                "| Field | Flag | Environment | Default | When to change |", "| :--- | :--- | :--- | :--- | :--- |"]
        for f in fields(cls):
            s = flags[f.name]
            default = f.default if f.default is not MISSING else None
            out.append(f"| `{f.name}` | `{s.flag}` | `{s.env}` | {_value(default)} | {WHEN[f.name]} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_BIG = {(1 << 63) - 1: "2^63-1", (1 << 31) - 1: "2^31-1"}


def _range(rule) -> str:
    lo, hi = rule.range
    if rule.kind == "boolean":
        return "true or false"
    if rule.kind == "name":
        return f"a text of 1..{rule.max_len} characters"
    if rule.kind == "id_or_name":
        return f"id {lo:g}..{_BIG.get(hi, f'{hi:g}')}, or a name of 1..{rule.max_len} characters"
    unit = f" {rule.unit}" if rule.unit else ""
    return f"{lo:g}..{_BIG.get(hi, f'{hi:g}')}{unit}"


def _synthesis_tables() -> str:
    common = option_rules(SynthesisOptions)
    out = []
    for title, cls, names in [("every voice", SynthesisOptions, list(common))] + [
            (f"{fam.name} voices", fam.synthesis_options, [n for n in option_rules(fam.synthesis_options) if n not in common])
            for fam in families().values()]:
        out += [f"### `{cls.__name__}`: {title} (`src/{cls.__module__.replace('.', '/')}.py`)", "",
                "| Option | Range | Default | When to change |", "| :--- | :--- | :--- | :--- |"]
        rules = option_rules(cls)
        for name in names:
            default, when = SYNTHESIS[cls.__name__, name]
            out.append(f"| `{name}` | {_range(rules[name])} | {default} | {when} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _engine_tables() -> str:
    flags = {s.name for s in settings()}
    out = []
    for cls in (EngineConfig, SchedulerConfig, Limits):
        module = cls.__module__.replace(".", "/")
        out += [f"### `{cls.__name__}` (`src/{module}.py`)", "",
                "| Field | Flag | Default | When to change |", "| :--- | :--- | :--- | :--- |"]
        for f in fields(cls):
            default = f.default if f.default is not MISSING else f.default_factory()
            flag = "`--" + f.name.replace("_", "-") + "`" if f.name in flags else "-"
            when = "As above." if f.name in flags else ENGINE_ONLY[f.name]
            shown = f"`{type(default).__name__}()`" if f.name == "scheduler" else _value(default)
            out.append(f"| `{f.name}` | {flag} | {shown} | {when} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _deprecated_table() -> str:
    out = ["| Old flag | Old variable | Now |", "| :--- | :--- | :--- |"]
    for old, new in DEPRECATED.items():
        out.append(f"| `--{old.replace('_', '-')}` | `VOXSERVE_{old.upper()}` | "
                   f"`--{new.replace('_', '-')}`, `VOXSERVE_{new.upper()}` |")
    return "\n".join(out) + "\n"


BLOCKS = {"serve-settings": _settings_tables, "runtime-options": _runtime_tables, "synthesis-options": _synthesis_tables,
          "engine-configs": _engine_tables, "deprecated": _deprecated_table}
_BLOCK = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def render(text: str) -> str:
    """`text` with every generated block rewritten."""
    seen = set()

    def block(m: re.Match) -> str:
        seen.add(m[2])
        return m[1] + BLOCKS[m[2]]() + m[4]

    out = _BLOCK.sub(block, text)
    missing = set(BLOCKS) - seen
    if missing:
        raise ValueError(f"docs/configuration.md lacks the generated blocks {sorted(missing)}")
    return out


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("docs/configuration.md is stale: run scripts/configuration_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
