"""CosyVoice 2's language model: a Qwen2 backbone that continues a prompt of text and speech
tokens with speech tokens (25 a second, vocabulary 6561 + 3 specials).

Input, as upstream lays it out: [sos, Qwen-embed(prompt text + text), task_id,
speech-embed(prompt speech tokens)], then one speech token a step; logits come from the last
hidden state through `llm_decoder` (not Qwen's own head). Keys are upstream's llm.pt keys
(`llm.model.*` is the transformers Qwen2ForCausalLM; its lm_head is not used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ...runtime.step import hf_mask

SOS, TASK_ID = 0, 1  # rows of llm_embedding
MIN_TOKEN_TEXT_RATIO, MAX_TOKEN_TEXT_RATIO = 2, 20


@dataclass(frozen=True)
class CosyLMDims:
    hidden: int
    speech_tokens: int = 6561
    """Speech vocabulary; ids speech_tokens .. speech_tokens + 2 are EOS and two specials."""

    @property
    def vocab(self) -> int:
        return self.speech_tokens + 3

    @property
    def eos(self) -> int:
        return self.speech_tokens

    @classmethod
    def from_state_dict(cls, sd: dict) -> "CosyLMDims":
        for key in ("llm_embedding.weight", "speech_embedding.weight", "llm_decoder.weight"):
            if key not in sd:
                raise KeyError(f"llm.pt has no {key}")
        h = sd["llm_embedding.weight"].shape[1]
        v = sd["speech_embedding.weight"].shape[0]
        if sd["llm_decoder.weight"].shape != (v, h) or sd["llm_embedding.weight"].shape[0] != 2:
            raise ValueError(f"llm.pt: llm_decoder.weight {tuple(sd['llm_decoder.weight'].shape)} / llm_embedding.weight "
                             f"{tuple(sd['llm_embedding.weight'].shape)} do not fit speech_embedding.weight {(v, h)}")
        return cls(hidden=h, speech_tokens=v - 3)


class _Backbone(nn.Module):
    """Holds the Qwen2ForCausalLM under upstream's attribute name (`llm.model`)."""

    def __init__(self, qwen: nn.Module):
        super().__init__()
        self.model = qwen


class CosyLM(nn.Module):
    def __init__(self, dims: CosyLMDims, qwen: nn.Module):
        super().__init__()
        self.dims = dims
        self.llm = _Backbone(qwen)
        self.llm_embedding = nn.Embedding(2, dims.hidden)
        self.llm_decoder = nn.Linear(dims.hidden, dims.vocab)
        self.speech_embedding = nn.Embedding(dims.vocab, dims.hidden)

    @property
    def text_embedding(self) -> nn.Module:
        return self.llm.model.model.embed_tokens

    def prompt_embeddings(self, text_ids: torch.Tensor, prompt_text_ids: torch.Tensor,
                          prompt_speech: torch.Tensor) -> torch.Tensor:
        """[N], [Np], [Ns] int -> [1 + Np + N + 1 + Ns, H]."""
        w = self.llm_embedding.weight
        text = self.text_embedding(torch.cat([prompt_text_ids, text_ids]).long())
        speech = self.speech_embedding(prompt_speech.long())
        return torch.cat([w[SOS:SOS + 1], text, w[TASK_ID:TASK_ID + 1], speech])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.llm_decoder(hidden)

    def forward(self, input_ids, inputs_embeds, attention_mask, position_ids, cache) -> torch.Tensor:
        """runtime.step's LMForward: embeddings [B, T, H] (ids are never passed) -> speech
        logits [B, T, vocab]; `cache` (a DynamicCache) is extended in place."""
        if inputs_embeds is None:
            inputs_embeds = self.speech_embedding(input_ids)
        mask = hf_mask(self.llm.model.config, attention_mask, position_ids.shape[1], inputs_embeds.dtype)
        out = self.llm.model.model(inputs_embeds=inputs_embeds, attention_mask=mask,
                                   position_ids=position_ids, cache=cache, use_cache=True)
        return self.llm_decoder(out.last_hidden_state)

    def teacher_forced_logits(self, prompt: torch.Tensor, speech: torch.Tensor) -> torch.Tensor:
        """prompt [P, H], speech [S] tokens -> log-probabilities [S + 1, vocab]: of the first
        token after the prompt, and after each given token."""
        x = torch.cat([prompt, self.speech_embedding(speech.long())])[None]
        out = self.llm.model.model(inputs_embeds=x, use_cache=False)
        return self.llm_decoder(out.last_hidden_state[0, prompt.shape[0] - 1:]).log_softmax(-1)


def length_bounds(n_text: int) -> tuple[int, int]:
    """Speech tokens a sentence of n_text text tokens makes: (min, max), as upstream
    (the prompt's text does not count)."""
    return int(n_text * MIN_TOKEN_TEXT_RATIO), int(n_text * MAX_TOKEN_TEXT_RATIO)
