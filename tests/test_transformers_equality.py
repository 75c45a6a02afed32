"""The engine reproduces transformers' RAG classes on tiny random checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

QUESTIONS = ["who wrote a farewell to arms", "what is the capital of france", "deepest lake in the world"]


def _hf_inputs(engine, parts, question, k):
    retrieval = engine.retrieve(question, k=k)
    texts = engine._inputs(retrieval)
    batch = parts["gen_tok"](texts, max_length=64, padding="max_length", truncation=True, return_tensors="pt")
    scores = torch.tensor([[p.score for p in retrieval.passages]])
    return batch, scores


@pytest.fixture(scope="module")
def hf_models(tiny_parts, rag_config):
    from transformers import RagSequenceForGeneration, RagTokenForGeneration

    token = RagTokenForGeneration(config=rag_config, question_encoder=tiny_parts["q_enc"], generator=tiny_parts["bart"]).eval()
    sequence = RagSequenceForGeneration(config=rag_config, question_encoder=tiny_parts["q_enc"], generator=tiny_parts["bart"]).eval()
    return token, sequence


@pytest.mark.parametrize("question", QUESTIONS)
@pytest.mark.parametrize("answer", ["paris", "ernest hemingway", "the deepest lake"])
def test_answer_scores_equal_minus_loss(tiny_engine, tiny_parts, hf_models, question, answer):
    token_model, sequence_model = hf_models
    k = 3
    batch, scores = _hf_inputs(tiny_engine, tiny_parts, question, k)
    labels = tiny_parts["gen_tok"]([answer], return_tensors="pt")["input_ids"]
    ours = tiny_engine.score(question, answer, k=k)
    with torch.no_grad():
        kwargs = dict(context_input_ids=batch.input_ids, context_attention_mask=batch.attention_mask,
                      doc_scores=scores, labels=labels, n_docs=k, reduce_loss=False)
        token_loss = token_model(**kwargs).loss
        sequence_loss = sequence_model(**kwargs).loss
    assert ours.variants["token"].logprob == pytest.approx(-float(token_loss), abs=1e-4)
    assert ours.variants["sequence"].logprob == pytest.approx(-float(sequence_loss), abs=1e-4)


@pytest.mark.parametrize("question", QUESTIONS)
@pytest.mark.parametrize("num_beams", [1, 3])
def test_rag_token_generate_equals_transformers(tiny_engine, tiny_parts, hf_models, question, num_beams):
    token_model, _ = hf_models
    k, new_tokens = 3, 8
    batch, scores = _hf_inputs(tiny_engine, tiny_parts, question, k)
    with torch.no_grad():
        theirs = token_model.generate(context_input_ids=batch.input_ids, context_attention_mask=batch.attention_mask,
                                      doc_scores=scores, n_docs=k, num_beams=num_beams, max_length=new_tokens + 1)
    ours = tiny_engine.ask(question, k=k, variants=("token",), num_beams=num_beams, max_new_tokens=new_tokens, closed_book=False)
    expected = [t for t in theirs[0, 1:].tolist() if t != tiny_parts["gen_tok"].pad_token_id]
    assert list(ours.variants["token"].token_ids) == expected


def test_retrieval_and_inputs_equal_rag_retriever(tiny_engine, tiny_parts, tiny_kb, rag_config):
    import faiss
    from datasets import Dataset
    from transformers import RagRetriever
    from transformers.models.rag.retrieval_rag import CustomHFIndex

    dataset = Dataset.from_dict({"title": list(tiny_kb.titles), "text": list(tiny_kb.texts),
                                 "embeddings": tiny_kb.embeddings.tolist()})
    dataset.add_faiss_index("embeddings", custom_index=faiss.IndexFlatIP(tiny_kb.dim))
    retriever = RagRetriever(rag_config, tiny_parts["q_tok"], tiny_parts["gen_tok"], index=CustomHFIndex(tiny_kb.dim, dataset))
    for question in QUESTIONS:
        q_ids = tiny_parts["q_tok"]([question], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            hidden = tiny_parts["q_enc"](q_ids).pooler_output
        out = retriever(q_ids, hidden.numpy(), n_docs=3, return_tensors="pt")
        retrieval = tiny_engine.retrieve(question, k=3)
        assert [p.id for p in retrieval.passages] == out["doc_ids"][0].tolist()
        ours = tiny_parts["gen_tok"](tiny_engine._inputs(retrieval), max_length=64, padding="max_length",
                                     truncation=True, return_tensors="pt")["input_ids"]
        assert torch.equal(ours, out["context_input_ids"])
        hf_scores = torch.bmm(hidden.unsqueeze(1), out["retrieved_doc_embeds"].float().transpose(1, 2)).squeeze(1)
        assert [p.score for p in retrieval.passages] == pytest.approx(hf_scores[0].tolist(), abs=1e-5)


CUSTOM_QUESTIONS = QUESTIONS + ["the quick brown fox", "mozart and the magic flute in vienna"]


def _custom_config(rag_config, passages_path, index_path):
    from transformers import RagConfig

    return RagConfig.from_question_encoder_generator_configs(
        rag_config.question_encoder, rag_config.generator, n_docs=3, max_combined_length=64,
        index_name="custom", passages_path=str(passages_path), index_path=str(index_path),
    )


def _their_retrieval(retriever, parts, question, k):
    """transformers' doc ids and doc scores (RagModel's bmm of the question with the retrieved embeddings)."""
    q_ids = parts["q_tok"]([question], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = parts["q_enc"](q_ids).pooler_output
    out = retriever(q_ids, hidden.numpy(), n_docs=k, return_tensors="pt")
    scores = torch.bmm(hidden.unsqueeze(1), out["retrieved_doc_embeds"].float().transpose(1, 2)).squeeze(1)
    return out["doc_ids"][0].tolist(), scores[0].tolist()


def _by_score(ids, scores):
    """IVF-PQ returns rows in the order of its codes' approximate scores; we order the same rows by
    the exact scores both sides compute (p(z|x) does not depend on the order)."""
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return [ids[i] for i in order], [scores[i] for i in order]


@pytest.fixture(scope="module", params=["hnsw", "flat", "ivfpq"])
def custom_kb(request, tiny_parts, rag_config, tmp_path_factory):
    """transformers' custom KB format (passages_path + index_path) and its RagRetriever."""
    from transformers import RagRetriever

    from tests import tiny

    passages_path, index_path = tiny.transformers_custom_kb(tmp_path_factory.mktemp(f"custom-{request.param}"),
                                                            tiny_parts["q_tok"], tiny_parts["ctx_enc"], index=request.param)
    config = _custom_config(rag_config, passages_path, index_path)
    return request.param, passages_path, index_path, config, RagRetriever(config, tiny_parts["q_tok"], tiny_parts["gen_tok"])


@pytest.mark.parametrize("lazy_from", [10**9, 0])  # passages and vectors in memory, or read in place from Arrow
@pytest.mark.parametrize("k", [3, 10])
def test_custom_kb_retrieval_equals_rag_retriever(tiny_parts, rag_config, custom_kb, lazy_from, k):
    from rag_demo.retrieval.corpus import load_kb
    from rag_demo.serving.loading import rag_engine_from_modules

    kind, passages_path, index_path, _, retriever = custom_kb
    kb = load_kb(passages_path, lazy_from=lazy_from)
    assert kb.index_file == index_path  # found beside the folder, as the script leaves it
    engine = rag_engine_from_modules(question_encoder=tiny_parts["q_enc"], question_tokenizer=tiny_parts["q_tok"],
                                     generator_model=tiny_parts["bart"], generator_tokenizer=tiny_parts["gen_tok"],
                                     rag_config=rag_config, kbs={"custom": kb})
    for question in CUSTOM_QUESTIONS:
        ids, scores = _their_retrieval(retriever, tiny_parts, question, k)
        ours = engine.retrieve(question, k=k, index=kind).passages
        if kind == "ivfpq":
            ids, scores = _by_score(ids, scores)
        assert [p.id for p in ours] == ids
        assert [p.score for p in ours] == pytest.approx(scores, rel=1e-6, abs=1e-6)  # float32 products, summed in another order
        docs = retriever.index.get_doc_dicts(np.array([ids]))[0]
        assert [(p.title, p.text) for p in ours] == list(zip(docs["title"], docs["text"]))
        if kind != "ivfpq":  # a few dozen passages: the graph / flat index is exact, so chunked exact search agrees
            assert [p.id for p in engine.retrieve(question, k=k, index="flat").passages] == ids


def test_rag_checkpoint_with_a_custom_kb_brings_it(tiny_parts, rag_config, custom_kb, tmp_path):
    from transformers import RagTokenForGeneration, RagTokenizer

    from rag_demo.config import EngineConfig
    from rag_demo.serving.loading import engine_from_config

    kind, passages_path, index_path, config, retriever = custom_kb
    RagTokenForGeneration(config=config, question_encoder=tiny_parts["q_enc"], generator=tiny_parts["bart"]).save_pretrained(
        tmp_path / "rag")
    RagTokenizer(question_encoder=tiny_parts["q_tok"], generator=tiny_parts["gen_tok"]).save_pretrained(tmp_path / "rag")
    engine = engine_from_config(EngineConfig(rag_checkpoint=str(tmp_path / "rag"), device="cpu"))
    assert engine.kb_names == ("my_knowledge_dataset",)
    assert engine.kbs["my_knowledge_dataset"].index_file == index_path
    for question in CUSTOM_QUESTIONS[:3]:
        ids, scores = _their_retrieval(retriever, tiny_parts, question, 3)
        ours = engine.retrieve(question, k=3, index=kind).passages
        ids, scores = _by_score(ids, scores) if kind == "ivfpq" else (ids, scores)
        assert [p.id for p in ours] == ids
        assert [p.score for p in ours] == pytest.approx(scores, rel=1e-6, abs=1e-6)
