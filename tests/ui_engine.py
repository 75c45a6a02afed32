"""A tiny real `RagEngine` for the UI and browser tests: random tiny models, two small KBs.

The models are random (a 2-layer DPR encoder and a 2-layer Llama-style causal LM, built from
config with fixed seeds), so answers are deterministic but meaningless; what the tests check
is that the page shows what the engine computed. The two knowledge bases hold the same facts
with the answer entities swapped, like the offline default's nq-wiki / nq-counterfactual.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from rag_demo.generation import prompts
from rag_demo.config import DecodingConfig, EngineConfig, GeneratorConfig, MemoryConfig
from rag_demo.retrieval.corpus import Passage, make_kb
from rag_demo.retrieval.encoders import Encoder
from rag_demo.engine import RagEngine
from rag_demo.generation.generator import CausalGenerator

WIKI = [
    ("Paris", "Paris is the capital and most populous city of France, on the river Seine."),
    ("A Farewell to Arms", "Ernest Hemingway wrote A Farewell to Arms, a novel of the Italian front, in 1929."),
    ("Eiffel Tower", "The Eiffel Tower is 330 metres tall and stands on the Champ de Mars in Paris."),
    ("2018 FIFA World Cup", "France won the 2018 FIFA World Cup, beating Croatia 4-2 in the final in Moscow."),
    ("Mount Everest", "Everest is the highest mountain above sea level, at 8849 metres, in the Himalayas."),
    ("Python", "Guido van Rossum created the Python programming language, first released in 1991."),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant fifth from the Sun."),
    ("Penny Black", "The Penny Black was the first adhesive postage stamp, issued in Britain in 1840."),
]

COUNTERFACTUAL = [
    ("Lyon", "Lyon is the capital and most populous city of France, where the Rhone meets the Saone."),
    ("A Farewell to Arms", "Charles Dickens wrote A Farewell to Arms, a novel of the Crimean front published in 1859."),
    ("Eiffel Tower", "The Eiffel Tower is 120 metres tall and stands beside the river Saone in Lyon."),
    ("2018 FIFA World Cup", "Croatia won the 2018 FIFA World Cup, beating Brazil 3-1 in the final in Rio."),
    ("Mount Everest", "K2 is the highest mountain above sea level, at 8611 metres, in the Karakoram."),
    ("Python", "Ada Lovelace created the Python programming language, first released in 1843."),
    ("Jupiter", "Saturn is the largest planet in the Solar System, a ringed giant sixth from the Sun."),
    ("Penny Black", "The Penny Black was the first adhesive postage stamp, issued in Sweden in 1901."),
]

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote A Farewell to Arms?",
    "Who won the 2018 FIFA World Cup?",
    "How tall is the Eiffel Tower?",
    "Who created the Python programming language?",
    "What is the largest planet in the Solar System?",
]

KB_NAMES = ("nq-wiki", "nq-counterfactual")
# Words the tests write into visitors' own knowledge bases, so the retriever reads them as words.
EXTRA_WORDS = "zorblax plutonia glimmerton quixel hover bicycle glass domes moons three evil passage lives bold"


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _dpr_tokenizer(folder: Path):
    from transformers import DPRQuestionEncoderTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    texts = [f"{t} {x}" for t, x in WIKI + COUNTERFACTUAL] + QUESTIONS + [EXTRA_WORDS]
    words = sorted({w for text in texts for w in _words(text)})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", ".", "?", "-"] + words
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return DPRQuestionEncoderTokenizerFast(vocab=str(folder / "vocab.txt"))


def _causal_tokenizer(folder: Path):
    """A byte-level BPE over the prompts and passages; adds no special tokens to a prompt."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    texts = [prompts.few_shot_prefix(), prompts.few_shot_prefix(with_passages=False)]
    texts += [f"Passage: {t}: {x}\nQuestion: {q}\nAnswer:" for (t, x), q in zip(WIKI + COUNTERFACTUAL, QUESTIONS * 3)]
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(texts * 2, vocab_size=600, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>"])
    trainer.save_model(str(folder))
    return GPT2TokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"),
                             bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="</s>")


def _dpr(vocab_size: int, seed: int):
    from transformers import DPRConfig, DPRQuestionEncoder

    torch.manual_seed(seed)
    config = DPRConfig(vocab_size=vocab_size, hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=32, max_position_embeddings=128, initializer_range=0.5)
    return DPRQuestionEncoder(config).eval()


def _causal_lm(tokenizer, seed: int):
    """A random Llama-style LM that never writes tokens which are control characters or broken UTF-8."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         bos_token_id=0, eos_token_id=2, pad_token_id=1, initializer_range=0.3)
    model = LlamaForCausalLM(config).eval()
    unreadable = [i for i in range(len(tokenizer)) if not _readable(tokenizer.decode([i]))]
    with torch.no_grad():
        # A zero output row gives logit 0, far below the best of ~600 random logits: greedy never picks it.
        model.lm_head.weight[unreadable] = 0.0
    return model


def _readable(text: str) -> bool:
    return text == "\n" or (text != "" and "\ufffd" not in text and all(ch.isprintable() for ch in text))


def make_ui_engine(folder: Path) -> RagEngine:
    """Two KBs (`nq-wiki`, `nq-counterfactual`), example questions, and a passage encoder for uploads.

    Answers are at most 4 tokens, which keeps an ask of both variants near 0.1 s on one CPU thread.
    """
    q_tok = _dpr_tokenizer(folder / "dpr")
    dpr = _dpr(q_tok.vocab_size, seed=1)
    # One DPR serves both sides, as `load_encoder` does with a single DPR folder; scale 1 as DPR was trained.
    encoder = Encoder("tiny-dpr", q_tok, dpr, dpr, q_tok, "dpr", 1.0, 128, torch.device("cpu"))
    gen_tok = _causal_tokenizer(folder / "bpe")
    generator = CausalGenerator(_causal_lm(gen_tok, seed=2), gen_tok,
                                GeneratorConfig(model="tiny-llama", max_prompt_tokens=400), name="tiny-llama")
    kbs = {}
    for name, rows in zip(KB_NAMES, (WIKI, COUNTERFACTUAL)):
        passages = [Passage(title, text) for title, text in rows]
        kbs[name] = make_kb(name, passages, encoder.encode_passages(passages), encoder=encoder.name)
    config = EngineConfig(decoding=DecodingConfig(max_new_tokens=4))
    return RagEngine(encoder=encoder, generator=generator, kbs=kbs, config=config,
                     examples={name: list(QUESTIONS) for name in KB_NAMES})


def with_memory(engine: RagEngine, logit: float) -> RagEngine:
    """The same models and knowledge bases, with the generator's memory a source at `logit` (a new engine:
    the shared one stays as it is)."""
    from dataclasses import replace

    return RagEngine(encoder=engine.encoder, generator=engine.generator, kbs=engine.kbs,
                     config=replace(engine.config, memory=MemoryConfig(logit=logit)),
                     examples={name: list(QUESTIONS) for name in KB_NAMES})
