"""Fine-tuning the generator as a reader of passages: a low-rank adapter trained on prompts that
hold a passage and a question, the target the answer that passage gives.

RAG fine-tunes its generator too (paper, section 2.4). The paper's loss is the marginal
likelihood over the top-k retrieved passages; here each training question is read with its
gold passage alone, the answer that passage gives as the target. That is one prompt per
question instead of k, which is what two CPU cores can afford. `marginal_loss` is the paper's
loss, for recipes that read each question's top k (`ReaderTuningConfig.marginal_passages`):
measured, it did not read better per second of training (docs/quality-notes.md). Half the
questions are read from a counterfactual KB, whose passage gives a swapped answer: the target is
always what the passage says, so the generator learns to read the passage rather than its own
memory.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..config import ReaderTuningConfig
from ..generation.adapters import AdapterShape, adapter_parameters, adapter_switch, add_adapters, block_number, first_block_for_share
from ..generation.kernels import PACKED_ATTENTION, attention_windows, pack_rows, rows_fit_windows
from ..precision import build_autocast

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ReadingExample:
    """A prompt that holds one passage and a question, and the answer that passage gives."""

    prompt_ids: tuple[int, ...]  # the whole prompt; it begins with the shared few-shot block
    answer_ids: tuple[int, ...]  # the answer's tokens and the token that ends it


@dataclass(frozen=True)
class FrozenBottom:
    """What the shared block leaves in the blocks below the lowest trainable one: their keys and
    values, and the hidden state that enters that block. Training changes none of it, so it is
    computed once (`frozen_bottom`) and each step runs the shared block through the trainable
    blocks only (with the recipe's top-half adapters, half of the shared block's cost)."""

    first: int  # the lowest block with trainable weights
    keys: tuple[torch.Tensor, ...]  # one (1, kv heads, S, head dim) per block below `first`
    values: tuple[torch.Tensor, ...]
    hidden: torch.Tensor  # (1, S, H) entering block `first`


def _blocks(model: torch.nn.Module):
    layers = getattr(model.base_model, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def frozen_bottom(model: torch.nn.Module, shared_ids: Sequence[int]) -> FrozenBottom | None:
    """The shared block's states below `model`'s lowest trainable block, or None where nothing can be
    kept: no shared block, no numbered blocks, a trainable weight outside them or in the lowest
    block, or dropout (which would draw new masks every step)."""
    blocks = _blocks(model)
    trained = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    numbers = [block_number(name) for name in trained]
    if (not shared_ids or blocks is None or not trained or None in numbers or min(numbers) == 0
            or getattr(model.config, "attention_dropout", 0.0)
            or any(isinstance(module, torch.nn.Dropout) and module.p > 0 for module in model.modules())):
        return None
    first = min(numbers)
    captured = {}

    def capture(module, args, kwargs):
        captured["hidden"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    hook = blocks[first].register_forward_pre_hook(capture, with_kwargs=True)
    try:
        single = _run_shared_block(model, shared_ids, None)
    finally:
        hook.remove()
    return FrozenBottom(first, tuple(layer.keys for layer in single.layers[:first]),
                        tuple(layer.values for layer in single.layers[:first]), captured["hidden"])


@contextlib.contextmanager
def _bottom_from(model: torch.nn.Module, bottom: FrozenBottom):
    """Within the block, each block below `bottom.first` only hands on what it computed once."""
    blocks = _blocks(model)

    def kept(index: int):
        def forward(hidden_states, *args, cache=None, **kwargs):
            cache = cache if cache is not None else kwargs["past_key_values"]  # the older name of the argument
            cache.update(bottom.keys[index], bottom.values[index], index)
            return bottom.hidden if index == bottom.first - 1 else hidden_states
        return forward

    for index in range(bottom.first):
        blocks[index].forward = kept(index)
    try:
        yield
    finally:
        for index in range(bottom.first):
            del blocks[index].forward


def _run_shared_block(model: torch.nn.Module, shared_ids: Sequence[int], bottom: FrozenBottom | None):
    """A DynamicCache of the shared block's keys and values at the model's current weights, without gradients."""
    from transformers import DynamicCache

    single = DynamicCache()
    device = next(model.parameters()).device
    with torch.no_grad(), (_bottom_from(model, bottom) if bottom is not None else contextlib.nullcontext()):
        model.base_model(input_ids=torch.tensor([list(shared_ids)], device=device), cache=single, use_cache=True)
    return single


def _shared_block_cache(model: torch.nn.Module, shared_ids: Sequence[int], rows: int, bottom: FrozenBottom | None = None):
    """The KV cache of the shared few-shot block, computed without gradients, repeated for `rows` rows.

    With `bottom` (`frozen_bottom` of the same model and block) only the blocks from `bottom.first`
    up are run."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if not shared_ids:
        return cache
    single = _run_shared_block(model, shared_ids, bottom)
    for index, layer in enumerate(single.layers):
        cache.update(layer.keys.expand(rows, -1, -1, -1).contiguous(), layer.values.expand(rows, -1, -1, -1).contiguous(), index)
    return cache


def _answer_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """(M, V) next-token logits of (M, H) hidden states, as the model's own head computes them."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def _answer_logprobs(model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(M,) float32 log-probability of each target token after (M, H) hidden states, under the model's head."""
    logprobs = torch.log_softmax(_answer_logits(model, hidden).float(), dim=-1)  # (M, V)
    return logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)


def _answer_token_logprobs(model: torch.nn.Module, shared_ids: Sequence[int], batch: Sequence[ReadingExample],
                           bottom: FrozenBottom | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """((B, T) float32 log-prob of each row's next token, (B, T) bool: that token is an answer token).

    Every prompt begins with `shared_ids`. That block's keys and values are computed once per batch
    and held constant (no gradient flows into them): it is about half of each prompt, so this
    nearly halves a step, and every layer still learns from each example's own passage, question
    and answer. Rows are packed end to end where the model attends per packed row (`_packable`),
    else right-padded; either way positions continue after the shared block. Only the answer
    positions go through the output head.
    """
    device = next(model.parameters()).device
    shared = len(shared_ids)
    rows = [list(example.prompt_ids[shared:]) + list(example.answer_ids) for example in batch]
    if _packable(model, shared, rows):
        return _packed_answer_token_logprobs(model, shared_ids, batch, rows, bottom)
    width = max(map(len, rows))
    tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # (B, T)
    mask = torch.zeros(len(rows), shared + width, dtype=torch.long, device=device)  # (B, S + T)
    mask[:, :shared] = 1
    labels = torch.full((len(rows), width), -100, dtype=torch.long, device=device)  # (B, T): next token to predict
    for row, (example, ids) in enumerate(zip(batch, rows)):
        tokens[row, :len(ids)] = torch.tensor(ids, device=device)
        mask[row, shared:shared + len(ids)] = 1
        answer = len(example.answer_ids)
        labels[row, len(ids) - answer - 1:len(ids) - 1] = torch.tensor(example.answer_ids, device=device)
    positions = torch.arange(shared, shared + width, device=device).expand(len(rows), -1)  # (B, T)
    hidden = model.base_model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                              cache=_shared_block_cache(model, shared_ids, len(rows), bottom), use_cache=True).last_hidden_state
    scored = labels != -100
    picked = torch.zeros(labels.shape, dtype=torch.float32, device=device)
    picked[scored] = _answer_logprobs(model, hidden[scored], labels[scored])
    return picked, scored


def _packable(model: torch.nn.Module, shared: int, rows: Sequence[Sequence[int]]) -> bool:
    """The rows can go through the model as one packed sequence: it attends through
    `kernels.packed_rows_attention` and every row fits each attention window (`kernels.rows_fit_windows`)."""
    if getattr(model.config, "_attn_implementation", None) != PACKED_ATTENTION:
        return False
    return rows_fit_windows(attention_windows(model.config), shared + max(map(len, rows)))


def _packed_answer_token_logprobs(model: torch.nn.Module, shared_ids: Sequence[int], batch: Sequence[ReadingExample],
                                  rows: list[list[int]], bottom: FrozenBottom | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """As `_answer_token_logprobs`, with the rows laid end to end in one sequence of N tokens: each
    attends to the shared block and causally to itself, so no padding goes through the layers (the
    length-sorted batches of the default recipe padded 12% of their tokens)."""
    device = next(model.parameters()).device
    pack = pack_rows(rows, shared=len(shared_ids), dtype=next(model.parameters()).dtype, device=device)
    lengths = pack.lengths
    width = max(lengths)
    ends = pack.ends.tolist()
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, T): next token to predict
    packed_at = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T): that position's place in the pack
    for row, (example, n, end) in enumerate(zip(batch, lengths, ends)):
        answer = len(example.answer_ids)
        labels[row, n - answer - 1:n - 1] = torch.tensor(example.answer_ids)
        packed_at[row, :n] = torch.arange(end - n, end)
    hidden = model.base_model(input_ids=pack.ids, cache=_shared_block_cache(model, shared_ids, 1, bottom), use_cache=True,
                              **pack.model_kwargs(model.config)).last_hidden_state[0]  # (N, H)
    labels, packed_at = labels.to(device), packed_at.to(device)
    scored = labels != -100
    picked = torch.zeros(labels.shape, dtype=torch.float32, device=device)
    picked[scored] = _answer_logprobs(model, hidden[packed_at[scored]], labels[scored])
    return picked, scored


def reading_loss(model: torch.nn.Module, shared_ids: Sequence[int], batch: Sequence[ReadingExample], *,
                 bottom: FrozenBottom | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of the answer tokens of `batch`, each read after its own prompt.

    `bottom`: `frozen_bottom(model, shared_ids)` at the current trainable set, which spares the
    shared block's run through the blocks below it."""
    picked, scored = _answer_token_logprobs(model, shared_ids, batch, bottom)
    return -picked[scored].mean()


@dataclass(frozen=True)
class MarginalExample:
    """One question read with each of its top K retrieved passages, and its answer (the paper's training).

    Every read's `answer_ids` are the same answer; `doc_logprobs` (K,) is log p(z|x) of the reads'
    passages under the retriever, held fixed: only the generator learns here.
    """

    reads: tuple[ReadingExample, ...]  # (K,)
    doc_logprobs: tuple[float, ...]  # (K,)

    def __post_init__(self):
        if not self.reads or len(self.reads) != len(self.doc_logprobs):
            raise ValueError("a marginal example needs one log p(z|x) for each of its reads")
        if len({read.answer_ids for read in self.reads}) != 1:
            raise ValueError("every read of a marginal example has the same answer")


def reads_of(examples: Sequence[ReadingExample] | Sequence[MarginalExample]) -> list[ReadingExample]:
    """Every prompt `examples` read, in order: a marginal example's K reads in its place."""
    return [read for example in examples
            for read in (example.reads if isinstance(example, MarginalExample) else (example,))]


def marginal_loss(model: torch.nn.Module, shared_ids: Sequence[int], batch: Sequence[MarginalExample], *,
                  bottom: FrozenBottom | None = None) -> torch.Tensor:
    """Mean over `batch` of RAG-Sequence's negative log marginal likelihood, per answer token:

        -log sum_z p(z|x) prod_i p(y_i|x, z, y<i) / |y|

    (paper, eq. 1, over each question's top K). Its gradient reaches each passage's read in
    proportion to p(z|x, y), the posterior of the passage given the answer, so reads whose passage
    holds the answer learn most. Dividing by |y| keeps the scale of `reading_loss`, so one learning
    rate serves both.
    """
    picked, _ = _answer_token_logprobs(model, shared_ids, reads_of(batch), bottom)
    sequence = picked.sum(dim=1)  # (B * K,) log p(y|x,z); non-answer positions hold 0
    losses, start = [], 0
    for example in batch:
        count = len(example.reads)
        doc = torch.tensor(example.doc_logprobs, dtype=torch.float32, device=sequence.device)  # (K,)
        losses.append(-torch.logsumexp(doc + sequence[start:start + count], dim=0) / len(example.reads[0].answer_ids))
        start += count
    return torch.stack(losses).mean()


def _train_only(model: torch.nn.Module, trained: Sequence[torch.nn.Parameter]) -> None:
    """`trained` are the only parameters of `model` that get gradients; the model is put in training mode."""
    trained_ids = {id(p) for p in trained}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in trained_ids)
    model.train()


def adapters_to_train(model: torch.nn.Module, config: ReaderTuningConfig) -> list[torch.nn.Parameter]:
    """The recipe's adapters on `model` (added unless it has some) as its only trainable parameters,
    the model in training mode; the adapters' parameters are returned."""
    if adapter_switch(model) is None:
        first = first_block_for_share(model, config.adapted_share)
        add_adapters(model, AdapterShape(rank=config.rank, alpha=config.alpha, first_layer=first), seed=config.seed)
    trained = list(adapter_parameters(model).values())
    _train_only(model, trained)
    return trained


def tune_reader(
    model: torch.nn.Module,
    shared_ids: Sequence[int],
    examples: Sequence[ReadingExample] | Sequence[MarginalExample],
    *,
    config: ReaderTuningConfig = ReaderTuningConfig(),
    progress: Callable[[int, int], None] | None = None,
    autocast: bool = False,
) -> torch.nn.Module:
    """Fine-tune a causal LM `model` in place on `examples` (`config.epochs` passes) and return it in eval mode.

    "lora" (the default) trains low-rank adapters only (`rag_demo.generation.adapters`, added when the model
    has none), so the base weights stay as they were and serve closed-book answers. "full" trains
    every weight but the token embeddings (tied to the output head in Gemma): they are most of the
    parameters, and the vocabulary needs no new meaning. `progress(done, total)` after every step.
    `autocast` runs forward and backward in bfloat16 where that is native (`rag_demo.precision`):
    weights, optimizer state and the answer log-softmax stay float32.

    `examples` are either all `ReadingExample`s (one passage each, `reading_loss`) or all
    `MarginalExample`s (a question's top K, `marginal_loss`); a step then takes
    `config.batch_size // K` questions, so it reads about as many prompts either way.
    """
    if not examples:
        raise ValueError("no reading examples")
    marginal = isinstance(examples[0], MarginalExample)
    if any(isinstance(example, MarginalExample) != marginal for example in examples):
        raise ValueError("train on reading examples or on marginal examples, not both")
    if any(tuple(read.prompt_ids[:len(shared_ids)]) != tuple(shared_ids) for read in reads_of(examples)):
        raise ValueError("every prompt must begin with the shared block")
    torch.manual_seed(config.seed)
    if marginal:
        lengths = [max(len(read.prompt_ids) + len(read.answer_ids) for read in example.reads) for example in examples]
        batch_size = max(1, config.batch_size // max(len(example.reads) for example in examples))
        loss_of = marginal_loss
    else:
        lengths = [len(example.prompt_ids) + len(example.answer_ids) for example in examples]
        batch_size, loss_of = config.batch_size, reading_loss
    batches = [batch for epoch in range(config.epochs)
               for batch in length_sorted_batches(lengths, batch_size=batch_size, window=config.sort_window,
                                                  seed=config.seed + epoch)]
    if config.method == "lora":
        trained = adapters_to_train(model, config)
    elif config.method == "full":
        frozen = {id(model.get_input_embeddings().weight)}
        head = model.get_output_embeddings()
        if head is not None:
            frozen.add(id(head.weight))
        trained = [p for p in model.parameters() if id(p) not in frozen and id(p) not in
                   {id(a) for a in adapter_parameters(model).values()}]
        _train_only(model, trained)
    else:
        raise ValueError(f"unknown reader tuning method {config.method!r}; use lora or full")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(trained, lr=config.learning_rate, weight_decay=0.0)
    with build_autocast(device, enabled=autocast):
        bottom = frozen_bottom(model, shared_ids)  # the shared block below the adapters, computed once
    total = len(batches)
    warmup = max(1, total // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (total - step) / total)
    started, running = time.perf_counter(), []
    try:
        for step in range(total):
            batch = [examples[i] for i in batches[step]]
            with build_autocast(device, enabled=autocast):
                loss = loss_of(model, shared_ids, batch, bottom=bottom)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            schedule.step()
            running.append(loss.item())
            if progress is not None:
                progress(step + 1, total)
    finally:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
    log.info("generator: mean answer loss %.3f over the first tenth of the steps, %.3f over the last (%.0f s)",
             float(np.mean(running[:warmup])), float(np.mean(running[-warmup:])), time.perf_counter() - started)
    return model.eval()


def length_sorted_batches(lengths: Sequence[int], *, batch_size: int, window: int, seed: int) -> list[list[int]]:
    """One epoch's batches of indices into `lengths`: a seeded shuffle, cut into windows of
    `window` batches, each window sorted by length and cut into batches, the batches shuffled.

    Rows are padded to their batch's longest, so batching rows of similar length wastes less of a
    step on padding, while the shuffle keeps each batch a random draw from a window. `window` 1 is
    the plain shuffle.
    """
    if batch_size < 1 or window < 1:
        raise ValueError("batch_size and window must be at least 1")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))
    span = batch_size * window
    batches = []
    for start in range(0, len(order), span):
        chunk = sorted(order[start:start + span].tolist(), key=lambda i: lengths[i]) if window > 1 else order[start:start + span].tolist()
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    if window > 1:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def shared_prefix(examples: Sequence[ReadingExample]) -> tuple[int, ...]:
    """The longest run of tokens every prompt begins with, less its last token: that token can merge
    with what follows when a prompt is tokenized whole, so it is left to the rows."""
    if not examples:
        return ()
    first = examples[0].prompt_ids
    length = min(len(example.prompt_ids) for example in examples)
    for example in examples[1:]:
        length = next((i for i in range(length) if example.prompt_ids[i] != first[i]), length)
    return tuple(first[:max(length - 1, 0)])


def mean_answer_loss(model: torch.nn.Module, shared_ids: Sequence[int], examples: Sequence[ReadingExample], *,
                     batch_size: int = 8, progress: Callable[[int, int], None] | None = None) -> float:
    """Mean per-token negative log-likelihood of the answers of `examples` (nan for none);
    `progress(done, total)` after each batch."""
    if not examples:
        return float("nan")
    total, tokens = 0.0, 0
    # by length, so that rows pad little: the mean does not depend on the order
    examples = sorted(examples, key=lambda example: len(example.prompt_ids) + len(example.answer_ids))
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = examples[start:start + batch_size]
            count = sum(len(example.answer_ids) for example in batch)
            total += reading_loss(model, shared_ids, batch).item() * count
            tokens += count
            if progress is not None:
                progress(min(start + batch_size, len(examples)), len(examples))
    return total / tokens
