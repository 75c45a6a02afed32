"""Question and passage encoders of the retriever: DPR (inner product) and sentence-transformers
bi-encoders (mean pooling, unit length, cosine).

p(z|x) is the softmax of `scale * score` over the top k. DPR was trained on raw inner products,
so its scale is 1. A cosine bi-encoder's scores live in [-1, 1]; it was trained with a softmax
over `scale * cos` (all-MiniLM-L6-v2: MultipleNegativesRankingLoss, scale 20), so that same
scale gives the retrieval distribution the model learned. Without it, p(z|x) would be nearly
uniform over the top k.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import EncoderConfig
from .corpus import Passage
from ..errors import ModelLoadError
from ..packaged import resolve_encoder_path
from ..precision import build_autocast

log = logging.getLogger(__name__)

SENTENCE_TRANSFORMERS_SCALE = 20.0

# What a question may end with that says nothing about what it asks. all-MiniLM-L6-v2 reads the
# closing "?" as a token of its own: on the 450 everyday training questions, dropping it changed the
# first passage of 9% and the top 5 of over half (docs/quality-notes.md), so the same question typed
# with or without it got different evidence. NQ's questions, on which the question side is tuned, end
# without one.
_CLOSING_MARKS = re.compile(r"[\s?!.？！。]+$")


def retrieval_question(question: str) -> str:
    """The question as the retriever reads it: without the marks and spaces it ends with (unchanged if
    that would leave nothing). The generator still reads it as typed.

    >>> retrieval_question("who painted the mona lisa ?! "), retrieval_question("?")
    ('who painted the mona lisa', '?')
    """
    return _CLOSING_MARKS.sub("", question) or question


def question_tail(tokenizer, question: str, max_length: int) -> str:
    """The end of a question too long for the encoder: as much of it as `max_length` tokens hold with the
    tokenizer's special tokens, cut at a token's start. A visitor who pastes a text before the question asks
    at the end, so the end is what the retriever keeps. Shorter questions, and tokenizers without character
    offsets, are returned unchanged (the tokenizer then cuts the end off)."""
    room = max_length - tokenizer.num_special_tokens_to_add()
    if not getattr(tokenizer, "is_fast", False) or room <= 0:
        return question
    offsets = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) <= room:
        return question
    return question[offsets[-room][0]:]


def load_pretrained(loader, model: str, what: str, **kwargs):
    """`loader.from_pretrained(model)` with a message that says what to do when it fails."""
    looks_like_path = model.startswith((".", "/", "~")) or Path(model).expanduser().exists()
    if looks_like_path and not Path(model).expanduser().exists():
        raise ModelLoadError(f"{what} path {model} does not exist; give an existing folder or a Hugging Face id")
    try:
        return loader.from_pretrained(str(Path(model).expanduser()) if looks_like_path else model, **kwargs)
    except (OSError, ValueError, KeyError, EnvironmentError) as err:
        hint = "" if looks_like_path else " (no local folder of that name, and the Hugging Face Hub could not serve it)"
        raise ModelLoadError(f"could not load {what} {model!r}{hint}: {str(err).splitlines()[0][:200]}") from None


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, D) unit vectors: the mean of hidden (B, L, D) over the unmasked positions of (B, L)."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, D)
    return torch.nn.functional.normalize(pooled, dim=-1)


@dataclass
class Encoder:
    """Encodes questions (and passages, when it has a passage side) into D-dim vectors."""

    name: str
    tokenizer: object
    question_model: torch.nn.Module
    passage_model: torch.nn.Module | None  # None: questions only (e.g. from a RAG checkpoint)
    passage_tokenizer: object | None
    kind: str  # "dpr" or "sentence-transformers"
    scale: float
    max_length: int
    device: torch.device
    question_weights: str = ""  # folder name of fine-tuned question weights (`rag_demo.training.question_encoder`); "": the encoder's own

    @property
    def normalized(self) -> bool:
        return self.kind == "sentence-transformers"

    @property
    def dim(self) -> int:
        config = self.question_model.config
        return int(getattr(config, "projection_dim", 0) or config.hidden_size)

    @property
    def description(self) -> str:
        """What computes q(x), as results name it: the encoder, and its fine-tuned question weights if any."""
        return f"{self.name}, question side {self.question_weights}" if self.question_weights else self.name

    def vectors(self, model: torch.nn.Module, tokenizer, first: list[str], second: list[str] | None = None) -> torch.Tensor:
        """(B, D) float32 vectors of texts read by `model` on its own device, with gradients when grad mode is on:
        DPR's pooled output (unnormalized, as trained), or a sentence-transformers model's unit mean-pooled output."""
        device = next(model.parameters()).device
        batch = tokenizer(first, second, padding=True, truncation=True, max_length=self.max_length,
                          return_tensors="pt").to(device)
        output = model(**batch)
        if self.kind == "dpr":
            return output.pooler_output.float()
        return mean_pooled(output.last_hidden_state.float(), batch["attention_mask"])

    def _embed(self, model, tokenizer, first: list[str], second: list[str] | None = None) -> torch.Tensor:
        with torch.inference_mode():
            return self.vectors(model, tokenizer, first, second)

    def question_vectors(self, model: torch.nn.Module, questions: list[str]) -> torch.Tensor:
        """(B, D) vectors of questions (`retrieval_question`, the end of a long one: `question_tail`) read by
        `model`, this encoder's question side or a copy of it being trained, with gradients when grad mode is on."""
        read = [question_tail(self.tokenizer, retrieval_question(q), self.max_length) for q in questions]
        return self.vectors(model, self.tokenizer, read)

    def encode_questions(self, questions: list[str], *, question_model: torch.nn.Module | None = None) -> torch.Tensor:
        """(B, D) float32 question vectors from the encoder's question side, or from `question_model` in its
        place (a copy being trained, `training.end_to_end`; put it in eval mode): the same tokenizer, length
        and pooling either way, so its vectors meet the same passage vectors."""
        with torch.inference_mode():
            return self.question_vectors(self.question_model if question_model is None else question_model, list(questions))

    def _passage_texts(self, passages: list[Passage]) -> tuple[list[str], list[str] | None]:
        if self.kind == "dpr":  # DPR's context encoder reads (title, text) as a sentence pair
            return [p.title for p in passages], [p.text for p in passages]
        return [f"{p.title}: {p.text}" if p.title else p.text for p in passages], None

    def passage_token_ids(self, passages: list[Passage]) -> list[tuple[int, ...]]:
        """What the passage side reads of each passage: its token ids, cut at `max_length`. Passages
        that read the same get the same vector."""
        first, second = self._passage_texts(passages)
        ids = self.passage_tokenizer(first, second, truncation=True, max_length=self.max_length)["input_ids"]
        return [tuple(row) for row in ids]

    def encode_passages(self, passages: list[Passage], *, batch_size: int = 64, progress=None,
                        autocast: bool = False) -> np.ndarray:
        """(N, D) float32 passage vectors; `progress(done, total)` is called after each batch.

        `autocast` runs the encoder in bfloat16 where the device does so natively
        (`rag_demo.precision`): on a Xeon with AMX about 2.5x faster, cosine to the float32 vectors
        above 0.9999.
        """
        if self.passage_model is None:
            raise ModelLoadError(
                f"encoder {self.name} has no passage side; build the KB with a DPR context encoder or a "
                "sentence-transformers model (--encoder)"
            )
        chunks = []
        with build_autocast(self.device, enabled=autocast):
            for start in range(0, len(passages), batch_size):
                vectors = self._embed(self.passage_model, self.passage_tokenizer, *self._passage_texts(passages[start : start + batch_size]))
                chunks.append(vectors.cpu().numpy())
                if progress is not None:
                    progress(min(start + batch_size, len(passages)), len(passages))
        return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros((0, self.dim), np.float32)


def _fit_length(model: torch.nn.Module, wanted: int) -> int:
    """The retriever reads at most what its position embeddings cover."""
    limit = getattr(model.config, "max_position_embeddings", None) or wanted
    return min(wanted, int(limit))


def load_encoder(config: EncoderConfig, *, device: torch.device | None = None, question_path: str | Path | None = None) -> Encoder:
    """Load a DPR or sentence-transformers encoder from a hub id, a folder, or the offline default.

    `question_path`: a folder with fine-tuned weights for the question side of a
    sentence-transformers encoder; passages are still encoded with the original weights.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    device = device or torch.device("cpu")
    path = resolve_encoder_path(config.model)
    model_config = load_pretrained(AutoConfig, path, "encoder")
    kind = config.kind if config.kind != "auto" else ("dpr" if model_config.model_type == "dpr" else "sentence-transformers")
    if kind == "dpr":
        from transformers import (
            DPRContextEncoder,
            DPRContextEncoderTokenizerFast,
            DPRQuestionEncoder,
            DPRQuestionEncoderTokenizerFast,
        )

        is_context = "DPRContextEncoder" in (model_config.architectures or [])
        model_cls, tok_cls = (
            (DPRContextEncoder, DPRContextEncoderTokenizerFast) if is_context else (DPRQuestionEncoder, DPRQuestionEncoderTokenizerFast)
        )
        model = load_pretrained(model_cls, path, "encoder").to(device).eval()
        tokenizer = load_pretrained(tok_cls, path, "encoder tokenizer")
        # One DPR folder is one side; the same weights then serve both, which keeps a KB buildable.
        scale = 1.0 if config.scale is None else config.scale
        return Encoder(config.model, tokenizer, model, model, tokenizer, "dpr", scale, _fit_length(model, config.input_tokens), device)
    model = load_pretrained(AutoModel, path, "encoder").to(device).eval()
    tokenizer = load_pretrained(AutoTokenizer, path, "encoder tokenizer")
    scale = SENTENCE_TRANSFORMERS_SCALE if config.scale is None else config.scale
    question_model = model
    if question_path is not None:
        question_model = load_pretrained(AutoModel, str(question_path), "fine-tuned question encoder").to(device).eval()
    return Encoder(config.model, tokenizer, question_model, model, tokenizer, "sentence-transformers", scale,
                   _fit_length(model, config.input_tokens), device,
                   question_weights=Path(question_path).name if question_path is not None else "")


def encoder_from_modules(
    name: str, question_model: torch.nn.Module, tokenizer, *, kind: str = "dpr", scale: float = 1.0, max_length: int = 256
) -> Encoder:
    """Wrap an already loaded question encoder (e.g. a RAG checkpoint's) without a passage side."""
    device = next(question_model.parameters()).device
    return Encoder(name, tokenizer, question_model.eval(), None, None, kind, scale, _fit_length(question_model, max_length), device)
