"""The generator p_theta(y_i | x, z, y_1:i-1) (paper, section 2.3) and decoding (section 2.5).

    prompts       the prompts that make a base causal LM answer with a short span
    tokenizing    loading a generator's tokenizer
    adapters      low-rank adapters on the generator, with an off switch
    kernels       fast paths that change how torch computes, never what
    decode_state  what a decode carries from step to step: log-probs, caches, masks
    saved_states  what a causal generator works out once, saved for the next start
    generator     seq2seq and causal LMs behind one interface: per-passage token log-probs
    decoding      greedy and beam search for RAG-Token and RAG-Sequence
"""
