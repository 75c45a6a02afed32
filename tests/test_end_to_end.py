"""The paper's training of the question encoder (`rag_demo.training.end_to_end`): its loss, its gradient, its loop,
reading once, and the `train` command's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_demo.config import EndToEndConfig
from rag_demo.retrieval.encoders import Encoder
from rag_demo.training.end_to_end import (
    CandidateReading,
    EndToEndTrainer,
    HeldOutCheck,
    ReadingCache,
    ReadQuestion,
    marginal_nll,
    padded_batch,
    question_vectors,
    read_candidates,
)
from rag_demo.training.pairs import load_pairs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _written_out_nll(logits: torch.Tensor, token_logprobs: torch.Tensor, mask: torch.Tensor, objective: str) -> torch.Tensor:
    """The paper's two losses written out term by term in float64 (the oracle: no marginalize.py, no logsumexp)."""
    prior = torch.exp(logits.double()) / torch.exp(logits.double()).sum(1, keepdim=True)  # (B, K) p(z|x)
    probs = torch.exp(token_logprobs.double()) ** mask[:, None, :].double()  # (B, K, T), 1 at padding
    if objective == "rag-sequence":
        return -torch.log((prior * probs.prod(-1)).sum(1))  # −log Σ_z p(z|x) Π_t p(y_t|x,z,y<t)
    return -torch.log((prior[:, :, None] * probs).sum(1)).sum(-1)  # −Σ_t log Σ_z p(z|x) p(y_t|x,z,y<t)


def _case(seed: int = 0, b: int = 3, k: int = 4, t: int = 3):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k, generator=generator) * 2
    token_logprobs = torch.log_softmax(torch.randn(b, k, 5, generator=generator) * 2, -1)[..., :t]  # (B, K, T) real log-probs
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, -1] = False
    token_logprobs = token_logprobs * mask[:, None, :]  # 0 at padding, as the loss expects
    return logits, token_logprobs, mask


@pytest.mark.parametrize("objective", ["rag-token", "rag-sequence"])
def test_the_loss_is_the_papers_formula_and_so_is_its_gradient(objective):
    logits, token_logprobs, mask = _case()
    ours = logits.clone().requires_grad_(True)
    oracle = logits.double().clone().requires_grad_(True)
    loss = marginal_nll(ours, token_logprobs, mask, objective=objective, k=4)
    expected = _written_out_nll(oracle, token_logprobs, mask, objective)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    loss.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(ours.grad.double(), oracle.grad, rtol=1e-4, atol=1e-6)


def test_the_gradient_on_the_logits_is_prior_minus_posterior():
    """∂/∂logit_z: RAG-Sequence p(z|x) − p(z|x,y); RAG-Token Σ_t [p(z|x) − p(z|x,y_t)]. The two differ, so
    swapping the objectives' marginalizations fails here."""
    logits, token_logprobs, mask = _case(seed=3, b=2, k=3, t=3)
    prior = torch.softmax(logits, 1)
    per_doc = (token_logprobs * mask[:, None, :]).sum(-1)
    sequence_posterior = torch.softmax(logits + per_doc, 1)
    token_posteriors = torch.softmax(logits[:, :, None] + token_logprobs, 1) * mask[:, None, :]  # (B, K, T)
    expected = {"rag-sequence": prior - sequence_posterior,
                "rag-token": prior * mask.sum(1, keepdim=True) - token_posteriors.sum(-1)}
    for objective, gradient in expected.items():
        leaf = logits.clone().requires_grad_(True)
        marginal_nll(leaf, token_logprobs, mask, objective=objective, k=3).sum().backward()
        torch.testing.assert_close(leaf.grad, gradient, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(expected["rag-sequence"], expected["rag-token"], atol=1e-3)


def test_a_worked_example():
    """Two passages at p(z|x) = 1/2; the answer's two tokens: passage 1 gives them 1/2 and 1/2, passage 2 gives 1 and 1/4.
    RAG-Sequence: −log(½·¼ + ½·¼) = log 4. RAG-Token: −log(½·½ + ½·1) − log(½·½ + ½·¼) = −log(3/4) − log(3/8)."""
    logits = torch.zeros(1, 2)
    token_logprobs = torch.log(torch.tensor([[[0.5, 0.5], [1.0, 0.25]]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    sequence = marginal_nll(logits, token_logprobs, mask, objective="rag-sequence", k=2)
    token = marginal_nll(logits, token_logprobs, mask, objective="rag-token", k=2)
    assert float(sequence) == pytest.approx(np.log(4))
    assert float(token) == pytest.approx(-np.log(0.75) - np.log(0.375))


def test_only_the_top_k_are_marginalized_over():
    logits = torch.tensor([[3.0, 2.0, -5.0]])
    token_logprobs = torch.log(torch.tensor([[[0.1], [0.1], [1.0]]]))  # the third reads the answer, but ranks last
    mask = torch.ones(1, 1, dtype=torch.bool)
    top_two = marginal_nll(logits, token_logprobs, mask, objective="rag-token", k=2)
    assert float(top_two) == pytest.approx(-np.log(0.1))
    assert float(marginal_nll(logits, token_logprobs, mask, objective="rag-token", k=3)) < float(top_two)


def test_padding_does_not_count():
    a = ReadQuestion("q1", "a", (0, 1), torch.log(torch.tensor([[0.5], [0.25]])), torch.zeros(2), (True, False))
    b = ReadQuestion("q2", "b", (0, 1), torch.log(torch.tensor([[0.5, 0.5], [1.0, 0.25]])), torch.zeros(2), (False, True))
    logprobs, mask = padded_batch([a, b])
    alone = marginal_nll(torch.zeros(1, 2), a.token_logprobs[None], torch.ones(1, 1, dtype=torch.bool),
                         objective="rag-token", k=2)
    together = marginal_nll(torch.zeros(2, 2), logprobs, mask, objective="rag-token", k=2)
    assert float(together[0]) == pytest.approx(float(alone[0]))


# ---- the loop, on a tiny DPR encoder over the tiny knowledge base --------------------------------------------

QUESTIONS = [  # (question, answer, row of tests.tiny.PASSAGES that holds it)
    ("who wrote a farewell to arms", "hemingway", 0),
    ("what is the capital of france", "paris", 1),
    ("what is the deepest lake in the world", "baikal", 2),
    ("what was the first adhesive postage stamp", "penny black", 3),
    ("who composed the magic flute", "mozart", 4),
]


@pytest.fixture()
def tiny_encoder(tiny_parts):
    return Encoder("tiny-dpr", tiny_parts["q_tok"], tiny_parts["q_enc"], tiny_parts["ctx_enc"], tiny_parts["q_tok"], "dpr",
                   1.0, 64, torch.device("cpu"))


def _reads(kb, *, answer_bearing_logprob: float = -0.2, other_logprob: float = -4.0) -> list[ReadQuestion]:
    """Each question read with every passage by a reader that finds its answer in the passage that holds it:
    the loop's test needs a reader that reads, and a random tiny one does not."""
    rows = tuple(range(len(kb)))
    reads = []
    for question, answer, row in QUESTIONS:
        logprobs = torch.full((len(rows), 2), other_logprob)
        logprobs[row] = answer_bearing_logprob
        reads.append(ReadQuestion(question, answer, rows, logprobs, torch.zeros(len(rows)),
                                  tuple(r == row for r in rows)))
    return reads


def _answer_prob(model, encoder, kb) -> float:
    model.eval()
    with torch.no_grad():
        vectors = question_vectors(model, encoder, [q for q, _, _ in QUESTIONS])  # (Q, D)
        probs = torch.softmax(encoder.scale * vectors @ torch.from_numpy(kb.embeddings).T, 1)  # (Q, N)
    return float(probs[torch.arange(len(QUESTIONS)), torch.tensor([row for _, _, row in QUESTIONS])].mean())


@pytest.mark.parametrize("objective", ["rag-token", "rag-sequence", "gold-passage"])
def test_training_moves_p_z_given_x_onto_the_passage_that_holds_the_answer(objective, tiny_encoder, tiny_kb):
    config = EndToEndConfig(objective=objective, steps=30, batch_size=5, learning_rate=1e-2, k=len(tiny_kb))
    trainer = EndToEndTrainer(tiny_encoder, tiny_kb.embeddings, _reads(tiny_kb), lexical_weight=0.0, config=config)
    before = _answer_prob(trainer.model, tiny_encoder, tiny_kb)
    losses = [trainer.step() for _ in range(config.steps)]
    after = _answer_prob(trainer.model, tiny_encoder, tiny_kb)
    assert after > before + 0.3, (before, after)
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert _answer_prob(tiny_encoder.question_model, tiny_encoder, tiny_kb) == pytest.approx(before)  # the encoder itself is untouched


def test_training_is_seeded(tiny_encoder, tiny_kb):
    config = EndToEndConfig(steps=3, batch_size=2, learning_rate=1e-3, k=3)

    def run() -> list[float]:
        trainer = EndToEndTrainer(tiny_encoder, tiny_kb.embeddings, _reads(tiny_kb), lexical_weight=0.0, config=config)
        return [trainer.step() for _ in range(config.steps)]

    assert run() == run()


def test_a_reader_that_does_not_care_gives_no_gradient(tiny_encoder, tiny_kb):
    """When every passage reads the answer equally, p(z|x) cannot change the answer's likelihood: no signal."""
    reads = _reads(tiny_kb, answer_bearing_logprob=-1.0, other_logprob=-1.0)
    trainer = EndToEndTrainer(tiny_encoder, tiny_kb.embeddings, reads, lexical_weight=0.0,
                              config=EndToEndConfig(batch_size=5, k=len(tiny_kb)))
    trainer.loss(reads).backward()
    assert max(float(p.grad.abs().max()) for p in trainer.model.parameters() if p.grad is not None) < 1e-5


def test_gold_passage_leaves_out_questions_without_an_answer_bearing_candidate(tiny_encoder, tiny_kb):
    reads = _reads(tiny_kb)
    unanswered = ReadQuestion("who is nobody", "nobody", reads[0].rows, reads[0].token_logprobs, reads[0].lexical,
                              (False,) * len(reads[0].rows))
    trainer = EndToEndTrainer(tiny_encoder, tiny_kb.embeddings, [*reads, unanswered], lexical_weight=0.0,
                              config=EndToEndConfig(objective="gold-passage"))
    assert len(trainer.examples) == len(reads)
    with pytest.raises(ValueError, match="answer-bearing"):
        EndToEndTrainer(tiny_encoder, tiny_kb.embeddings, [unanswered], lexical_weight=0.0,
                        config=EndToEndConfig(objective="gold-passage"))


def test_held_out_figures(tiny_encoder, tiny_kb):
    questions = [(q, (a,)) for q, a, _ in QUESTIONS]
    check = HeldOutCheck(tiny_encoder, tiny_kb.embeddings, questions, np.zeros((len(questions), len(tiny_kb))),
                         lambda row: tiny_kb.texts[row], lexical_weight=0.2, ks=(1, len(tiny_kb)), mass_k=len(tiny_kb))
    figures = check.measure(tiny_encoder.question_model)
    assert figures.recall[len(tiny_kb)] == 1.0  # every answer is in some passage of the base
    assert figures.answer_mass == pytest.approx(_answer_prob(tiny_encoder.question_model, tiny_encoder, tiny_kb), abs=1e-5)
    top = check.top(tiny_encoder.question_model, 0, 3)
    assert sum(top.probs) == pytest.approx(1.0) and top.answer_bearing == tuple(r == 0 for r in top.rows)


def test_reads_are_done_once_and_cached(tmp_path, tiny_kb):
    calls = []

    def read(question, answer, rows):
        calls.append(question)
        return torch.full((len(rows), 2), -1.0)

    pairs = [(q, (a,)) for q, a, _ in QUESTIONS[:2]]

    def reading() -> CandidateReading:
        return CandidateReading(read, lambda q: np.arange(len(tiny_kb), dtype=float), lambda row: tiny_kb.texts[row],
                                ReadingCache.open(tmp_path / "reads.pt"))

    first = read_candidates(pairs, candidates=lambda q: [0, 1, 2], reading=reading())
    again = read_candidates(pairs, candidates=lambda q: [0, 1, 2], reading=reading())
    assert len(calls) == 2
    assert [e.answer_bearing for e in again] == [(True, False, False), (False, True, False)]
    assert torch.equal(first[1].token_logprobs, again[1].token_logprobs) and again[0].lexical.tolist() == [0.0, 1.0, 2.0]
    (tmp_path / "reads.pt").write_bytes(b"not a torch file")
    assert ReadingCache.open(tmp_path / "reads.pt").reads == {}  # a damaged cache is read again, not trusted


def test_the_engine_reads_candidates_and_a_second_run_reads_nothing(ui_engine):
    from rag_demo.serving.retriever_training import prepare_training

    pairs = [("What is the capital of France?", ("Paris",)), ("Who wrote A Farewell to Arms?", ("Ernest Hemingway", "Hemingway"))]
    held = [("Who won the 2018 FIFA World Cup?", ("France",))]
    data = prepare_training(ui_engine, kb="nq-wiki", pairs=pairs, held_out=held, candidates=3)
    assert [len(e.rows) for e in data.examples] == [3, 3] and data.fresh_reads == 6
    first = data.examples[0]
    result = ui_engine.score(first.question, first.answer, kb="nq-wiki", rows=list(first.rows), memory=False)
    assert torch.allclose(first.token_logprobs, torch.tensor(result.variants["token"].doc_token_logprobs).T)
    assert prepare_training(ui_engine, kb="nq-wiki", pairs=pairs, held_out=held, candidates=3).fresh_reads == 0
    trainer = EndToEndTrainer(ui_engine.encoder, data.kb.embeddings, data.examples, lexical_weight=data.lexical_weight,
                              config=EndToEndConfig(steps=2, batch_size=2, k=3))
    assert np.isfinite(trainer.step())
    assert data.check.measure(trainer.model).questions == 1


# ---- question-answer files and the command line -------------------------------------------------------------


def test_pairs_from_csv_and_jsonl(tmp_path):
    (tmp_path / "qa.csv").write_text("Question,Answers\nwho painted it?,Rembrandt|Rembrandt van Rijn\n", encoding="utf-8")
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "where?", "answer": "Paris"}) + "\n\n", encoding="utf-8")
    assert load_pairs(tmp_path / "qa.csv") == [("who painted it?", ("Rembrandt", "Rembrandt van Rijn"))]
    assert load_pairs(tmp_path / "qa.jsonl") == [("where?", ("Paris",))]
    assert len(load_pairs("everyday-train")) == 450


@pytest.mark.parametrize("content, suffix, message", [
    (None, ".csv", "no questions file"),
    ("", ".jsonl", "holds no question-answer pairs"),
    ("question,reply\nwho?,me\n", ".csv", "needs a header with a 'question' column"),
    ("question,answer\nwho?,\n", ".csv", "line 2 lacks a question or an answer"),
    ('{"question": "who?"}\n', ".jsonl", "line 1 lacks"),
    ("not json\n", ".jsonl", "line 1 is not valid JSON"),
    ("question\tanswer\n", ".tsv", "neither .jsonl nor .csv"),
])
def test_bad_question_files_are_one_line_and_exit_2(tmp_path, capsys, content, suffix, message):
    from rag_demo.cli import main

    path = tmp_path / f"pairs{suffix}"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["train", "--questions", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_train_options_are_refused_before_loading(capsys):
    from rag_demo.cli import main

    assert main(["train", "--objective", "rag-both"]) == 2
    assert main(["train", "--save", "../elsewhere"]) == 2
    assert "cannot name a question encoder" in capsys.readouterr().err
    assert main(["train", "--kb", "mine"]) == 2  # a KB without question sets of its own needs --questions
    assert "--questions FILE" in capsys.readouterr().err


def test_train_saves_a_named_encoder_that_ask_can_load(ui_engine, tmp_path, capsys, monkeypatch):
    from rag_demo import cli

    monkeypatch.setattr("rag_demo.serving.loading.engine_from_config", lambda config, **options: ui_engine)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("question,answer\n" + "".join(f"{q},{a}\n" for q, a in [
        ("What is the capital of France?", "Paris"), ("Who wrote A Farewell to Arms?", "Hemingway"),
        ("How tall is the Eiffel Tower?", "330 metres"), ("Who created Python?", "Guido van Rossum"),
        ("What is the largest planet?", "Jupiter")]), encoding="utf-8")
    assert cli.main(["train", "--kb", "nq-wiki", "--questions", str(pairs), "--steps", "2", "--batch-size", "2",
                     "--check-every", "1", "--save", "mine", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 2 and set(out["before"]) == {"recall@1", "recall@5", "recall@20", "answer_mass", "questions"}
    assert out["before"]["questions"] == 1  # a fifth of the file, held out
    args = cli.build_parser().parse_args(["ask", "q", "--question-encoder", "mine"])
    config = cli.engine_config(args)
    assert config.encoder.question_weights == out["path"] and not config.encoder.tuned
    record = json.loads((Path(out["path"]) / "training.json").read_text())
    assert len(record["losses"]) == 2


def test_the_logit_gradient_pulls_up_the_passage_that_reads_the_answer(tiny_encoder, tiny_kb):
    reads = _reads(tiny_kb)
    for objective in ("rag-token", "rag-sequence"):
        trainer = EndToEndTrainer(tiny_encoder, tiny_kb.embeddings, reads, lexical_weight=0.0,
                                  config=EndToEndConfig(objective=objective, k=len(tiny_kb)))
        prior, gradient = trainer.logit_gradient(reads[1])
        assert int(gradient.argmin()) == 1 and float(gradient[1]) < 0  # row 1 holds the answer: its logit rises
        assert float(prior.sum()) == pytest.approx(1.0) and float(gradient.sum()) == pytest.approx(0.0, abs=1e-5)


@pytest.mark.slow
def test_train_on_the_default_base_and_ask_with_it(capsys):
    """The real default: wikipedia, everyday-train, Gemma reading (cached after a first run), MiniLM training."""
    import shutil

    from rag_demo import cli
    from rag_demo.serving.retriever_training import encoders_folder

    name = "test-smoke"
    try:
        assert cli.main(["train", "--max-questions", "3", "--steps", "2", "--check-every", "1", "--save", name,
                         "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["before"]["questions"] == 220 and 0 < out["before"]["recall@5"] <= 1
        assert cli.main(["ask", "who painted the night watch?", "--variant", "token", "--no-memory", "--no-closed-book",
                         "--question-encoder", name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["passages"]
    finally:
        shutil.rmtree(encoders_folder() / name, ignore_errors=True)
