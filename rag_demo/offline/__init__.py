"""Fetching, converting and caching the offline default: the NQ knowledge-conflict passages and Gemma-3-270m.

Everything lives under `config.cache_root()`, never in the repository:

    sources/bigbench-1.0.0/       task.json of BIG-bench's contextual_parametric_knowledge_conflicts
    models/gemma3-270m-<sha>/     the packaged GGUF, dequantized once into float32 safetensors + tokenizer
    models/minilm-questions-<key>/  the default encoder's question side, fine-tuned on nq-wiki (`rag_demo.training.question_encoder`)
    models/gemma3-270m-reader-adapter-<key>/  the generator's reading adapter (`rag_demo.generation.adapters`, a few MB)
    kbs/<name>-<key>/             a KB written by `corpus.save_kb`, plus its questions.jsonl
    downloads/                    where a hand-fetched bigbench-1.0.0.tar.gz may be put (no network)

The modules, each importing only those above it:

    cache      cache folders: staging, the completeness marker, atomic publishing, disk errors
    worlds     pure: task.json's records -> the real passages and one consistent counterfactual world
    source     fetching the bigbench sdist and extracting task.json
    gguf       the packaged GGUF generator, converted once into a float32 safetensors folder
    kbs        nq-wiki and nq-counterfactual: embedded, with their questions and example questions
    tuned      the fine-tuned question encoder and the generator's reading adapter
    prepare    all of the above, built where missing: `prepare()`

Each artifact is a folder built in a hidden staging folder beside its destination and renamed
into place, so a crash never leaves a half-written folder under the real name. A folder counts
as complete only when its `complete.json` names the expected key, every listed file has the
recorded size, and the marker's own checksum holds; anything else is logged and rebuilt. Keys
change with what the artifact is made from (bigbench version, the GGUF's sha256, the encoder),
so an old artifact is never mistaken for a new one. Checking a complete cache loads no model.
"""
