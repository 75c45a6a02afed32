"""What the benchmarks measure, made without downloads: tokenizers trained on given text,
random-init models of the paper's shapes, a tiny engine over a dozen passages (`--quick` runs),
and vectors shaped like text embeddings.

transformers and tokenizers are imported inside the functions that build with them: the scale
benchmark's children need only the vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rag_demo.config import EngineConfig, GeneratorConfig, IndexConfig
from rag_demo.retrieval.corpus import Passage, make_kb

QUICK_PASSAGES = [
    ("Lake Baikal", "Lake Baikal is a rift lake in Siberia and the deepest lake in the world, reaching 1,642 metres."),
    ("Penny Black", "The Penny Black was the first adhesive postage stamp, issued in the United Kingdom in May 1840."),
    ("The Magic Flute", "The Magic Flute is an opera by Mozart that premiered in Vienna in September 1791."),
    ("Hemingway", "Ernest Hemingway wrote A Farewell to Arms and The Sun Also Rises in the nineteen twenties."),
    ("Paris", "Paris is the capital and largest city of France, on the river Seine in the north of the country."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas on the Nepal border."),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the Solar System, a gas giant."),
    ("Amazon", "The Amazon River in South America is the largest river by discharge volume of water in the world."),
    ("Thomas Jefferson", "Thomas Jefferson wrote Notes on the State of Virginia and was the third president."),
    ("Animal Farm", "Animal Farm is a novella by George Orwell in which Snowball stands for Leon Trotsky."),
    ("Encore", "Encore Las Vegas is a luxury hotel owned and operated by Wynn Resorts on the Las Vegas Strip."),
    ("Douglas Park", "Douglas Park in Chicago is named after Stephen A. Douglas, a senator from Illinois."),
]
QUICK_QUESTIONS = ["how deep is lake baikal", "who wrote notes on the state of virginia", "who owns the encore hotel",
                   "when was the penny black issued"]


def bpe_tokenizer(texts: list[str], folder: Path, vocab_size: int):
    """A byte-level BPE tokenizer with BART's special tokens, trained on `texts`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    trainer.save_model(str(folder))
    return BartTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))


def wordpiece_tokenizer(texts: list[str], folder: Path, vocab_size: int):
    """A DPR (BERT, uncased) word-piece tokenizer trained on `texts`."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import DPRQuestionEncoderTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=1, show_progress=False)
    trainer.save_model(str(folder))
    return DPRQuestionEncoderTokenizerFast(vocab=str(folder / "vocab.txt"))


def rag_parts(shape: str, gen_vocab: int, q_vocab: int, *, seed: int = 0):
    """A DPR question encoder and a BART generator of the given shape, random weights.

    "large": DPRConfig() (BERT-base) + BartConfig() (BART-large), the paper's shapes.
    """
    from transformers import BartConfig, BartForConditionalGeneration, DPRConfig, DPRQuestionEncoder

    torch.manual_seed(seed)
    if shape == "large":
        q_config, g_config = DPRConfig(vocab_size=q_vocab), BartConfig(vocab_size=gen_vocab)
    elif shape == "base":
        q_config = DPRConfig(vocab_size=q_vocab, hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
        g_config = BartConfig(vocab_size=gen_vocab, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                              decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
    elif shape == "tiny":
        q_config = DPRConfig(vocab_size=q_vocab, hidden_size=24, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
        g_config = BartConfig(vocab_size=gen_vocab, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, init_std=0.5)
    else:
        raise ValueError(f"unknown shape {shape!r}; use large, base or tiny")
    g_config.forced_eos_token_id = 2
    return DPRQuestionEncoder(q_config).eval(), BartForConditionalGeneration(g_config).eval()


def quick_engine(folder: Path, device: torch.device):
    """An engine over tiny random models (a Gemma-3-shaped causal LM, a DPR encoder) and QUICK_PASSAGES."""
    from transformers import DPRConfig, DPRContextEncoder, DPRQuestionEncoder, Gemma3ForCausalLM, Gemma3TextConfig

    from rag_demo.generation import prompts
    from rag_demo.retrieval.encoders import Encoder
    from rag_demo.engine import RagEngine
    from rag_demo.generation.generator import CausalGenerator

    passages = [Passage(t, x) for t, x in QUICK_PASSAGES]
    texts = [p.title + " " + p.text for p in passages] + QUICK_QUESTIONS
    gen_tok = bpe_tokenizer(texts + [prompts.few_shot_prefix(), prompts.few_shot_prefix(with_passages=False)], folder / "gen", 1000)
    q_tok = wordpiece_tokenizer(texts, folder / "dpr", 400)
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(gen_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4096,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=4096, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    model = Gemma3ForCausalLM(config).eval().to(device)
    generator = CausalGenerator(model, gen_tok, GeneratorConfig(model="tiny-gemma3", max_prompt_tokens=1024), name="tiny-gemma3")
    dpr = DPRConfig(vocab_size=q_tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    q_model, c_model = DPRQuestionEncoder(dpr).eval().to(device), DPRContextEncoder(dpr).eval().to(device)
    encoder = Encoder("tiny-dpr", q_tok, q_model, c_model, q_tok, "dpr", 1.0, 128, device)
    kb = make_kb("tiny", passages, encoder.encode_passages(passages), encoder="tiny-dpr")
    engine = RagEngine(encoder=encoder, generator=generator, kbs={"tiny": kb},
                       config=EngineConfig(device=device.type, index=IndexConfig(ivf_nlist=2, pq_bytes=8)),
                       examples={"tiny": QUICK_QUESTIONS})
    return engine


def synthetic_vectors(n: int, dim: int, clusters: int, *, seed: int, latent_dim: int = 64, space_seed: int = 0) -> np.ndarray:
    """Unit vectors shaped like text embeddings, float32 (n, dim).

    Sentence embeddings use few directions of their space and group by topic, and a query lies
    among the passages it should find. So: `clusters` topic centres in a `latent_dim`-dim subspace,
    points spread around them, and a little noise in every direction. The subspace and centres
    come from `space_seed`, shared by base vectors and queries; `seed` draws the points. (Points of
    full-rank noise would be nearly equidistant, and recall against exact search would mean nothing.)
    """
    space = np.random.default_rng(space_seed)
    latent_dim = min(latent_dim, dim)
    basis = (space.standard_normal((latent_dim, dim)) / np.sqrt(latent_dim)).astype(np.float32)  # (L, dim)
    centres = space.standard_normal((clusters, latent_dim)).astype(np.float32)  # (C, L)
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    for start in range(0, n, step):
        m = min(step, n - start)
        latent = centres[rng.integers(0, clusters, m)] + 0.5 * rng.standard_normal((m, latent_dim), dtype=np.float32)
        chunk = latent @ basis + 0.05 * rng.standard_normal((m, dim), dtype=np.float32)
        out[start : start + m] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out
