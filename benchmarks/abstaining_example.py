"""A worked example in the reading prompt whose passage does not answer: can the base generator learn from
the prompt alone to say so, so that the passages that do answer carry RAG's marginal?

    python -m rag_demo eval --kb wikipedia --questions everyday-train --variant token --n 150 --seed 0 --k 5 --answers A
    python -m benchmarks.abstaining_example --kb wikipedia --questions everyday-train --variant token --n 150 --seed 0 --k 5 --answers B
    python -m benchmarks.paired_answers A B

Without the NQ pair the offline default reads with the base generator, which was never trained to
abstain (`ReaderTuningConfig.distractors` trains the reading adapter to), so it names an entity of every
passage it reads. This runs `eval` with its arguments after putting a fourth worked example second in the
prompt: a passage on the topic that does not hold the answer, answered `prompts.NO_ANSWER`; the reader's
probability of beginning with the marker is then kept out of every answer, as for a reader trained
with distractors (`Generator.no_answer_ids`). The closed-book prompt is unchanged.
"""

from __future__ import annotations

import sys

ABSTAINING = (
    "Cutty Sark",
    "The Cutty Sark is a British clipper ship built on the River Leven in 1869. She was one of the last tea "
    "clippers to be built and is now a museum ship in Greenwich, London.",
    "who designed the cutty sark",
)


def main(argv: list[str] | None = None) -> int:
    from rag_demo.cli import main as cli_main
    from rag_demo.generation import prompts
    from rag_demo.generation.generator import Generator

    examples = list(prompts.EXAMPLES)
    examples.insert(1, (*ABSTAINING, prompts.NO_ANSWER))
    prompts.EXAMPLES = tuple(examples)  # read by every prompt this process makes, the saved prefix states keyed by it
    Generator.no_answer_ids = property(lambda generator: generator._no_answer_first)
    return cli_main(["eval", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
