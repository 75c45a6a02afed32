"""Command line: `python -m rag_demo ask|score|compare|build-kb|build-bm25|build-index|prepare|eval|train ...`.

Bad input ends with one line on stderr and exit code 2; `--json` prints the same object the
web API returns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

from .config import (
    ASK,
    DECODING_DEFAULTS,
    VARIANTS,
    DECODINGS,
    DEFAULT_KBS,
    DEFAULT_LEXICAL_WEIGHT,
    INDEX_KINDS,
    LIMITS,
    RETRIEVERS,
    DecodingConfig,
    EncoderConfig,
    EngineConfig,
    GeneratorConfig,
    MemoryConfig,
    named_paths,
)
from .retrieval.corpus import VECTOR_DTYPES
from .serving.train_command import add_train_command
from .errors import RagDemoError
from .options import BOTH, CLOSED_BOOK
from .terminal import print_comparison, print_summary
from .text import check_length, looks_like_path, one_line, require_words

log = logging.getLogger(__name__)


class UsageError(RagDemoError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see `python -m {self.prog} --help`)")


def _count(most: int | None = None):
    """An argparse type: a whole number from 1 to `most` (unbounded when None); argparse names the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < 1 or (most is not None and value > most):
            raise argparse.ArgumentTypeError("must be at least 1" if most is None else f"must be between 1 and {most}")
        return value

    return parse


def _above_zero(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def _decoding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-beams", type=_count(LIMITS.max_beams), default=DECODING_DEFAULTS.num_beams,
                        help=f"beams for each passage's decoding (default {DECODING_DEFAULTS.num_beams}: greedy; "
                             f"at most {LIMITS.max_beams})")
    parser.add_argument("--max-new-tokens", type=_count(LIMITS.max_new_tokens), default=DECODING_DEFAULTS.max_new_tokens,
                        help=f"longest answer in generator tokens (default {DECODING_DEFAULTS.max_new_tokens}, "
                             f"at most {LIMITS.max_new_tokens})")


def _model_options(parser: argparse.ArgumentParser, *, one_retriever: bool = True) -> None:
    """The engine's options; `one_retriever` adds --index and --retriever (compare runs every retriever, exactly)."""
    parser.add_argument("--kb", default=None, help="knowledge base name or folder (default: the first one); a folder "
                        "saved by `datasets` with title, text, embeddings, and a faiss file beside it named after it, "
                        "is transformers' custom KB format")
    parser.add_argument("--k", type=_count(LIMITS.max_k), default=None,
                        help=f"passages to retrieve (default {ASK.k}, or every passage of a smaller knowledge base; "
                             f"at most {LIMITS.max_k})")
    if one_retriever:
        parser.add_argument("--index", default=ASK.index, choices=INDEX_KINDS,
                            help=f"index variant (default {ASK.index}; bm25 retrieval is always exact and uses none)")
        parser.add_argument("--retriever", default=None, choices=RETRIEVERS,
                            help="dense: the paper's; bm25: word matching alone; hybrid: dense + BM25 logits "
                                 "(default: hybrid when a lexical weight is set, else dense)")
    parser.add_argument("--rag-checkpoint", default=None, help="facebook/rag-* id or a saved Rag* folder")
    parser.add_argument("--generator", default=None, help="generator hub id or folder (seq2seq or causal LM)")
    parser.add_argument("--question-encoder", default=None,
                        help="question encoder hub id or folder, or the NAME of one `train` saved")
    parser.add_argument("--untuned-questions", action="store_true",
                        help="the default encoder's packaged weights for questions, not the ones fine-tuned on nq-wiki")
    parser.add_argument("--untuned-generator", action="store_true",
                        help="the default generator as converted, without the reading adapter trained on the KBs' passages")
    parser.add_argument("--scale", type=_above_zero, default=None,
                        help="retrieval logit scale, above 0 (default: the encoder's)")
    parser.add_argument("--lexical-weight", type=float, default=None,
                        help=f"BM25's weight in the logits (default {DEFAULT_LEXICAL_WEIGHT} with the default encoder, 0 with others)")
    parser.add_argument("--kb-path", action="append", default=[], metavar="NAME=PATH",
                        help="use this KB folder under NAME (repeatable); skips building the default KBs")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="generator weights (default: the generator config's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _restatement_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-restatements", action="store_true",
                        help="keep answers that only restate the question (by default each is decoded again "
                             "without its first word, a few times at most)")


def _memory_options(parser: argparse.ArgumentParser) -> None:
    """--memory / --no-memory and --memory-logit: the generator's memory ∅ as a source beside the k passages."""
    switch = parser.add_mutually_exclusive_group()
    switch.add_argument("--memory", dest="memory", action="store_true", default=None,
                        help="the generator's memory as a source beside the k passages (default: where this setup "
                             "has a fitted logit); fails where it has none")
    switch.add_argument("--no-memory", dest="memory", action="store_false",
                        help="the paper's k passages alone")
    parser.add_argument("--memory-logit", type=float, default=None, metavar="THETA",
                        help="the memory's logit beside the passages' (scale · score): makes memory a source with "
                             "any setup")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rag_demo", description="Retrieval-Augmented Generation with provenance.")
    parser.add_argument("-v", "--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ask = commands.add_parser("ask", help="answer a question with RAG-Token and/or RAG-Sequence")
    ask.add_argument("question")
    ask.add_argument("--variant", default=ASK.variant, choices=(*VARIANTS, BOTH), help=f"default {ASK.variant}")
    _decoding_options(ask)
    ask.add_argument("--decoding", default=DECODING_DEFAULTS.sequence_decoding, choices=DECODINGS,
                     help=f"RAG-Sequence decoding (default {DECODING_DEFAULTS.sequence_decoding})")
    ask.add_argument("--no-closed-book", action="store_true", help="skip the generator-only answer")
    ask.add_argument("--extractive", action="store_true", help="answers copy a run of a retrieved passage (causal generators)")
    _model_options(ask)
    _restatement_option(ask)
    _memory_options(ask)

    score = commands.add_parser("score", help="log p(answer|question) under both variants")
    score.add_argument("question")
    score.add_argument("answer")
    score.add_argument("--variant", default=ASK.variant, choices=(*VARIANTS, BOTH), help=f"default {ASK.variant}")
    _model_options(score)
    _memory_options(score)

    compare = commands.add_parser("compare", help="the top k passages of each retriever (dense, bm25, hybrid) side by side")
    compare.add_argument("question")
    _model_options(compare, one_retriever=False)
    _memory_options(compare)

    build = commands.add_parser("build-kb", help="make a KB from .txt/.md files or a .jsonl/.csv with title,text")
    build.add_argument("source")
    build.add_argument("out")
    build.add_argument("--encoder", default=EncoderConfig().model, help="passage encoder id or folder")
    build.add_argument("--words", type=_count(), default=100, help="words per passage (default 100, as DPR)")
    build.add_argument("--vectors", default="arrow", choices=("arrow",) + VECTOR_DTYPES,
                       help="arrow: an embeddings column (transformers' layout, default); float16/float32: a "
                            "memory-mapped embeddings.npy beside the passages, for large KBs")

    bm25 = commands.add_parser("build-bm25", help="build a KB folder's BM25 index once and save it there; bm25 and "
                               "hybrid retrieval then open it from disk (for KBs of more than 100 million postings, "
                               "which an ask does not index itself)")
    bm25.add_argument("kb", help="a KB folder")
    bm25.add_argument("--max-postings", type=_count(), default=None,
                      help="refuse past this many postings (default: no limit; a build takes about 18 bytes a posting)")

    build_index = commands.add_parser("build-index", help="build a KB folder's approximate index once, with progress, "
                                      "where asks with --index look for it; an interrupted build resumes when run again")
    build_index.add_argument("kb", help="a KB folder")
    build_index.add_argument("--kind", required=True, choices=[kind for kind in INDEX_KINDS if kind != "flat"])

    prepare = commands.add_parser("prepare", help="fetch, convert, embed and index the offline default ahead of time, "
                                  "and check the example questions")
    prepare.add_argument("--json", action="store_true")

    evaluate = commands.add_parser("eval", help="exact match / F1 / recall on sampled questions: the KB's own "
                                   "held-out questions, or a question set (everyday on wikipedia)")
    evaluate.add_argument("--variant", default=VARIANTS[0], choices=(*VARIANTS, CLOSED_BOOK), help=f"default {VARIANTS[0]}")
    evaluate.add_argument("--n", type=_count(), default=100, help="questions asked, drawn with --seed (default 100)")
    evaluate.add_argument("--seed", type=int, default=0, help="the draw of questions (default 0)")
    _decoding_options(evaluate)
    evaluate.add_argument("--decoding", default=DECODING_DEFAULTS.sequence_decoding, choices=DECODINGS,
                          help=f"RAG-Sequence decoding (default {DECODING_DEFAULTS.sequence_decoding})")
    evaluate.add_argument("--extractive", action="store_true", help="answers copy a run of a retrieved passage")
    evaluate.add_argument("--table", action="store_true",
                          help="every variant and closed-book for each --ks, on every KB (or the --kb given); "
                               "prints a markdown table")
    evaluate.add_argument("--ks", type=_k_list, default=(1, 5, 10), help="comma-separated k values for --table "
                          "(default 1,5,10)")
    evaluate.add_argument("--gold-passage", action="store_true",
                          help="read each question's gold passage alone instead of retrieving (the reading ceiling)")
    evaluate.add_argument("--kb-sample", type=_count(), default=None, metavar="N",
                          help="ask over N passages of the KB drawn with --seed (and the questions they answer)")
    evaluate.add_argument("--questions", default=None, metavar="SET",
                          help="ask a question set instead of the KB's own questions: everyday (the evaluation set), "
                               "everyday-train, or a JSONL file of {\"question\": ..., \"answers\": [...]}; wikipedia and "
                               "its twin ask everyday by default")
    evaluate.add_argument("--answers", type=Path, default=None, metavar="FILE",
                          help="also write every answer to FILE, one JSON line each (question, gold answers, prediction, "
                               "exact match), to read which questions failed or to compare two builds "
                               "(python -m benchmarks.paired_answers)")
    _memory_options(evaluate)
    _model_options(evaluate)
    _restatement_option(evaluate)

    add_train_command(commands, count=_count)
    return parser


def engine_config(args) -> EngineConfig:
    config = EngineConfig(device=args.device, rag_checkpoint=args.rag_checkpoint)
    if args.generator:
        config = replace(config, generator=GeneratorConfig(model=args.generator))
    if args.dtype:
        config = replace(config, generator=replace(config.generator, dtype=args.dtype))
    if args.untuned_generator:
        config = replace(config, generator=replace(config.generator, tuned=False))
    trained = _trained_encoder(args.question_encoder)
    if trained is None and args.question_encoder:
        _check_encoder_name(args.question_encoder)
    if trained is not None:  # a question side trained by `train`: the default encoder's passage side, these questions
        config = replace(config, encoder=EncoderConfig(scale=args.scale, tuned=False, question_weights=str(trained)))
    elif args.question_encoder or args.scale is not None or args.untuned_questions:
        encoder = EncoderConfig(model=args.question_encoder or EncoderConfig().model, scale=args.scale,
                                tuned=not args.untuned_questions)
        config = replace(config, encoder=encoder)
    if args.lexical_weight is not None:
        if not args.lexical_weight >= 0:
            raise UsageError("--lexical-weight must be 0 or more")
        config = replace(config, retrieval=replace(config.retrieval, lexical_weight=args.lexical_weight))
    memory_logit = getattr(args, "memory_logit", None)
    if memory_logit is not None:
        if not math.isfinite(memory_logit):
            raise UsageError("--memory-logit must be a finite number")
        if getattr(args, "memory", None) is False:
            raise UsageError("--memory-logit makes memory a source and --no-memory turns it off; give one of them")
        config = replace(config, memory=MemoryConfig(logit=memory_logit))
    if getattr(args, "max_new_tokens", None) or getattr(args, "num_beams", None):
        config = replace(config, decoding=DecodingConfig(
            max_new_tokens=getattr(args, "max_new_tokens", DECODING_DEFAULTS.max_new_tokens),
            num_beams=getattr(args, "num_beams", DECODING_DEFAULTS.num_beams),
            sequence_decoding=getattr(args, "decoding", DECODING_DEFAULTS.sequence_decoding)))
    if getattr(args, "keep_restatements", False):
        config = replace(config, decoding=replace(config.decoding, set_aside_restatements=False))
    return config


def _trained_encoder(name: str | None) -> Path | None:
    """The folder of a question encoder `train` saved under `name` (a plain name, not a path); None for others."""
    if not name or _names_a_folder(name):
        return None
    from .serving.retriever_training import trained_encoder_path

    return trained_encoder_path(name)


def _check_encoder_name(name: str) -> None:
    """Refuse a plain name (not the offline default's, no owner/ of a Hugging Face id, no folder) that no
    `train --save` saved, before any download is tried: a mistyped name otherwise spent half a minute on the Hub's
    retries."""
    if name == EncoderConfig().model or looks_like_path(name) or _names_a_folder(name):  # an owner/name id too
        return
    from .serving.retriever_training import trained_encoder_names

    saved = trained_encoder_names()
    raise UsageError(f"no question encoder {name!r}: no `train --save` saved one of that name "
                     f"({'saved: ' + ', '.join(saved) if saved else 'none is saved'}), and it is no folder; "
                     "a Hugging Face id has the form owner/name")


def _names_a_folder(text: str) -> bool:
    try:
        return Path(text).expanduser().is_dir()
    except (OSError, ValueError):  # a NUL byte, a name too long
        return False


def _kb_paths(args) -> dict[str, str] | None:
    """The KBs to load: those of --kb-path; a --kb folder alone (so that nothing of the offline
    default is built for a command that reads only that folder); None: the default KBs."""
    if not args.kb_path:
        kb = getattr(args, "kb", None)
        if kb and _names_a_folder(kb):
            return {kb: kb}
        return None
    try:
        return named_paths(args.kb_path)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _progress():
    from .progress import ConsoleProgress

    return ConsoleProgress()


def make_engine(args):
    from .serving.loading import engine_from_config

    return engine_from_config(engine_config(args), kb_paths=_kb_paths(args), progress=_progress())


def _check_cheap_options(args) -> None:
    """Refuse what needs no model before spending seconds on loading one (argparse has checked the numbers)."""
    for text, what in ((getattr(args, "question", "x"), "question"), (getattr(args, "answer", "x"), "answer")):
        check_length(require_words(text, what=what), what=what)
    kb = getattr(args, "kb", None)
    # the offline default's bases are known by name before any model loads; a folder, --kb-path's names and a RAG
    # checkpoint's index are known only once loaded
    if (kb and kb not in DEFAULT_KBS and not getattr(args, "kb_path", None) and not getattr(args, "rag_checkpoint", None)
            and not looks_like_path(kb) and not _names_a_folder(kb)):
        raise UsageError(f"unknown knowledge base {kb!r}; choose one of {', '.join(DEFAULT_KBS)} (the last two where "
                         "their source could be had), give a KB folder, or name one with --kb-path NAME=DIR")


def _k(args, engine) -> int:
    """--k, or by default ASK.k lowered to the size of a knowledge base smaller than that (a folder of a few passages)."""
    if args.k is not None:
        return args.k
    return min(ASK.k, len(engine.resolve_kb(args.kb)))


def cmd_ask(args) -> int:
    _check_cheap_options(args)
    engine = make_engine(args)
    result = engine.ask(args.question, kb=args.kb, k=_k(args, engine), index=args.index, variants=args.variant,
                        num_beams=args.num_beams, max_new_tokens=args.max_new_tokens,
                        sequence_decoding=args.decoding, closed_book=not args.no_closed_book, retriever=args.retriever,
                        extractive=args.extractive, memory=args.memory)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        print_summary(result)
    return 0


def cmd_score(args) -> int:
    _check_cheap_options(args)
    engine = make_engine(args)
    result = engine.score(args.question, args.answer, kb=args.kb, k=_k(args, engine), index=args.index, variants=args.variant,
                          retriever=args.retriever, memory=args.memory)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        print_summary(result)
    return 0


def cmd_compare(args) -> int:
    _check_cheap_options(args)
    engine = make_engine(args)
    comparison = engine.compare_retrievers(args.question, kb=args.kb, k=_k(args, engine))
    # the retrievers are compared over their k passages, as the web API does; memory's share is told beside them
    memory_logits = ({r.retriever: engine.memory_logit(r.retriever, kb=comparison.kb) for r in comparison.rankings}
                     if args.memory is not False else {})
    some = any(logit is not None for logit in memory_logits.values())
    if args.memory and not some:
        raise UsageError("this setup has no fitted logit for the generator's memory; give one (--memory-logit) "
                         "or compare without --memory")
    if args.json:
        print(json.dumps(comparison.to_json(lambda retriever, kb: memory_logits.get(retriever)), ensure_ascii=False))
    else:
        print_comparison(comparison, memory_logits=memory_logits if some else None)
    return 0


def cmd_build_kb(args) -> int:
    from .retrieval.corpus import make_kb, read_source, save_kb
    from .retrieval.encoders import load_encoder

    passages = read_source(args.source, words_per_passage=args.words)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder; choose another output path")
    encoder = load_encoder(EncoderConfig(model=args.encoder))
    progress = _progress()
    vectors = encoder.encode_passages(passages, progress=lambda done, total: progress("embedding passages", done, total))
    try:
        save_kb(make_kb(out.name, passages, vectors, encoder=args.encoder), out, vectors=args.vectors)
    except OSError as err:
        raise UsageError(f"could not write {out}: {err.strerror}; choose a writable folder") from None
    print(f"wrote {len(passages)} passages ({encoder.dim}-dim embeddings from {args.encoder}) to {out}")
    return 0


def cmd_build_bm25(args) -> int:
    import numpy as np

    from .retrieval.corpus import load_kb
    from .retrieval.lexical import LexicalIndex, lexical_path

    kb = load_kb(args.kb)
    progress = _progress()
    index = LexicalIndex.for_kb_folder(kb.path, kb.titles, kb.texts, fingerprint=kb.fingerprint, max_postings=args.max_postings,
                                       progress=lambda done, total: progress("indexing passages for BM25", done, total))
    if not isinstance(index.docs, np.memmap):  # for_kb_folder answers from memory when it cannot save
        raise UsageError(f"could not write {lexical_path(kb.path)} (see the warning above); make the KB folder writable")
    print(f"BM25 of {index.size:,} passages ({len(index.vocabulary):,} terms, {len(index.docs):,} postings) "
          f"is in {lexical_path(kb.path)}")
    return 0


def cmd_build_index(args) -> int:
    from .retrieval.corpus import load_kb
    from .retrieval.index import cached_index, index_cache_paths, prebuilt_kind

    kb = load_kb(args.kb)
    if kb.index_file is not None and prebuilt_kind(kb.index_file) == args.kind:
        print(f"{kb.path} serves the {args.kind} index that came with it, {kb.index_file}; nothing to build")
        return 0
    config = EngineConfig().index  # the parameters asks use, so that they find this file
    folder = kb.path / "indexes"
    path, _ = index_cache_paths(args.kind, kb.fingerprint, folder, config)
    progress, built = _progress(), []

    def rows(done: int, total: int) -> None:
        built.append(done)
        progress(f"building the {args.kind} index", done, total)

    try:
        index = cached_index(args.kind, kb.embeddings, kb.fingerprint, folder, config, prebuilt=kb.index_file, progress=rows)
    except KeyboardInterrupt:
        print(f"rag_demo: run the same command again to go on from the last checkpoint in {folder}", file=sys.stderr)
        raise
    if not path.is_file():  # cached_index answers from memory when it cannot save
        raise UsageError(f"could not write {path} (see the warning above); make the KB folder writable")
    print(f"{args.kind} index of {len(kb):,} passages ({index.nbytes:,} bytes) "
          f"{'is' if built else 'was already'} in {path}")
    return 0


def cmd_prepare(args) -> int:
    from .offline.prepare import prepare

    prepared = prepare(progress=_progress(), retry_unavailable=True)
    from .serving.featured import feature_checked_examples
    from .serving.loading import engine_from_config

    # the page's first start would ask each example question once to order them; do it at build time
    feature_checked_examples(engine_from_config(progress=_progress()), progress=_progress())
    if args.json:
        print(json.dumps({"generator": str(prepared.generator_path),
                          "reader_adapter": str(prepared.reader_adapter_path) if prepared.reader_adapter_path else None,
                          "encoder": str(prepared.encoder_path),
                          "question_encoder": str(prepared.question_encoder_path or prepared.encoder_path),
                          "kbs": {k: str(v) for k, v in prepared.kb_paths.items()},
                          "unavailable": dict(prepared.unavailable)}))
    else:
        print(f"generator: {prepared.generator_path}\nencoder: {prepared.encoder_path}")
        if prepared.reader_adapter_path is not None:
            print(f"reading adapter (fine-tuned; off for closed-book): {prepared.reader_adapter_path}")
        if prepared.question_encoder_path is not None:
            print(f"question encoder (fine-tuned): {prepared.question_encoder_path}")
        for name, path in prepared.kb_paths.items():
            print(f"kb {name}: {path}")
        for name, reason in prepared.unavailable.items():
            print(f"kb {name}: left out: {reason}")
    return 0


def _k_list(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not ks or min(ks) < 1 or max(ks) > LIMITS.max_k:
        raise argparse.ArgumentTypeError(f"every k must be between 1 and {LIMITS.max_k}")
    return ks


@contextlib.contextmanager
def _answers_file(path: Path | None):
    """Yields None, or a callable that writes one answer record to `path` as a JSON line. Opened
    before any model loads, so a path that cannot be written fails in a moment."""
    if path is None:
        yield None
        return
    try:
        file = path.open("w", encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write --answers {path}: {err.strerror or err}") from None

    def write(record: dict) -> None:
        file.write(json.dumps(record, ensure_ascii=False) + "\n")
        file.flush()  # an interrupted run keeps what it answered
    with file:
        yield write


def cmd_eval(args) -> int:
    _check_cheap_options(args)
    with _answers_file(args.answers) as answers:
        return _run_eval(args, answers)


def _run_eval(args, answers) -> int:
    from .evaluate import evaluate, evaluate_table, print_report, print_table

    from .questions import set_eval_questions

    question_set = set_eval_questions(args.questions) if args.questions else None
    engine = make_engine(args)
    if args.table:
        kbs = (args.kb,) if args.kb else engine.kb_names
        reports = evaluate_table(engine, kbs=kbs, ks=args.ks, n=args.n, seed=args.seed, index=args.index,
                                 num_beams=args.num_beams, max_new_tokens=args.max_new_tokens, sequence_decoding=args.decoding,
                                 kb_sample=args.kb_sample, retriever=args.retriever, extractive=args.extractive,
                                 gold_passage=args.gold_passage, answers=answers, memory=args.memory,
                                 questions={kb: question_set for kb in kbs} if question_set else None,
                                 progress=_progress())
        if args.json:
            print(json.dumps(reports))
        else:
            print_table(reports)
        return 0
    report = evaluate(engine, kb=args.kb or engine.default_kb, variant=args.variant, n=args.n, seed=args.seed,
                      k=args.k or ASK.k, index=args.index, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens,
                      sequence_decoding=args.decoding, kb_sample=args.kb_sample, retriever=args.retriever,
                      extractive=args.extractive, gold_passage=args.gold_passage, answers=answers, memory=args.memory,
                      questions=question_set, progress=_progress())
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


def cmd_train(args) -> int:
    from .serving.train_command import run_train

    return run_train(args, kb_paths=_kb_paths(args), progress=_progress())


COMMANDS = {"ask": cmd_ask, "score": cmd_score, "compare": cmd_compare, "build-kb": cmd_build_kb, "build-bm25": cmd_build_bm25,
            "build-index": cmd_build_index, "prepare": cmd_prepare, "eval": cmd_eval, "train": cmd_train}


def main(argv: list[str] | None = None) -> int:
    # Library download / loading bars would bury the one line a user needs; ours stay.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return COMMANDS[args.command](args)
    except RagDemoError as err:
        print(f"rag_demo: {one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rag_demo: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, not bad input: one line for the user, the traceback with -v
        log.info("unexpected error", exc_info=True)
        print(f"rag_demo: unexpected error ({type(err).__name__}: {one_line(str(err))[:200]}); rerun with -v for details "
              "and report it", file=sys.stderr)
        return 1
