"""bfloat16 autocast in the build: on where native, off elsewhere, and close to float32 where on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rag_demo import precision, tuning
from rag_demo.config import EncoderConfig, ReaderTuningConfig
from rag_demo.corpus import Passage
from rag_demo.encoders import load_encoder
from tests import tiny
from tests.test_tuning import reader, tiny_sentence_encoder  # noqa: F401 (a fixture)

native = pytest.mark.skipif(not precision.bf16_native("cpu"), reason="this CPU has no native bfloat16")


def test_autocast_is_off_when_disabled_or_not_native(monkeypatch):
    with precision.build_autocast("cpu", enabled=False):
        assert not torch.is_autocast_enabled("cpu")
    assert precision.build_precision("cpu", enabled=False) == "float32"
    monkeypatch.setattr(precision, "bf16_native", lambda device: False)
    with precision.build_autocast("cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert precision.build_precision("cpu") == "float32"


@native
def test_autocast_multiplies_in_bfloat16_where_native():
    with precision.build_autocast("cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert precision.build_precision("cpu") == "bfloat16-autocast"


@native
def test_passage_vectors_under_autocast_stay_close_to_float32(tmp_path, one_torch_thread):
    encoder = load_encoder(EncoderConfig(model=str(tiny_sentence_encoder(tmp_path / "encoder"))))
    passages = [Passage(title, text) for title, text in tiny.PASSAGES]
    exact = encoder.encode_passages(passages, batch_size=4)
    fast = encoder.encode_passages(passages, batch_size=4, autocast=True)
    assert fast.dtype == np.float32 and fast.shape == exact.shape
    assert not np.array_equal(fast, exact)  # autocast did run
    assert np.min(np.sum(fast * exact, axis=1)) > 0.999  # unit vectors: cosine


@native
def test_reader_tuned_under_autocast_learns_like_float32(reader):  # noqa: F811
    generator, examples = reader
    model = generator.model
    shared = tuning.shared_prefix(examples)
    before = tuning.mean_answer_loss(model, shared, examples)
    tuning.tune_reader(model, shared, examples * 4, autocast=True,
                       config=ReaderTuningConfig(learning_rate=3e-2, batch_size=4, epochs=2, adapted_share=1.0))
    after = tuning.mean_answer_loss(model, shared, examples)
    assert after < before - 2, (before, after)
    assert all(p.dtype == torch.float32 for p in model.parameters())
