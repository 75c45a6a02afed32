"""Tiny random models of real architectures, built from config in milliseconds (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "paris is the capital of france and a large city",
    "ernest hemingway wrote a farewell to arms and the sun also rises",
    "lake baikal is the deepest lake in the world",
    "who wrote the novel about the war in italy",
    "the penny black was the first adhesive postage stamp",
    "mozart composed the magic flute in vienna",
]

PASSAGES = [
    ("Hemingway", "Ernest Hemingway wrote A Farewell to Arms and The Sun Also Rises."),
    ("Paris", "Paris is the capital of France and a large city on the Seine."),
    ("Baikal", "Lake Baikal is the deepest lake in the world, in Siberia."),
    ("Penny Black", "The Penny Black was the first adhesive postage stamp, issued in 1840."),
    ("Magic Flute", "Mozart composed The Magic Flute, which premiered in Vienna."),
    ("Fox", "The quick brown fox jumps over the lazy dog again and again."),
]

PASSAGE_QUESTIONS = [  # (passage row in PASSAGES, question, the answer that passage gives)
    (0, "who wrote a farewell to arms", "Ernest Hemingway"),
    (1, "what is the capital of france", "Paris"),
    (2, "what is the deepest lake in the world", "Lake Baikal"),
    (3, "when was the penny black issued", "1840"),
    (4, "who composed the magic flute", "Mozart"),
    (5, "what does the quick brown fox jump over", "the lazy dog"),
]


def bart_tokenizer(folder: Path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(SENTENCES * 3, vocab_size=300, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    trainer.save_model(str(folder))
    return BartTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))


def dpr_tokenizer(folder: Path):
    from transformers import DPRQuestionEncoderTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    words = sorted({w for s in SENTENCES + [t + " " + x for t, x in PASSAGES] for w in s.lower().replace(",", " ").replace(".", " ").split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "."] + words
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return DPRQuestionEncoderTokenizerFast(vocab=str(folder / "vocab.txt"))


def tiny_bart(vocab_size: int, seed: int = 0):
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=vocab_size, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=512,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
        init_std=0.5,  # large random weights: outputs then depend clearly on the passage
    )
    return BartForConditionalGeneration(config).eval()


def tiny_dpr(vocab_size: int, seed: int = 1):
    from transformers import DPRConfig, DPRContextEncoder, DPRQuestionEncoder

    torch.manual_seed(seed)
    config = DPRConfig(vocab_size=vocab_size, hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=32, max_position_embeddings=128, initializer_range=0.5)
    return DPRQuestionEncoder(config).eval(), DPRContextEncoder(config).eval()


def tiny_causal(vocab_size: int, seed: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         bos_token_id=0, eos_token_id=2, pad_token_id=1, initializer_range=0.5)
    return LlamaForCausalLM(config).eval()


def tiny_sentence_encoder(folder: Path) -> Path:
    """A random BERT with a WordPiece tokenizer, saved like a sentence-transformers model folder."""
    from transformers import BertConfig, BertModel

    tokenizer = dpr_tokenizer(folder)
    torch.manual_seed(3)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_causal_folder(folder: Path) -> Path:
    """A random tiny Llama and its tokenizer, saved as the converted default generator is."""
    tokenizer = bart_tokenizer(folder / "tokenizer")
    tiny_causal(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def custom_kb_passages(n: int = 40) -> list[tuple[str, str]]:
    """A few dozen short passages from the words the tiny tokenizers know."""
    words = " ".join(SENTENCES).split()
    return [(f"{PASSAGES[i % len(PASSAGES)][0]} {i}", " ".join(words[(7 * i + j) % len(words)] for j in range(12))) for i in range(n)]


def transformers_custom_kb(folder: Path, tokenizer, context_encoder, *, index: str = "hnsw", n: int = 40) -> tuple[Path, Path]:
    """What transformers' `use_own_knowledge_dataset.py` writes, at toy size: (passages_path, index_path).

    The passages embedded by a DPR context encoder, saved with `save_to_disk` (float32 embeddings,
    as the script's features ask), and a faiss index over them saved beside the folder with
    `dataset.get_index("embeddings").save(...)`.
    """
    import faiss
    from datasets import Dataset, Features, Sequence, Value

    rows = custom_kb_passages(n)
    with torch.no_grad():
        batch = tokenizer([t for t, _ in rows], [x for _, x in rows], padding=True, return_tensors="pt")
        vectors = context_encoder(**batch).pooler_output.numpy()
    features = Features({"text": Value("string"), "title": Value("string"), "embeddings": Sequence(Value("float32"))})
    dataset = Dataset.from_dict({"text": [x for _, x in rows], "title": [t for t, _ in rows], "embeddings": vectors.tolist()},
                                features=features)
    passages_path = folder / "my_knowledge_dataset"
    dataset.save_to_disk(str(passages_path))
    dim = vectors.shape[1]
    if index == "hnsw":
        made = faiss.IndexHNSWFlat(dim, 128, faiss.METRIC_INNER_PRODUCT)
    elif index == "flat":
        made = faiss.IndexFlatIP(dim)
    else:  # ivfpq: a few lists, trained on the passages themselves
        made = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, 2, 4, 4, faiss.METRIC_INNER_PRODUCT)
        made.train(vectors)
        made.nprobe = 2
    dataset.add_faiss_index("embeddings", custom_index=made)
    index_path = folder / f"my_knowledge_dataset_{index}_index.faiss"
    dataset.get_index("embeddings").save(str(index_path))
    return passages_path, index_path
