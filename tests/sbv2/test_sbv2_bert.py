"""SBV2's BERT as a shared component (issue 20): one instance per language and device, one padded
batch per call, hidden_states[-3] expanded to phones on the device, features never copied to the
host; run by the real engine as a stage that mixes the sentences of several requests and voices.

The BERTs are the fixtures' tiny ones (JP DeBERTa-v2, hidden 1024, 3 layers; EN DeBERTa-v3 and
ZH RoBERTa, 2 layers) rebuilt from seeds and saved into a BERT_ROOT laid out like SBV2's, with
the recorded tokenizer files, so they load through the same transformers path as a user's
`bert/` folder."""

from __future__ import annotations

import gc
import re
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

import sbv2_fixtures as fx  # noqa: E402
from serve_fakes import RecordingSink
from voxserve.errors import InvalidInputError, VoiceLoadError  # noqa: E402
from voxserve.families.sbv2 import bert as sb  # noqa: E402
from voxserve.families.sbv2.bert import SbvBert, bert_key, shared_bert  # noqa: E402
from voxserve.limits import DEFAULT_LIMITS  # noqa: E402
from voxserve.voice import Unit, Voice  # noqa: E402

# Batched vs solo in fp32: padding changes the GEMM shapes and so the order of each reduction;
# over 24 layers that is a few ulps of the largest features (|x| up to ~4, ulp 4.8e-7), and it
# differs by CPU (docs/sbv2.md has the figures). A masking or position bug moves them by >1e-2.
FP32_BOUND = 5e-5


ZH_BERT = fx.ZH_BERT
build_bert = fx.build_bert
write_bert_root = fx.write_bert_root


@pytest.fixture(scope="module")
def bert_root(sbv2_bert_root) -> Path:
    return sbv2_bert_root


@pytest.fixture(scope="module")
def jp_bert(bert_root) -> SbvBert:
    return shared_bert(bert_root, "JP")


def jp_input(entry: dict) -> tuple[str, list[int]]:
    """SBV2's BERT input for a front-end entry: the readable words joined, word2ph with blanks."""
    return "".join(entry["sep_text"]), fx.word2ph_blank(entry["text"], "JP")


def varied_inputs(n: int = 8) -> list[tuple[str, list[int]]]:
    """n JP sentences of different lengths, shortest to longest spread over the batch."""
    entries = sorted(fx.frontend()["jp"], key=lambda d: len("".join(d["sep_text"])))
    pick = [entries[round(k * (len(entries) - 1) / (n - 1))] for k in range(n)]
    ins = [jp_input(d) for d in pick]
    ins = ins[::2] + ins[1::2][::-1]  # mixed order: long rows next to short ones
    assert len({len(t) for t, _ in ins}) >= n - 1
    return ins


def max_diff(a: torch.Tensor, b) -> float:
    b = torch.as_tensor(b)
    assert tuple(a.shape) == tuple(b.shape), (a.shape, b.shape)
    return float((a.float().cpu() - b.float().cpu()).abs().max())


# --------------------------------------------------------------------------- the component


def test_batched_features_equal_solo_features(jp_bert):
    ins = varied_inputs(8)
    solo = [jp_bert.run([x])[0] for x in ins]
    for order in (list(range(8)), list(range(8))[::-1]):
        batch = jp_bert.run([ins[k] for k in order])
        diffs = []
        for k, f in zip(order, batch):
            assert f.shape == (1024, sum(ins[k][1])) and f.dtype == torch.float32
            diffs.append(max_diff(f, solo[k]))
        lengths = sorted(len(t) for t, _ in ins)
        print(f"batched vs solo, 8 sentences of {lengths} chars: max |diff| {max(diffs):.2e}")
        assert max(diffs) <= FP32_BOUND


def test_features_equal_the_recorded_reference(jp_bert):
    """Case 0 of both variants: repeat(hidden_states[-3], word2ph_blank) as recorded in synth.npz,
    alone and inside a batch of other sentences."""
    a = fx.arrays()
    others = varied_inputs(8)[:5]
    for variant in fx.VARIANTS:
        c = fx.meta()["models"][variant]["cases"][0]
        w2p = a[f"{variant}/0/word2ph_blank"].tolist()
        ref = np.repeat(a[f"{variant}/0/bert_hidden_m3"], a[f"{variant}/0/word2ph_blank"], axis=0).T
        if f"{variant}/0/bert_phone_level" in a:
            np.testing.assert_array_equal(ref, a[f"{variant}/0/bert_phone_level"])
        ids = jp_bert.tokenize([c["bert_text"]])[0]["input_ids"][0]
        assert ids == a[f"{variant}/0/bert_input_ids"].tolist()  # the same tokens as the reference's
        solo = jp_bert.run([(c["bert_text"], w2p)])[0]
        batched = jp_bert.run(others[:2] + [(c["bert_text"], w2p)] + others[2:])[2]
        d_solo, d_batch = max_diff(solo, ref), max_diff(batched, ref)
        print(f"{variant}/0 vs the reference: solo {d_solo:.2e}, in a batch of 6 {d_batch:.2e}")
        assert d_solo <= FP32_BOUND and d_batch <= FP32_BOUND


def sbv2_features(model, tokenizer, text: str, w2p: list[int]) -> np.ndarray:
    """SBV2's get_bert_feature, one sentence, written out: tokenise, hidden_states[-3][0],
    repeat each token's vector word2ph[i] times, transpose."""
    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        res = model(**enc, output_hidden_states=True)
    res = torch.cat(res["hidden_states"][-3:-2], -1)[0]
    assert len(w2p) == res.shape[0]
    return torch.cat([res[i].repeat(w2p[i], 1) for i in range(len(w2p))], dim=0).T.numpy()


def test_zh_bert_batched_equals_sbv2s_recipe(bert_root):
    """ZH (RoBERTa-wwm, BertForMaskedLM): the recorded ZH sentences, batched, equal SBV2's
    per-sentence recipe run on the model as SBV2 loads it (AutoModelForMaskedLM)."""
    import transformers

    zh = shared_bert(bert_root, "ZH")
    folder = bert_root / ZH_BERT
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ins = [(d["norm_text"], fx.word2ph_blank(d["text"], "ZH")) for d in fx.frontend()["zh"]]
    assert len({len(t) for t, _ in ins}) == len(ins) >= 2  # different lengths: padding in the batch
    got = zh.run(ins)
    diffs = [max_diff(f, sbv2_features(model, tok, t, w)) for f, (t, w) in zip(got, ins)]
    print(f"ZH batch of {len(ins)} vs SBV2's recipe: max |diff| {max(diffs):.2e}")
    assert max(diffs) <= FP32_BOUND


def test_en_bert_equals_the_fixture_tokens_and_features(bert_root):
    """EN (DeBERTa-v3, DebertaV2Model + DebertaV2Tokenizer, which needs sentencepiece): the tokens
    are the recorded ones and the batched features equal the tiny model's on those tokens."""
    pytest.importorskip("sentencepiece")
    en = shared_bert(bert_root, "EN")
    entries = fx.frontend()["en"][:6]
    ins = [(d["norm_text"], fx.word2ph_blank(d["text"], "EN")) for d in entries]
    for d in entries:
        assert en.tokenize([d["norm_text"]])[0]["input_ids"][0] == fx.bert_input_ids(d["text"], "EN")
    got = en.run(ins)
    diffs = [max_diff(f, fx.phone_level_bert(d["text"], "EN")) for f, d in zip(got, entries)]
    print(f"EN batch of {len(ins)} vs the tiny model per sentence: max |diff| {max(diffs):.2e}")
    assert max(diffs) <= FP32_BOUND


def test_trimmed_encoder_gives_hidden_states_m3_exactly(bert_root, jp_bert):
    """The shared BERT runs only the layers up to hidden_states[-3]'s (JP tiny: 1 of 3); the full
    model's hidden_states[-3] is the same, bit for bit. (The EN and ZH tiny BERTs have 2 layers,
    so their hidden_states[-3] is the embeddings' output: they run untrimmed, tested above.)"""
    assert jp_bert.trimmed and len(jp_bert.model.encoder.layer) == 1
    full = SbvBert(bert_root / fx.JP_BERT, "JP", trim_layers=False)
    assert not full.trimmed and len(full.model.encoder.layer) == 3
    ins = varied_inputs(8)
    for a, b in zip(jp_bert.run(ins), full.run(ins)):
        assert torch.equal(a, b)


def test_an_input_that_cannot_run_is_its_own_error(jp_bert, bert_root):
    """A word2ph that does not fit the tokens (or a negative entry, or too many tokens for a
    model with absolute positions) is that input's output, as an error; its batch mates run."""
    ins = varied_inputs(4)
    text, w2p = ins[1]
    bad = [(text, w2p[:-1]), (text, [-1] + w2p[1:])]
    got = jp_bert.run([ins[0], bad[0], ins[2], bad[1], ins[3]])
    assert isinstance(got[1], ValueError) and re.search(
        r"word2ph has \d+ entries but the text .* has \d+ tokens", str(got[1]))
    assert isinstance(got[3], ValueError) and "negative" in str(got[3])
    for k, i in ((0, 0), (2, 2), (4, 3)):
        assert max_diff(got[k], jp_bert.run([ins[i]])[0]) <= FP32_BOUND
    assert jp_bert.max_tokens is None  # DeBERTa-v2: relative positions only
    zh = shared_bert(bert_root, "ZH")
    assert zh.max_tokens == 512  # BERT: absolute position embeddings
    long = "你好" * 300
    ok = (fx.frontend()["zh"][0]["norm_text"], fx.word2ph_blank(fx.frontend()["zh"][0]["text"], "ZH"))
    got = zh.run([(long, [1] * 602), ok])
    assert isinstance(got[0], InvalidInputError) and "at most 512" in str(got[0])
    assert isinstance(got[1], torch.Tensor) and got[1].shape == (1024, sum(ok[1]))
    assert isinstance(jp_bert.run([bad[0]])[0], ValueError)


def test_max_batch_is_bounded(bert_root, jp_bert):
    assert jp_bert.max_batch == 16
    text, w2p = jp_input(fx.frontend()["jp"][0])
    with pytest.raises(ValueError, match="max_batch"):
        jp_bert.run([(text, w2p)] * 17)
    for bad in (0, sb.MAX_BATCH_LIMIT + 1):
        with pytest.raises(ValueError, match="max_batch"):
            SbvBert(bert_root / fx.JP_BERT, "JP", max_batch=bad)
    assert jp_bert.run([]) == []


def test_missing_folder_names_it(tmp_path):
    with pytest.raises(VoiceLoadError, match=fx.EN_BERT):
        shared_bert(tmp_path, "EN")
    (tmp_path / ZH_BERT).mkdir()
    (tmp_path / ZH_BERT / "config.json").write_text("{}")
    with pytest.raises(VoiceLoadError, match="cannot load"):
        shared_bert(tmp_path, "ZH")
    with pytest.raises(VoiceLoadError, match="unknown language"):
        shared_bert(tmp_path, "FR")


# measured on this CPU (batch of 8 vs fp32): 5.9e-2, on features up to ~4.2 (mean |x| ~0.8)
CPU_BF16_BOUND = 1e-1


def test_cpu_bf16_parity(bert_root, jp_bert):
    """bf16 is allowed on CPU by the precision policy: its features (returned in fp32) against fp32."""
    half = SbvBert(bert_root / fx.JP_BERT, "JP", "cpu", "bf16")
    assert half.key == jp_bert.key and half.dtype == torch.bfloat16
    ins = varied_inputs(8)
    got, ref = half.run(ins), jp_bert.run(ins)
    assert all(f.dtype == torch.float32 for f in got)
    d = max(max_diff(f, r) for f, r in zip(got, ref))
    print(f"CPU bf16 vs fp32, batch of 8: max |diff| {d:.2e} (bound {CPU_BF16_BOUND:.0e})")
    assert d <= CPU_BF16_BOUND


@pytest.mark.slow
def test_real_size_deberta_batches_like_solo(tmp_path):
    """A real-size JP DeBERTa-v2 (24 layers, hidden 1024, FFN 4096; random init, 1.2 GB) through
    the same loader: 22 layers run; batched equals solo within the fp32 bound (measured 3.8e-6
    for these 4 sentences, 5.0e-6 for all 8; ~25 s here)."""
    import transformers

    b = fx.meta()["bert"][fx.JP_BERT]
    cfg = dict(b["config"], num_hidden_layers=24, intermediate_size=4096)
    torch.manual_seed(20261202)
    d = tmp_path / fx.JP_BERT
    transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**cfg)).save_pretrained(d)
    for f, v in b["tokenizer_files"].items():
        (d / f).write_text(v["text"], encoding="utf-8")
    bert = shared_bert(tmp_path, "JP")
    assert bert.trimmed and len(bert.model.encoder.layer) == 22
    ins = varied_inputs(8)[:4]
    batch = bert.run(ins)
    d = max(max_diff(f, bert.run([x])[0]) for f, x in zip(batch, ins))
    print(f"real-size DeBERTa, batch of 4 vs solo: max |diff| {d:.2e}")
    assert d <= FP32_BOUND


# --------------------------------------------------------------------------- one per device


def test_two_loads_share_one_instance_and_one_set_of_weights(bert_root, jp_bert):
    first = shared_bert(bert_root, "JP", "cpu")
    second = shared_bert(str(bert_root) + "/", "JP", torch.device("cpu"))  # another spelling of the same
    assert first is second is jp_bert
    assert first.key == ("sbv2-bert", "JP", str((bert_root / fx.JP_BERT).resolve()), "cpu")
    assert first.key == bert_key("JP", bert_root / fx.JP_BERT, "cpu")
    assert [k for k in sb._shared.keys() if k[1] == "JP" and k[2] == first.key[2]] == [first.key]
    ptrs = {p.data_ptr() for p in first.model.parameters()}
    assert ptrs == {p.data_ptr() for p in second.model.parameters()}
    assert shared_bert(bert_root, "JP", "cpu", "fp32") is first
    with pytest.raises(VoiceLoadError, match="dtype"):
        shared_bert(bert_root, "JP", "cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        shared_bert(bert_root, "JP", "cpu", torch.float16)  # the precision policy: fp16 is CUDA only


def test_concurrent_first_loads_make_one_instance(bert_root, tmp_path, monkeypatch):
    """Two voices loading at once in two threads: one load, one instance; freed with its voices."""
    root = tmp_path / "bert"
    shutil.copytree(bert_root / fx.JP_BERT, root / fx.JP_BERT)
    loads = []
    real = sb._load

    def counting(folder, language):
        loads.append(folder)
        time.sleep(0.05)  # widen the window for a race
        return real(folder, language)

    monkeypatch.setattr(sb, "_load", counting)
    got: list = [None, None]
    start = threading.Barrier(2)

    def load(k):
        start.wait()
        got[k] = shared_bert(root, "JP")

    threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got[0] is got[1] is not None and len(loads) == 1
    key = got[0].key
    assert key in sb._shared
    del got[:], t
    threads.clear()
    gc.collect()
    assert key not in sb._shared  # no voice holds it: not kept alive by the cache


# --------------------------------------------------------------------------- through the engine


class BertVoice(Voice):
    """A minimal one-shot voice whose units need the shared BERT: text is '|'-separated JP
    front-end sentences; its 'audio' is made from the features and its own gain, so a mix-up
    between sentences or voices would show. Records the features it received, by identity."""

    family = "sbv2-bert-test"
    sample_rate = 16000
    limits = DEFAULT_LIMITS

    def __init__(self, name, bert, gain, device="cpu"):
        self.name, self.bert, self.gain, self.device = name, bert, gain, device
        self.seen: list = []  # the features its batches received, by identity
        self.by_index: dict[int, torch.Tensor] = {}

    def components(self):
        return {self.bert.key: self.bert}

    def units(self, text, options=None):
        entries = {d["text"]: d for d in fx.frontend()["jp"]}
        parts = [p for p in text.split("|") if p]

        def bert_input(p):  # "BAD:" + a sentence: a word2ph one entry short (a front-end bug)
            if p.startswith("BAD:"):
                t, w = jp_input(entries[p[4:]])
                return t, w[:-1]
            return jp_input(entries[p])

        return iter([Unit(i, p, len(p), (p, self.gain), component=self.bert.key,
                          component_input=bert_input(p)) for i, p in enumerate(parts)])

    def with_component_output(self, unit, output):
        if isinstance(output, Exception):  # this sentence's BERT input could not run
            raise output
        return replace(unit, component=None, component_input=None, payload=(unit.payload, output))

    @staticmethod
    def audio_for(feats: torch.Tensor, gain: float) -> np.ndarray:
        return (feats.float().mean(dim=0) * gain).cpu().numpy()

    def run_units(self, units, early=(), on_early=None):
        out = []
        for u in units:
            assert u.component is None
            (_, gain), feats = u.payload
            self.seen.append(feats)
            self.by_index[u.index] = feats
            out.append(self.audio_for(feats, gain))
        return out


Sink = RecordingSink


def spy(bert: SbvBert, monkeypatch) -> tuple[list, list]:
    """Record each call's inputs and outputs (the outputs returned as they are)."""
    batches, outputs = [], []
    real = bert.run

    def run(inputs):
        out = real(inputs)
        batches.append(list(inputs))
        outputs.extend(out)
        return out

    monkeypatch.setattr(bert, "run", run)
    return batches, outputs


def wait_staged(eng, n: int, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while sum(len(w.stage_queue) for w in eng._workers.values()) < n:
        assert time.time() < deadline, "the sentences never reached the BERT stage"
        time.sleep(0.005)


def drain(eng) -> None:
    for _ in range(1000):
        if eng.step() is None:
            return
    raise AssertionError("the engine never ran out of work")


TEXTS = {"a": [0, 7, 20], "b": [3, 30]}  # front-end JP sentences per voice


def submit_two_voices(bert: SbvBert, device: str = "cpu"):
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig

    jp = fx.frontend()["jp"]
    va, vb = BertVoice("a", bert, 1.0, device), BertVoice("b", bert, -2.0, device)
    eng = Engine({"a": va, "b": vb}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0),
                                                  max_queue_wait_s=3600)).start(threads=False)
    assert list(eng._workers[device].components.values()) == [bert]  # one instance on the device
    sinks = {}
    for name, voice in (("a", va), ("b", vb)):
        sinks[name] = Sink()
        eng.submit(name, "|".join(jp[i]["text"] for i in TEXTS[name]), None, sinks[name])
    wait_staged(eng, 5)
    return eng, {"a": va, "b": vb}, sinks


def test_engine_stage_batches_both_voices_and_hands_over_the_same_tensors(jp_bert, monkeypatch):
    batches, outputs = spy(jp_bert, monkeypatch)
    eng, voices, sinks = submit_two_voices(jp_bert)
    drain(eng)
    jp = fx.frontend()["jp"]
    assert len(batches) == 1 and sorted(t for t, _ in batches[0]) == sorted(
        jp_input(jp[i])[0] for v in TEXTS.values() for i in v)  # one stage batch, both voices
    diffs = []
    for name, voice in voices.items():
        s = sinks[name]
        assert s.done.is_set() and s.error is None
        assert len(voice.seen) == len(TEXTS[name])
        for k, i in enumerate(TEXTS[name]):  # each sentence its own features, in its own voice
            solo = jp_bert.run([jp_input(jp[i])])[0]
            diffs.append(max_diff(voice.by_index[k], solo))
            np.testing.assert_allclose(s.audio[k], voice.audio_for(solo, voice.gain), atol=1e-5)
    print(f"engine stage batch of 5 vs solo: max |diff| {max(diffs):.2e}")
    # the voices received the very tensors the component produced: no copy on the way
    assert {id(x) for x in voices["a"].seen + voices["b"].seen} == {id(x) for x in outputs[:5]}


def test_engine_a_bad_input_fails_its_request_only(jp_bert, monkeypatch):
    """A sentence whose BERT input cannot run, in the same stage batch as another voice's
    sentences: its request fails, the other voice's request completes."""
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig

    batches, _ = spy(jp_bert, monkeypatch)
    jp = fx.frontend()["jp"]
    va, vb = BertVoice("a", jp_bert, 1.0), BertVoice("b", jp_bert, -2.0)
    eng = Engine({"a": va, "b": vb}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0),
                                                  max_queue_wait_s=3600)).start(threads=False)
    good, bad = Sink(), Sink()
    eng.submit("a", "|".join(jp[i]["text"] for i in (0, 7)), None, good)
    eng.submit("b", jp[3]["text"] + "|BAD:" + jp[30]["text"], None, bad)
    wait_staged(eng, 4)
    drain(eng)
    assert len(batches) == 1 and len(batches[0]) == 4  # one stage batch, both voices
    assert good.done.is_set() and good.error is None and sorted(good.audio) == [0, 1]
    assert isinstance(bad.error, ValueError) and "word2ph" in str(bad.error)


def test_engine_worker_thread_runs_the_bert_stage(jp_bert, monkeypatch):
    """The engine's own worker thread (not step() by hand): 4 requests over two voices, each
    sentence's features its own."""
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig

    batches, _ = spy(jp_bert, monkeypatch)
    jp = fx.frontend()["jp"]
    va, vb = BertVoice("a", jp_bert, 1.0), BertVoice("b", jp_bert, -2.0)
    texts = [[0, 7], [3], [20, 30, 5], [11]]
    sinks = [Sink() for _ in texts]
    with Engine({"a": va, "b": vb}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))) as eng:
        for k, (idx, s) in enumerate(zip(texts, sinks)):
            eng.submit("ab"[k % 2], "|".join(jp[i]["text"] for i in idx), None, s)
        for s in sinks:
            assert s.done.wait(60) and s.error is None
    assert sum(len(b) for b in batches) == 7
    for k, (idx, s) in enumerate(zip(texts, sinks)):
        gain = (1.0, -2.0)[k % 2]
        for j, i in enumerate(idx):
            want = BertVoice.audio_for(jp_bert.run([jp_input(jp[i])])[0], gain)
            np.testing.assert_allclose(s.audio[j], want, atol=1e-5)


def test_library_path_runs_one_bert_call(jp_bert, monkeypatch):
    batches, _ = spy(jp_bert, monkeypatch)
    jp = fx.frontend()["jp"]
    v = BertVoice("a", jp_bert, 1.0)
    audio = v.synthesize("|".join(jp[i]["text"] for i in (1, 2, 5)))
    assert len(batches) == 1 and len(batches[0]) == 3
    want = np.concatenate([v.audio_for(jp_bert.run([jp_input(jp[i])])[0], 1.0) for i in (1, 2, 5)])
    np.testing.assert_allclose(audio.samples, want, atol=1e-5)


# --------------------------------------------------------------------------- CUDA


class DeviceToHostCopy(AssertionError):
    pass


class DeviceToHostGuard:
    """Fails on any device-to-host copy of floating-point data (features, hidden states) made
    while active, in this thread: `.cpu()`, `.to("cpu")` (and `.numpy()`, which needs one of
    them), `.item()`, `host_tensor.copy_(device_tensor)`. It raises at the op (a
    traceback to the culprit) and records it in `violations` (a caller that catches exceptions,
    like the engine's stage, cannot hide it). Integer syncs are recorded in `int_syncs`, not
    failed. `device_type`: what counts as the device ("cpu" only to test the guard itself)."""

    def __init__(self, device_type: str = "cuda"):
        self.device_type = device_type
        self.violations: list[str] = []
        self.int_syncs: list[str] = []

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        guard = self

        def on_device(x) -> bool:
            return isinstance(x, torch.Tensor) and x.device.type == guard.device_type

        def on_host(x) -> bool:
            return isinstance(x, torch.Tensor) and x.device.type == "cpu"

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = func.overloadpacket.__name__
                src = None
                if name == "_local_scalar_dense" and on_device(args[0]):  # .item()
                    src = args[0]
                elif name == "copy_" and on_host(args[0]) and on_device(args[1]):
                    src = args[1]
                out = func(*args, **kwargs)
                if name == "_to_copy" and on_device(args[0]) and on_host(out):  # .cpu(), .to("cpu")
                    src = args[0]
                if src is not None:
                    what = f"{func} of {tuple(src.shape)} {src.dtype}"
                    if not src.is_floating_point():
                        guard.int_syncs.append(what)
                    else:
                        guard.violations.append(what)
                        raise DeviceToHostCopy(f"device-to-host copy: {what}")
                return out

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        return False


def test_device_to_host_guard_catches_copies():
    """The guard's detection, with the CPU standing in for the device (no GPU needed)."""
    x = torch.ones(4, 1024)
    copies = {"to": lambda: x.to("cpu", copy=True), "copy_": lambda: torch.empty(4, 1024).copy_(x),
              "item": lambda: (x * 2).sum().item()}  # (CPU .tolist() reads memory: no op to see)
    for what, f in copies.items():
        with DeviceToHostGuard("cpu") as g:
            with pytest.raises(DeviceToHostCopy):
                f()
        assert len(g.violations) >= 1, what
    with DeviceToHostGuard("cpu") as g:
        torch.ones(3, dtype=torch.long).sum().item()
        y = x * 2 + 1  # device-side work is fine
    assert not g.violations and g.int_syncs and y.shape == x.shape
    with DeviceToHostGuard("cuda") as g:  # a CPU-only forward: nothing leaves a (CUDA) device
        pass
    assert not g.violations


@pytest.fixture(scope="module")
def cuda_bert(bert_root):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return shared_bert(bert_root, "JP", "cuda")


@pytest.mark.cuda
def test_cuda_guard_catches_a_host_copy():
    """The guard itself on CUDA: each kind of device-to-host copy of a float tensor is caught."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.ones(4, 1024, device="cuda")
    copies = {"cpu": lambda: x.cpu(), "to": lambda: x.to("cpu"), "numpy": lambda: x.cpu().numpy(),
              "copy_": lambda: torch.empty(4, 1024).copy_(x), "item": lambda: (x * 2).sum().item()}
    for what, f in copies.items():
        with DeviceToHostGuard() as g:
            with pytest.raises(DeviceToHostCopy):
                f()
        assert g.violations, what
    with DeviceToHostGuard() as g:
        y = (x * 2).to(torch.float16)  # device-side work, a host-to-device copy: fine
        z = torch.ones(3).to("cuda")
    assert not g.violations and y.is_cuda and z.is_cuda


@pytest.mark.cuda
def test_cuda_features_never_leave_the_device(cuda_bert, jp_bert, monkeypatch):
    """The BERT stage on CUDA through the engine, under a guard that fails on any device-to-host
    copy of float data: features stay on the device and equal the CPU's."""
    assert cuda_bert.key[3] == f"cuda:{torch.cuda.current_device()}" and cuda_bert is not jp_bert
    ins = varied_inputs(8)
    with DeviceToHostGuard() as g:  # the library call
        feats = cuda_bert.run(ins)
        torch.cuda.synchronize()
    assert not g.violations, g.violations
    assert all(f.is_cuda for f in feats)
    cpu = jp_bert.run(ins)
    d = max(max_diff(f, c) for f, c in zip(feats, cpu))
    print(f"CUDA fp32 vs CPU fp32, batch of 8: max |diff| {d:.2e}; integer syncs: {g.int_syncs}")
    assert d <= 1e-4
    solo = [cuda_bert.run([x])[0] for x in ins]
    d = max(max_diff(f, s) for f, s in zip(feats, solo))
    print(f"CUDA batched vs solo: max |diff| {d:.2e}")
    assert d <= 1e-4

    batches, outputs = spy(cuda_bert, monkeypatch)
    eng, voices, sinks = submit_two_voices(cuda_bert, cuda_bert.key[3])
    with DeviceToHostGuard() as g:  # the engine's stage: BERT and the hand-over to the voices
        assert eng.step() is not None
        torch.cuda.synchronize()
    assert not g.violations, g.violations
    assert len(batches) == 1 and len(batches[0]) == 5 and all(o.is_cuda for o in outputs)
    drain(eng)  # the voices' own runs (their 'audio' goes to the host: not the BERT stage)
    assert all(s.done.is_set() and s.error is None for s in sinks.values())
    assert {id(x) for v in voices.values() for x in v.seen} == {id(x) for x in outputs}


# Parity bounds of half-precision BERT vs fp32 (max |diff| of the features, whose magnitude is up
# to ~4.2, mean |x| ~0.8, on the tiny DeBERTa). NOT YET MEASURED ON CUDA (no GPU was lent to the
# task that wrote this); the same batch on CPU measured fp16 6.6e-3 (before fp16 was refused on
# CPU) and bf16 5.9e-2. The bounds leave about 3x that; a CUDA run prints the measured values,
# to be recorded here.
HALF_BOUNDS = {torch.float16: 2e-2, torch.bfloat16: 2e-1}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_half_precision_parity(bert_root, cuda_bert, dtype):
    folder = bert_root / fx.JP_BERT
    half = SbvBert(folder, "JP", "cuda", dtype)  # its own instance: the shared one is fp32
    ins = varied_inputs(8)
    ref = cuda_bert.run(ins)
    with DeviceToHostGuard() as g:
        got = half.run(ins)
        torch.cuda.synchronize()
    assert not g.violations, g.violations
    # output_dtype: what the synthesizer takes
    assert all(f.is_cuda and f.dtype == torch.float32 for f in got)
    d = max(max_diff(f, r) for f, r in zip(got, ref))
    solo = max(max_diff(half.run([x])[0], f) for x, f in zip(ins, got))
    print(f"CUDA {dtype} vs fp32: max |diff| {d:.2e} (bound {HALF_BOUNDS[dtype]:.0e}); "
          f"batched vs solo {solo:.2e}")
    assert d <= HALF_BOUNDS[dtype]
