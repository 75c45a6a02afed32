"""The engine reproduces transformers' RAG classes on tiny random checkpoints."""

from __future__ import annotations

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
