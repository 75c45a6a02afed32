import math
from collections import Counter

import numpy as np
import pytest

from rag_demo.lexical import LexicalIndex, terms

TEXTS = [
    "Mozart composed The Magic Flute in 1791 in Vienna.",
    "The Penny Black stamp was issued in 1840; the penny post followed.",
    "Lake Baikal in Siberia is the deepest lake, deeper than any other lake.",
    "",
    "Flute and piccolo: the flute family.",
]


def bm25_by_formula(texts, question, k1, b):
    docs = [terms(t) for t in texts]
    mean = sum(map(len, docs)) / len(docs)
    out = []
    for doc in docs:
        tf = Counter(doc)
        score = 0.0
        for word in terms(question):
            df = sum(word in d for d in docs)
            if df == 0 or word not in tf:
                continue
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            score += idf * tf[word] * (k1 + 1) / (tf[word] + k1 * (1 - b + b * len(doc) / mean))
        out.append(score)
    return np.array(out)


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.2, 0.75), (2.0, 0.0)])
@pytest.mark.parametrize("question", ["who composed the magic flute", "deepest lake lake", "penny 1840 flute", "nothing matches zzz"])
def test_scores_equal_the_bm25_formula(question, k1, b):
    index = LexicalIndex.build(TEXTS, k1=k1, b=b)
    np.testing.assert_allclose(index.scores(question), bm25_by_formula(TEXTS, question, k1, b), rtol=1e-5, atol=1e-6)


def test_top_orders_by_score_and_drops_non_matching():
    index = LexicalIndex.build(TEXTS)
    top = index.top("magic flute", 5)
    scores = index.scores("magic flute")
    assert top.tolist() == [0, 4]  # the empty passage and the unrelated ones score 0 and are left out
    assert scores[0] > scores[4] > 0
    assert index.top("the of who", 3).tolist() == []  # stopwords only
    assert index.top("flute", 0).tolist() == []


def test_words_are_unicode_and_case_blind():
    index = LexicalIndex.build(["Zürich liegt am Zürichsee.", "Πλάτων ήταν φιλόσοφος."])
    assert index.top("ZÜRICH", 2).tolist() == [0]
    assert index.top("πλάτων", 2).tolist() == [1]


def test_empty_knowledge_base():
    index = LexicalIndex.build([])
    assert index.scores("anything").shape == (0,)
    assert index.top("anything", 3).tolist() == []
