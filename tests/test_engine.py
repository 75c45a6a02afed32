"""Engine behaviour on tiny random models: identities, references, provenance, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from rag_demo.config import LIMITS
from rag_demo.errors import InputError, KnowledgeBaseError
from rag_demo.generation.decoding import length_limit_notice

QUESTION = "who wrote a farewell to arms"


def _gen_batch(parts, texts):
    return parts["gen_tok"](texts, max_length=64, padding=True, truncation=True, return_tensors="pt")


def _plain_logprob(bart, batch_row, labels):
    """log p(labels[1:] | input, labels[:1]) from one un-batched BART forward."""
    with torch.no_grad():
        logits = bart(**batch_row, decoder_input_ids=labels[:, :-1]).logits
    return logits.log_softmax(-1).gather(-1, labels[:, 1:, None]).squeeze(-1)[0]


def test_k1_equals_the_plain_generator(tiny_engine, tiny_parts):
    result = tiny_engine.ask(QUESTION, k=1, max_new_tokens=8, closed_book=False)
    text = tiny_engine._inputs(tiny_engine.retrieve(QUESTION, k=1))
    with torch.no_grad():
        plain = tiny_parts["bart"].generate(**_gen_batch(tiny_parts, text), max_length=9, num_beams=1, do_sample=False)
    expected = plain[0, 1:].tolist()
    assert list(result.variants["token"].token_ids) == expected
    assert list(result.variants["sequence"].token_ids) == expected
    labels = plain[:, :]
    direct = float(_plain_logprob(tiny_parts["bart"], _gen_batch(tiny_parts, text), labels).sum())
    assert result.variants["token"].logprob == pytest.approx(direct, abs=1e-4)
    assert result.variants["sequence"].logprob == pytest.approx(direct, abs=1e-4)
    assert result.passages[0].prob == pytest.approx(1.0)


def test_per_passage_logprobs_equal_unbatched_forwards(tiny_engine, tiny_parts):
    result = tiny_engine.score(QUESTION, "ernest hemingway", k=4)
    texts = tiny_engine._inputs(tiny_engine.retrieve(QUESTION, k=4))
    labels = tiny_parts["gen_tok"](["ernest hemingway"], return_tensors="pt")["input_ids"]
    variant = result.variants["token"]
    for z, text in enumerate(texts):
        direct = _plain_logprob(tiny_parts["bart"], _gen_batch(tiny_parts, [text]), labels)
        assert [row[z] for row in variant.doc_token_logprobs] == pytest.approx(direct.tolist(), abs=1e-4)


def test_provenance_shapes_and_sums(tiny_engine):
    result = tiny_engine.ask(QUESTION, k=4, max_new_tokens=6)
    assert len(result.passages) == 4
    assert sum(p.prob for p in result.passages) == pytest.approx(1.0, abs=1e-5)
    assert [p.rank for p in result.passages] == [1, 2, 3, 4]
    assert all(a.score >= b.score for a, b in zip(result.passages, result.passages[1:]))
    for variant in result.variants.values():
        T = len(variant.tokens)
        assert T == len(variant.token_ids) == len(variant.token_logprobs) == len(variant.closed_book_token_logprobs)
        assert len(variant.posteriors) == T and all(len(row) == 4 for row in variant.posteriors)
        assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in variant.posteriors)
        assert sum(variant.token_logprobs) == pytest.approx(variant.logprob, abs=1e-3)
    seq = result.variants["sequence"]
    # the running posterior's last row is p(z|x,y) = p(z|x) p(y|x,z) / p(y|x)
    per_doc = [sum(row[z] for row in seq.doc_token_logprobs) for z in range(4)]
    expected = [math.exp(math.log(p.prob) + lp - seq.logprob) for p, lp in zip(result.passages, per_doc)]
    assert list(seq.posteriors[-1]) == pytest.approx(expected, abs=1e-4)
    assert set(result.timings_ms) >= {"encode", "search", "generate", "total"}


@pytest.mark.parametrize("variants, closed_book, decoding", [
    (("token", "sequence"), True, "thorough"), (("token",), False, "thorough"), (("sequence",), True, "fast"),
])
def test_ask_reports_each_step_once_in_order(tiny_engine, variants, closed_book, decoding):
    heard = []
    result = tiny_engine.ask(QUESTION, k=3, max_new_tokens=4, variants=variants, closed_book=closed_book,
                             sequence_decoding=decoding, progress=lambda *report: heard.append(report))
    stages = [stage for stage, _, _ in heard]
    total = heard[0][2]
    assert [done for _, done, _ in heard] == list(range(total)) and {t for _, _, t in heard} == {total}
    assert stages[:2] == ["retrieving passages", "reading the 3 passages"]
    assert stages[-1] == ("the closed-book answer (no passages)" if closed_book else "tracing each answer token to its passages")
    assert any(s.startswith("RAG-Token") for s in stages) == ("token" in variants)
    scoring = [s for s in stages if s.startswith("RAG-Sequence: scoring")]
    if "sequence" in variants:
        candidates = len(result.variants["sequence"].candidates)
        plural = "s" if candidates != 1 else ""
        against = "against all 3 passages" if decoding == "thorough" else "against the passages that wrote them"
        assert scoring == [f"RAG-Sequence: scoring {candidates} candidate answer{plural} {against}"]
    else:
        assert scoring == []
    quiet = tiny_engine.ask(QUESTION, k=3, max_new_tokens=4, variants=variants, closed_book=closed_book,
                            sequence_decoding=decoding)
    assert {v: r.token_ids for v, r in quiet.variants.items()} == {v: r.token_ids for v, r in result.variants.items()}


def test_score_reports_its_four_steps(tiny_engine):
    heard = []
    tiny_engine.score(QUESTION, "paris", k=2, progress=lambda *report: heard.append(report))
    assert heard == [("retrieving passages", 0, 4), ("reading the 2 passages", 1, 4),
                     ("scoring the answer under each passage", 2, 4), ("scoring it closed-book (no passages)", 3, 4)]


def test_a_scored_answer_has_no_badge_and_says_why(tiny_engine):
    from rag_demo.sureness import SCORED_NO_BADGE

    scored = tiny_engine.score(QUESTION, "paris", k=2)
    assert all(result.sureness == "" for result in scored.variants.values())
    assert scored.notices.count(SCORED_NO_BADGE) == 1 and "answers the generator wrote itself" in SCORED_NO_BADGE


def test_closed_book_matches_generator_without_passages(tiny_engine, tiny_parts):
    result = tiny_engine.ask(QUESTION, k=2, max_new_tokens=6)
    question_as_read = tiny_engine.retrieve(QUESTION, k=1).generator_question
    with torch.no_grad():
        plain = tiny_parts["bart"].generate(**_gen_batch(tiny_parts, [question_as_read]), max_length=7, num_beams=1, do_sample=False)
    assert result.closed_book.answer == tiny_parts["gen_tok"].decode(plain[0, 1:], skip_special_tokens=True).strip()
    assert result.closed_book.logprob == pytest.approx(sum(result.closed_book.token_logprobs), abs=1e-5)


def _reference_sequence_decode(engine, parts, rag_config, question, k, num_beams, new_tokens, fast):
    """RAG-Sequence decoding from transformers' pieces, with the attention mask kept."""
    from transformers import RagSequenceForGeneration

    retrieval = engine.retrieve(question, k=k)
    texts = engine._inputs(retrieval)
    batch = parts["gen_tok"](texts, max_length=64, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        outs = parts["bart"].generate(**batch, num_beams=num_beams, num_return_sequences=num_beams,
                                      max_length=new_tokens + 1, do_sample=False)
    pad = parts["gen_tok"].pad_token_id
    found: dict[tuple, list[int]] = {}
    for row, seq in enumerate(outs.tolist()):
        while seq and seq[-1] == pad:
            seq.pop()
        found.setdefault(tuple(seq), [])
        if row // num_beams not in found[tuple(seq)]:
            found[tuple(seq)].append(row // num_beams)
    model = RagSequenceForGeneration(config=rag_config, question_encoder=parts["q_enc"], generator=parts["bart"]).eval()
    scores = torch.tensor([[p.score for p in retrieval.passages]])
    best, best_score = None, -float("inf")
    for seq, finders in found.items():
        docs = list(range(k)) if not fast else finders
        labels = torch.tensor([list(seq)])
        with torch.no_grad():
            loss = model(context_input_ids=batch.input_ids[docs], context_attention_mask=batch.attention_mask[docs],
                         doc_scores=scores[:, docs], labels=labels, n_docs=len(docs), reduce_loss=False).loss
        # renormalizing over the finders' priors would change the score; add their prior mass back
        score = -float(loss) + (float(torch.logsumexp(retrieval.doc_lp[docs], 0)) if fast else 0.0)
        if score > best_score:
            best, best_score = seq, score
    return list(best[1:]), best_score


@pytest.mark.parametrize("num_beams", [1, 2, 3])
@pytest.mark.parametrize("decoding", ["thorough", "fast"])
@pytest.mark.parametrize("question", [QUESTION, "capital of france"])
def test_rag_sequence_decoding_equals_reference(tiny_engine, tiny_parts, rag_config, num_beams, decoding, question):
    k, new_tokens = 3, 6
    ours = tiny_engine.ask(question, k=k, variants=("sequence",), num_beams=num_beams, max_new_tokens=new_tokens,
                           sequence_decoding=decoding, closed_book=False).variants["sequence"]
    ids, score = _reference_sequence_decode(tiny_engine, tiny_parts, rag_config, question, k, num_beams, new_tokens, decoding == "fast")
    assert list(ours.token_ids) == ids
    assert max(s for _, s in ours.candidates) == pytest.approx(score, abs=1e-4)
    if decoding == "thorough":
        assert ours.logprob == pytest.approx(score, abs=1e-4)


def test_index_variants_answer_and_report_recall(tiny_engine):
    flat = tiny_engine.ask(QUESTION, k=3, index="flat", closed_book=False)
    assert flat.index_recall is None
    exact = {p.id for p in flat.passages}
    for kind in ("hnsw", "ivfpq"):
        result = tiny_engine.ask(QUESTION, k=3, index=kind, closed_book=False)
        # recall@3 against flat: the share of flat's passages this index found too
        assert result.index == kind and result.index_recall == len({p.id for p in result.passages} & exact) / 3
        assert result.timings_ms["recall check"] > 0 and "recall check" not in flat.timings_ms
    reports = {r.kind: r for r in tiny_engine.index_reports("tiny", k=3)}
    assert set(reports) == {"flat", "hnsw", "ivfpq"}
    assert reports["flat"].recall_at_k == 1.0 and reports["hnsw"].recall_at_k == 1.0  # 6 vectors: HNSW is exact


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"question": "   "}, "empty"),
        ({"question": "\x00\x07"}, "empty"),
        ({"k": 0}, "at least 1"),
        ({"k": 99}, "larger than the knowledge base"),
        ({"index": "annoy"}, "unknown index"),
        ({"variants": ("beam",)}, "unknown variant"),
        ({"kb": "nope"}, "unknown knowledge base"),
        ({"num_beams": 0}, "num_beams"),
        ({"max_new_tokens": 10_000}, "max_new_tokens"),
        ({"sequence_decoding": "quick"}, "unknown decoding"),
        ({"extractive": True}, "causal generators only"),  # the tiny BART is seq2seq
    ],
)
def test_bad_input_gets_a_clear_error(tiny_engine, kwargs, message):
    kwargs = {"question": QUESTION, **kwargs}
    with pytest.raises(InputError, match=message):
        tiny_engine.ask(kwargs.pop("question"), **kwargs)


def test_blank_answer_is_refused(tiny_engine):
    with pytest.raises(InputError, match="answer is empty"):
        tiny_engine.score(QUESTION, "  ")


def test_long_question_is_cut_with_a_notice(tiny_engine):
    from rag_demo.retrieval.encoders import question_tail

    result = tiny_engine.ask("lake " * 3000, k=2, max_new_tokens=2, closed_book=False)
    assert any("cut" in n for n in result.notices) and any("retriever read its last" in n for n in result.notices)
    pasted = tiny_engine.ask("lake " * 500 + QUESTION, k=2, max_new_tokens=2, closed_book=False)
    assert pasted.question.endswith(QUESTION) and pasted.question.startswith("lake")  # its end, from a word's start
    assert len(pasted.question) <= LIMITS.max_question_chars and any("its last" in n for n in pasted.notices)
    encoder = tiny_engine.encoder
    pasted, question = "lake " * 300, QUESTION.rstrip("?")
    tail = encoder.encode_questions([pasted + question])
    assert torch.allclose(tail, encoder.encode_questions([question_tail(encoder.tokenizer, pasted + question, encoder.max_length)]))
    assert not torch.allclose(tail, encoder.encode_questions([pasted]))  # the question is read, not its first lakes


def test_the_retriever_reads_the_end_of_a_long_question_where_the_question_is():
    """A text pasted before a question: the question encoder keeps the last tokens that fit, not the first."""
    from transformers import BertTokenizerFast

    from rag_demo.retrieval.encoders import question_tail

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "wrote", "hamlet", "lake", "##s", "the"]
    tokenizer = BertTokenizerFast(vocab=_vocab_file(vocab))
    question = "who wrote hamlet"
    assert question_tail(tokenizer, question, 8) == question  # 3 tokens and [CLS] [SEP] fit
    pasted = "the lakes " * 20 + question
    tail = question_tail(tokenizer, pasted, 8)
    assert tail.endswith(question) and len(tokenizer(tail)["input_ids"]) == 8
    assert tokenizer(tail)["input_ids"][1:-1] == tokenizer(pasted, add_special_tokens=False)["input_ids"][-6:]
    assert question_tail(tokenizer, "the lakes " * 20, 9) == "s the lakes the lakes "  # cut at a token's start, inside a word


def _vocab_file(words) -> str:
    import tempfile

    handle = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    handle.write("\n".join(words) + "\n")
    handle.close()
    return handle.name


def test_kb_with_other_dimension_is_refused(tiny_engine):
    import numpy as np

    from rag_demo.retrieval.corpus import Passage, make_kb

    other = make_kb("other", [Passage("a", "b")], np.ones((1, 7), np.float32))
    with pytest.raises(KnowledgeBaseError, match="7-dim"):
        tiny_engine.ask(QUESTION, kb=other, k=1)


def test_private_kb_changes_the_answer_source(tiny_engine, tiny_parts):
    from rag_demo.retrieval.corpus import Passage, make_kb

    passages = [Passage("Swap", "Swapped text about an unrelated topic entirely."), Passage("Other", "More text.")]
    with torch.no_grad():
        batch = tiny_parts["q_tok"]([p.title for p in passages], [p.text for p in passages], padding=True, return_tensors="pt")
        vectors = tiny_parts["ctx_enc"](**batch).pooler_output
    private = make_kb("private", passages, vectors.numpy())
    result = tiny_engine.ask(QUESTION, kb=private, k=2, closed_book=False)
    assert {p.title for p in result.passages} == {"Swap", "Other"} and result.kb == "private"


def test_warm_up_loads_each_kb_index_and_the_few_shot_cache(tmp_path):
    from tests.ui_engine import make_ui_engine

    engine = make_ui_engine(tmp_path)
    assert not engine.retriever.held() and not engine.generator._blocks.states
    assert engine.warm_up() > 0
    assert {(kb.fingerprint, "flat") for kb in engine.kbs.values()} <= engine.retriever.held()
    # both few-shot blocks' caches (with passages, and closed-book) are ready for the first visitor
    from rag_demo.generation import prompts

    assert {text for text, _ in engine.generator._blocks.states} == {prompts.few_shot_prefix(),
                                                                     prompts.few_shot_prefix(with_passages=False)}
    # every engine offers bm25 retrieval, so its index is ready for the first visitor too
    assert {(kb.fingerprint, "bm25") for kb in engine.kbs.values()} <= engine.retriever.held()

    from dataclasses import replace

    from rag_demo.config import RetrievalConfig
    from rag_demo.engine import RagEngine

    hybrid = RagEngine(encoder=engine.encoder, generator=engine.generator, kbs=engine.kbs,
                       config=replace(engine.config, retrieval=RetrievalConfig(lexical_weight=0.5)))
    hybrid.warm_up()
    assert {(kb.fingerprint, "bm25") for kb in hybrid.kbs.values()} <= hybrid.retriever.held()


def test_warm_up_reads_the_saved_approximate_indexes_and_builds_none(tmp_path):
    from rag_demo.retrieval.corpus import load_kb, save_kb
    from rag_demo.engine import RagEngine
    from tests.ui_engine import make_ui_engine

    engine = make_ui_engine(tmp_path / "engine")
    saved = {name: load_kb(save_kb(kb, tmp_path / name), name=name) for name, kb in engine.kbs.items()}
    first = RagEngine(encoder=engine.encoder, generator=engine.generator, kbs=saved, config=engine.config)
    first.search_index("nq-wiki", "hnsw")  # built once and saved beside the KB, as `prepare` does
    wiki = saved["nq-wiki"]
    assert first.retriever.prebuilt_kinds(wiki) == ["hnsw"] and first.retriever.prebuilt_kinds(saved["nq-counterfactual"]) == []
    fresh = RagEngine(encoder=engine.encoder, generator=engine.generator, kbs=saved, config=engine.config)
    fresh.warm_up()
    kinds = {kind for _, kind in fresh.retriever.held()}
    assert (wiki.fingerprint, "hnsw") in fresh.retriever.held()  # the first HNSW ask reads no file
    assert "ivfpq" not in kinds  # never built, so not built at start-up either


# -- hybrid retrieval: dense + BM25 logits ----------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_engine(tiny_parts, tiny_kb, rag_config):
    from rag_demo.config import EngineConfig, RetrievalConfig
    from rag_demo.serving.loading import rag_engine_from_modules

    return rag_engine_from_modules(
        question_encoder=tiny_parts["q_enc"], question_tokenizer=tiny_parts["q_tok"],
        generator_model=tiny_parts["bart"], generator_tokenizer=tiny_parts["gen_tok"],
        rag_config=rag_config, kbs={"tiny": tiny_kb}, config=EngineConfig(retrieval=RetrievalConfig(lexical_weight=0.7)),
    )


def _brute_force_hybrid(engine, kb, question, k):
    """Every passage's scale * <q, d> + weight * BM25, sorted: the top k and their logits."""
    from rag_demo.retrieval.lexical import LexicalIndex

    xq = engine.encoder.encode_questions([question])[0]
    dense = torch.from_numpy(kb.embeddings) @ xq
    lexical = torch.from_numpy(LexicalIndex.build([f"{t} {x}" for t, x in zip(kb.titles, kb.texts)]).scores(question))
    logits = engine.encoder.scale * dense + engine.lexical_weight * lexical
    order = torch.argsort(logits, descending=True, stable=True)[:k]
    return order.tolist(), logits[order], dense[order], lexical[order]


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivfpq"])
@pytest.mark.parametrize("question", [QUESTION, "the deepest lake in siberia", "capital of france"])
def test_hybrid_logits_are_scaled_dense_plus_weighted_bm25(hybrid_engine, tiny_kb, question, index):
    result = hybrid_engine.ask(question, k=3, index=index, closed_book=False, variants=("token",), max_new_tokens=2)
    rows, logits, dense, lexical = _brute_force_hybrid(hybrid_engine, tiny_kb, question, 3)
    assert (result.retriever, result.lexical_weight) == ("hybrid", 0.7)
    assert [p.id for p in result.passages] == rows  # 6 passages: every index holds all of them as candidates
    assert [p.score for p in result.passages] == pytest.approx(dense.tolist(), abs=1e-5)
    assert [p.lexical for p in result.passages] == pytest.approx(lexical.tolist(), abs=1e-5)
    assert [p.logit for p in result.passages] == pytest.approx(logits.tolist(), abs=1e-4)
    assert [p.prob for p in result.passages] == pytest.approx(torch.softmax(logits, 0).tolist(), abs=1e-5)


def test_hybrid_finds_a_rare_word_that_dense_retrieval_misses(hybrid_engine, tiny_kb):
    """The tiny DPR is random, so dense ranks passages by chance; a large BM25 weight puts the one
    passage that shares the question's rare words first."""
    from dataclasses import replace

    question = "when was the penny black issued"
    dense = hybrid_engine.ask(question, k=2, retriever="dense", closed_book=False, variants=("token",), max_new_tokens=1)
    assert dense.retriever == "dense" and all(p.lexical == 0 for p in dense.passages)
    loud = replace(hybrid_engine.config, retrieval=replace(hybrid_engine.config.retrieval, lexical_weight=1000.0))
    from rag_demo.engine import RagEngine

    engine = RagEngine(encoder=hybrid_engine.encoder, generator=hybrid_engine.generator, kbs=hybrid_engine.kbs, config=loud)
    hybrid = engine.ask(question, k=2, closed_book=False, variants=("token",), max_new_tokens=1)
    assert hybrid.passages[0].title == "Penny Black" and hybrid.passages[0].prob > 0.99


def test_dense_retriever_is_the_plain_engine(hybrid_engine, tiny_engine):
    ours = hybrid_engine.ask(QUESTION, k=3, retriever="dense", closed_book=False)
    plain = tiny_engine.ask(QUESTION, k=3, closed_book=False)
    assert plain.retriever == "dense" and tiny_engine.lexical_weight == 0.0
    assert [(p.id, p.prob) for p in ours.passages] == [(p.id, p.prob) for p in plain.passages]
    assert ours.variants["token"].answer == plain.variants["token"].answer


def test_retriever_choice_is_checked(hybrid_engine, tiny_engine):
    with pytest.raises(InputError, match="unknown retriever"):
        hybrid_engine.ask(QUESTION, retriever="sparse")
    with pytest.raises(InputError, match="lexical weight"):
        tiny_engine.ask(QUESTION, retriever="hybrid")
    with pytest.raises(InputError, match="0 or more"):
        from rag_demo.config import EngineConfig, RetrievalConfig
        from rag_demo.engine import RagEngine

        RagEngine(encoder=tiny_engine.encoder, generator=tiny_engine.generator, kbs=tiny_engine.kbs,
                  config=EngineConfig(retrieval=RetrievalConfig(lexical_weight=float("nan"))))


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivfpq"])
def test_a_kb_kept_on_disk_retrieves_as_in_memory(tiny_engine, hybrid_engine, tiny_kb, tmp_path_factory, index):
    """Vectors memory-mapped from a .npy, passages read from the Arrow file: the same rows and scores."""
    from rag_demo.retrieval.corpus import load_kb, save_kb
    from rag_demo.retrieval.store import ColumnRows

    folder = save_kb(tiny_kb, tmp_path_factory.mktemp("disk-kb") / "kb", vectors="float32")
    disk = load_kb(folder, lazy_from=0)
    assert isinstance(disk.titles, ColumnRows) and disk.fingerprint == tiny_kb.fingerprint
    for engine in (tiny_engine, hybrid_engine):
        for question in (QUESTION, "the deepest lake in siberia"):
            want = engine.retrieve(question, k=3, index=index)
            got = engine.retrieve(question, kb=disk, k=3, index=index)
            assert [(p.id, p.title, p.text) for p in got.passages] == [(p.id, p.title, p.text) for p in want.passages]
            assert [p.score for p in got.passages] == pytest.approx([p.score for p in want.passages], abs=1e-6)
            assert got.doc_lp.tolist() == pytest.approx(want.doc_lp.tolist(), abs=1e-6)


# -- bm25 retrieval: BM25 alone, for any encoder ------------------------------------------------------


def _bm25_oracle(kb, question, k):
    """Every passage's BM25 score from an index built here, sorted (ties in row order): top rows, their scores."""
    from rag_demo.retrieval.lexical import LexicalIndex

    scores = torch.from_numpy(LexicalIndex.build([f"{t} {x}" for t, x in zip(kb.titles, kb.texts)]).scores(question))
    order = torch.argsort(scores, descending=True, stable=True)[:k]
    return order.tolist(), scores[order]


@pytest.mark.parametrize("question", [QUESTION, "the deepest lake in siberia", "penny black stamp issued in 1840"])
def test_bm25_p_is_a_softmax_of_scaled_bm25_over_the_top_k(tiny_engine, tiny_kb, question):
    from rag_demo.config import BM25_SCALE

    assert tiny_engine.lexical_weight == 0 and tiny_engine.retrievers == ("dense", "bm25")  # no weight, bm25 all the same
    result = tiny_engine.ask(question, k=3, retriever="bm25", closed_book=False, variants=("token",), max_new_tokens=2)
    rows, bm25 = _bm25_oracle(tiny_kb, question, 3)
    assert (result.retriever, result.scale, result.lexical_weight, result.index_recall) == ("bm25", BM25_SCALE, 0.0, None)
    assert [p.id for p in result.passages] == rows and bm25[0] > 0
    assert [p.score for p in result.passages] == pytest.approx(bm25.tolist(), abs=1e-5)
    assert [p.lexical for p in result.passages] == [p.score for p in result.passages]
    assert [p.logit for p in result.passages] == pytest.approx((BM25_SCALE * bm25).tolist(), abs=1e-5)
    assert [p.prob for p in result.passages] == pytest.approx(torch.softmax(BM25_SCALE * bm25, 0).tolist(), abs=1e-6)
    assert result.timings_ms["encode"] == 0.0  # no encoder ran


def test_bm25_searches_exactly_whatever_the_index_and_says_so(tiny_engine):
    flat = tiny_engine.retrieve(QUESTION, k=1, retriever="bm25")
    for index in ("hnsw", "ivfpq"):
        other = tiny_engine.retrieve(QUESTION, k=1, index=index, retriever="bm25")
        assert other.passages == flat.passages and other.index_recall is None
        assert any(f"the {index} index holds dense vectors, so it was not used" in n for n in other.notices)
    assert not flat.notices
    with pytest.raises(InputError, match="unknown index"):
        tiny_engine.retrieve(QUESTION, k=3, index="lsh", retriever="bm25")


def test_bm25_fills_the_top_k_with_passages_sharing_no_word_and_says_so(tiny_engine, tiny_kb):
    one = tiny_engine.retrieve("penny", k=3, retriever="bm25")
    assert one.passages[0].title == "Penny Black" and [p.id for p in one.passages[1:]] == [0, 1]  # ties keep KB order
    assert one.notices == ("only 1 passage shares a word with the question; the last 2 of the top 3 score 0 "
                           "(ties keep the knowledge base's order)",)
    none = tiny_engine.retrieve("zzz qqq", k=len(tiny_kb), retriever="bm25")
    assert [p.prob for p in none.passages] == pytest.approx([1 / len(tiny_kb)] * len(tiny_kb))
    assert none.notices == (f"no passage shares a word with the question: all score 0, so the top {len(tiny_kb)} follow "
                            "the knowledge base's order",)
    import doctest

    from rag_demo.retrieval import retriever

    assert doctest.testmod(retriever).failed == 0  # the notice with one passage short


def test_compare_retrievers_is_each_retrievers_own_top_k(hybrid_engine, tiny_engine):
    for engine, offered in ((hybrid_engine, ("dense", "bm25", "hybrid")), (tiny_engine, ("dense", "bm25"))):
        comparison = engine.compare_retrievers(f"  {QUESTION}\n", k=3)
        assert comparison.question == QUESTION and comparison.kb == "tiny" and comparison.k == 3
        assert tuple(r.retriever for r in comparison.rankings) == offered
        for ranking in comparison.rankings:
            alone = engine.retrieve(QUESTION, k=3, retriever=ranking.retriever)
            assert ranking.passages == alone.passages
            assert (ranking.scale, ranking.lexical_weight) == (alone.scale, alone.lexical_weight)
            assert ranking.gold_rank is None
        assert comparison.gold_ids == ()  # an in-memory KB has no questions
        assert set(comparison.timings_ms) == {*offered, "total"}
    with pytest.raises(InputError, match="larger than the knowledge base"):
        tiny_engine.compare_retrievers(QUESTION, k=99)


def test_compare_marks_the_gold_passage_of_a_kb_stored_with_questions(tiny_parts, tiny_kb, rag_config, tmp_path):
    import json

    from rag_demo.retrieval.corpus import load_kb, save_kb
    from rag_demo.questions import QUESTIONS_FILE, gold_rows_by_question
    from rag_demo.serving.loading import rag_engine_from_modules

    folder = save_kb(tiny_kb, tmp_path / "tiny")
    rows = [{"question": "Who wrote A Farewell to Arms?", "answer": "Ernest Hemingway", "swapped_answer": "x",
             "passage_answer": "Ernest Hemingway", "gold_id": 0},
            {"question": "who wrote a farewell to arms", "answer": "Hemingway", "swapped_answer": "x",
             "passage_answer": "Hemingway", "gold_id": 4},  # the same question asked of another passage
            {"question": "Where is Lake Baikal?", "answer": "Siberia", "swapped_answer": "x", "passage_answer": "Siberia",
             "gold_id": 2}]
    (folder / QUESTIONS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    kb = load_kb(folder, name="tiny")
    assert gold_rows_by_question(kb.path) == {"who wrote farewell to arms": (0, 4), "where is lake baikal": (2,)}
    engine = rag_engine_from_modules(question_encoder=tiny_parts["q_enc"], question_tokenizer=tiny_parts["q_tok"],
                                     generator_model=tiny_parts["bart"], generator_tokenizer=tiny_parts["gen_tok"],
                                     rag_config=rag_config, kbs={"tiny": kb})
    comparison = engine.compare_retrievers("WHO wrote 'A Farewell to Arms'", k=len(kb))  # case, quotes and articles differ
    assert comparison.gold_ids == (0, 4)
    for ranking in comparison.rankings:  # every passage is in the top k, so each retriever ranks the gold ones
        assert ranking.gold_rank == min(p.rank for p in ranking.passages if p.id in (0, 4))
    bm25 = engine.compare_retrievers("who wrote a farewell to arms", k=1).rankings[1]
    assert bm25.retriever == "bm25" and bm25.passages[0].id == 0 and bm25.gold_rank == 1
    assert engine.compare_retrievers("what is the capital of france", k=2).gold_ids == ()


def test_evaluating_with_bm25_reports_bm25_recall(tiny_engine, tiny_kb):
    from rag_demo.evaluate import EvalQuestion, evaluate

    asked = ["penny black stamp", "deepest lake baikal in siberia", "the magic flute premiered in vienna"]
    # each question's gold passage is the one BM25 ranks first, so BM25's recall@1 is 1 and dense's (random) is not
    questions = [EvalQuestion(q, "x", "x", _bm25_oracle(tiny_kb, q, 1)[0][0]) for q in asked]
    options = dict(kb="tiny", variant="token", n=3, seed=0, k=1, questions=questions, max_new_tokens=1)
    report = evaluate(tiny_engine, retriever="bm25", **options)
    assert (report["retriever"], report["retrieval_recall"]) == ("bm25", 1.0)
    assert evaluate(tiny_engine, retriever="dense", **options)["retrieval_recall"] < 1.0


def test_an_answer_that_reaches_the_length_limit_is_said_to_be_cut_short(causal_engine):
    result = causal_engine.ask(QUESTION, k=2, max_new_tokens=3)  # a tiny random generator seldom stops on its own
    stops = causal_engine._stop_ids()
    answers = {"RAG-Token": result.variants["token"].token_ids, "RAG-Sequence": result.variants["sequence"].token_ids}
    cut = [name for name, ids in answers.items() if len(ids) == 3 and ids[-1] not in stops]
    said = [notice for notice in result.notices if "length limit of 3 tokens" in notice]
    assert cut and len(said) == 1 and all(name in said[0] for name in cut)


def test_a_question_about_the_asker_or_the_present_is_told_so_wherever_it_is_asked(causal_engine):
    """A review asked "what did I eat for breakfast?": a Breakfast passage took p(z|x) 0.82 and the page answered
    "eggs" with nothing said. Ask, Score and Compare must each say that no passage can know it."""
    from rag_demo.question_kinds import ABOUT_NOW_NOTE, ABOUT_THE_ASKER_NOTE

    asker, now = "what did I eat for breakfast?", "who won the match yesterday?"
    assert ABOUT_THE_ASKER_NOTE in causal_engine.ask(asker, k=2, max_new_tokens=2).notices
    assert ABOUT_THE_ASKER_NOTE in causal_engine.score(asker, "eggs", k=2).notices
    assert ABOUT_NOW_NOTE in causal_engine.compare_retrievers(now, k=2).notices
    plain = causal_engine.ask(QUESTION, k=2, max_new_tokens=2).notices
    assert ABOUT_THE_ASKER_NOTE not in plain and ABOUT_NOW_NOTE not in plain


def test_a_recent_year_a_request_or_another_language_is_told_so_in_the_answer_itself(causal_engine):
    """A review asked "who won the 2025 nba finals?" and got a wrong name, with nothing said; /ask_json lacked the
    page's note on a French question. The engine's notices carry each, so the page, the JSON and the CLI all say it."""
    from rag_demo.question_kinds import LANGUAGE_NOTE, RECENT_YEAR_NOTE, REQUEST_NOTE, TWO_QUESTIONS_NOTE

    notes = {"who won the 2025 nba finals?": RECENT_YEAR_NOTE, "write a poem about cats": REQUEST_NOTE,
             "qui a peint la Joconde ?": LANGUAGE_NOTE, "who invented the light bulb and when did he die?": TWO_QUESTIONS_NOTE}
    for question, note in notes.items():
        notices = causal_engine.ask(question, k=2, max_new_tokens=2).notices
        assert notices.count(note) == 1, (question, notices)
    plain = causal_engine.ask(QUESTION, k=2, max_new_tokens=2).notices
    assert not set(notes.values()) & set(plain)


def test_an_answer_the_generator_ended_at_once_is_said_to_have_no_words(causal_engine, monkeypatch):
    spoken = causal_engine.ask(QUESTION, k=2, max_new_tokens=3)
    assert not any(notice.startswith("No words from") for notice in spoken.notices)
    monkeypatch.setattr(causal_engine.generator, "decode", lambda ids, **options: " ")  # every answer reads as empty
    silent = causal_engine.ask(QUESTION, k=2, max_new_tokens=3)
    assert [n for n in silent.notices if n.startswith("No words from")] == [
        "No words from RAG-Token, RAG-Sequence and the closed-book answer: the generator ended each at once"]


def test_only_answers_without_their_stop_token_are_cut_short():
    stop, ended, open_ended = frozenset({2}), (5, 6, 2), (5, 6, 7)
    assert length_limit_notice({"RAG-Token": ended, "RAG-Sequence": (5, 2)}, 3, stop) == ()
    assert length_limit_notice({"RAG-Token": open_ended, "RAG-Sequence": ended, "the closed-book answer": open_ended}, 3,
                               stop) == ("RAG-Token and the closed-book answer reached the length limit of 3 tokens before "
                                         "ending: they are cut short",)
    assert length_limit_notice({"a": open_ended, "b": open_ended, "c": open_ended}, 3, stop)[0].startswith("a, b and c ")
