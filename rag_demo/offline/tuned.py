"""The offline default's fine-tuned parts, built once from the default KBs' training questions: the
encoder's question side (`tuning.tune_question_encoder`) and the generator's reading adapter
(`tuning.tune_reader`). Held-out questions are measured before and after: the encoder's recall in
its folder's marker, the reader's answer loss in its folder's check.json, measured once the adapter
serves (`check_tuned_generator`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import (
    DEFAULT_ENCODER,
    DEFAULT_GENERATOR,
    DEFAULT_LEXICAL_WEIGHT,
    EncoderConfig,
    GeneratorConfig,
    ReaderTuningConfig,
    TuningConfig,
)
from ..retrieval.corpus import KnowledgeBase, Passage, load_kb
from ..errors import InputError
from ..progress import Progress, counted
from ..questions import SPLIT_VERSION, KBQuestion, contains_answer, load_questions, split_questions
from .cache import is_complete, marker_problem, publish, report, resolve_root, staged, timed, writing
from .gguf import generator_key
from .kbs import kb_key

if TYPE_CHECKING:
    from ..retrieval.encoders import Encoder

log = logging.getLogger(__name__)

TUNED_ENCODER_NAME = "minilm-questions"
TUNING_FORMAT = 2  # bump when `rag_demo.training.question_encoder` changes what it trains; 2: `retrieval_question`
TUNING_CHECK_QUESTIONS = 1000  # held-out questions the build measures recall on, before and after
TUNED_GENERATOR_NAME = "gemma3-270m-reader-adapter"
READER_FORMAT = 3  # bump when `rag_demo.training.reader` changes how the generator is trained; 3: float32 again after autocast
READER_QUESTIONS_VARIABLE = "RAG_DEMO_READER_QUESTIONS"  # training questions of the build's reader, if not the default
READER_QUESTIONS_MAX = 10_000  # the training split holds about 11,000 nq-wiki questions, some without a clear answer
READER_CHECK_QUESTIONS = 100  # held-out questions (half of them counterfactual) whose answer loss the build records
READER_CHECK_FILE = "check.json"  # in the adapter's folder, beside its marker: the check comes after it serves


def _tuned_model_folder(name: str, key: str, cache: str | Path | None) -> Path:
    """models/<name>-<first 12 hex of the key's sha256> under the cache root."""
    return resolve_root(cache) / "models" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def wants_tuned_encoder(encoder_config: EncoderConfig) -> bool:
    """Whether the config asks for the fine-tuned question side: only the default encoder has one."""
    return encoder_config.model == DEFAULT_ENCODER and encoder_config.tuned


def wants_reading_adapter(generator_config: GeneratorConfig) -> bool:
    """Whether the config asks for the reading adapter: only the default generator has one."""
    return generator_config.model == DEFAULT_GENERATOR and generator_config.tuned


def tuned_encoder_key(encoder_config: EncoderConfig, tuning: TuningConfig = TuningConfig()) -> str:
    """What the tuned question encoder is made from: nq-wiki (with its encoder), the recipe, the retrieval logits."""
    return (f"{kb_key(encoder_config.model, encoder_config.input_tokens)}:tuning{TUNING_FORMAT}:{tuning}"
            f":scale={encoder_config.scale}:lexical={DEFAULT_LEXICAL_WEIGHT}:split={SPLIT_VERSION}")


def tuned_encoder_path(encoder_config: EncoderConfig, tuning: TuningConfig = TuningConfig(), *,
                       cache: str | Path | None = None) -> Path:
    """Where the tuned question encoder for this encoder lives (built or not); computing this loads nothing."""
    return _tuned_model_folder(TUNED_ENCODER_NAME, tuned_encoder_key(encoder_config, tuning), cache)


def cached_tuned_encoder(encoder_config: EncoderConfig, *, cache: str | Path | None = None) -> Path | None:
    """The fine-tuned question side this config asks for, when it is cached; None otherwise (or when
    the config asks for none: another encoder, or `tuned=False`). Reads a marker, loads nothing."""
    if not wants_tuned_encoder(encoder_config):
        return None
    path = tuned_encoder_path(encoder_config, cache=cache)
    return path if marker_problem(path, tuned_encoder_key(encoder_config)) is None else None


def training_split(questions: list[KBQuestion]) -> tuple[list[KBQuestion], list[KBQuestion]]:
    """(training, held out) of `questions.split_questions`: near-duplicates and the page's examples never train."""
    split = split_questions(questions)
    return list(split.training), list(split.held_out)


def ensure_tuned_encoder(encoder: Encoder, encoder_config: EncoderConfig, wiki_path: Path, *,
                         tuning: TuningConfig = TuningConfig(), cache: str | Path | None = None,
                         progress: Progress | None = None) -> Path:
    """Fine-tune (once) the question side of `encoder` on a seeded share of nq-wiki's training questions
    (`TuningConfig.question_share`); the folder of the weights.

    On 2 AMD EPYC Zen 3 cores (float32) one epoch over all 11,289 took 154 s, over half of them 65 s.
    """
    import torch

    from ..training import question_encoder as tuner
    from ..retrieval.lexical import LexicalIndex
    from ..precision import build_precision

    folder = tuned_encoder_path(encoder_config, tuning, cache=cache)
    key = tuned_encoder_key(encoder_config, tuning)
    if is_complete(folder, key):
        return folder
    kb = load_kb(wiki_path)
    training, held = training_split(load_questions(wiki_path))
    training = tuner.drawn_share([tuner.TrainingQuestion(q.question, q.gold_id) for q in training], tuning.question_share,
                                 seed=tuning.seed)
    check = [tuner.TrainingQuestion(q.question, q.gold_id) for q in held]
    check = [check[i] for i in sorted(random.Random(0).sample(range(len(check)), min(TUNING_CHECK_QUESTIONS, len(check))))]
    lexical = LexicalIndex.for_passages(kb.titles, kb.texts)
    passages = torch.from_numpy(kb.embeddings)  # (N, D)
    before = tuner.recall_at(encoder.question_model, encoder, passages, lexical, check, lexical_weight=DEFAULT_LEXICAL_WEIGHT)
    stage = f"fine-tuning the question encoder on {counted(len(training), 'question')}"
    report(progress, stage, 0, 1)
    with timed(stage):
        model = tuner.tune_question_encoder(encoder, kb.embeddings, lexical, training, lexical_weight=DEFAULT_LEXICAL_WEIGHT,
                                            config=tuning, progress=lambda done, total: report(progress, stage, done, total),
                                            autocast=True)
    after = tuner.recall_at(model, encoder, passages, lexical, check, lexical_weight=DEFAULT_LEXICAL_WEIGHT)
    log.info("gold passage in the top 1 / 5 / 20 for %d held-out questions: %s before, %s after fine-tuning", len(check),
             " / ".join(f"{100 * before[k]:.1f}%" for k in (1, 5, 20)), " / ".join(f"{100 * after[k]:.1f}%" for k in (1, 5, 20)))
    with staged(folder) as staging, writing(staging):
        model.save_pretrained(staging)
        publish(staging, folder, key, {
            "training_questions": len(training), "checked_questions": len(check),
            "recall_before": {str(k): v for k, v in before.items()}, "recall_after": {str(k): v for k, v in after.items()},
            "precision": build_precision(encoder.device),
        })
    return folder


def _prompt_digest() -> str:
    """The prompt the generator is trained on: a change to `prompts` trains it again."""
    from ..generation import prompts

    parts = (prompts.few_shot_prefix(), prompts.rag_prompt("{question}", "{title}", "{text}"), prompts.ANSWER_STOP)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def build_reader_tuning(environ: Mapping[str, str] | None = None) -> ReaderTuningConfig:
    """The recipe the offline build trains its reader with: the default, or with RAG_DEMO_READER_QUESTIONS
    training questions. Twice the default's 600 read better (docs/quality-notes.md) and take twice the
    reader's training, so a host that builds its cache once may ask for them. One variable, read by
    every entry point (app, commands, `prepare`), so all of them look for the same adapter.

    >>> build_reader_tuning({}).examples, build_reader_tuning({"RAG_DEMO_READER_QUESTIONS": "1200"}).examples
    (600, 1200)
    """
    environ = os.environ if environ is None else environ
    text = environ.get(READER_QUESTIONS_VARIABLE, "").strip()
    if not text:
        return ReaderTuningConfig()
    if not text.isdigit() or not 1 <= int(text) <= READER_QUESTIONS_MAX:
        raise InputError(f"{READER_QUESTIONS_VARIABLE} is the number of questions the reader trains on, a whole number "
                         f"from 1 to {READER_QUESTIONS_MAX:,} (the default is {ReaderTuningConfig().examples}); not {text!r}")
    return replace(ReaderTuningConfig(), examples=int(text))


def _recipe_text(tuning: ReaderTuningConfig) -> str:
    """The recipe as the key names it. A field at the value it implicitly had before it existed
    (no distractors, every block adapted, gold passages alone) is left out, so adapters built then
    keep their key; with distractors the marker they learned is named too."""
    from ..generation.prompts import NO_ANSWER

    text = repr(tuning).replace(", adapted_share=1.0", "").replace(", marginal_passages=0", "")
    if not tuning.distractors:
        return text.replace(", distractors=0", "")
    return f"{text}:no_answer={NO_ANSWER}"


def tuned_generator_key(generator_config: GeneratorConfig = GeneratorConfig(), tuning: ReaderTuningConfig | None = None,
                        encoder_config: EncoderConfig = EncoderConfig()) -> str:
    """What the fine-tuned generator is made from: the converted generator, the default KBs as
    `encoder_config` builds them, the recipe (None: the build's, `build_reader_tuning`) and the
    prompt. The KBs' encoder counts though the reader never sees a vector: its retrieval picks the
    page's example questions, which are left out of training, so another encoder (or passage cut)
    trains on other questions."""
    tuning = tuning or build_reader_tuning()
    return (f"{generator_key()[1]}:{kb_key(encoder_config.model, encoder_config.input_tokens)}:reader{READER_FORMAT}"
            f":{_recipe_text(tuning)}:prompt={_prompt_digest()}:max_prompt_tokens={generator_config.max_prompt_tokens}"
            f":split={SPLIT_VERSION}")


def tuned_generator_path(generator_config: GeneratorConfig = GeneratorConfig(), tuning: ReaderTuningConfig | None = None,
                         encoder_config: EncoderConfig = EncoderConfig(), *, cache: str | Path | None = None) -> Path:
    """Where the fine-tuned generator lives (built or not); computing this loads nothing."""
    return _tuned_model_folder(TUNED_GENERATOR_NAME, tuned_generator_key(generator_config, tuning, encoder_config), cache)


def cached_tuned_generator(generator_config: GeneratorConfig = GeneratorConfig(), *,
                           encoder_config: EncoderConfig = EncoderConfig(), cache: str | Path | None = None) -> Path | None:
    """The fine-tuned default generator when it is cached; None otherwise (or when the config asks
    for none: another generator, or `tuned=False`). Reads a marker, loads nothing."""
    if not wants_reading_adapter(generator_config):
        return None
    path = tuned_generator_path(generator_config, encoder_config=encoder_config, cache=cache)
    return path if marker_problem(path, tuned_generator_key(generator_config, encoder_config=encoder_config)) is None else None


def reading_questions(kb_paths: Mapping[str, Path], tuning: ReaderTuningConfig = ReaderTuningConfig()
                      ) -> tuple[list[tuple[str, KBQuestion]], list[tuple[str, KBQuestion]]]:
    """(training, check): (KB name, question) pairs to read with their gold passage.

    Training questions come from the training split, `tuning.examples` of them in a seeded order,
    each read from nq-counterfactual with probability `tuning.counterfactual_share`, else from
    nq-wiki. The check is as many held-out questions, half from each KB. Questions whose passage
    gives no clear answer are skipped.
    """
    wiki = load_questions(kb_paths["nq-wiki"])
    counterfactual = {(q.question, q.gold_id): q for q in load_questions(kb_paths["nq-counterfactual"])}
    training, held = training_split(wiki)
    rng = random.Random(tuning.seed)
    chosen = []
    for question in rng.sample(training, len(training)):
        if len(chosen) == tuning.examples:
            break
        swapped = counterfactual.get((question.question, question.gold_id))
        if swapped is not None and swapped.passage_answer and rng.random() < tuning.counterfactual_share:
            chosen.append(("nq-counterfactual", swapped))
        elif question.passage_answer:
            chosen.append(("nq-wiki", question))
    check_rng = random.Random(tuning.seed + 1)
    check = []
    for number, question in enumerate(check_rng.sample(held, min(READER_CHECK_QUESTIONS, len(held)))):
        swapped = counterfactual.get((question.question, question.gold_id))
        pick = ("nq-counterfactual", swapped) if number % 2 and swapped is not None else ("nq-wiki", question)
        if pick[1].passage_answer:
            check.append(pick)
    return chosen, check


DISTRACTOR_CANDIDATES = 3  # a question's distractor is drawn from its best BM25 matches that do not hold its answer


def distractor_rows(kb_paths: Mapping[str, Path], kbs: Mapping[str, KnowledgeBase],
                    questions: list[tuple[str, KBQuestion]], count: int, *, seed: int) -> list[tuple[str, KBQuestion, int]]:
    """(KB name, question, row) for the first `count` of `questions`: a passage of the same KB that
    ranks high for the question by BM25 but holds neither its gold passage's answer nor the
    real-world one, so it looks like an answer and is not. These are what a reader meets among
    the top k; a question without such a passage among its best 50 matches gets none."""
    from ..retrieval.lexical import LexicalIndex, lexical_path

    lexical = {name: LexicalIndex.load(lexical_path(path)) for name, path in kb_paths.items()}
    rng = random.Random(seed)
    rows = []
    for name, question in questions[:count]:
        kb = kbs[name]
        picks = []
        for row in lexical[name].top(question.question, 50).tolist():
            text = f"{kb.titles[row]} {kb.texts[row]}"
            if row == question.gold_id or any(contains_answer(text, answer)
                                              for answer in (question.passage_answer, question.answer)):
                continue
            picks.append(row)
            if len(picks) == DISTRACTOR_CANDIDATES:
                break
        if picks:
            rows.append((name, question, rng.choice(picks)))
    return rows


def _reading_examples(generator, kbs: Mapping[str, KnowledgeBase], questions: list[tuple[str, KBQuestion]],
                      distractors: list[tuple[str, KBQuestion, int]] = ()):
    """Each question read with its gold passage, the target its answer; each distractor read with
    its passage, the target `prompts.NO_ANSWER`."""
    from ..generation.prompts import NO_ANSWER

    reads = [(name, question, question.gold_id, question.passage_answer) for name, question in questions]
    reads += [(name, question, row, NO_ANSWER) for name, question, row in distractors]
    return [reading_example(generator, kbs[name], question.question, row, target) for name, question, row, target in reads]


def reading_example(generator, kb: KnowledgeBase, question: str, row: int, target: str):
    """`question` read with passage `row` of `kb` in the generator's prompt, `target` the answer to learn."""
    from ..training.reader import ReadingExample

    prompt = generator.format_input(question, Passage(kb.titles[row], kb.texts[row]))
    return ReadingExample(tuple(generator.tokenizer(prompt)["input_ids"]), generator.answer_target(target).ids)


# (KB name, question, k, rows or None) -> (rows, log p(z|x) of each): the engine's top k, or with
# rows given, its p(z|x) over just those rows
Retrieve = Callable[[str, str, int, Sequence[int] | None], tuple[Sequence[int], Sequence[float]]]


def marginal_examples(generator, kbs: Mapping[str, KnowledgeBase], questions: list[tuple[str, KBQuestion]],
                      retrieve: Retrieve, k: int):
    """Each question read with each of its top k passages (`tuning.MarginalExample`), the target the
    answer its gold passage gives. When retrieval misses the gold passage it takes the last place
    and p(z|x) is taken over those k rows: otherwise the target could stand in no passage read, and
    the loss would teach answering from memory, against the swapped world."""
    from ..training.reader import MarginalExample

    examples, missed = [], 0
    for name, question in questions:
        rows, doc_logprobs = retrieve(name, question.question, k, None)
        rows = [int(row) for row in rows]
        if question.gold_id not in rows:
            missed += 1
            rows, doc_logprobs = retrieve(name, question.question, k, rows[:k - 1] + [question.gold_id])
        reads = tuple(reading_example(generator, kbs[name], question.question, row, question.passage_answer) for row in rows)
        examples.append(MarginalExample(reads, tuple(float(lp) for lp in doc_logprobs)))
    log.info("marginal training: %d of %d questions had their gold passage put in the last of their %d places", missed, len(questions), k)
    return examples


def ensure_tuned_generator(generator_path: Path, kb_paths: Mapping[str, Path], *,
                           generator_config: GeneratorConfig = GeneratorConfig(),
                           encoder_config: EncoderConfig = EncoderConfig(),
                           tuning: ReaderTuningConfig | None = None, cache: str | Path | None = None,
                           progress: Progress | None = None) -> Path:
    """Train (once) the default generator's reading adapter on gold passages (`tuning.tune_reader`);
    the adapter's folder. The base weights are not changed, so they still answer closed-book.

    A CUDA GPU is used when present.
    """
    import torch

    from ..generation.adapters import save_adapters
    from ..generation.generator import load_generator

    tuning = tuning or build_reader_tuning()
    if tuning.method != "lora":
        raise ValueError("the cached reader is an adapter; train a full fine-tune with `train_reader` instead")
    folder = tuned_generator_path(generator_config, tuning, encoder_config, cache=cache)
    key = tuned_generator_key(generator_config, tuning, encoder_config)
    if is_complete(folder, key):
        return folder
    device = torch.device("cuda") if torch.cuda.is_available() else None
    generator = load_generator(replace(generator_config, tuned=False, dtype="float32"), path=str(generator_path), device=device)
    # the held-out check waits until the adapter serves (`check_tuned_generator`): 40 s of a first start
    info = train_reader(generator, kb_paths, tuning=tuning, progress=progress, check_after=False)
    with staged(folder) as staging, writing(staging):
        save_adapters(generator.model, staging, no_answer=generator.reads_no_answer)
        publish(staging, folder, key, info)
    return folder


def check_tuned_generator(generator_path: Path, adapter_path: Path, kb_paths: Mapping[str, Path], *,
                          generator_config: GeneratorConfig = GeneratorConfig(),
                          tuning: ReaderTuningConfig | None = None, progress: Progress | None = None) -> dict:
    """Measure the saved reading adapter as the engine loads it: the answer loss of held-out gold
    passages (`reader_check_loss`), written to `READER_CHECK_FILE` in its folder and returned.

    A record, not a gate: the build runs it after the adapter has begun to serve, so a first start
    reaches full quality without waiting for it. The folder's marker does not list the file, so the
    adapter stays complete whether or not the check has run.
    """
    import torch

    from ..generation.generator import load_generator

    tuning = tuning or build_reader_tuning()
    device = torch.device("cuda") if torch.cuda.is_available() else None
    generator = load_generator(replace(generator_config, tuned=True, dtype="float32"), path=str(generator_path),
                               device=device, adapter=adapter_path)
    stage = "checking the reading adapter on held-out gold passages"
    with timed(stage):
        checked, loss = reader_check_loss(generator, kb_paths, tuning,
                                          progress=lambda done, total: report(progress, stage, done, total))
    log.info("answer loss on %d held-out gold passages after fine-tuning: %.3f", checked, loss)
    record = {"checked_questions": checked, "answer_loss_after": loss if checked else None}
    staging = adapter_path / (READER_CHECK_FILE + ".tmp")
    with writing(adapter_path):
        staging.write_text(json.dumps(record), encoding="utf-8")
        os.replace(staging, adapter_path / READER_CHECK_FILE)
    return record


def reader_check_record(adapter_path: Path) -> dict | None:
    """What the build measured of the adapter in `adapter_path`: its `READER_CHECK_FILE`, or for a
    folder built when the check came before publishing, the same fields from its marker; None when
    it was never checked."""
    from .cache import MARKER

    for path, inside in ((adapter_path / READER_CHECK_FILE, False), (adapter_path / MARKER, True)):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        record = record.get("info", {}) if inside else record
        if isinstance(record, dict) and record.get("answer_loss_after") is not None:
            return {"checked_questions": record.get("checked_questions"), "answer_loss_after": record["answer_loss_after"]}
    return None


def reader_check_loss(generator, kb_paths: Mapping[str, Path], tuning: ReaderTuningConfig, *, autocast: bool = False,
                      progress: Callable[[int, int], None] | None = None) -> tuple[int, float]:
    """(questions, mean answer loss in nats per token) of `generator` as it is, reading the held-out
    check questions of `reading_questions` with their gold passages."""
    from ..precision import build_autocast
    from ..training.reader import mean_answer_loss, shared_prefix

    kbs = {name: load_kb(path, name=name) for name, path in kb_paths.items()}
    _, check = reading_questions(kb_paths, tuning)
    examples = _reading_examples(generator, kbs, check)
    if not examples:
        return 0, float("nan")
    with build_autocast(generator.model.device, enabled=autocast):
        return len(examples), mean_answer_loss(generator.model, shared_prefix(examples), examples, progress=progress)


def train_reader(generator, kb_paths: Mapping[str, Path], *, tuning: ReaderTuningConfig = ReaderTuningConfig(),
                 progress: Progress | None = None, autocast: bool = False, check_before: bool = False,
                 check_after: bool = True, retrieve: Retrieve | None = None) -> dict:
    """Fine-tune `generator` in place as a reader of gold passages (`reading_questions`,
    `tuning.tune_reader`); what it trained on and the answer loss of held-out gold passages after
    training (and before, with `check_before`), in nats per token. The build skips the check before:
    it measures the unchanged converted generator, the same figure every time (0.861, results.md),
    and took half a minute of every first start. `autocast`: train and check in bfloat16 where that is
    native (`rag_demo.precision`); the record says which precision ran. The default build trains
    in float32: an adapter trained under autocast followed 67.0% of 300 held-out swapped gold
    passages against 70.0% in float32, and saved only 80 of 470 s (`benchmarks.reader_methods`).
    `check_after=False` leaves the check after training to the caller (the build's
    `check_tuned_generator`). `tuning.marginal_passages` needs `retrieve`, the engine's retrieval
    (`Retrieve`)."""
    from ..precision import build_precision
    from ..training.reader import reads_of, shared_prefix, tune_reader

    if tuning.marginal_passages and (retrieve is None or tuning.distractors or tuning.marginal_passages < 2):
        raise ValueError("marginal training needs the engine's retrieval, at least 2 passages and no distractors")
    kbs = {name: load_kb(path, name=name) for name, path in kb_paths.items()}
    training, _ = reading_questions(kb_paths, tuning)
    distractors = distractor_rows(kb_paths, kbs, training, tuning.distractors, seed=tuning.seed) if tuning.distractors else []
    if tuning.marginal_passages:
        examples = marginal_examples(generator, kbs, training, retrieve, tuning.marginal_passages)
    else:
        examples = _reading_examples(generator, kbs, training, distractors)
    shared = shared_prefix(reads_of(examples))
    device = generator.model.device
    before = after = None
    checked = 0
    if check_before:
        checked, before = reader_check_loss(generator, kb_paths, tuning, autocast=autocast)
    stage = f"fine-tuning the generator on {counted(len(training), 'question')}" + (
        f" and {counted(len(distractors), 'distractor passage')}" if distractors else "") + (
        f", each read with its top {tuning.marginal_passages} passages" if tuning.marginal_passages else "")
    report(progress, stage, 0, 1)
    with timed(stage):
        tune_reader(generator.model, shared, examples, config=tuning, autocast=autocast,
                    progress=lambda done, total: report(progress, stage, done, total))
    generator.reads_no_answer = bool(distractors)
    if check_after:
        checked, after = reader_check_loss(generator, kb_paths, tuning, autocast=autocast)
        log.info("answer loss on %d held-out gold passages after fine-tuning: %.3f%s", checked, after,
                 "" if before is None else f" ({before:.3f} before)")
    return {
        "training_questions": len(training), "distractors": len(distractors), "counterfactual": sum(name == "nq-counterfactual" for name, _ in training),
        "checked_questions": checked,
        "answer_loss_before": before if checked else None, "answer_loss_after": after if checked else None,
        "precision": build_precision(device, enabled=autocast),
    }
