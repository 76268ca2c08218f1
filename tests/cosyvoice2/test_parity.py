"""voxserve's CosyVoice 2 against the reference (cosyvoice2-eu 0.2.8) on the tiny random model:
the recorded outputs (tests/fixtures/cosyvoice2/make_reference.py) against ours, loaded through
the same loader a downloaded CosyVoice2-0.5B folder goes through."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cv2_fixtures as fx
from voxserve.families.cosyvoice2.pipeline import Stream, load_model
from voxserve.families.cosyvoice2.voice import CosyPrompt


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    return load_model(fx.write_model_folder(tmp_path_factory.mktemp("cv2")))


@pytest.fixture(scope="module")
def a():
    return fx.arrays()


def _prompt(a) -> CosyPrompt:
    return CosyPrompt("p", torch.zeros(0, dtype=torch.long), torch.tensor(a["flow/prompt_token"]),
                      torch.tensor(a["flow/prompt_feat"]), torch.tensor(a["flow/embedding"]))


def test_rebuilt_weights_are_the_recorded_ones():
    m = fx.meta()
    for part in ("llm", "flow", "hift"):
        sd = fx.state_dict(part)
        assert fx.weights.tensors_sha256({k: sd[k].numpy() for k in m["shapes"][part]}) == m["sha256"][part], part


def test_tokenizer_ids_equal_the_reference(model):
    for text, ids in fx.meta()["tokens"].items():
        assert model.tokenize(text) == ids, text


@pytest.mark.parametrize("case", [0, 1])
def test_language_model_prompt_and_teacher_forced_logits(model, a, case):
    g = lambda k: torch.tensor(a[f"llm/{case}/{k}"])  # noqa: E731
    with torch.inference_mode():
        pe = model.lm.prompt_embeddings(g("text"), g("prompt_text"), g("prompt_speech"))
        np.testing.assert_allclose(pe.numpy(), a[f"llm/{case}/lm_input"], atol=1e-6)
        logp = model.lm.teacher_forced_logits(pe, g("speech"))
    pos = fx.meta()["llm_cases"][case]["positions"]
    assert np.abs(logp[pos].numpy() - a[f"llm/{case}/logp"]).max() <= 1e-4
    np.testing.assert_array_equal(logp.argmax(-1).numpy(), a[f"llm/{case}/logp_argmax"])


def _flow(model, a, tokens, streaming, finalize, extra_rows=()):
    """Our flow's new mel for the fixture's prompt + tokens (row 0), batched with extra rows."""
    p = _prompt(a)
    rows = [torch.cat([p.speech_tokens, torch.tensor(tokens)])] + [torch.cat([p.speech_tokens, torch.tensor(t)]) for t in extra_rows]
    lengths = torch.tensor([len(r) for r in rows])
    toks = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    n = len(rows)
    with torch.inference_mode():
        mel, frames = model.flow(toks, lengths, p.speech_feat[None].expand(n, -1, -1),
                                 torch.tensor([len(p.speech_feat)] * n), p.embedding[None].expand(n, -1), streaming, finalize)
    pf = len(p.speech_feat)
    return [mel[i, :, pf:int(frames[i])].numpy() for i in range(n)]


@pytest.mark.parametrize("key, n, streaming, finalize", [
    ("flow/mel_full", 60, False, True), ("flow/mel_streaming", 60, True, True),
    ("flow/mel_streaming_lookahead", 33, True, False)])
def test_flow_equals_the_reference(model, a, key, n, streaming, finalize):
    got = _flow(model, a, a["flow/token"][:n], streaming, finalize)[0]
    assert got.shape == a[key].shape
    assert np.abs(got - a[key]).max() <= 1e-4


@pytest.mark.parametrize("streaming, finalize", [(False, True), (True, False), (True, True)])
def test_flow_rows_of_a_padded_batch_equal_their_solo_run(model, a, streaming, finalize):
    toks = a["flow/token"]
    solo = [_flow(model, a, t, streaming, finalize)[0] for t in (toks[:40], toks[:23], toks[5:60])]
    batch = _flow(model, a, toks[:40], streaming, finalize, extra_rows=(toks[:23], toks[5:60]))
    for s, b in zip(solo, batch):
        assert s.shape == b.shape and np.abs(s - b).max() <= 1e-5


def test_hift_f0_source_and_wave_with_a_seeded_generator(model, a):
    mel = torch.tensor(a["hift/mel"])[None]
    with torch.inference_mode():
        f0 = model.hift.f0_predictor(mel)[0].numpy()
        wave, source = model.hift(mel, torch.Generator().manual_seed(fx.meta()["hift"]["seed"]))
    assert np.abs(f0 - a["hift/f0"]).max() <= 1e-4 * np.abs(a["hift/f0"]).max()
    assert (a["hift/f0"] > 10).mean() > 0.9  # voiced: the sine source ran, not noise only
    assert np.abs(source[0, 0].numpy() - a["hift/source"]).max() <= 1e-4
    assert np.abs(wave[0].numpy() - a["hift/wave"]).max() <= 1e-4


def _chunks():
    la = fx.meta()["flow"]["lookahead"]
    return [(off, end if final else end - la, final) for off, end, final in fx.meta()["flow"]["chunks"]]


def test_streamed_vocoding_equals_the_references_caches_and_cross_fade(model, a):
    """HiFT per chunk, on the reference's own flow output: the 8-frame mel cache, the source
    cache and the Hamming cross-fade of the held-back tail are upstream's."""
    st = Stream(_prompt(a), torch.Generator().manual_seed(fx.meta()["t2w"]["seed"]))
    with torch.inference_mode():
        for k, (off, end, final) in enumerate(_chunks()):
            mel = torch.tensor(a[f"t2w/stream_mel/{k}"])
            new = mel if k == 0 else mel[:, 8:]
            got = model._vocode([(st, None, off, end, final, True)], [new])[0]
            want = a[f"t2w/stream/{k}"]
            assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4, k


def test_token2wav_streamed_and_whole_equal_the_reference(model, a):
    toks = a["flow/token"].tolist()
    with torch.inference_mode():
        st = Stream(_prompt(a), torch.Generator().manual_seed(fx.meta()["t2w"]["seed"]))
        streamed = [model.token2wav([(st, toks, off, end, final, True)])[0] for off, end, final in _chunks()]
        full = model.token2wav([(Stream(_prompt(a), torch.Generator().manual_seed(7)), toks, 0, len(toks), True, False)])[0]
    assert np.abs(full - a["t2w/full"]).max() <= 1e-4
    for k, w in enumerate(streamed):
        # HiFT integrates F0 into phase over a chunk: a 5e-7 difference of the flow's mel (float
        # summation order) becomes up to ~4e-4 here; the vocoding itself is exact (test above)
        assert w.shape == a[f"t2w/stream/{k}"].shape and np.abs(w - a[f"t2w/stream/{k}"]).max() <= 1e-3
    # streamed vs whole: chunk masks and full attention give other mel; ours differ from each
    # other as the reference's do
    ref_gap = np.concatenate([a[f"t2w/stream/{k}"] for k in range(len(streamed))]) - a["t2w/full"]
    assert np.abs((np.concatenate(streamed) - full) - ref_gap).max() <= 1e-3
