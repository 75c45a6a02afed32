"""The generator p(y_i | x, z, y<i): seq2seq (BART, T5) or causal LMs behind one small interface.

Rows are (passage, hypothesis) pairs: the k passages of a question run as one batch with a
KV cache, so one forward pass gives every passage's next-token distribution.

    state = generator.start(inputs)            # prompts in, state.logprobs (R, V) out
    state = generator.advance(state, tokens)   # one token per row
    state = generator.select(state, rows)      # reorder / expand rows (beam search)
    generator.continuation_logprobs(state, rows, targets, mask)  # teacher-forced (P, T)
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from pathlib import Path

import torch

from . import prompts
from .adapters import adapters_active, base_weights, load_adapters, reads_no_answer
from .tokenizing import drop_construction_tables, load_tokenizer
from ..config import DEFAULT_GENERATOR, GeneratorConfig
from ..retrieval.corpus import Passage
from .restatements import first_word_forms
from .decode_state import DecodeState, Target, copy_cache, index_rows, rebinding_layers, row_bytes
from ..errors import ModelLoadError
from .kernels import PACKED_ATTENTION, attention_windows, pack_rows, register_packed_attention, rows_fit_windows, use_few_rows_head
from .saved_states import FewShotBlocks, SavedStates

log = logging.getLogger(__name__)

PACK_TOKENS = 1024  # causal prefill: rows are packed into forwards of at most this many tokens
CONTINUATION_BYTES = 256 * 2**20  # teacher forcing: about this much memory (logits, cache copies) at once


class Generator:
    """What seq2seq and causal generators share; see the module docstring for the protocol."""

    kind = "base"

    def __init__(self, model, tokenizer, config: GeneratorConfig, *, name: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config
        self.name = name
        self.weights = ""  # folder name of the reading adapter, or of the weights when not `name` itself
        # its reading adapter learned to write `prompts.NO_ANSWER` after a passage that does not answer
        self.reads_no_answer = False
        self.saved_states: SavedStates | None = None  # what it computes once, kept across restarts
        self.device = next(model.parameters()).device

    def base_weights(self):
        """A block in which this generator computes with its base weights (no reading adapter):
        closed-book answers show what the model itself knows."""
        return base_weights(self.model)

    @property
    def has_adapter(self) -> bool:
        return getattr(self.model, "adapter_switch", None) is not None

    # -- text <-> ids -------------------------------------------------------------------------
    @property
    def eos_ids(self) -> frozenset[int]:
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        return frozenset(ids if isinstance(ids, (list, tuple)) else [ids])

    @property
    def no_answer_ids(self) -> frozenset[int]:
        """Tokens no answer may begin with: how this generator says a passage does not answer.
        None unless its reader learned to (`reads_no_answer`) and its prompt has the marker."""
        return self._no_answer_first if self.reads_no_answer else frozenset()

    @property
    def _no_answer_first(self) -> frozenset[int]:
        return frozenset()

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """The tokenizer's special tokens (BOS, EOS, padding ...): none of them is a word of an answer."""
        return frozenset(int(i) for i in self.tokenizer.all_special_ids)

    def first_word_forms(self, token_id: int) -> frozenset[int]:
        """See `restatements.first_word_forms`."""
        return first_word_forms(self.tokenizer, token_id)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    # -- rows ---------------------------------------------------------------------------------
    def select(self, state: DecodeState, rows: torch.Tensor) -> DecodeState:
        """Keep / repeat / reorder rows in place of `state` (its cache is reordered, not copied)."""
        rows = rows.to(self.device)
        if torch.equal(rows.cpu(), torch.arange(state.rows)):
            return state
        state.cache.reorder_cache(rows)
        return replace(
            state,
            logprobs=state.logprobs.index_select(0, rows.to(state.logprobs.device)),
            encoder_hidden=index_rows(state.encoder_hidden, rows),
            encoder_mask=index_rows(state.encoder_mask, rows),
            attention_mask=index_rows(state.attention_mask, rows),
            next_position=index_rows(state.next_position, rows),
        )

    def fork(self, state: DecodeState, rows: torch.Tensor) -> DecodeState:
        """Like `select`, but leaves `state` usable."""
        return self.select(replace(state, cache=copy_cache(state.cache)), rows)

    def continuation_logprobs(self, state: DecodeState, rows: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(target_t | row, target<t), pairing target i with row rows[i]; `state` is left unchanged.

        rows: (P,) row indices; targets, mask: (P, T) (mask marks real tokens; padded positions get 0) -> (P, T).
        """
        pairs, length = targets.shape
        if length == 0:
            return torch.zeros(pairs, 0)
        first = self._first_logprobs(state, rows, targets)
        if length == 1:
            return (first.cpu() * mask).float()
        # RAG-Sequence may score ~10 candidates under ~10 passages: P copies of a row's cache and
        # (P, T-1, V) float32 logits (three times: model output, float, log-softmax) would take
        # gigabytes at once, so the pairs go through in slices of bounded size. Targets are
        # right-padded to the longest; pairs sorted by length and each slice cut to its own longest
        # compute (almost) no padding.
        lengths = mask.sum(dim=1).tolist()
        vocab, pair_bytes = state.logprobs.shape[-1], 2 * row_bytes(state)
        rest = torch.zeros(pairs, length - 1)
        order = sorted(range(pairs), key=lambda i: lengths[i])
        while order:
            take = 1
            while take < len(order) and (take + 1) * (3 * (lengths[order[take]] - 1) * vocab * 4 + pair_bytes) <= CONTINUATION_BYTES:
                take += 1
            picked, order = order[:take], order[take:]
            width = max(lengths[i] for i in picked)
            if width < 2:
                continue  # one-token targets: `first` has them
            index = torch.tensor(picked)
            branch = self.fork(state, rows[index])
            part = targets[index, :width].to(self.device)
            logits = self._forward_tokens(branch, part[:, :-1])  # (p, width-1, V)
            rest[index, : width - 1] = torch.log_softmax(logits.float(), dim=-1).gather(2, part[:, 1:, None]).squeeze(-1).cpu()
            del branch, logits
        return (torch.cat([first.cpu(), rest], dim=1) * mask).float()

    @staticmethod
    def _first_logprobs(state: DecodeState, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(P, 1): each pair's first target token under its row, read off the state (no forward)."""
        device = state.logprobs.device
        return state.logprobs.index_select(0, rows.to(device)).gather(1, targets[:, :1].to(device))

    @torch.inference_mode()
    def advance(self, state: DecodeState, tokens: torch.Tensor) -> DecodeState:
        """Feed one token per row; the cache of `state` grows (the returned state replaces it)."""
        state = replace(state)
        logits = self._forward_tokens(state, tokens.view(-1, 1).to(self.device))[:, -1]
        state.logprobs = self.step_logprobs(logits)
        return state

    def step_logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), dim=-1)


class Seq2SeqGenerator(Generator):
    """BART / T5: each row's input is encoded once; the decoder runs on top with a cache."""

    kind = "seq2seq"

    def format_input(self, question: str, passage: Passage | None) -> str:
        """transformers' RagRetriever format: prefix + title + title_sep + text + doc_sep + question."""
        if passage is None:
            return question
        title = passage.title.removeprefix('"').removesuffix('"')
        prefix = self.config.prefix or ""
        return (prefix + title + self.config.title_sep + passage.text + self.config.doc_sep + question).replace("  ", " ")

    @property
    def decoder_start(self) -> int:
        start = self.model.generation_config.decoder_start_token_id
        return int(start if start is not None else self.model.config.decoder_start_token_id)

    def answer_target(self, answer: str) -> Target:
        """As transformers' RAG scores `labels`: a leading BOS is fed, not scored; EOS is scored."""
        ids = self.tokenizer(answer, add_special_tokens=True)["input_ids"]
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids and ids[0] == bos:
            return Target(prefix=(bos,), ids=tuple(ids[1:]))
        return Target(prefix=(self.decoder_start,), ids=tuple(ids))

    def answer_targets(self, answer: str) -> list[Target]:
        """The ways the answer may end: for a seq2seq generator only EOS."""
        return [self.answer_target(answer)]

    def generation_prefix(self) -> tuple[int, ...]:
        return (self.decoder_start,)

    def count_input_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    @torch.inference_mode()
    def start(self, texts: list[str], prefix: tuple[int, ...]) -> DecodeState:
        batch = self.tokenizer(
            texts, max_length=self.config.max_combined_length, truncation=True, padding=True, return_tensors="pt"
        ).to(self.device)
        encoder = self.model.get_encoder()
        hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        from transformers import DynamicCache, EncoderDecoderCache

        state = DecodeState(
            logprobs=torch.empty(0),
            cache=EncoderDecoderCache(DynamicCache(), DynamicCache()),
            encoder_hidden=hidden,
            encoder_mask=batch["attention_mask"],
        )
        decoder_ids = torch.tensor([list(prefix)] * len(texts), dtype=torch.long, device=self.device)
        logits = self._forward_tokens(state, decoder_ids)[:, -1]
        state.logprobs = self.step_logprobs(logits)
        return state

    def _forward_tokens(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed (R, n) decoder tokens; the cache grows by n. Returns (R, n, V) logits."""
        with torch.inference_mode():
            out = self.model(
                encoder_outputs=(state.encoder_hidden,),
                attention_mask=state.encoder_mask,
                decoder_input_ids=tokens,
                cache=state.cache,
                use_cache=True,
            )
        return out.logits


class CausalGenerator(Generator):
    """Decoder-only LMs: a few-shot prompt per passage (see `rag_demo.generation.prompts`), left-padded."""

    kind = "causal"

    def __init__(self, model, tokenizer, config: GeneratorConfig, *, name: str):
        super().__init__(model, tokenizer, config, name=name)
        self._blocks = FewShotBlocks(model, tokenizer)
        if model.config._attn_implementation == "sdpa":  # the same attention, per packed row (`kernels`)
            model.set_attn_implementation(register_packed_attention())

    def format_input(self, question: str, passage: Passage | None) -> str:
        if passage is None:
            return prompts.closed_book_prompt(question)
        text = self._fit_passage(question, passage)
        return prompts.rag_prompt(question, passage.title, text)

    def _fit_passage(self, question: str, passage: Passage) -> str:
        """Cut the passage (never the question) so the prompt fits max_prompt_tokens."""
        budget = self.config.max_prompt_tokens - self.count_input_tokens(prompts.rag_prompt(question, passage.title, ""))
        ids = self.tokenizer(passage.text, add_special_tokens=False)["input_ids"]
        if len(ids) <= budget:
            return passage.text
        return self.tokenizer.decode(ids[: max(budget, 0)])

    def copy_source(self, question: str, passage: Passage) -> list[int]:
        """The passage's tokens as an answer would copy them: after 'Answer:', words start with a space."""
        text = self._fit_passage(question, passage)
        return self.tokenizer(" " + " ".join(part for part in (passage.title, text) if part), add_special_tokens=False)["input_ids"]

    @functools.cached_property
    def stop_ids(self) -> frozenset[int]:
        """EOS and every token that contains a line break ("\n", "\n\n", ...): the answer line ends."""
        if self.saved_states is not None:  # scanning Gemma's 262,144 tokens takes 0.3 s
            return self.saved_states.ids("stop-ids", self._scanned_stop_ids, stop=prompts.ANSWER_STOP)
        return self._scanned_stop_ids()

    def _scanned_stop_ids(self) -> frozenset[int]:
        vocab = self.tokenizer.get_vocab()
        newline_tokens = {i for token, i in vocab.items() if "\n" in token or "Ċ" in token}  # Ċ: byte-level BPE's newline
        newline_tokens |= set(self.tokenizer(prompts.ANSWER_STOP, add_special_tokens=False)["input_ids"][-1:])
        return self.eos_ids | frozenset(newline_tokens)

    @functools.cached_property
    def _no_answer_first(self) -> frozenset[int]:
        """The first token of `prompts.NO_ANSWER` as it follows 'Answer:'. A reader trained with
        distractor passages writes it where a passage does not answer; no answer begins with it, so
        that mass stays out of every answer (`decoding.logits_processors`)."""
        return frozenset(self.answer_target(prompts.NO_ANSWER).ids[:1])

    def answer_target(self, answer: str) -> Target:
        """The answer as it follows 'Answer:', ended as the worked examples end theirs (`prompts.ANSWER_STOP`)."""
        return self.answer_targets(answer)[0]

    def answer_targets(self, answer: str) -> list[Target]:
        """The answer followed by each token that commonly ends one: the worked examples' ending
        first, then a single newline, then EOS. Generation may stop with any of them."""
        body = self.tokenizer(" " + answer.strip(), add_special_tokens=False)["input_ids"]
        endings = [self.tokenizer(stop, add_special_tokens=False)["input_ids"][-1] for stop in (prompts.ANSWER_STOP, "\n")]
        endings += sorted(self.eos_ids)
        return [Target(prefix=(), ids=tuple(body) + (end,)) for end in dict.fromkeys(endings)]

    def generation_prefix(self) -> tuple[int, ...]:
        return ()

    def count_input_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    @torch.inference_mode()
    def start(self, texts: list[str], prefix: tuple[int, ...] = ()) -> DecodeState:
        """Run the prompts. The few-shot block they all begin with is computed once per generator
        and its KV cache reused; each row then feeds only its own rest.

        The rests are packed end to end into one sequence (a block-diagonal mask keeps rows apart),
        so no padding is computed; the cache is then laid out as a left-padded batch for decoding.
        Models whose cache or attention does not allow this run the left-padded batch directly.
        """
        rows = [self.tokenizer(text)["input_ids"] + list(prefix) for text in texts]
        shared, prefix_cache = self._shared_prefix(rows)
        rests = [r[len(shared) :] for r in rows]
        if self._can_pack(rows, prefix_cache, len(shared)):
            logits, cache = self._prefill_packed(rests, prefix_cache, len(shared))
        else:
            logits, cache = self._prefill_padded(rests, prefix_cache, len(shared))
        width = max(len(r) for r in rests)
        rest_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rests], dtype=torch.long, device=self.device)
        attention = torch.cat([torch.ones(len(rows), len(shared), dtype=torch.long, device=self.device), rest_mask], dim=1)
        return DecodeState(
            logprobs=self.step_logprobs(logits),
            cache=cache,
            attention_mask=attention,
            next_position=torch.tensor([len(r) for r in rows], dtype=torch.long, device=self.device),
        )

    def _can_pack(self, rows: list[list[int]], prefix_cache, shared: int) -> bool:
        """Packing needs plain dynamic cache layers, an attention that takes a 4-D mask, and rows no
        longer than any sliding window (the packed mask has no window)."""
        if not rows_fit_windows(self._packable_layers, max(map(len, rows))):
            return False
        return prefix_cache is None or all(layer.keys.shape[-2] == shared for layer in prefix_cache.layers)

    def continuation_logprobs(self, state: DecodeState, rows: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """As `Generator.continuation_logprobs`, but every target scored under one row rides in that
        row's single forward: the targets are laid end to end after the row's cache, a mask keeps
        each to its own tokens, and positions restart at the row's next position. No cache copy per
        pair, no padding between targets. Falls back where a sliding window could cut the keys."""
        pairs, length = targets.shape
        lengths = mask.sum(dim=1).tolist()
        if length < 2 or not self._can_pack_targets(state, rows.tolist(), lengths):
            return super().continuation_logprobs(state, rows, targets, mask)
        out = torch.zeros(pairs, length)
        out[:, 0] = self._first_logprobs(state, rows, targets)[:, 0].cpu()
        vocab = state.logprobs.shape[-1]
        for group in self._target_groups(rows.tolist(), lengths, vocab):
            self._score_packed(state, group, rows, targets, lengths, out)
        return (out * mask).float()

    def _can_pack_targets(self, state: DecodeState, rows: list[int], lengths: list[int]) -> bool:
        """Cache + the longest row's pack stays inside every attention window, so no window cuts a key
        and the 4-D mask of `_score_packed` sees exactly the keys the plain path sees."""
        if not self._packable_layers or state.attention_mask is None:
            return False
        packed: dict[int, int] = {}
        for row, n in zip(rows, lengths):
            packed[row] = packed.get(row, 0) + max(n - 1, 0)
        longest = state.attention_mask.shape[1] + max(packed.values(), default=0)
        if rows_fit_windows(self._packable_layers, longest):
            return True
        # A window cuts keys: a mask per layer type can apply it as the plain path does, when the
        # sliding layers hold what that mask assumes (their last window - 1 positions)
        return self._sliding_keys_kept(state) is not None and max(lengths, default=0) < min(self._packable_layers)

    @functools.cached_property
    def _window_layer_types(self) -> tuple[str, ...]:
        """The model's layer types when it takes a mask per type (full and sliding attention); else ()."""
        types = tuple(getattr(self.model.config, "layer_types", None) or ())
        window = getattr(self.model.config, "sliding_window", None)
        if not types or not set(types) <= {"full_attention", "sliding_attention"} or len(types) != len(self._packable_layers):
            return ()
        expected = tuple(float(window) if t == "sliding_attention" else float("inf") for t in types)
        return types if window and expected == self._packable_layers else ()

    def _sliding_keys_kept(self, state: DecodeState) -> int | None:
        """How many past positions the sliding layers of `state` hold; None when a per-type mask cannot apply."""
        if not self._window_layer_types or "sliding_attention" not in self._window_layer_types:
            return None
        layer = state.cache.layers[self._window_layer_types.index("sliding_attention")]
        past = state.attention_mask.shape[1]
        window = int(self.model.config.sliding_window)
        kept = int(layer.keys.shape[-2]) if getattr(layer, "keys", None) is not None else -1
        if getattr(layer, "cumulative_length", past) != past or kept != min(past, window - 1):
            return None
        return kept

    def _target_groups(self, rows: list[int], lengths: list[int], vocab: int) -> list[list[int]]:
        """Pairs split so that each group's logits (rows x packed tokens x V, float32, twice) stay
        within CONTINUATION_BYTES; a group holds whole pairs."""
        groups, current, tokens_per_row = [], [], {}
        for i, n in enumerate(lengths):
            if n < 2:
                continue
            trial = dict(tokens_per_row)
            trial[rows[i]] = trial.get(rows[i], 0) + n - 1
            if current and len(trial) * max(trial.values()) * vocab * 8 > CONTINUATION_BYTES:
                groups.append(current)
                current, trial = [], {rows[i]: n - 1}
            current.append(i)
            tokens_per_row = trial
        if current:
            groups.append(current)
        return groups

    def _score_packed(self, state: DecodeState, group: list[int], rows: torch.Tensor, targets: torch.Tensor,
                      lengths: list[int], out: torch.Tensor) -> None:
        """Teacher-force the pairs of `group`, one forward row per distinct state row; fills out[i, 1:n]."""
        distinct = sorted({int(rows[i]) for i in group})
        slot = {r: j for j, r in enumerate(distinct)}
        placed: list[tuple[int, int, int]] = []  # (pair, forward row, start column)
        used = [0] * len(distinct)
        for i in group:
            j = slot[int(rows[i])]
            placed.append((i, j, used[j]))
            used[j] += lengths[i] - 1
        width, past = max(used), state.attention_mask.shape[1]
        ids = torch.full((len(distinct), width), int(self.tokenizer.pad_token_id or 0), dtype=torch.long)
        offsets = torch.zeros(len(distinct), width, dtype=torch.long)
        allowed = torch.zeros(len(distinct), width, past + width, dtype=torch.bool)
        allowed[:, :, :past] = state.attention_mask[distinct].bool().cpu()[:, None, :]
        for j in range(len(distinct)):  # pad positions see only themselves (their output is unused)
            allowed[j, used[j]:, past + used[j]:] = torch.eye(width - used[j], dtype=torch.bool)
        for i, j, start in placed:
            n = lengths[i] - 1
            ids[j, start : start + n] = targets[i, :n]
            offsets[j, start : start + n] = torch.arange(n)
            allowed[j, start : start + n, past + start : past + start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        dtype = next(self.model.parameters()).dtype

        def additive(keep: torch.Tensor) -> torch.Tensor:
            return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)[:, None].to(self.device)

        mask = additive(allowed)
        kept = self._sliding_keys_kept(state)
        if kept is not None and not all(past + width <= w for w in self._packable_layers):
            # sliding layers see their last `kept` past positions and the pack; a target token at
            # offset t (position past + t) sees a past position p only when p > past + t - window
            window = int(self.model.config.sliding_window)
            sliding = allowed[:, :, past - kept:].clone()
            first_visible = (kept - window + 1) + offsets  # (rows, width): first kept column each query may see
            columns = torch.arange(kept)
            sliding[:, :, :kept] &= columns[None, None, :] >= first_visible[:, :, None]
            mask = {"full_attention": mask, "sliding_attention": additive(sliding)}
        branch = self.fork(state, torch.tensor(distinct))
        positions = branch.next_position.cpu()[:, None] + offsets
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask,
                                position_ids=positions.to(self.device), cache=branch.cache, use_cache=True).logits
        for i, j, start in placed:
            n = lengths[i] - 1
            scored = torch.log_softmax(logits[j, start : start + n].float(), dim=-1)  # (n, V)
            out[i, 1 : n + 1] = scored.gather(1, targets[i, 1 : n + 1, None].to(scored.device)).squeeze(-1).cpu()
        del branch, logits

    @functools.cached_property
    def _packable_layers(self) -> tuple[float, ...]:
        """Each cache layer's attention window (inf: full); () when packed prefill is not possible."""
        from transformers import DynamicCache

        if self.model.config._attn_implementation not in ("sdpa", "eager", PACKED_ATTENTION):
            return ()
        layers = DynamicCache(config=self.model.config).layers
        if not layers or not all(type(layer) in rebinding_layers() for layer in layers):
            return ()
        return attention_windows(self.model.config)

    def _prefill_padded(self, rests: list[list[int]], prefix_cache, shared: int) -> tuple[torch.Tensor, object]:
        """The rests as one left-padded batch after R copies of the prefix cache. Returns (R, V) logits, cache."""
        from transformers import DynamicCache

        if prefix_cache is None:
            cache = DynamicCache(config=self.model.config)
        else:
            cache = copy_cache(prefix_cache)
            cache.reorder_cache(torch.zeros(len(rests), dtype=torch.long, device=self.device))
        width = max(len(r) for r in rests)
        ids = torch.full((len(rests), width), self.tokenizer.pad_token_id, dtype=torch.long)
        rest_mask = torch.zeros(len(rests), width, dtype=torch.long)
        for i, rest in enumerate(rests):
            ids[i, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            rest_mask[i, width - len(rest) :] = 1
        ids, rest_mask = ids.to(self.device), rest_mask.to(self.device)
        attention = torch.cat([torch.ones(len(rests), shared, dtype=torch.long, device=self.device), rest_mask], dim=1)
        positions = (shared + rest_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1], cache

    def _prefill_packed(self, rests: list[list[int]], prefix_cache, shared: int) -> tuple[torch.Tensor, object]:
        """Rows packed into forwards of at most PACK_TOKENS tokens. Returns (R, V) logits and a cache laid
        out as [prefix | left padding | rest] per row, as `_prefill_padded` leaves it."""
        from transformers import DynamicCache

        chunks, current = [], []
        for i, rest in enumerate(rests):
            if current and sum(len(rests[j]) for j in current) + len(rest) > PACK_TOKENS:
                chunks.append(current)
                current = []
            current.append(i)
        chunks.append(current)
        width = max(len(r) for r in rests)
        logits = [None] * len(rests)
        pieces: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in rests]  # per row, per layer (keys, values)
        dtype = next(self.model.parameters()).dtype
        for chunk in chunks:
            pack = pack_rows([rests[i] for i in chunk], shared=shared, dtype=dtype, device=self.device)
            lengths, ends = pack.lengths, pack.ends
            cache = DynamicCache()  # plain layers keep every packed position (no sliding-window crop)
            if prefix_cache is not None:
                for index, layer in enumerate(prefix_cache.layers):
                    cache.update(layer.keys, layer.values, index)
            out = self.model(input_ids=pack.ids, cache=cache, use_cache=True, logits_to_keep=(ends - 1).to(self.device),
                             **pack.model_kwargs(self.model.config))
            for j, i in enumerate(chunk):
                logits[i] = out.logits[0, j]
                start, end = shared + int(ends[j]) - lengths[j], shared + int(ends[j])
                pieces[i] = [(layer.keys[0, :, start:end], layer.values[0, :, start:end]) for layer in cache.layers]
        batched = DynamicCache(config=self.model.config)
        for index in range(len(pieces[0])):
            sample = pieces[0][index][0]  # (H, n, D)
            keys = sample.new_zeros(len(rests), sample.shape[0], shared + width, sample.shape[2])  # (R, H, S + W, D)
            values = torch.zeros_like(keys)
            if prefix_cache is not None:
                keys[:, :, :shared] = prefix_cache.layers[index].keys
                values[:, :, :shared] = prefix_cache.layers[index].values
            for i, rest in enumerate(rests):
                keys[i, :, shared + width - len(rest) :] = pieces[i][index][0]
                values[i, :, shared + width - len(rest) :] = pieces[i][index][1]
            batched.update(keys, values, index)
        return torch.stack(logits), batched

    def _shared_prefix(self, rows: list[list[int]]) -> tuple[list[int], object | None]:
        """The longest cached few-shot block that begins every row, with its one-row cache (shared: not
        to be written; `copy_cache` it first). ([], None) when no block fits."""
        for text in (prompts.few_shot_prefix(), prompts.few_shot_prefix(with_passages=False)):
            ids, cache = self._prefix_state(text)
            if ids and all(len(r) > len(ids) and r[: len(ids)] == ids for r in rows):
                return ids, cache
        return [], None

    def _prefix_state(self, text: str) -> tuple[list[int], object]:
        # a closed-book pass runs on the base weights; `weights` names the adapter for saved states
        adapter = self.weights if adapters_active(self.model) else None
        return self._blocks.state(text, adapter=adapter, saved=self.saved_states)

    def _forward_tokens(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed (R, n) tokens after the rows so far; mutates `state`. Returns (R, n, V) logits."""
        n = tokens.shape[1]
        steps = torch.arange(n, device=self.device)
        positions = state.next_position[:, None] + steps  # (R, n)
        state.attention_mask = torch.cat([state.attention_mask, torch.ones_like(tokens)], dim=1)
        state.next_position = state.next_position + n
        with torch.inference_mode():
            out = self.model(
                input_ids=tokens,
                attention_mask=state.attention_mask,
                position_ids=positions,
                cache=state.cache,
                use_cache=True,
            )
        return out.logits



def generator_from_model(model, tokenizer, config: GeneratorConfig, *, name: str) -> Generator:
    """Wrap a loaded transformers model in the generator interface that fits its architecture."""
    use_few_rows_head(model)
    if getattr(model.config, "is_encoder_decoder", False):
        return Seq2SeqGenerator(model, tokenizer, config, name=name)
    return CausalGenerator(model, tokenizer, config, name=name)


def load_generator(config: GeneratorConfig, *, path: str | None = None, device: torch.device | None = None,
                   adapter: str | Path | None = None, states: str | Path | None = None) -> Generator:
    """Load a seq2seq or causal LM by hub id or folder (`path` overrides `config.model`), and the
    reading adapter saved in the folder `adapter` if one is given (`rag_demo.generation.adapters`).

    `states`: a folder to keep what it computes once across restarts (`rag_demo.generation.saved_states`),
    for a `path` named by its content, as the offline default's cache folders are."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from ..retrieval.encoders import load_pretrained

    source = path or config.model
    model_config = load_pretrained(AutoConfig, source, "generator")
    seq2seq = config.kind == "seq2seq" or (config.kind == "auto" and getattr(model_config, "is_encoder_decoder", False))
    loader = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    dtype = getattr(torch, config.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ModelLoadError(f"unknown dtype {config.dtype!r}; use float32, bfloat16 or float16")
    model = load_pretrained(loader, source, "generator", dtype=dtype)
    tokenizer = load_tokenizer(source, converted=path is not None and config.model == DEFAULT_GENERATOR)
    drop_construction_tables(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if adapter is not None:
        try:
            load_adapters(model, adapter)
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"could not load the reading adapter in {adapter}: {err}") from None
    model.to(device or torch.device("cpu"))
    generator = generator_from_model(model, tokenizer, config, name=config.model)
    generator.weights = Path(adapter).name if adapter is not None else (Path(path).name if path else "")
    if states is not None and path is not None:
        generator.saved_states = SavedStates(Path(states), weights=Path(path).name)
    generator.reads_no_answer = adapter is not None and reads_no_answer(adapter)
    return generator
