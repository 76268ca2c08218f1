"""Command line: `voxserve say | voices | serve | bench | loadtest`.

Thin: parse, call the library, write the result. Option defaults come from the dataclasses.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
from pathlib import Path

from .families import family_for_source
from .flags import load_option_args, load_options_from, option_values, options_args, options_from, runtime_args, runtime_from
from .limits import Limits
from .voices.registry import resolve_voice

EXIT_USAGE = 2  # bad input (argparse uses 2 as well)
EXIT_ERROR = 1


DEFAULT_OUTPUT = "out.wav"
SAY_FORMATS = ("wav", "flac", "ogg", "mp3", "opus", "aac", "pcm")


def _read_text(ns: argparse.Namespace) -> str:
    if ns.text is not None and ns.file is not None:
        raise ValueError("give TEXT or -f FILE, not both")
    if ns.file is not None:
        if ns.file == "-":
            return sys.stdin.read()
        try:
            return Path(ns.file).read_text(encoding="utf-8")
        except OSError as e:  # a missing or unreadable -f is bad input, like a bad flag
            raise ValueError(f"cannot read {ns.file}: {e.strerror or e}") from None
    if ns.text is not None:
        return ns.text
    if sys.stdin.isatty():
        raise ValueError("no text: give TEXT, -f FILE, or pipe text on stdin")
    return sys.stdin.read()


def _say_output(ns: argparse.Namespace) -> str:
    """-o, or out.wav when -o is left out; an existing out.wav is never replaced unasked (a
    second `say` would silently lose the first one's audio): naming it with -o replaces it."""
    if ns.output is not None:
        return ns.output
    if os.path.lexists(DEFAULT_OUTPUT):
        raise ValueError(f"{DEFAULT_OUTPUT} exists: give -o {DEFAULT_OUTPUT} to replace it, or -o another file")
    return DEFAULT_OUTPUT


def _checked_output(path: str) -> None:
    """An output that cannot be written (a directory, a missing folder) is bad input."""
    from .outfile import check_output

    try:
        check_output(path)
    except OSError as e:
        raise ValueError(str(e)) from None


def _say_format(ns: argparse.Namespace, output: str) -> str:
    if ns.format:
        return ns.format
    if output == "-":
        return "wav"
    ext = Path(output).suffix.lower().lstrip(".")
    formats = {f: f for f in SAY_FORMATS} | {"oga": "ogg", "raw": "pcm"}
    if ext not in formats:
        raise ValueError(f"cannot tell the audio format of {Path(output).name}; name the file .wav, .flac, .ogg, "
                         f".mp3, .opus, .aac or .pcm, or give --format ({'|'.join(SAY_FORMATS)})")
    return formats[ext]


def _server(ns: argparse.Namespace) -> str:
    """--server, else $VOXSERVE_SAY_SERVER; '' = say it here."""
    from .say_remote import SERVER_ENV

    return ns.server if ns.server is not None else os.environ.get(SERVER_ENV, "")


def cmd_say_remote(ns: argparse.Namespace, server: str) -> int:
    """`say --server URL`: the text said by a running `voxserve serve` (voxserve.say_remote)."""
    from .outfile import open_output
    from .say_remote import check_server_url, request_body, say_remote

    url = check_server_url(server)
    text = _read_text(ns)
    options = {k: v for k, v in option_values(ns).items() if v is not None}  # the server's voice checks its own
    local = [flag for flag, given in (("--device", ns.device), ("--dtype", ns.dtype),
                                      ("--max-audio-seconds", ns.max_audio_seconds),
                                      ("--max-sentence-audio-seconds", ns.max_sentence_audio_seconds),
                                      ("--captions", ns.captions)) if given is not None]
    local += ["--" + k.replace("_", "-") for k in (*runtime_from(ns), *load_options_from(ns))]
    if local:
        raise ValueError(f"{local[0]} sets how a voice loaded here runs; with --server the server's own "
                         f"settings apply (leave it out, or say it here without --server)")
    ns.output = _say_output(ns)
    _checked_output(ns.output)
    fmt = _say_format(ns, ns.output)
    body = request_body(text, ns.voice, options, fmt)
    say_remote(url, body, lambda: open_output(ns.output))
    if ns.output != "-":
        print(f"wrote {ns.output} (said by the server at {url})", file=sys.stderr)
    return 0


def cmd_say(ns: argparse.Namespace) -> int:
    server = _server(ns)
    if server:
        return cmd_say_remote(ns, server)
    if ns.own_process and "torch" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
        # read once, when PyTorch loads its OpenMP runtime: idle helper threads sleep instead of
        # spinning, which on a busy machine cost a one-shot `say` 2-4x its CPU time
        # (docs/benchmarks.md, "`say` start-up, third pass"); a server keeps them spinning
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    from . import load_voice
    from .audio import SentenceJoiner, write_stream
    from .outfile import open_output

    text = _read_text(ns)
    # the voice's family's options, checked before the voice loads (another family's flag fails)
    options = options_from(ns, family_for_source(resolve_voice(ns.voice)).synthesis_options)
    ns.output = _say_output(ns)
    _checked_output(ns.output)
    if ns.captions is not None:
        from .captions import caption_format

        caption_format(ns.captions)
        _checked_output(ns.captions)
    fmt = _say_format(ns, ns.output)
    sentence_s = ns.max_sentence_audio_seconds
    limits = Limits(max_sentence_audio_seconds=Limits.max_sentence_audio_seconds if sentence_s is None else sentence_s,
                    max_audio_seconds=ns.max_audio_seconds)
    voice = load_voice(ns.voice, device=ns.device or "auto", dtype=ns.dtype, limits=limits, **load_options_from(ns),
                       **runtime_from(ns))
    if ns.captions is not None and not voice.word_timestamps:
        raise ValueError(f"voice {voice.name!r} gives no word timestamps: --captions needs a voice that does")
    stream = voice.stream(text, options)  # options checked now
    silence = voice.silence_after(options)
    words, sentence_ends = [], []  # whole-audio times, for --captions
    # the first chunk before the output opens: text with nothing to say leaves the file alone
    first = next(stream)

    def chunks():
        from tqdm import tqdm

        from .text.split import split_sentences
        from .voice import shift_words

        joiner = SentenceJoiner(voice.sample_rate, silence)
        pos = 0  # samples written
        show = ns.progress if ns.progress is not None else (len(split_sentences(text)) > 3 and sys.stderr.isatty())
        with tqdm(unit="sentence", disable=not show, file=sys.stderr) as bar:
            for c in itertools.chain([first], stream):
                parts = joiner.pieces(c.samples, c.partial)
                lead = sum(len(p) for p in parts[:-1])  # the silence before a sentence
                words.extend(shift_words(c.words, (pos + lead) / voice.sample_rate))
                pos += sum(len(p) for p in parts)
                if not c.partial:
                    sentence_ends.append(pos / voice.sample_rate)
                yield from parts
                bar.update(0 if c.partial else 1)

    # opened only now: bad input or a missing voice leaves an existing file alone and no reader
    # of a pipe waiting; a pipe, a device or stdout gets each container's stream form
    with open_output(ns.output) as out:
        write_stream(out, voice.sample_rate, fmt, chunks())
    if ns.output != "-":
        from .audio import OPUS_RATES

        rate = f"; resampled to 48000 Hz, opus has no {voice.sample_rate} Hz" if (
            fmt == "opus" and voice.sample_rate not in OPUS_RATES) else ""
        print(f"wrote {ns.output} ({len(sentence_ends)} sentences{rate})", file=sys.stderr)
    if ns.captions is not None:
        from .captions import write_captions

        n = write_captions(ns.captions, words, sentence_ends, text)
        print(f"wrote {ns.captions} ({n} cues)", file=sys.stderr)
    return 0


def cmd_voices(ns: argparse.Namespace) -> int:
    import json

    from .voices.registry import DEFAULT_VOICE, search_dirs, voice_sources

    infos = [s.describe() | {"default": name == DEFAULT_VOICE} for name, s in sorted(voice_sources().items())]
    if ns.json:
        print(json.dumps(infos, indent=2))
        return 0
    for info in infos:
        speakers = info.get("speakers") or []
        extra = f"  {len(speakers)} speakers" if speakers else ""
        mark = "*" if info["default"] else " "
        print(f"{mark} {info['name']:<28} {','.join(info.get('languages') or ()):<8} "
              f"{info.get('sample_rate', '')!s:>6} Hz{extra}  {info['path']}")
    print(f"\n* the default voice ({DEFAULT_VOICE}).\nVoice folders searched, in order of precedence "
          f"($VOXSERVE_VOICES_PATH's, then the user's; installed voice packages come last):")
    for d in search_dirs():
        print(f"  {d}{'' if d.is_dir() else '  (not there)'}")
    print("Fetch a voice by name: voxserve voices download NAME")
    return 0


def cmd_voices_download(ns: argparse.Namespace) -> int:
    from .families import families, family_for_download
    from .voices.download import check_base_url
    from .voices.registry import search_dirs, user_voice_dir

    base_url = check_base_url(ns.base_url) if ns.base_url else None
    plan = []
    for name in ns.names:  # every name checked before anything is fetched
        fam = family_for_download(name)
        if fam is None:
            examples = ", ".join(f"{f.download.example} (a {f.name} voice)" for f in families().values() if f.download)
            raise ValueError(f"{name!r} is not written as any voice repository names its voices: {examples}")
        plan.append((name, fam))
    folder = Path(ns.dir).expanduser() if ns.dir else user_voice_dir()
    for name, fam in plan:
        path, fetched = fam.download.fetch(name, folder, base_url, force=ns.force)
        print(f"{name}: {'downloaded and verified' if fetched else 'installed already (--force fetches it again)'}: "
              f"{path}", file=sys.stderr)
    if folder.resolve() not in [d.expanduser().resolve() for d in search_dirs()]:
        print(f"note: {folder} is not a voice folder voxserve searches: add it to VOXSERVE_VOICES_PATH",
              file=sys.stderr)
    return 0


def cmd_voices_add(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from .families import get_family
    from .voices.registry import check_new_voice_name, resolve_voice, user_voice_dir

    model = resolve_voice(ns.model)
    fam = get_family(model.family)
    if fam.add_voice is None:
        raise ValueError(f"{ns.model} is a {fam.name} voice: that family makes no voices from recordings")
    folder = Path(ns.dir).expanduser() if ns.dir else user_voice_dir()
    check_new_voice_name(ns.name, fam.name, folder)
    out = fam.add_voice(model, ns.name, Path(ns.prompt_wav).expanduser(), ns.prompt_text, folder)
    print(f"saved voice {ns.name!r} in {out}")
    return 0


BUILT_IN = ("say", "voices")  # subcommands defined here; the others' modules add their own


def build_parser(only_built_in: bool = False) -> argparse.ArgumentParser:
    """The whole command line; only_built_in: without the other modules' subcommands (a
    `say` or `voices` command line has no use for the server's or the benchmark's flags,
    whose modules take a large part of a `say`'s start-up to import)."""
    p = argparse.ArgumentParser(prog="voxserve", description="Fast neural text-to-speech.")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="synthesise text to an audio file")
    say.add_argument("text", nargs="?", help="text to say (or -f FILE, or stdin)")
    say.add_argument("-f", "--file", help="read the text from FILE ('-' = stdin)")
    say.add_argument("-o", "--output", default=None,
                     help=f"output file, '-' for stdout (default {DEFAULT_OUTPUT}, which is not replaced if it "
                          f"exists: give -o {DEFAULT_OUTPUT} for that)")
    say.add_argument("--voice", default=None, help="voice name, path to a Piper .onnx (or piper:PATH), bark:DIR (a local Bark checkpoint), "
                                                "sbv2:DIR (a Style-Bert-VITS2 model folder; with --bert-dir) or cosyvoice2:DIR "
                                                "(a CosyVoice 2 model folder) (default en_US-joe-medium)")
    say.add_argument("--format", choices=SAY_FORMATS,
                     help="default: from -o's extension (opus at a voice rate Opus has not is resampled to 48 kHz)")
    say.add_argument("--server", default=None, metavar="URL",
                     help="have a running `voxserve serve` at URL say it (e.g. http://127.0.0.1:8000): no model "
                          "loads here, so it starts in a fraction of the time; the voice is one the server "
                          "holds, the options and output as here; $VOXSERVE_API_KEY is sent as its key "
                          "[env VOXSERVE_SAY_SERVER; '' = say it here]")
    say.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default auto)")
    say.add_argument("--dtype", default=None, help="fp32 (default); bf16 (CPU with AVX512-BF16/AMX, or CUDA); fp16 (CUDA)")
    say.add_argument("--max-audio-seconds", type=float, default=None,
                     help="refuse a text whose audio would pass this (default: no limit, the audio "
                          "streams to the output)")
    say.add_argument("--max-sentence-audio-seconds", type=float, default=None,
                     help=f"refuse a sentence whose audio would pass this (default {Limits.max_sentence_audio_seconds:g})")
    say.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar (default: on a terminal, for more than 3 sentences; none with --server)")
    say.add_argument("--captions", default=None, metavar="FILE",
                     help="also write subtitles of the audio, timed by the voice's word timestamps: "
                          "FILE.srt or FILE.vtt (a cue of up to 42 characters, within a sentence)")
    load_option_args(say)
    runtime_args(say)
    options_args(say)
    say.set_defaults(func=cmd_say)

    voices = sub.add_parser("voices", help="list the voices that can load and where they are looked for; "
                                           "`voices download`: fetch voices by name; `voices add`: save a "
                                           "voice from a recording")
    voices.add_argument("--json", action="store_true")
    voices.set_defaults(func=cmd_voices)
    vsub = voices.add_subparsers(dest="voices_command")
    add = vsub.add_parser("add", help="save a zero-shot voice from a recording and its transcript "
                                      "(families that clone voices: CosyVoice 2)")
    add.add_argument("name", help="the new voice's name (letters, digits, _ . -)")
    add.add_argument("--model", required=True, help="the model the voice speaks with, e.g. cosyvoice2:DIR")
    add.add_argument("--prompt-wav", required=True, help="a recording of the speaker, 0.5-30 s for CosyVoice 2 (WAV, FLAC, OGG)")
    add.add_argument("--prompt-text", required=True, help="what the recording says, word for word")
    add.add_argument("--dir", default=None, help="the voice folder to save it in (default: the user voice "
                                                 "folder, ~/.local/share/voxserve/voices)")
    add.set_defaults(func=cmd_voices_add)
    dl = vsub.add_parser("download", help="fetch voices by name from their public voice repository "
                                          "(Piper voices: huggingface.co/rhasspy/piper-voices), verified, "
                                          "into the user voice folder",
                         epilog="exit status: 0 done; 2 bad input (a malformed or unknown voice name, a bad "
                                "URL: for a malformed name nothing is fetched); 1 a failure (the network, an "
                                "HTTP error, a file that fails its size or digest check or does not load: "
                                "nothing of that voice is installed)")
    dl.add_argument("names", nargs="+", metavar="NAME", help="a voice's name, e.g. en_US-lessac-medium")
    dl.add_argument("--dir", default=None, help="the voice folder to install into (default: the user voice "
                                                "folder, ~/.local/share/voxserve/voices)")
    dl.add_argument("--base-url", default=None, metavar="URL",
                    help="a mirror of the repository, with the same layout (http or https)")
    dl.add_argument("--force", action="store_true", help="download a voice again even if it is installed there")
    dl.set_defaults(func=cmd_voices_download)

    if not only_built_in:  # imported here: a `say` or `voices` has no use for them
        from . import bench, loadtest
        from .serve import cli as serve_cli

        for module in (serve_cli, bench, loadtest):
            module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .errors import (
        InvalidInputError,
        UnknownSpeakerError,
        UnknownVoiceError,
        VoiceLoadError,
        VoxserveError,
    )

    args = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in args if not a.startswith("-")), None)  # the subcommand (-v takes no value)
    top_help = first is None or not {"-h", "--help"}.isdisjoint(args[:args.index(first)])
    ns = build_parser(only_built_in=first in BUILT_IN and not top_help).parse_args(argv)
    # a command line of its own (not main() called in a process that does other things): the
    # servers may restart it with another allocator (runtime/allocator.py)
    ns.own_process = argv is None
    logging.basicConfig(level=logging.WARNING - 10 * ns.verbose, format="%(levelname)s %(name)s: %(message)s")
    try:
        rc = ns.func(ns)
    except (InvalidInputError, UnknownVoiceError, UnknownSpeakerError, VoiceLoadError, ValueError) as e:
        print(f"voxserve: error: {e}", file=sys.stderr)
        rc = EXIT_USAGE
    except (VoxserveError, OSError) as e:
        print(f"voxserve: error: {e}", file=sys.stderr)
        rc = EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    if ns.own_process and ns.command == "say" and "torch" in sys.modules:
        _exit_now(rc)
    return rc


def _exit_now(rc: int) -> None:
    """End a one-shot command whose work is done (its output written and closed) without the
    interpreter's teardown, which with PyTorch loaded costs ~0.3 s of CPU (docs/benchmarks.md,
    "`say` start-up, third pass")."""
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
