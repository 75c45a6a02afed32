"""Fine-tuning the retriever's question side and the generator (paper, section 2.4).

    question_encoder  the question encoder on a KB's training questions; the passage side and index stay fixed
    reader            a low-rank adapter that teaches the generator to answer from the passage it reads
"""
