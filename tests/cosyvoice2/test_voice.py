"""A CosyVoice 2 model folder as a voxserve voice, on the tiny random model: loading (and what
an incomplete folder says), seeded synthesis, the step runner's continuous batching (a
sequence's audio alone == beside joiners), its per-request chunk schedule (first audio after
the first chunk; a second request streams as fast as the first), cancellation and failures,
zero-shot prompts from a recording through the ONNX stand-ins."""

from __future__ import annotations

import shutil

import cv2_fixtures as fx_
import numpy as np
import pytest
import torch

import voxserve
from voxserve import SynthesisOptions
from voxserve.errors import InvalidOptionError, UnknownSpeakerError, VoiceLoadError
from voxserve.families.bark import BarkOptions
from voxserve.families.cosyvoice2 import CosyOptions
from voxserve.families.cosyvoice2.runner import CosyStepRunner
from voxserve.families.cosyvoice2.store import read_recording

SPF = 480  # samples per mel frame; 2 mel frames per speech token


def units(voice, text, **opts):
    return list(voice.units(text, CosyOptions(**opts)))


def run(runner, schedule):
    """schedule: {step: [(key, unit), ...]} joins before that step. Steps the runner until idle;
    returns key -> [(step, samples, final)] and key -> error."""
    out, errors, step = {}, {}, 0
    while runner.active or any(s >= step for s in schedule):
        for key, unit in schedule.get(step, ()):
            runner.join(key, unit)
        for res in runner.step():
            if res.error is not None:
                errors[res.key] = res.error
            else:
                out.setdefault(res.key, []).append((step, res.audio, res.final))
        step += 1
        assert step < 5000
    return out, errors


def joined(chunks):
    return np.concatenate([a for _, a, _ in chunks])


# ----------------------------------------------------------------------------- loading
def test_model_folder_loads_as_a_voice_with_its_saved_speakers(cv2_voice, cv2_dir):
    assert cv2_voice.family == "cosyvoice2" and cv2_voice.name == cv2_dir.name
    assert cv2_voice.speakers == ["spk"] and cv2_voice.sample_rate == 24000
    assert cv2_voice.step_runner() is not None


@pytest.mark.parametrize("missing", ["flow.pt", "CosyVoice-BlankEN/config.json", "cosyvoice2.yaml"])
def test_an_incomplete_folder_names_what_is_missing(cv2_dir, tmp_path, missing):
    d = tmp_path / "m"
    shutil.copytree(cv2_dir, d)
    (d / missing).unlink()
    with pytest.raises(VoiceLoadError, match=missing.replace(".", r"\.")):
        voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")


def test_a_tensor_of_the_wrong_shape_is_named(cv2_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(cv2_dir, d)
    sd = torch.load(d / "flow.pt", weights_only=True)
    key = next(k for k in sd if k.endswith("weight") and sd[k].ndim == 2)
    sd[key] = torch.zeros(sd[key].shape[0] + 1, sd[key].shape[1])
    torch.save(sd, d / "flow.pt")
    with pytest.raises(VoiceLoadError, match=f"flow.pt: tensor {key} has shape"):
        voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")


def test_a_pickled_checkpoint_is_refused(cv2_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(cv2_dir, d)
    torch.save({"x": object()}, d / "hift.pt")  # weights_only cannot read it: no code runs
    with pytest.raises(VoiceLoadError, match="hift.pt: cannot read the state dict"):
        voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")


# ----------------------------------------------------------------------------- synthesis
def test_seeded_synthesis_is_repeatable_and_the_seed_matters(cv2_voice):
    a = cv2_voice.synthesize("Hello there.", SynthesisOptions(seed=3)).samples
    b = cv2_voice.synthesize("Hello there.", SynthesisOptions(seed=3)).samples
    c = cv2_voice.synthesize("Hello there.", SynthesisOptions(seed=4)).samples
    np.testing.assert_array_equal(a, b)
    assert len(a) % (2 * SPF) == 0 and len(a) > 0 and np.isfinite(a).all()
    assert len(a) != len(c) or not np.allclose(a, c)


def test_length_bounds_hold(cv2_voice):
    (u,) = units(cv2_voice, "Hello there.", seed=1)
    n_text = len(u.payload.text_ids)
    assert (u.payload.min_tokens, u.payload.max_tokens) == (2 * n_text, 20 * n_text)
    out, _ = run(CosyStepRunner(cv2_voice.model), {0: [("a", u)]})
    tokens = len(joined(out["a"])) // (2 * SPF)
    assert 2 * n_text <= tokens <= 20 * n_text


def test_options_cosyvoice_does_not_take_are_refused(cv2_voice):
    assert cv2_voice.synthesis_options is CosyOptions
    with pytest.raises(TypeError, match="temperature"):
        CosyOptions(temperature=0.5)  # its sampler's rule is upstream's: no temperature
    with pytest.raises(TypeError, match="CosyOptions"):
        cv2_voice.synthesize("Hello.", BarkOptions(temperature=0.5))
    with pytest.raises(UnknownSpeakerError, match="spk"):
        cv2_voice.synthesize("Hello.", SynthesisOptions(speaker="nobody"))


def test_speed_stretches_the_sentence_made_whole(cv2_voice):
    (u1,) = units(cv2_voice, "Hello there.", seed=2)
    (u2,) = units(cv2_voice, "Hello there.", seed=2, speed=2.0)
    out, _ = run(CosyStepRunner(cv2_voice.model), {0: [("n", u1), ("f", u2)]})
    assert len(out["f"]) == 1 and out["f"][0][2]  # one chunk: the whole sentence
    n, f = len(joined(out["n"])), len(joined(out["f"]))
    assert abs(f - n / 2) <= 2 * SPF


# ----------------------------------------------------------------------------- the step runner
def test_first_audio_comes_after_the_first_chunk_not_the_sentence(cv2_voice):
    (u,) = units(cv2_voice, "Hello there, this is a longer sentence to say.", seed=1)
    out, _ = run(CosyStepRunner(cv2_voice.model), {0: [("a", u)]})
    chunks = out["a"]
    assert len(chunks) >= 3 and chunks[-1][2] and not any(f for _, _, f in chunks[:-1])
    prompt = u.payload.prompt.n_speech_tokens
    hop = 25 + (-prompt % 25)  # first chunk: to the 25-token grid of prompt + generated
    # ready once hop + lookahead tokens exist: step (hop + 3 - 1), the prefill making the first
    assert chunks[0][0] == hop + 3 - 1
    assert len(chunks[0][1]) == hop * 2 * SPF - 8 * SPF  # the last 8 frames' samples held back to cross-fade


def test_a_second_request_streams_as_fast_as_the_first(cv2_voice):
    """Upstream keeps its hop on the shared model: its second request's first chunk held 6.8 s."""
    runner = cv2_voice.step_runner()
    firsts = []
    for k in range(3):
        (u,) = units(cv2_voice, "Hello there, this is a longer sentence to say.", seed=10 + k)
        out, _ = run(runner, {0: [(("r", k), u)]})
        firsts.append((out[("r", k)][0][0], len(out[("r", k)][0][1])))
    assert firsts[1] == firsts[0] == firsts[2]
    assert firsts[0][1] / 24000 < 1.5


def tokens_of(runner, schedule):
    """run(), also returning key -> the speech tokens its last chunk was made from."""
    model, toks = runner.model, {}
    real = model.token2wav

    def spy(jobs):
        keys = {id(seq.stream): key for key, seq in runner._seqs.items()}
        for st, tokens, *_ in jobs:
            toks[keys[id(st)]] = list(tokens)
        return real(jobs)

    model.token2wav = spy
    try:
        return (*run(runner, schedule), toks)
    finally:
        del model.token2wav


def test_a_sequence_is_the_same_alone_and_beside_joiners(cv2_voice):
    text = "Hello there, this is a longer sentence to say."
    (a,) = units(cv2_voice, text, seed=7)
    alone, _, t_alone = tokens_of(CosyStepRunner(cv2_voice.model), {0: [("a", a)]})
    others = [units(cv2_voice, t, seed=s)[0] for t, s in (("Short one.", 1), ("Another sentence here.", 2),
                                                           (text, 3))]
    # joiners at the start, in the middle of a's generation and at its first chunk
    busy, errors, t_busy = tokens_of(CosyStepRunner(cv2_voice.model),
                                     {0: [("b", others[0]), ("a", a)], 11: [("c", others[1])], 32: [("d", others[2])]})
    assert not errors and len(t_alone["a"]) > 500
    assert t_busy["a"] == t_alone["a"]
    assert [s for s, _, _ in busy["a"]] == [s for s, _, _ in alone["a"]]
    for (_, x, fx), (_, y, fy) in zip(busy["a"], alone["a"]):
        assert fx == fy
        fx_.assert_same_audio(x, y)


def test_not_streaming_makes_each_sentence_in_one_piece_equal_in_length(cv2_voice):
    (u,) = units(cv2_voice, "Hello there, this is a longer sentence to say.", seed=5)
    streamed, _ = run(CosyStepRunner(cv2_voice.model, streaming=True), {0: [("a", u)]})
    whole, _ = run(CosyStepRunner(cv2_voice.model, streaming=False), {0: [("a", u)]})
    assert len(whole["a"]) == 1 and whole["a"][0][2]
    assert len(joined(streamed["a"])) == len(joined(whole["a"]))


def test_capacity_bounds_the_running_sequences(cv2_voice):
    runner = CosyStepRunner(cv2_voice.model, capacity=2)
    us = [units(cv2_voice, "Hello there.", seed=s)[0] for s in range(4)]
    for k, u in enumerate(us):
        runner.join(k, u)
    runner.step()
    assert len(runner.decoder) == 2 and runner.active == 4
    while runner.active:
        runner.step()
        assert len(runner.decoder) <= 2


def test_leave_drops_a_sequence_and_the_rest_run_on(cv2_voice):
    runner = CosyStepRunner(cv2_voice.model)
    (a,) = units(cv2_voice, "Hello there.", seed=1)
    (b,) = units(cv2_voice, "Hello there.", seed=2)
    ref, _ = run(CosyStepRunner(cv2_voice.model), {0: [("b", b)]})
    out, _ = run(runner, {0: [("a", a), ("b", b)]} | {5: []})
    runner2 = CosyStepRunner(cv2_voice.model)
    runner2.join("a", a)
    runner2.join("b", b)
    got = []
    for step in range(2000):
        if step == 5:
            runner2.leave("a")
        for res in runner2.step():
            assert res.key == "b"
            got.append(res.audio)
        if not runner2.active:
            break
    assert len(runner2.decoder) == 0
    np.testing.assert_allclose(np.concatenate(got), joined(ref["b"]), atol=1e-4)


def test_a_failed_decode_step_fails_its_sequences_and_the_runner_goes_on(cv2_voice, monkeypatch):
    runner = CosyStepRunner(cv2_voice.model)
    us = [units(cv2_voice, "Hello there.", seed=s)[0] for s in range(2)]
    runner.join("a", us[0])
    runner.step()
    calls = {"n": 0}
    forward = runner.decoder.batch.forward

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return forward(*args)

    runner.decoder.batch.forward = failing
    res = runner.step()
    assert [r.key for r in res] == ["a"] and isinstance(res[0].error, RuntimeError)
    assert runner.active == 0
    runner.decoder.batch.forward = forward
    out, errors = run(runner, {0: [("b", us[1])]})
    assert not errors and out["b"][-1][2]


def test_a_failed_token2wav_fails_only_its_batch(cv2_voice, monkeypatch):
    model = cv2_voice.model
    runner = CosyStepRunner(model)
    (a,) = units(cv2_voice, "Hello there.", seed=1)
    real = model.token2wav
    state = {"failed": False}

    def once(jobs):
        if not state["failed"]:
            state["failed"] = True
            raise RuntimeError("flow failed (simulated)")
        return real(jobs)

    monkeypatch.setattr(model, "token2wav", once)
    out, errors = run(runner, {0: [("a", a)], 40: [("b", units(cv2_voice, "Hello there.", seed=2)[0])]})
    assert set(errors) == {"a"} and out["b"][-1][2] and runner.active == 0


# ----------------------------------------------------------------------------- zero-shot prompts
def test_a_prompt_from_a_recording_speaks(cv2_dir, prompt_wav):
    voice = voxserve.load_voice(f"cosyvoice2:{cv2_dir}", device="cpu")
    wave, rate = read_recording(prompt_wav)
    p = voice.add_prompt("rec", wave, rate, "Hello, this is my voice.")
    assert p.n_speech_tokens == 50 and p.speech_feat.shape == (100, 80) and p.embedding.shape == (192,)
    assert "rec" in voice.speakers
    a = voice.synthesize("Hello there.", SynthesisOptions(speaker="rec", seed=1)).samples
    b = voice.synthesize("Hello there.", SynthesisOptions(speaker="spk", seed=1)).samples
    assert len(a) > 0 and np.isfinite(a).all()
    assert len(a) != len(b) or not np.allclose(a, b)


def test_a_recording_out_of_bounds_is_refused(cv2_voice):
    with pytest.raises(ValueError, match="s"):
        cv2_voice.add_prompt("short", np.zeros(800, np.float32), 16000, "hi")


def test_instruct_and_cross_lingual_modes_lay_out_the_language_models_prompt_as_upstream(cv2_voice):
    """Upstream's frontend_instruct2: the LM reads `instructions + <|endofprompt|>` in place of the
    prompt's transcript and none of its speech tokens; frontend_cross_lingual: neither. The
    flow keeps the speaker's prompt in both."""
    model, text = cv2_voice.model, "Hello there."
    (plain,) = units(cv2_voice, text, seed=3)
    (inst,) = units(cv2_voice, text, seed=3, instructions="Speak slowly.")
    (cross,) = units(cv2_voice, text, seed=3, cross_lingual=True)
    ids, p = plain.payload.text_ids, plain.payload.prompt
    end = model.tokenize("<|endofprompt|>")
    assert len(end) == 1 and end[0] > 256  # one special token, not its spelling
    assert inst.payload.lm_prompt_ids.tolist() == model.tokenize("Speak slowly.") + end
    lm = model.lm
    with torch.inference_mode():
        assert torch.equal(model.prompt(inst.payload),
                           lm.prompt_embeddings(ids, inst.payload.lm_prompt_ids, p.speech_tokens[:0]))
        assert torch.equal(model.prompt(cross.payload), lm.prompt_embeddings(ids, ids[:0], p.speech_tokens[:0]))
        full = model.prompt(plain.payload)
    assert full.shape[0] == 1 + len(p.text_ids) + len(ids) + 1 + p.n_speech_tokens
    assert model.prompt(cross.payload).shape[0] == 1 + len(ids) + 1
    # the length bounds follow the text alone, in every mode
    assert (inst.payload.min_tokens, inst.payload.max_tokens) == (plain.payload.min_tokens, plain.payload.max_tokens)
    with pytest.raises(InvalidOptionError, match="cross_lingual"):
        units(cv2_voice, text, instructions="Speak slowly.", cross_lingual=True)


def test_an_instructed_sentence_is_seeded_and_differs_from_the_plain_one(cv2_voice):
    opts = dict(seed=11, instructions="Speak slowly.")
    a = cv2_voice.synthesize("Hi there.", CosyOptions(**opts))
    b = cv2_voice.synthesize("Hi there.", CosyOptions(**opts))
    c = cv2_voice.synthesize("Hi there.", SynthesisOptions(seed=11))
    np.testing.assert_array_equal(a.samples, b.samples)
    assert len(a.samples) != len(c.samples) or not np.array_equal(a.samples, c.samples)
