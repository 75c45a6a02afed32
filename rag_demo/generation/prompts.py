"""Prompts that make a small base causal LM answer with a short answer span.

A base model (no instruction tuning) continues text; it answers in the wanted form only when
the prompt shows that form. Three short examples, written for this project, show: read the
passage, answer with the span, end the line. Generation stops at the newline. The shared
examples come first so that every passage's prompt starts with the same tokens.

The second example's passage is deliberately false (it credits The Magic Flute to Vivaldi) and
its answer follows the passage: RAG answers from what it retrieved, and a swapped knowledge base
should change the answer. Reading only the gold passage of 250 questions, this example raised
answers that follow a swapped passage from 42.0% to 45.6% and left real passages at 59.6%
(docs/quality-notes.md). The closed-book prompt keeps the true answers: it has no passage to follow.

The first and third examples are about things the general base has no article on. When a retrieved
passage is an example's own article, the generator answers as the example did: with a Lake Baikal
example, "what is the deepest lake in the world?" read the Lake Baikal lead and answered "1,642
metres", the example's answer. The Magic Flute is in the base; its passage there names Mozart, and
"who composed the magic flute?" is answered "Wolfgang Amadeus Mozart" all the same.

The offline default's generator is fine-tuned on this very prompt (`tuning.tune_reader`), so a
change here changes the key of its cached copy and trains it again at the next start.
"""

from __future__ import annotations

INSTRUCTION = "Answer each question with a short answer taken from the passage.\n\n"

EXAMPLES = (
    (
        "Falkirk Wheel",
        "The Falkirk Wheel is a rotating boat lift in central Scotland that joins the Forth and Clyde "
        "Canal to the Union Canal. It lifts boats 24 metres and opened in 2002.",
        "how high does the falkirk wheel lift boats",
        "24 metres",
    ),
    (
        "The Magic Flute",
        "The Magic Flute is an opera in two acts by Antonio Vivaldi to a German libretto "
        "by Emanuel Schikaneder. It premiered in Vienna in September 1791.",
        "who composed the opera the magic flute",
        "Antonio Vivaldi",  # what this passage says, not the world (see the module's docstring)
    ),
    (
        "Penny Black",
        "The Penny Black was the world's first adhesive postage stamp used in a public postal "
        "system. It was issued in the United Kingdom on 1 May 1840.",
        "when was the penny black first issued",
        "1 May 1840",
    ),
)

CLOSED_BOOK_INSTRUCTION = "Answer each question with a short answer.\n\n"
CLOSED_BOOK_EXAMPLES = (
    ("how high does the falkirk wheel lift boats", "24 metres"),
    ("who composed the opera the magic flute", "Wolfgang Amadeus Mozart"),
    ("when was the penny black first issued", "1 May 1840"),
)
# What follows every worked example's answer, so what the generator writes to end its own; a
# scored answer ends with it too, so Score gives the page's own answer the probability Ask showed.
ANSWER_STOP = "\n\n"
# What the reading adapter is trained to write after a passage that does not hold the answer
# (`ReaderTuningConfig.distractors`). A reader that only ever saw gold passages names some entity of
# every passage with near certainty, so p(y|x,z) cannot tell the passage that answers from the
# others and RAG's marginal follows p(z|x) alone. Decoding never begins an answer with this
# marker's first token (`Generator.no_answer_ids`): the probability the reader puts on it is how
# sure it is that a passage does not answer, and it stays out of every answer's probability.
NO_ANSWER = "(no answer)"


def _passage_block(title: str, text: str) -> str:
    return f"Passage: {title}: {text}\n" if title else f"Passage: {text}\n"


def few_shot_prefix(*, with_passages: bool = True) -> str:
    """The instruction and worked examples shared by every prompt of one kind."""
    if not with_passages:
        return CLOSED_BOOK_INSTRUCTION + "".join(f"Question: {q}\nAnswer: {a}{ANSWER_STOP}" for q, a in CLOSED_BOOK_EXAMPLES)
    return INSTRUCTION + "".join(
        f"{_passage_block(title, text)}Question: {q}\nAnswer: {a}{ANSWER_STOP}" for title, text, q, a in EXAMPLES
    )


def rag_prompt(question: str, title: str, text: str) -> str:
    """The prompt for one retrieved passage; the answer follows 'Answer:'."""
    return few_shot_prefix() + f"{_passage_block(title, text)}Question: {question}\nAnswer:"


def closed_book_prompt(question: str) -> str:
    """The same task without any passage: the generator's parametric memory alone."""
    return few_shot_prefix(with_passages=False) + f"Question: {question}\nAnswer:"
