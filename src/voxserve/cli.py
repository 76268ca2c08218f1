"""Command line: `voxserve say | voices | serve | bench | loadtest`.

Thin: parse, call the library, write the result. Option defaults come from the dataclasses.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

from .options import SynthesisOptions

EXIT_USAGE = 2  # bad input (argparse uses 2 as well)
EXIT_ERROR = 1


def _options_args(p: argparse.ArgumentParser) -> None:
    """Flags for every SynthesisOptions field (default None = the voice's default)."""
    helps = {
        "speaker": "speaker id or name (multi-speaker voices)",
        "speed": "speaking rate multiplier, e.g. 1.25",
        "noise_scale": "generator noise (0 = deterministic with --noise-w 0)",
        "noise_w": "duration noise",
        "sentence_silence": "seconds of silence after each sentence",
        "seed": "noise seed for reproducible output",
        "temperature": "sampling temperature of token-generating voices (Bark); 0 = greedy",
    }
    types = {"speaker": str, "seed": int}
    for f in fields(SynthesisOptions):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=types.get(f.name, float),
                       default=f.default, help=helps.get(f.name, ""))


def _options_from(ns: argparse.Namespace) -> SynthesisOptions:
    kw = {f.name: getattr(ns, f.name) for f in fields(SynthesisOptions)}
    if isinstance(kw["speaker"], str) and kw["speaker"].isdigit():
        kw["speaker"] = int(kw["speaker"])
    return SynthesisOptions(**kw)


def _read_text(ns: argparse.Namespace) -> str:
    if ns.text is not None and ns.file is not None:
        raise ValueError("give TEXT or -f FILE, not both")
    if ns.file is not None:
        return sys.stdin.read() if ns.file == "-" else Path(ns.file).read_text(encoding="utf-8")
    if ns.text is not None:
        return ns.text
    if sys.stdin.isatty():
        raise ValueError("no text: give TEXT, -f FILE, or pipe text on stdin")
    return sys.stdin.read()


def cmd_say(ns: argparse.Namespace) -> int:
    from . import load_voice
    from .audio import check_format, format_from_path, write_stream

    text = _read_text(ns)
    options = _options_from(ns).validate()
    fmt = check_format(ns.format) if ns.format else ("wav" if ns.output == "-" else format_from_path(Path(ns.output)))
    voice = load_voice(ns.voice, device=ns.device, dtype=ns.dtype)
    units = list(voice.units(text, options))  # front end for the whole text; audio streams below
    silence = voice.silence_after(options)

    def chunks():
        import numpy as np
        from tqdm import tqdm

        show = ns.progress if ns.progress is not None else (len(units) > 3 and sys.stderr.isatty())
        with tqdm(total=len(units), unit="sentence", disable=not show, file=sys.stderr) as bar:
            for c in voice.stream_units(iter(units)):
                yield c.samples
                if silence and not c.is_last:
                    yield np.zeros(int(round(silence * voice.sample_rate)), dtype=np.float32)
                bar.update(1)

    if ns.output == "-":
        out = sys.stdout.buffer
        if fmt in ("pcm", "wav"):
            if fmt == "wav":
                out.write(streaming_wav_header(voice.sample_rate))
            write_stream(out, voice.sample_rate, "pcm", chunks())
        else:  # containers that seek back on close: spool through a temporary file
            with tempfile.TemporaryFile() as tmp:
                write_stream(tmp, voice.sample_rate, fmt, chunks())
                tmp.seek(0)
                shutil.copyfileobj(tmp, out)
        out.flush()
    else:
        path = Path(ns.output)
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as f:
            write_stream(f, voice.sample_rate, fmt, chunks())
        os.replace(tmp, path)
        print(f"wrote {path} ({len(units)} sentences)", file=sys.stderr)
    return 0


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum, as ffmpeg does)."""
    import struct

    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def cmd_voices(ns: argparse.Namespace) -> int:
    import json

    from .voices.registry import voice_sources

    infos = [s.describe() for _, s in sorted(voice_sources().items())]
    if ns.json:
        print(json.dumps(infos, indent=2))
        return 0
    for info in infos:
        speakers = info.get("speakers") or []
        extra = f"  {len(speakers)} speakers" if speakers else ""
        print(f"{info['name']:<28} {info.get('language', ''):<8} {info.get('sample_rate', '')!s:>6} Hz{extra}  {info['path']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="voxserve", description="Fast neural text-to-speech.")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="synthesise text to an audio file")
    say.add_argument("text", nargs="?", help="text to say (or -f FILE, or stdin)")
    say.add_argument("-f", "--file", help="read the text from FILE ('-' = stdin)")
    say.add_argument("-o", "--output", default="out.wav", help="output file, '-' for stdout (default out.wav)")
    say.add_argument("--voice", default=None, help="voice name, path to a Piper .onnx, or bark:DIR for a local Bark checkpoint (default en_US-joe-medium)")
    say.add_argument("--format", choices=["wav", "flac", "ogg", "mp3", "opus", "pcm"], help="default: from -o's extension")
    say.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    say.add_argument("--dtype", default=None, help="fp32 (default); bf16 (CPU with AVX512-BF16/AMX, or CUDA); fp16 (CUDA)")
    say.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar (default: on a terminal, for more than 3 sentences)")
    _options_args(say)
    say.set_defaults(func=cmd_say)

    voices = sub.add_parser("voices", help="list the voices that can load")
    voices.add_argument("--json", action="store_true")
    voices.set_defaults(func=cmd_voices)

    for mod in ("serve.cli", "bench", "loadtest"):
        try:
            module = __import__(f"voxserve.{mod}", fromlist=["add_parser"])
        except ModuleNotFoundError as e:
            if e.name != f"voxserve.{mod}" and not f"voxserve.{mod}".startswith(f"{e.name}."):
                raise
            continue
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .errors import InvalidInputError, UnknownSpeakerError, UnknownVoiceError, VoxserveError

    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * ns.verbose, format="%(levelname)s %(name)s: %(message)s")
    try:
        return ns.func(ns)
    except (InvalidInputError, UnknownVoiceError, UnknownSpeakerError, ValueError) as e:
        print(f"voxserve: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (VoxserveError, OSError) as e:
        print(f"voxserve: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
