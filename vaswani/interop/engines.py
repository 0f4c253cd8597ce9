"""Translation with an exported model (`vaswani-export`): CTranslate2 or ONNX Runtime instead of PyTorch.

    engine, source_tokenizer, target_tokenizer = load_exported("runs/de-en/ct2-int8")
    translations = translate(sentences, engine, source_tokenizer, target_tokenizer)
    n_best = translate_n_best(sentences, engine, source_tokenizer, target_tokenizer, n_best=4)  # with scores

Both engines take token ids (`generate`) and return, per sentence, its best `num_return_sequences` outputs (`Output`:
the generated ids after the start token, `</s>` included when a hypothesis ended with it, and the score). Settings
left out (`length_penalty`, `length_penalty_form`, `early_stopping`) are the exported model's generation config, kept
in the export's metadata as `generation_config`, as `generate()` takes them from the model's.
`translate` and `translate_n_best` are `vaswani.recipe.translation`'s functions, which take an engine in place of the
model: length-sorted batches, §6.1's maximum output length (longest source of the batch + 50), empty lines kept
empty, input order, `translation.Hypothesis` results.

How each engine decodes, against the PyTorch model's `generate()`:

- `OnnxEngine` runs the two graphs of `export.to_onnx` with ONNX Runtime and the model's own beam search (greedy
  search as one beam without a length penalty, done at its first `</s>`), `generation_vaswani.BeamSearch` (transformers' beam search with either length-penalty form of
  `generation_vaswani.length_penalty_factor`: the paper's ((5 + |Y|) / 6)^alpha or |Y|^alpha), the one loop that
  `generate()` runs too. Same outputs as `generate()` with the same settings; it always computes the scores.
- `CTranslate2Engine` runs CTranslate2's own search. Its beam search divides by |Y|^alpha only (the "power" form;
  asked for the paper's form, it warns and uses |Y|^alpha) and stops a sentence once k hypotheses have finished, as
  transformers' `early_stopping=True`; with those two settings its outputs are `generate()`'s. It computes scores
  only when asked (`with_scores`; else 0.0).

The engines are optional extras (`pip install vaswani-transformer[ctranslate2]` or `[onnx]`), imported here only when
an engine is loaded.
"""

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from ..common.fileio import read_json
from ..generation_vaswani import BeamSearch
from ..recipe.tokenization import load_tokenizers
from ..recipe.translation import translate, translate_n_best  # noqa: F401 (an engine in place of the model)
from .export import ENGINES, read_metadata

logger = logging.getLogger(__name__)


class Output(NamedTuple):
    """One decoded sequence: the generated ids (after the start token, `</s>` included when it ended there) and its
    score as `generate()` gives it: for beam search the summed log-probability divided by the length penalty, for
    greedy decoding the summed log-probability."""

    ids: list[int]
    score: float


class Exported:
    """What both engines read from an export: its metadata, and its decoding as a generation config."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.metadata = read_metadata(folder)
        self.generation_config = SimpleNamespace(**self.metadata["decoding"])

    def decoding(self, length_penalty, length_penalty_form, early_stopping, **fields):
        """The settings asked for, the export's generation config where a setting is None, and `fields`."""
        config = self.generation_config
        return SimpleNamespace(
            length_penalty=config.length_penalty if length_penalty is None else length_penalty,
            length_penalty_form=length_penalty_form or config.length_penalty_form,
            early_stopping=config.early_stopping if early_stopping is None else early_stopping,
            **fields,
        )


# --------------------------------------------------------------------------------------------------------------------
# CTranslate2
# --------------------------------------------------------------------------------------------------------------------
class CTranslate2Engine(Exported):
    """A CTranslate2 export, decoded by `ctranslate2.Translator` (greedy or beam search, n-best)."""

    def __init__(self, folder, device="cpu", threads=0):
        import ctranslate2

        super().__init__(folder)
        # in the export's own weight type (CTranslate2's compute_type "default")
        self.translator = ctranslate2.Translator(str(folder), device=device, intra_threads=threads)
        # CTranslate2 writes one vocabulary file when both sides are equal
        sides = (
            ("shared", "shared")
            if (self.folder / "shared_vocabulary.json").is_file()
            else ("source", "target")
        )
        self.source_tokens, target_tokens = (
            read_json(self.folder / f"{side}_vocabulary.json") for side in sides
        )
        self.target_ids = {token: i for i, token in enumerate(target_tokens)}
        self.warned = False  # about the length-penalty form, once

    def generate(
        self,
        input_ids,
        num_beams,
        max_new_tokens,
        length_penalty=None,
        length_penalty_form=None,
        early_stopping=None,
        num_return_sequences=1,
        min_new_tokens=0,
        with_scores=False,
    ):
        """Decode a batch of sources (id lists, `</s>` included) into `num_return_sequences` `Output`s per source.
        `early_stopping` is CTranslate2's own (k finished hypotheses) whatever is asked; `length_penalty_form` "gnmt"
        falls back to "power" with a warning (`note_length_penalty`)."""
        length_penalty = self.note_length_penalty(num_beams, length_penalty, length_penalty_form)
        longest = max(map(len, input_ids))
        if max(longest, max_new_tokens) > self.metadata["max_positions"]:
            raise ValueError(
                f"a source of {longest} tokens or {max_new_tokens} new tokens exceeds the exported position table "
                f"({self.metadata['max_positions']} positions: max_position_embeddings at export)"
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

    def note_length_penalty(self, num_beams, length_penalty, length_penalty_form):
        """Warn, once per engine, when a beam search asks for a length penalty CTranslate2 cannot apply: it divides
        by |Y|^alpha only (`translate_batch` has no other form), not by the GNMT ((5 + |Y|) / 6)^alpha of §6.1.
        Returns the alpha it applies."""
        decoding = self.decoding(length_penalty, length_penalty_form, None)
        length_penalty, length_penalty_form = decoding.length_penalty, decoding.length_penalty_form
        if num_beams > 1 and length_penalty and length_penalty_form != "power" and not self.warned:
            self.warned = True
            logger.warning(
                "CTranslate2 has only the length penalty |Y|^alpha: this decoding divides beam scores by |Y|^%s, not "
                "by the model's %s form ((5 + |Y|) / 6)^%s, so its translations can differ from --engine pytorch or "
                "onnx",
                length_penalty,
                length_penalty_form,
                length_penalty,
            )
        return length_penalty


# --------------------------------------------------------------------------------------------------------------------
# ONNX Runtime
# --------------------------------------------------------------------------------------------------------------------
class OnnxEngine(Exported):
    """An ONNX export (encoder graph + decoder graph with its cache), run with ONNX Runtime on the CPU; the search is
    the model's own beam search (`generate`)."""

    def __init__(self, folder, threads=0):
        import onnxruntime

        from .export.to_onnx import DECODER_FILE, ENCODER_FILE, cache_names

        super().__init__(folder)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        # ONNX Runtime's threads otherwise spin after each call and starve torch's search between calls.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.encoder, self.decoder = (
            onnxruntime.InferenceSession(str(self.folder / name), options, providers=["CPUExecutionProvider"])
            for name in (ENCODER_FILE, DECODER_FILE)
        )
        layers = self.metadata["decoder_layers"]
        self.cache_names = cache_names("past", layers) + cache_names(
            "cross", layers
        )  # the decoder graph's order

    def encode(self, input_ids, attention_mask):
        """(B, S) int64 ids and mask -> the encoder output (B, S, d_model) and the cross-attention cache (a list of
        (B, h, S, d_k) arrays: `cache_names("cross", layers)`)."""
        memory, *cross = self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        return memory, cross

    def decode(self, decoder_input_ids, attention_mask, past, cross):
        """One decoder call: (B, T) new ids after the cached `past` -> logits (B, T, V) and the extended cache. An
        empty `past` is the cross-attention cache cut to no position: `[c[:, :, :0] for c in cross]`."""
        feed = {
            "decoder_input_ids": decoder_input_ids,
            "encoder_attention_mask": attention_mask,
            **dict(zip(self.cache_names, [*past, *cross], strict=True)),
        }
        logits, *present = self.decoder.run(None, feed)
        return logits, present

    def generate(
        self,
        input_ids,
        num_beams,
        max_new_tokens,
        length_penalty=None,
        length_penalty_form=None,
        early_stopping=None,
        num_return_sequences=1,
        min_new_tokens=0,
        with_scores=True,
    ):
        """Decode a batch of sources (id lists, `</s>` included) into `num_return_sequences` `Output`s per source as
        `generate()` does, by `generation_vaswani.BeamSearch`: a finished hypothesis' summed log-probability divided by
        `length_penalty_factor(|Y|, alpha, form)` (|Y| counts `</s>`), a hypothesis stopped at `</s>` or at
        `max_new_tokens`; greedy search as one beam without a length penalty, done at its first `</s>`."""
        k, eos = num_beams, self.metadata["eos_token_id"]
        if k == 1 and num_return_sequences != 1:
            raise ValueError("greedy search returns one sequence per source: num_return_sequences must be 1")
        if not 1 <= num_return_sequences <= k:
            raise ValueError(
                f"num_return_sequences must be between 1 and num_beams ({k}), got {num_return_sequences}"
            )
        # right-padded with the pad id; the mask marks the real tokens
        rows = [torch.tensor(sentence) for sentence in input_ids]
        ids = pad_sequence(rows, batch_first=True, padding_value=self.metadata["pad_token_id"]).numpy()
        mask = pad_sequence([torch.ones_like(row) for row in rows], batch_first=True).numpy()
        _, cross = self.encode(ids, mask)
        mask = np.repeat(mask, k, axis=0)  # (B * k, S): the beams of a source are consecutive rows
        cross = [np.repeat(c, k, axis=0) for c in cross]
        tokens = np.full_like(mask[:, :1], self.metadata["decoder_start_token_id"])  # (B * k, 1) int64
        past = [c[:, :, :0] for c in cross]  # (B * k, h, 0, d_k): no target position yet
        # greedy search: one beam without a length penalty, done at its first `</s>`
        settings = (length_penalty, length_penalty_form, early_stopping) if k > 1 else (0.0, "power", True)
        max_length = 1 + max_new_tokens
        # `pad_token_id=None`: the positions after a hypothesis' `</s>` hold `</s>`
        search = self.decoding(
            *settings, num_beams=k, max_length=max_length, eos_token_id=eos, pad_token_id=None
        )
        beams = BeamSearch(torch.from_numpy(tokens), search, search.length_penalty_form)
        for step in range(max_new_tokens):
            logits, past = self.decode(tokens, mask, past, cross)
            log_probs = torch.from_numpy(logits[:, -1]).float().log_softmax(-1)  # (B * k, V)
            if step < min_new_tokens:
                log_probs[:, eos] = -torch.inf
            # a hypothesis stops at `</s>` or at the length limit
            order = beams.step(log_probs, lambda seqs: (seqs[:, -1] == eos) | (seqs.shape[1] == max_length))
            if beams.done():
                break
            # the cache rows each continuing beam extends
            past = [cache[order.numpy()] for cache in past]
            tokens = beams.sequences()[:, -1:].numpy()
        sequences, scores, _ = beams.best(num_return_sequences)
        outputs = [
            Output(ids[1 : (ids + [eos]).index(eos, 1) + 1], score)
            for ids, score in zip(sequences.tolist(), scores.tolist(), strict=True)
        ]
        return [outputs[i : i + num_return_sequences] for i in range(0, len(outputs), num_return_sequences)]


# --------------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------------
def load_engine(folder, engine=None, threads=0, **options):
    """The engine of an exported folder; `engine`, when given, must be the one the folder was exported for.
    `options` go to `CTranslate2Engine` (`device`)."""
    exported = read_metadata(folder)["engine"]
    if engine not in (None, exported):
        raise ValueError(f"--engine {engine} but {folder} holds a {exported} export")
    if exported == "ctranslate2":
        return CTranslate2Engine(folder, threads=threads, **options)
    if exported == "onnx":
        if options:
            raise ValueError(f"{sorted(options)} apply to ctranslate2 exports only")
        return OnnxEngine(folder, threads)
    raise ValueError(f"{folder}: unknown engine {exported!r} (known: {ENGINES})")


def load_exported(folder, engine=None, **options):
    """`(engine, source_tokenizer, target_tokenizer)` of an exported folder (the tokenizers were exported with it)."""
    # the engine first: a folder that is no export is named as such
    return load_engine(folder, engine, **options), *load_tokenizers(folder)
