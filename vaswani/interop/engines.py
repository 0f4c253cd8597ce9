"""Translation with an exported model (`vaswani-export`): CTranslate2 or ONNX Runtime instead of PyTorch.

    engine, source_tokenizer, target_tokenizer = load_exported("runs/de-en/ct2-int8")
    translations = translate(sentences, engine, source_tokenizer, target_tokenizer)
    n_best = translate_n_best(sentences, engine, source_tokenizer, target_tokenizer, n_best=4)  # with scores

Both engines take token ids (`generate`) and return, per sentence, its best `num_return_sequences` outputs (`Output`:
the generated ids after the start token, `</s>` included when a hypothesis ended with it, and the score).
`translate` and `translate_n_best` are `vaswani.recipe.translation`'s functions of the same names with an engine in place of
the model: length-sorted batches, §6.1's maximum output length (longest source of the batch + 50), empty lines kept
empty, input order, `translation.Hypothesis` results.

How each engine decodes, against the PyTorch model's `generate()`:

- `OnnxEngine` runs the two graphs of `export.to_onnx` with ONNX Runtime: greedy search here, or the model's own beam
  search, `generation_vaswani.BeamSearch` (transformers' beam search with either length-penalty form of
  `generation_vaswani.length_penalty_factor`: the paper's ((5 + |Y|) / 6)^alpha or |Y|^alpha), the one loop that
  `generate()` runs too. Same outputs as `generate()` with the same settings.
- `CTranslate2Engine` runs CTranslate2's own search. Its beam search divides by |Y|^alpha only (the "power" form;
  asked for the paper's form, it warns and uses |Y|^alpha) and stops a sentence once k hypotheses have finished, as
  transformers' `early_stopping=True`; with those two settings its outputs are `generate()`'s.

The engines are optional extras (`pip install vaswani-transformer[ctranslate2]` or `[onnx]`), imported here only when
an engine is loaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..common.fileio import read_json
from ..generation_vaswani import EXTRA_OUTPUT_TOKENS, BeamSearch
from ..recipe.tokenization import load_tokenizers
from ..recipe.translation import (
    LENGTH_PENALTY,
    NUM_BEAMS,
    Hypothesis,
    check_decoding,
    decode_in_batches,
)
from .export import ENGINES, read_metadata

logger = logging.getLogger(__name__)


class Output(NamedTuple):
    """One decoded sequence: the generated ids (after the start token, `</s>` included when it ended there) and its
    score as `generate()` gives it: for beam search the summed log-probability divided by the length penalty, for
    greedy decoding the summed log-probability (0.0 unless asked for)."""

    ids: list[int]
    score: float


# --------------------------------------------------------------------------------------------------------------------
# CTranslate2
# --------------------------------------------------------------------------------------------------------------------
class CTranslate2Engine:
    """A CTranslate2 export, decoded by `ctranslate2.Translator` (greedy or beam search, n-best)."""

    name = "ctranslate2"

    def __init__(
        self, folder: str | os.PathLike, device: str = "cpu", compute_type: str = "default", threads: int = 0
    ):
        import ctranslate2

        folder = Path(folder)
        self.metadata = read_metadata(folder)
        self.translator = ctranslate2.Translator(
            str(folder), device=device, compute_type=compute_type, intra_threads=threads
        )
        self.source_tokens, target_tokens = _ctranslate2_vocabularies(folder)
        self.target_ids = {token: i for i, token in enumerate(target_tokens)}
        self.max_positions = self.metadata["max_positions"]
        self.warned = False  # about the length-penalty form, once

    def generate(
        self,
        input_ids: Sequence[Sequence[int]],
        num_beams: int,
        max_new_tokens: int,
        length_penalty: float = LENGTH_PENALTY,
        length_penalty_form: str = "power",
        early_stopping: bool | str = True,
        num_return_sequences: int = 1,
        min_new_tokens: int = 0,
        with_scores: bool = False,
    ) -> list[list[Output]]:
        """Decode a batch of sources (id lists, `</s>` included). `early_stopping` is CTranslate2's own (k finished
        hypotheses) whatever is asked; `length_penalty_form` "gnmt" falls back to "power" with a warning
        (`note_length_penalty`)."""
        self.note_length_penalty(num_beams, length_penalty, length_penalty_form)
        longest = max(len(ids) for ids in input_ids)
        if longest > self.max_positions or max_new_tokens > self.max_positions:
            raise ValueError(
                f"a source of {longest} tokens or {max_new_tokens} new tokens exceeds the exported position table "
                f"({self.max_positions} positions: max_position_embeddings at export)"
            )
        results = self.translator.translate_batch(
            [[self.source_tokens[i] for i in ids] for ids in input_ids],
            beam_size=num_beams,
            # greedy: no length penalty, so that a score is the summed log-probability, as in transformers
            length_penalty=length_penalty if num_beams > 1 else 0.0,
            num_hypotheses=num_return_sequences,
            return_end_token=True,  # |Y| counts </s>, as in transformers
            return_scores=with_scores,
            min_decoding_length=min_new_tokens,
            max_decoding_length=max_new_tokens,
            max_input_length=0,
        )
        return [
            [
                Output([self.target_ids[t] for t in tokens], score)
                for tokens, score in zip(
                    result.hypotheses, result.scores or [0.0] * len(result.hypotheses), strict=True
                )
            ]
            for result in results
        ]

    def note_length_penalty(self, num_beams: int, length_penalty: float, length_penalty_form: str) -> None:
        """Warn, once per engine, when a beam search asks for a length penalty CTranslate2 cannot apply: it divides
        by |Y|^alpha only (`translate_batch` has no other form), not by the GNMT ((5 + |Y|) / 6)^alpha of §6.1."""
        if num_beams == 1 or not length_penalty or length_penalty_form == "power" or self.warned:
            return
        self.warned = True
        logger.warning(
            "CTranslate2 has only the length penalty |Y|^alpha: this decoding divides beam scores by |Y|^%s, not by "
            "the model's %s form ((5 + |Y|) / 6)^%s, so its translations can differ from --engine pytorch or onnx",
            length_penalty,
            length_penalty_form,
            length_penalty,
        )


def _ctranslate2_vocabularies(folder: Path) -> tuple[list[str], list[str]]:
    """The source and target token lists CTranslate2 wrote (one shared file when they are equal)."""
    shared = folder / "shared_vocabulary.json"
    if shared.is_file():
        tokens = read_json(shared)
        return tokens, tokens
    return tuple(read_json(folder / f"{side}_vocabulary.json") for side in ("source", "target"))


# --------------------------------------------------------------------------------------------------------------------
# ONNX Runtime
# --------------------------------------------------------------------------------------------------------------------
class OnnxEngine:
    """An ONNX export (encoder graph + decoder graph with its cache), run with ONNX Runtime on the CPU; the search is
    this module's (`greedy_search`, `beam_search`)."""

    name = "onnx"

    def __init__(self, folder: str | os.PathLike, threads: int = 0):
        import onnxruntime

        from .export.to_onnx import DECODER_FILE, ENCODER_FILE, cache_names

        folder = Path(folder)
        self.metadata = read_metadata(folder)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        # ONNX Runtime's threads otherwise spin after each call and starve torch's search between calls.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = lambda name: onnxruntime.InferenceSession(  # noqa: E731
            str(folder / name), options, providers=["CPUExecutionProvider"]
        )
        self.encoder, self.decoder = session(ENCODER_FILE), session(DECODER_FILE)
        layers = self.metadata["decoder_layers"]
        self.cross_names = cache_names("cross", layers)
        self.past_names = cache_names("past", layers)
        self.empty_cache_shape = (self.metadata["decoder_attention_heads"], 0, self.metadata["head_dim"])

    def encode(
        self, input_ids: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(B, S) int64 ids and mask -> the encoder output (B, S, d_model) and the cross-attention cache."""
        memory, *cross = self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        return memory, cross

    def empty_cache(self, rows: int) -> list[np.ndarray]:
        return [np.zeros((rows, *self.empty_cache_shape), dtype=np.float32)] * len(self.past_names)

    def decode(
        self,
        decoder_input_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        cross: list[np.ndarray],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder call: (B, T) new ids after the cached `past` -> logits (B, T, V) and the extended cache."""
        feed = {"decoder_input_ids": decoder_input_ids, "encoder_attention_mask": attention_mask}
        feed.update(zip(self.past_names, past, strict=True))
        feed.update(zip(self.cross_names, cross, strict=True))
        logits, *present = self.decoder.run(None, feed)
        return logits, present

    def generate(
        self,
        input_ids: Sequence[Sequence[int]],
        num_beams: int,
        max_new_tokens: int,
        length_penalty: float = LENGTH_PENALTY,
        length_penalty_form: str = "gnmt",
        early_stopping: bool | str = False,
        num_return_sequences: int = 1,
        min_new_tokens: int = 0,
        with_scores: bool = False,
    ) -> list[list[Output]]:
        """Decode a batch of sources (id lists, `</s>` included; right-padded here), as `generate()` does."""
        pad, eos = self.metadata["pad_token_id"], self.metadata["eos_token_id"]
        longest = max(len(ids) for ids in input_ids)
        ids = np.full((len(input_ids), longest), pad, dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, sentence in enumerate(input_ids):
            ids[row, : len(sentence)], mask[row, : len(sentence)] = sentence, 1
        _, cross = self.encode(ids, mask)
        if num_beams == 1:
            if num_return_sequences != 1:
                raise ValueError(
                    "greedy search returns one sequence per source: num_return_sequences must be 1"
                )
            outputs = greedy_search(self, mask, cross, max_new_tokens, min_new_tokens, eos, pad, with_scores)
            return [[output] for output in outputs]
        return beam_search(
            self,
            mask,
            cross,
            num_beams,
            max_new_tokens,
            length_penalty,
            length_penalty_form,
            early_stopping,
            num_return_sequences,
            min_new_tokens,
            eos,
        )


def _start_tokens(engine: OnnxEngine, rows: int) -> np.ndarray:
    return np.full((rows, 1), engine.metadata["decoder_start_token_id"], dtype=np.int64)


def greedy_search(
    engine: OnnxEngine,
    mask: np.ndarray,
    cross: list[np.ndarray],
    max_new_tokens: int,
    min_new_tokens: int,
    eos: int,
    pad: int,
    with_scores: bool = False,
) -> list[Output]:
    """The most probable token at each step until `</s>` or `max_new_tokens`; finished rows continue with padding.
    With `with_scores`, each output's summed log-probability (up to and with `</s>`)."""
    rows = mask.shape[0]
    tokens, past = _start_tokens(engine, rows), engine.empty_cache(rows)
    finished = np.zeros(rows, dtype=bool)
    scores = np.zeros(rows, dtype=np.float64)
    outputs: list[np.ndarray] = []
    for step in range(max_new_tokens):
        logits, past = engine.decode(tokens, mask, past, cross)
        logits = logits[:, -1]  # (B, V)
        if step < min_new_tokens:
            logits[:, eos] = -np.inf
        chosen = logits.argmax(-1)
        if with_scores:  # log p(chosen) = logit - logsumexp(logits)
            top = logits[np.arange(rows), chosen]
            log_p = top - (top + np.log(np.exp(logits - top[:, None]).sum(-1)))
            scores += np.where(finished, 0.0, log_p)
        tokens = np.where(finished, pad, chosen)[:, None]
        outputs.append(tokens[:, 0])
        finished |= tokens[:, 0] == eos
        if finished.all():
            break
    generated = np.stack(outputs, axis=1)  # (B, steps)
    return [
        Output(_until_eos(row.tolist(), eos), float(score))
        for row, score in zip(generated, scores, strict=True)
    ]


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def beam_search(
    engine: OnnxEngine,
    mask: np.ndarray,
    cross: list[np.ndarray],
    k: int,
    max_new_tokens: int,
    alpha: float,
    form: str,
    early_stopping: bool | str,
    num_return_sequences: int,
    min_new_tokens: int,
    eos: int,
) -> list[list[Output]]:
    """The model's own beam search (`generation_vaswani.BeamSearch`, as `generate()` runs it) on the ONNX graphs: a
    finished hypothesis' summed log-probability is divided by `length_penalty_factor(|Y|, alpha, form)` (|Y| counts
    the generated tokens, `</s>` included); a hypothesis stops at `</s>` or at `max_new_tokens`."""
    if not 1 <= num_return_sequences <= k:
        raise ValueError(
            f"num_return_sequences must be between 1 and num_beams ({k}), got {num_return_sequences}"
        )
    batch = mask.shape[0]
    mask = np.repeat(mask, k, axis=0)  # (B * k, S): the beams of a source are consecutive rows
    cross = [np.repeat(c, k, axis=0) for c in cross]
    past = engine.empty_cache(batch * k)
    tokens = _start_tokens(engine, batch * k)
    beams = BeamSearch(torch.from_numpy(tokens), k, 1 + max_new_tokens, eos, 1, alpha, form, early_stopping)
    for step in range(max_new_tokens):
        logits, past = engine.decode(tokens, mask, past, cross)
        log_probs = torch.from_numpy(logits[:, -1]).float().log_softmax(-1)  # (B * k, V)
        if step < min_new_tokens:
            log_probs[:, eos] = -torch.inf
        candidates, scores, origins = beams.candidates(log_probs)
        stops = (candidates[:, :, beams.cur_len] == eos) | (beams.cur_len + 1 == beams.max_length)
        order = beams.advance(candidates, scores, origins, stops).numpy()
        if beams.done(stops):
            break
        past = [
            np.take(cache, order, axis=0) for cache in past
        ]  # the cache rows each continuing beam extends
        tokens = beams.sequences()[:, -1:].numpy()
    sequences, scores, _ = beams.best(num_return_sequences)
    outputs = [
        Output(_until_eos(ids[1:], eos), float(score))
        for ids, score in zip(sequences.tolist(), scores.tolist(), strict=True)
    ]
    return [outputs[i : i + num_return_sequences] for i in range(0, len(outputs), num_return_sequences)]


# --------------------------------------------------------------------------------------------------------------------
# Loading and translating text
# --------------------------------------------------------------------------------------------------------------------
Engine = CTranslate2Engine | OnnxEngine


def load_engine(folder: str | os.PathLike, engine: str | None = None, threads: int = 0, **options) -> Engine:
    """The engine of an exported folder; `engine`, when given, must be the one the folder was exported for.
    `options` go to `CTranslate2Engine` (`device`, `compute_type`)."""
    exported = read_metadata(folder)["engine"]
    if engine is not None and engine != exported:
        raise ValueError(f"--engine {engine} but {folder} holds a {exported} export")
    if exported == "ctranslate2":
        return CTranslate2Engine(folder, threads=threads, **options)
    if exported == "onnx":
        if options:
            raise ValueError(f"{sorted(options)} apply to ctranslate2 exports only")
        return OnnxEngine(folder, threads=threads)
    raise ValueError(f"{folder}: unknown engine {exported!r} (known: {ENGINES})")


def load_exported(folder: str | os.PathLike, engine: str | None = None, **options):
    """`(engine, source_tokenizer, target_tokenizer)` of an exported folder (the tokenizers were exported with it)."""
    loaded = load_engine(folder, engine, **options)  # first: a folder that is no export is named as such
    source, target = load_tokenizers(folder)
    return loaded, source, target


def translate_n_best(
    sentences: Iterable[str],
    engine: Engine,
    source_tokenizer,
    target_tokenizer=None,
    n_best: int = 1,
    batch_size: int = 64,
    max_tokens: int | None = None,
    num_beams: int = NUM_BEAMS,
    length_penalty: float | None = None,
    length_penalty_form: str | None = None,
    max_new_tokens: int | None = None,
    extra_output_tokens: int = EXTRA_OUTPUT_TOKENS,
    show_progress: bool = True,
    with_scores: bool = True,
    max_source_length: int | None = None,
    early_stopping: bool | str | None = None,
) -> list[list[Hypothesis]]:
    """`vaswani.recipe.translation.translate_n_best` with an exported model instead of the PyTorch one: the `n_best` best
    translations of each sentence, best first, with their scores, in input order; the same batching, the same default
    output limit (the longest source of the batch + 50), empty lines as `n_best` empty translations of score 0.

    `length_penalty`, `length_penalty_form` and `early_stopping` default to the exported model's generation config
    (CTranslate2 runs its own form, see the module docstring)."""
    decoding = engine.metadata["decoding"]
    if length_penalty is None:
        length_penalty = decoding.get("length_penalty", LENGTH_PENALTY)
    check_decoding(num_beams, length_penalty, max_new_tokens, n_best)
    length_penalty_form = length_penalty_form or decoding["length_penalty_form"]
    if isinstance(engine, CTranslate2Engine):  # said once, before the first sentence
        engine.note_length_penalty(num_beams, length_penalty, length_penalty_form)

    def decode(sources: list[list[int]]) -> list[list[tuple[list[int], float]]]:
        outputs = engine.generate(
            sources,
            num_beams=num_beams,
            max_new_tokens=max_new_tokens or max(len(ids) for ids in sources) + extra_output_tokens,
            length_penalty=length_penalty,
            length_penalty_form=length_penalty_form,
            early_stopping=decoding["early_stopping"] if early_stopping is None else early_stopping,
            num_return_sequences=n_best,
            with_scores=with_scores,
        )
        return [[(h.ids, h.score) for h in hypotheses] for hypotheses in outputs]

    return decode_in_batches(
        sentences,
        decode,
        source_tokenizer,
        target_tokenizer,
        n_best,
        batch_size,
        max_tokens,
        max_source_length,
        show_progress,
    )


def translate(
    sentences: Iterable[str], engine: Engine, source_tokenizer, target_tokenizer=None, **options
) -> list[str]:
    """The best translation of each sentence (`translate_n_best` with `n_best=1`, no scores computed), as
    `vaswani.recipe.translation.translate` gives it with the PyTorch model."""
    n_best = translate_n_best(
        sentences, engine, source_tokenizer, target_tokenizer, with_scores=False, **options
    )
    return [hypotheses[0].text for hypotheses in n_best]


__all__ = [
    "CTranslate2Engine",
    "ENGINES",
    "OnnxEngine",
    "Output",
    "beam_search",
    "greedy_search",
    "load_engine",
    "load_exported",
    "translate",
    "translate_n_best",
]
