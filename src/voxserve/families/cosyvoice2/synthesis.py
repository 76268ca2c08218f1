"""What a CosyVoice 2 voice takes per request (`CosyOptions`, the family's
`synthesis_options`): the common options (a saved voice or prompt as `speaker`; `seed` the
sampler's), normalisation and upstream's two other modes, instruct and cross-lingual. Plain
dataclasses, importable without torch. Its sampling rule is upstream's (top-p 0.8, top-k 25,
repetition-aware): no temperature."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import NORMALIZE, SynthesisOptions, boolean_field, name_field, option

MAX_INSTRUCTIONS_CHARS = 4096  # OpenAI's bound on `instructions`


@dataclass(frozen=True)
class CosyOptions(SynthesisOptions):
    normalize: bool | None = option(NORMALIZE)
    """None = true: English text is read in its spoken form (numbers and the like as words)."""
    instructions: str | None = name_field(MAX_INSTRUCTIONS_CHARS, "how to speak, a spoken-style prompt (instruct "
                                                                  "mode), e.g. 'Speak slowly and calmly.'")
    """The language model reads these instead of the speaker's prompt transcript and speech
    tokens (the flow still takes the speaker's voice). The OpenAI route's `instructions`."""
    cross_lingual: bool | None = boolean_field("speak the text without the speaker prompt's transcript, for text in "
                                               "another language than the prompt")
    """Cross-lingual mode: the language model gets neither the prompt's transcript nor its speech
    tokens, only the text; the flow keeps the speaker's voice. Not with `instructions`."""
