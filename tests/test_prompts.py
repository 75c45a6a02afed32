"""The worked examples of the few-shot prompts."""

from rag_demo.generation import prompts


def test_every_reading_example_answers_with_a_span_of_its_own_passage():
    for title, passage, question, answer in prompts.EXAMPLES:
        assert answer in passage, (title, answer)
        assert f"Question: {question}\nAnswer: {answer}{prompts.ANSWER_STOP}" in prompts.few_shot_prefix()


def test_closed_book_examples_ask_the_same_questions_with_real_world_answers():
    reading = {question: answer for _, _, question, answer in prompts.EXAMPLES}
    closed = dict(prompts.CLOSED_BOOK_EXAMPLES)
    assert list(closed) == list(reading)
    # only the deliberately false passage's answer differs, and the closed-book prompt never states it
    differing = [q for q in reading if reading[q] != closed[q]]
    assert differing == ["who composed the opera the magic flute"]
    block = prompts.few_shot_prefix(with_passages=False)
    assert "Vivaldi" not in block and "Wolfgang Amadeus Mozart" in block
    assert "Passage:" not in block
