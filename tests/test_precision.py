"""bfloat16 autocast in the build: on where native, off elsewhere, and close to float32 where on."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rag_demo import precision
from rag_demo.training import reader as reader_tuning
from rag_demo.config import EncoderConfig, ReaderTuningConfig
from rag_demo.retrieval.corpus import Passage
from rag_demo.retrieval.encoders import load_encoder
from tests import tiny

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
    encoder = load_encoder(EncoderConfig(model=str(tiny.tiny_sentence_encoder(tmp_path / "encoder"))))
    passages = [Passage(title, text) for title, text in tiny.PASSAGES]
    exact = encoder.encode_passages(passages, batch_size=4)
    fast = encoder.encode_passages(passages, batch_size=4, autocast=True)
    assert fast.dtype == np.float32 and fast.shape == exact.shape
    assert not np.array_equal(fast, exact)  # autocast did run
    assert np.min(np.sum(fast * exact, axis=1)) > 0.999  # unit vectors: cosine


@native
def test_reader_tuned_under_autocast_learns_like_float32(reader):
    """The same adapter recipe from the same weights, once in float32 and once under autocast: both
    learn, and autocast gets most of float32's gain (0.92 of it when written; bfloat16 rounding makes
    the two runs part a little, so an exact match would test torch, not us)."""
    generator, examples = reader
    shared = reader_tuning.shared_prefix(examples)
    recipe = ReaderTuningConfig(learning_rate=3e-2, batch_size=4, epochs=2, adapted_share=1.0)
    before = reader_tuning.mean_answer_loss(generator.model, shared, examples)
    gains = {}
    for autocast in (False, True):
        model = copy.deepcopy(generator.model)
        reader_tuning.tune_reader(model, shared, examples * 4, autocast=autocast, config=recipe)
        gains[autocast] = before - reader_tuning.mean_answer_loss(model, shared, examples)
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert gains[False] > 2, gains  # nats per answer token, as test_tuning asks of float32
    assert gains[True] > 0.8 * gains[False], gains
