"""The SDPA attention transform against transformers' eager Bark attention."""

from __future__ import annotations

import pytest
import torch
from bark_fixtures import TEXTS

import voxserve
from voxserve import SynthesisOptions
from voxserve.families.bark.model import BarkSdpaSelfAttention, bark_attention_modules, set_bark_attention
from voxserve.families.bark.voice import BarkRuntimeOptions, load_bark_voice


@pytest.fixture(scope="module")
def eager_voice(tiny_bark_dir):
    return load_bark_voice(tiny_bark_dir, device="cpu", runtime=BarkRuntimeOptions(attention="eager"))


def test_default_is_sdpa(bark_voice, eager_voice):
    mods = bark_attention_modules(bark_voice.runner.model)
    assert len(mods) == 6 and all(isinstance(m, BarkSdpaSelfAttention) for m in mods)  # 3 stages x 2 layers
    assert not any(isinstance(m, BarkSdpaSelfAttention) for m in bark_attention_modules(eager_voice.runner.model))


def _causal_logits(model, ids, split):
    """Prefill `split` tokens, then feed the rest one at a time through the KV cache: the
    three masking cases of causal attention (q == k, q < k with several queries, q == 1)."""
    full = model(input_ids=ids).logits
    out = model(input_ids=ids[:, :split], use_cache=True)
    cache, steps = out.cache, [out.logits]
    chunk = model(input_ids=ids[:, split : split + 3], cache=cache, use_cache=True)  # 3 queries, longer keys
    steps.append(chunk.logits)
    for t in range(split + 3, ids.shape[1]):
        o = model(input_ids=ids[:, t : t + 1], cache=chunk.cache, use_cache=True)
        steps.append(o.logits)
    return full, torch.cat(steps, dim=1)


@pytest.mark.parametrize("stage", ["semantic", "coarse_acoustics"])
def test_sdpa_matches_eager_causal(bark_voice, eager_voice, stage):
    sdpa_model = getattr(bark_voice.runner.model, stage)
    eager_model = getattr(eager_voice.runner.model, stage)
    ids = torch.randint(0, 40, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        e_full, e_inc = _causal_logits(eager_model, ids, 9)
        s_full, s_inc = _causal_logits(sdpa_model, ids, 9)
    torch.testing.assert_close(s_full, e_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_inc, e_inc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e_inc, e_full, atol=1e-5, rtol=1e-5)  # the cache path itself is right


def test_sdpa_matches_eager_fine_and_with_mask(bark_voice, eager_voice):
    ids = torch.randint(0, 16, (2, 24, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 18:] = 0
    with torch.no_grad():
        for m in (None, mask):
            s = bark_voice.runner.model.fine_acoustics(3, input_ids=ids, attention_mask=m).logits
            e = eager_voice.runner.model.fine_acoustics(3, input_ids=ids, attention_mask=m).logits
            torch.testing.assert_close(s, e, atol=1e-5, rtol=1e-5)
        sem_ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(2))
        sem_mask = torch.ones(2, 12, dtype=torch.long)
        sem_mask[0, :4] = 0  # left padding: additive mask combined with the causal block
        s = bark_voice.runner.model.semantic(input_ids=sem_ids, attention_mask=sem_mask).logits
        e = eager_voice.runner.model.semantic(input_ids=sem_ids, attention_mask=sem_mask).logits
        torch.testing.assert_close(s[0, 4:], e[0, 4:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s[1], e[1], atol=1e-5, rtol=1e-5)


def test_sdpa_and_eager_generate_the_same_tokens(bark_voice, eager_voice):
    items = bark_voice.items(TEXTS[:4], voxserve.DETERMINISTIC.merged(SynthesisOptions(speaker="announcer")))
    a = bark_voice.runner.generate_tokens(items)
    b = eager_voice.runner.generate_tokens(items)
    for x, y in zip(a, b):
        for k in ("semantic", "coarse", "fine"):
            assert torch.equal(x[k], y[k])


def test_switch_back_and_forth(eager_voice):
    model = eager_voice.runner.model
    assert set_bark_attention(model, "sdpa") == 6
    assert all(isinstance(m, BarkSdpaSelfAttention) for m in bark_attention_modules(model))
    assert set_bark_attention(model, "eager") == 6
    assert not any(isinstance(m, BarkSdpaSelfAttention) for m in bark_attention_modules(model))
    with pytest.raises(ValueError):
        set_bark_attention(model, "flash")
