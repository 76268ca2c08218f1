"""Exceptions raised by voxserve. The HTTP layer maps each to a status code."""

from __future__ import annotations

from collections.abc import Sequence


class VoxserveError(Exception):
    """Base class of every error voxserve raises on purpose."""


class InvalidInputError(VoxserveError, ValueError):
    """The caller's text or options cannot be synthesised (HTTP 400)."""


class EmptyTextError(InvalidInputError):
    def __init__(self) -> None:
        super().__init__("text is empty: nothing to synthesise")


class UnpronounceableTextError(InvalidInputError):
    def __init__(self, text: str) -> None:
        shown = text if len(text) <= 40 else text[:37] + "..."
        super().__init__(f"text has no pronounceable characters: {shown!r}")


class InvalidOptionError(InvalidInputError):
    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"invalid option {option}: {message}")


class TextTooLongError(InvalidInputError):
    """Input over a configured character limit (HTTP 413)."""

    def __init__(self, length: int, limit: int) -> None:
        self.length, self.limit = length, limit
        super().__init__(f"input has {length} characters; the limit is {limit}")


class AudioTooLongError(InvalidInputError):
    """The audio a request or sentence would make is over a configured limit (HTTP 413)."""

    def __init__(self, what: str, seconds: float, limit: float, option: str = "max_audio_seconds") -> None:
        self.what, self.seconds, self.limit, self.option = what, seconds, limit, option
        super().__init__(f"{what} would be {seconds:.1f} s of audio; the limit ({option}) is {limit:g} s")


class UnknownVoiceError(VoxserveError, LookupError):
    """No voice of that name (HTTP 404)."""

    def __init__(self, name: str, available: Sequence[str], hint: str = "", list_available: bool = True) -> None:
        """hint: where such a voice may come from (`voxserve voices download NAME`); with
        list_available False the message leaves out `available` (a repository's hundreds)."""
        self.name, self.available = name, list(available)
        message = f"unknown voice {name!r}"
        if list_available:
            message += f"; available voices: {', '.join(self.available) if self.available else 'none'}"
        super().__init__(message + (f"; {hint}" if hint else ""))

    def __str__(self) -> str:  # LookupError would repr() the message
        return self.args[0]


class UnknownSpeakerError(VoxserveError, LookupError):
    """The voice has no such speaker (HTTP 400: the voice exists, the option is wrong)."""

    def __init__(self, speaker: object, voice: str, speakers: Sequence[str] | int) -> None:
        self.speaker = speaker
        if isinstance(speakers, int):
            listed = f"ids 0..{speakers - 1}" if speakers > 1 else "none (single-speaker voice)"
        else:
            listed = ", ".join(speakers)
        super().__init__(f"voice {voice!r} has no speaker {speaker!r}; speakers: {listed}")

    def __str__(self) -> str:
        return self.args[0]


class VoiceLoadError(VoxserveError):
    """A voice file is missing, unreadable or does not describe a model we can run."""


class OverloadedError(VoxserveError):
    """The engine's queue is full; retry later (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class EngineClosedError(VoxserveError):
    """The engine is shutting down or not started (HTTP 503)."""
