"""Voices made over HTTP (POST /v1/audio/voices) from a prompt recording and its transcript.

Each is saved in the voice folder as `voxserve voices add` saves one (so a later server loads it
by name) and is, at once, a speaker of the loaded voice that made it: a request for its name goes
to that voice with `speaker` set to it, on every route. Only loaded voices whose family clones
(`Voice.clones`: CosyVoice 2) make them. Nothing of a request ever becomes a path: the name is
checked against the voice-name rule (letters, digits, `_ . -`) before anything is looked up.
"""

from __future__ import annotations

import asyncio
import io
import shutil
from dataclasses import replace
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path

import numpy as np

from ..engine import Engine
from ..errors import UnknownSpeakerError
from ..families import families
from ..options import SynthesisOptions
from ..voice import Voice
from ..voices.registry import check_name, check_new_voice_name, user_voice_dir, voice_sources
from .http_errors import BadRequest

MAX_PROMPT_SECONDS = 30.0
"""A prompt recording's bound (CosyVoice 2's speech tokenizer takes 30 s at most)."""
MAX_PROMPT_TEXT = 2000
"""A prompt transcript's bound, in characters."""


def parse_form(content_type: str, body: bytes) -> dict[str, tuple[bytes, str | None]]:
    """multipart/form-data -> {field: (its bytes, its filename or None)} (the stdlib's MIME
    parser: python-multipart is not a dependency). A field given twice is refused."""
    if content_type.split(";", 1)[0].strip().lower() != "multipart/form-data":
        raise BadRequest("send the voice as multipart/form-data (name, prompt_audio, prompt_text)",
                         code="invalid_content_type", status=415)
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    msg = BytesParser(policy=HTTP).parsebytes(head + body)
    if not msg.is_multipart() or msg.defects:
        raise BadRequest("the multipart/form-data body is malformed", code="invalid_form")
    out: dict[str, tuple[bytes, str | None]] = {}
    for part in msg.iter_parts():
        field = part.get_param("name", header="content-disposition")
        if not isinstance(field, str):
            raise BadRequest("a form part has no name", code="invalid_form")
        if field in out:
            raise BadRequest(f"the form field {field!r} is given twice", field, "invalid_form")
        out[field] = (part.get_payload(decode=True) or b"", part.get_filename())
    return out


def decode_recording(data: bytes) -> tuple[np.ndarray, int]:
    """(mono float32 samples, rate) of an uploaded recording (WAV, FLAC, OGG: what soundfile
    reads), its length checked from the header before the samples are decoded."""
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(data))
        if info.samplerate <= 0 or info.frames <= 0:
            raise ValueError("no audio in it")
        seconds = info.frames / info.samplerate
        if seconds > MAX_PROMPT_SECONDS:
            raise BadRequest(f"the prompt recording is {seconds:.1f} s; at most {MAX_PROMPT_SECONDS:g} s",
                             "prompt_audio", "audio_too_long", status=413)
        wave, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except BadRequest:
        raise
    except (ValueError, RuntimeError, soundfile.LibsndfileError) as e:
        raise BadRequest(f"the prompt recording cannot be decoded (WAV, FLAC or OGG): {e}", "prompt_audio",
                         "invalid_audio") from None
    if not np.isfinite(wave).all():
        raise BadRequest("the prompt recording holds non-finite samples", "prompt_audio", "invalid_audio")
    return np.ascontiguousarray(wave.mean(axis=1), dtype=np.float32), int(rate)


class ClonedVoices:
    """The voices made over HTTP in this process: name -> the loaded voice that speaks it."""

    def __init__(self, engine: Engine, folder: Path | None):
        self.engine = engine
        self.folder = Path(folder).expanduser() if folder is not None else user_voice_dir()
        self.made: dict[str, str] = {}
        self._lock = asyncio.Lock()  # one change of the store at a time

    def cloners(self) -> list[str]:
        return [n for n, v in self.engine.voices.items() if isinstance(v, Voice) and v.clones]

    def with_speaker(self, name: str, options: SynthesisOptions) -> SynthesisOptions:
        """The options of a request to voice `name`, made here, as its maker's voice takes them:
        with its speaker."""
        if options.speaker not in (None, name, 0):
            raise UnknownSpeakerError(options.speaker, name, [name])
        return replace(options, speaker=name)

    async def add(self, name: str, recording: bytes, text: str, model: str | None) -> str:
        """Make and save voice `name`; the loaded voice that speaks it."""
        try:
            check_name(name)
        except ValueError as e:
            raise BadRequest(str(e), "name", "invalid_name") from None
        cloners = self.cloners()
        if not cloners:
            raise BadRequest("no voice loaded on this server makes voices from recordings (CosyVoice 2 does: "
                             "serve one with --voice cosyvoice2:DIR)", "model", "cloning_unsupported")
        if model is None:
            model = cloners[0]
        elif model not in cloners:
            raise BadRequest(f"{model!r} is not a loaded voice that makes voices from recordings; these are: "
                             f"{', '.join(cloners)}", "model", "cloning_unsupported")
        text = text.strip()
        if not text or len(text) > MAX_PROMPT_TEXT:
            raise BadRequest(f"prompt_text is the recording's words, 1-{MAX_PROMPT_TEXT} characters", "prompt_text",
                             "invalid_input")
        wave, rate = await asyncio.to_thread(decode_recording, recording)
        voice = self.engine.voice(model)
        async with self._lock:
            if name in self.engine.voices or name in self.made:
                raise BadRequest(f"the name {name!r} is taken by a voice of this server; choose another name",
                                 "name", "name_taken", status=409)
            try:
                await asyncio.to_thread(check_new_voice_name, name, voice.family, self.folder)
            except ValueError as e:
                reserved = "OpenAI" in str(e)
                raise BadRequest(str(e), "name", "invalid_name" if reserved else "name_taken",
                                 status=400 if reserved else 409) from None
            try:
                await asyncio.to_thread(voice.clone, name, wave, rate, text, self.folder)
            except ValueError as e:  # the family's own checks of the recording (length, rate)
                raise BadRequest(str(e), "prompt_audio", "invalid_audio") from None
            self.made[name] = model
        return model

    async def delete(self, name: str) -> None:
        """Forget voice `name` and delete its saved copy: only a voice made from a recording
        and saved in this server's voice folder."""
        try:
            check_name(name)
        except ValueError:
            raise BadRequest(f"no voice {name!r}", "name", "voice_not_found", status=404) from None
        async with self._lock:
            if name in self.engine.voices:
                raise BadRequest(f"{name!r} was loaded when the server started: restart it without that voice "
                                 "to delete it", "name", "voice_in_use", status=409)
            source = (await asyncio.to_thread(voice_sources)).get(name)
            base = self.made.pop(name, None)
            if base is not None:
                self.engine.voice(base).forget(name)
            if source is None:
                if base is None:
                    raise BadRequest(f"no voice {name!r}", "name", "voice_not_found", status=404)
                return
            fam = families().get(source.family)
            path = Path(source.path)
            if fam is None or fam.add_voice is None or path.parent.resolve() != self.folder.resolve():
                raise BadRequest(f"{name!r} is not a voice made from a recording in this server's voice folder",
                                 "name", "voice_not_deletable", status=409)
            await asyncio.to_thread(shutil.rmtree if path.is_dir() else Path.unlink, path)
