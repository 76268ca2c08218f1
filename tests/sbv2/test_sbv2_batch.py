"""A padded batch computes what each sentence computes alone: within 1e-4 everywhere, the last
100 ms included (the reference's own batch does not: its HiFi-GAN sees the padding), zero past
each row's end, and per-row seeds make a row's noise independent of its batch mates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbv2_fixtures as fx
from sbv2_fixtures import batch_inputs, with_bert

TOL = 1e-4
DETERMINISTIC = {"noise_scale": 0.0, "noise_scale_w": 0.0, "sdp_ratio": 0.0}


def rows(out) -> list[np.ndarray]:
    return [out.wave[i, 0, : int(n)].numpy() for i, n in enumerate(out.wave_lengths)]


def check_rows_equal_solo(ck, cases, order, **kw):
    batch = [cases[i] for i in order]
    out = ck.model.infer(**batch_inputs(batch), **kw)
    tail = ck.sample_rate // 10  # 100 ms
    diffs = []
    for row, (case, wave) in enumerate(zip(batch, rows(out))):
        solo_kw = {k: ([v[row]] if isinstance(v, list) else v) for k, v in kw.items()}
        solo = rows(ck.model.infer(**batch_inputs([case]), **solo_kw))[0]
        assert wave.shape == solo.shape
        d_all = float(np.abs(wave - solo).max())
        d_tail = float(np.abs(wave[-tail:] - solo[-tail:]).max())
        diffs.append((case.index, d_all, d_tail))
        assert d_all <= TOL and d_tail <= TOL, (case.index, d_all, d_tail)
        assert not out.wave[row, 0, len(wave):].any()  # nothing past the row's end
    return out, diffs


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_padded_batch_rows_equal_solo_and_reference(sbv2_checkpoints, sbv2_cases, variant):
    ck = sbv2_checkpoints[variant]
    cases = [with_bert(c) for c in sbv2_cases[variant]]
    # longest first and last: every row is padded in one order or the other
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        out, diffs = check_rows_equal_solo(ck, cases, order, **DETERMINISTIC)
        print(variant, order, [f"case {i}: all {a:.1e} last-100ms {t:.1e}" for i, a, t in diffs])
        for row, wave in enumerate(rows(out)):  # and the reference too
            ref = cases[order[row]].wave
            assert wave.shape == ref.shape and float(np.abs(wave - ref).max()) <= TOL


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_padded_batch_of_sdp_cases_rows_equal_solo_and_reference(sbv2_checkpoints, sbv2_cases, variant):
    """The stochastic duration predictor's cases (noise 0, per-row sdp_ratio 0.5 / 1.0) in a
    padded batch, in both orders, and mixed with the sdp_ratio = 0 cases: every row equals its
    solo output (last 100 ms included) and the reference's wave, with the reference's durations."""
    ck = sbv2_checkpoints[variant]
    plain = [with_bert(c) for c in sbv2_cases[variant]]
    sdp = [with_bert(c) for c in fx.sdp_cases(plain)]
    assert len(sdp) >= 2
    batches = [sdp, sdp[::-1], plain + sdp]
    for cases in batches:
        kw = {"noise_scale": 0.0, "noise_scale_w": 0.0, "sdp_ratio": [c.meta["sdp_ratio"] for c in cases]}
        out, diffs = check_rows_equal_solo(ck, cases, list(range(len(cases))), **kw)
        print(variant, kw["sdp_ratio"], [f"case {i}: all {a:.1e} last-100ms {t:.1e}" for i, a, t in diffs])
        for row, (case, wave) in enumerate(zip(cases, rows(out))):
            assert wave.shape == case.wave.shape and float(np.abs(wave - case.wave).max()) <= TOL
            np.testing.assert_array_equal(out.durations[row, : len(case.durations)].numpy().astype(np.int32),
                                          case.durations)


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_seeded_noise_is_per_row(sbv2_checkpoints, sbv2_cases, variant):
    """Noise on (prior, duration noise through the stochastic predictor): each row equals its
    solo run with the same seed, whatever its batch mates, and a seed repeats exactly."""
    ck = sbv2_checkpoints[variant]
    cases = [with_bert(c) for c in sbv2_cases[variant]]
    kw = dict(noise_scale=0.667, noise_scale_w=0.8, sdp_ratio=[0.5, 0.2, 1.0, 0.0], seeds=[11, 12, 13, 14])
    out, _ = check_rows_equal_solo(ck, cases, [0, 1, 2, 3], **kw)
    again = ck.model.infer(**batch_inputs(cases), **kw)
    assert torch.equal(out.wave, again.wave)
    plain = ck.model.infer(**batch_inputs(cases), **DETERMINISTIC)
    assert not torch.equal(out.wave[0], plain.wave[0])  # the noise did something
    other = ck.model.infer(**batch_inputs(cases), **{**kw, "seeds": [21, 12, 13, 14]})
    assert not torch.equal(other.wave[0], out.wave[0]) and torch.equal(other.wave[1], out.wave[1])


def test_generators_equal_seeds(sbv2_checkpoints, sbv2_cases):
    ck = sbv2_checkpoints["jp_extra"]
    cases = [with_bert(c) for c in sbv2_cases["jp_extra"][:2]]
    gens = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    a = ck.model.infer(**batch_inputs(cases), noise_scale=0.5, seeds=[5, 6])
    b = ck.model.infer(**batch_inputs(cases), noise_scale=0.5, generators=gens)
    assert torch.equal(a.wave, b.wave)


def test_missing_languages_are_zero_features(sbv2_checkpoints, sbv2_cases):
    """The multilingual model feeds zeros for the languages a sentence is not in: passing them
    explicitly or leaving them out gives the same output."""
    ck = sbv2_checkpoints["multilingual"]
    case = with_bert(sbv2_cases["multilingual"][0])
    args = batch_inputs([case])
    t = args["x"].shape[1]
    a = ck.model.infer(**args, **DETERMINISTIC)
    args["bert"] = {**args["bert"], "ZH": torch.zeros(1, 1024, t), "EN": torch.zeros(1, 1024, t)}
    b = ck.model.infer(**args, **DETERMINISTIC)
    assert float((a.wave - b.wave).abs().max()) <= 1e-6
    with pytest.raises(ValueError, match="EN"):
        jp = sbv2_checkpoints["jp_extra"]
        jp.model.infer(**{**args, "bert": {"EN": args["bert"]["EN"]}}, **DETERMINISTIC)


def test_unmasked_decoder_would_fail_the_tail_check(sbv2_checkpoints, sbv2_cases):
    """The check has teeth: decoding the same padded batch without the mask (as the reference's
    HiFi-GAN does) changes the shorter rows' last samples by more than the tolerance."""
    ck = sbv2_checkpoints["jp_extra"]
    cases = [with_bert(c) for c in sbv2_cases["jp_extra"]]
    out = ck.model.infer(**batch_inputs(cases), keep_stages=True, **DETERMINISTIC)
    g = ck.model.speaker_embedding(torch.tensor([c.meta["sid"] for c in cases]))
    with torch.no_grad():
        unmasked = ck.model.dec(out.stages["z"], None, g)
    i = 2  # the shortest row
    n = int(out.wave_lengths[i])
    tail = ck.sample_rate // 10
    assert float((unmasked[i, 0, n - tail : n] - out.wave[i, 0, n - tail : n]).abs().max()) > TOL
