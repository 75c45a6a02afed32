"""The retriever p_eta(z|x) (paper, section 2.2): knowledge bases and the search over them.

    corpus       passages and knowledge bases: splitting, building, saving and loading
    store        a knowledge base's rows kept on disk, read as they are needed
    encoders     question and passage encoders (DPR, sentence-transformers)
    lexical      Okapi BM25, the lexical half of hybrid retrieval
    flat         exact inner product search in chunks (the oracle of the approximate indexes)
    index_build  building a faiss index block by block, resumable
    index        the index variants behind one search interface, cached beside their KB
    retriever    a question's top k passages and their weights p(z|x)
"""
