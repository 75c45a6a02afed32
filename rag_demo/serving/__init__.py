"""The engine served to the page and the command line.

    heap        keeps a long-running server's resident memory from creeping up
    loading     building a `RagEngine` from settings: the offline default, hub ids, RAG checkpoints
    featured    the page's example questions, ordered so that the first ones are answered right
    background  the engine built in a thread, swapped in stage by stage while the page shows progress
    process     the same in a process of its own beside the page's
"""
