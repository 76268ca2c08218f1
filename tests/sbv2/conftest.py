"""Fixtures for the SBV2 tests: the reference's tiny model folders rebuilt from seeds into
tmp_path (real formats), loaded through the loader a user's checkpoint goes through, and each
fixture case's synthesizer inputs (see sbv2_fixtures.py)."""

from __future__ import annotations

import pytest

import sbv2_fixtures as fx


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def sbv2_folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sbv2")
    return {v: fx.write_model_folder(v, root / f"tiny-{v.replace('_', '-')}") for v in fx.VARIANTS}


@pytest.fixture(scope="session")
def sbv2_checkpoints(sbv2_folders) -> dict:
    from voxserve.families.sbv2.loader import load_sbv2_checkpoint

    return {v: load_sbv2_checkpoint(p) for v, p in sbv2_folders.items()}


@pytest.fixture(scope="session")
def sbv2_cases() -> dict[str, list[fx.Case]]:
    a = fx.arrays()
    out: dict[str, list[fx.Case]] = {}
    for v in fx.VARIANTS:
        out[v] = []
        for i, c in enumerate(fx.meta()["models"][v]["cases"]):
            k = f"{v}/{i}"
            out[v].append(fx.Case(v, i, c, a[f"{k}/phone_ids"], a[f"{k}/tone_ids"], a[f"{k}/language_ids"],
                               None, a[f"{k}/style_vec"], a[f"{k}/wave"], a[f"{k}/durations"]))
    return out




@pytest.fixture(scope="session")
def sbv2_bert_root(tmp_path_factory):
    """A BERT folder laid out like SBV2's bert/: the fixtures' tiny JP, EN and ZH BERTs."""
    pytest.importorskip("transformers")
    return fx.write_bert_root(tmp_path_factory.mktemp("bert_root"))
