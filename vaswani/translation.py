"""Batched translation with the paper's decoding (Vaswani et al., 2017, §6.1).

§6.1: "We used beam search with a beam size of 4 and length penalty α = 0.6 [...]. We set the maximum output
length during inference to input length + 50, but terminate early when possible."

- Beam size 4 and length penalty 0.6 unless asked otherwise; the rest of the model's `generation_config` applies.
- Maximum output length, per batch: the longest source of the batch (in tokens, `</s>` included) + 50 new tokens,
  as `VaswaniTranslationPipeline` does; a fixed `max_new_tokens` overrides it.
- Sentences are sorted by length (longest first, so that a batch that does not fit in memory fails at once) and
  batched by sentence count and optionally by padded source tokens; translations come back in input order.
- An empty (or all-whitespace) line translates to an empty line without running the model, so outputs stay
  line-aligned with their inputs.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel, PreTrainedTokenizerBase

from .data import read_lines
from .generation_vaswani import (
    EXTRA_OUTPUT_TOKENS,
    PAPER_LENGTH_PENALTY,
    PAPER_LENGTH_PENALTY_FORM,
    PAPER_NUM_BEAMS,
)
from .metrics import compute_bleu, reported_scores
from .tokenization import load_tokenizers

logger = logging.getLogger(__name__)

NUM_BEAMS = PAPER_NUM_BEAMS  # §6.1
LENGTH_PENALTY = PAPER_LENGTH_PENALTY  # §6.1, alpha


def length_penalty_form_of(model: PreTrainedModel, requested: str | None = None) -> str:
    """The length penalty form a beam search of `model` uses: `requested`, else its generation config's, else the
    paper's ("gnmt") for this package's models, which default to it, and transformers' |Y| ** alpha ("power") for
    any other model."""
    form = requested or getattr(model.generation_config, "length_penalty_form", None)
    if form:
        return form
    return PAPER_LENGTH_PENALTY_FORM if getattr(model.config, "model_type", None) == "vaswani" else "power"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_translation_model(
    model_path: str | os.PathLike,
    tokenizer_path: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    bf16: bool = False,
    **model_kwargs,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerBase]:
    """Load `(model, source_tokenizer, target_tokenizer)` for inference, the model in eval mode on `device`.

    The tokenizer(s) come from `tokenizer_path`, else from the model folder: a joint vocabulary
    (`tokenizer.json`) or separate ones (`source/` and `target/`), see `tokenization.load_tokenizers`.
    `bf16` casts the weights to bfloat16. `model_kwargs` go to `from_pretrained` (e.g. `attn_implementation`).
    """
    device = torch.device(device or default_device())
    model = AutoModelForSeq2SeqLM.from_pretrained(model_path, **model_kwargs)
    model = model.to(device=device, dtype=torch.bfloat16 if bf16 else None).eval()
    source_tokenizer, target_tokenizer = load_tokenizers(tokenizer_path or model_path)
    logger.info(
        "Loaded %s (%s) on %s; tokenizer(s) from %s",
        model_path,
        model.dtype,
        device,
        tokenizer_path or model_path,
    )
    return model, source_tokenizer, target_tokenizer


def make_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Group the indices of `lengths`, longest first, into batches.

    A batch holds at most `batch_size` sentences and, if `max_tokens` is given, at most `max_tokens` padded source
    tokens (sentences x longest length); a sentence longer than `max_tokens` gets a batch of its own.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep input order
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted longest first, so the batch's first sentence is its longest.
        too_many_tokens = (
            max_tokens is not None and current and (len(current) + 1) * lengths[current[0]] > max_tokens
        )
        if current and (len(current) == batch_size or too_many_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@torch.inference_mode()
def translate(
    sentences: Iterable[str],
    model: PreTrainedModel,
    source_tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 64,
    max_tokens: int | None = None,
    num_beams: int = NUM_BEAMS,
    length_penalty: float = LENGTH_PENALTY,
    length_penalty_form: str | None = None,
    max_new_tokens: int | None = None,
    extra_output_tokens: int = EXTRA_OUTPUT_TOKENS,
    show_progress: bool = True,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences`, returning one translation per sentence in the same order.

    Args:
        sentences: source sentences; empty or all-whitespace ones translate to "".
        model: an encoder-decoder with `generate()`, in eval mode, on the device to translate on.
        source_tokenizer: encodes the sources; `target_tokenizer` (default: the same) decodes the outputs.
        batch_size: at most this many sentences per `generate` call.
        max_tokens: if given, also at most this many padded source tokens per call.
        num_beams, length_penalty: §6.1's beam size 4 and alpha = 0.6 by default.
        length_penalty_form: "gnmt" (((5 + |Y|) / 6) ** alpha, the form §6.1 cites) or "power" (|Y| ** alpha,
            transformers'); `None` leaves the model's generation config to decide (the paper's for this package's
            models). See `generation_vaswani.length_penalty_factor`.
        max_new_tokens: a fixed output limit; `None` gives §6.1's input length + `extra_output_tokens`, where
            the input length is the longest source of the batch.
        show_progress: a tqdm bar over sentences.
        generate_kwargs: further arguments of `model.generate` (e.g. `early_stopping`).
    """
    sentences = list(sentences)  # e.g. a `datasets` column
    target_tokenizer = target_tokenizer or source_tokenizer
    translations = [""] * len(sentences)
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    encoded = source_tokenizer([sentences[i] for i in todo])["input_ids"] if todo else []
    batches = make_batches([len(ids) for ids in encoded], batch_size, max_tokens)
    device = model.device
    if length_penalty_form is not None:
        generate_kwargs["length_penalty_form"] = length_penalty_form
    with tqdm(total=len(sentences), desc="Translating", unit="sent", disable=not show_progress) as progress:
        progress.update(len(sentences) - len(todo))  # the empty lines
        for batch in batches:
            inputs = source_tokenizer.pad(
                {"input_ids": [encoded[j] for j in batch]}, padding=True, return_tensors="pt"
            ).to(device)
            limit = max_new_tokens
            if limit is None:
                limit = inputs["input_ids"].shape[1] + extra_output_tokens
            output_ids = model.generate(
                **inputs,
                num_beams=num_beams,
                length_penalty=length_penalty,
                max_new_tokens=limit,
                **generate_kwargs,
            )
            texts = target_tokenizer.batch_decode(output_ids, skip_special_tokens=True)
            for j, text in zip(batch, texts, strict=True):
                translations[todo[j]] = text
            progress.update(len(batch))
    return translations


def read_sentences(path: str | os.PathLike | None) -> list[str]:
    """The lines of a UTF-8 file (`.gz` allowed), or of standard input for `None` or "-"."""
    if path is None or str(path) == "-":
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="\n")
        return [line.rstrip("\r\n") for line in stdin]
    return list(read_lines(path))


def _one_line(text: str) -> str:
    """A translation as one output line: a line break the decoder produced would shift all later lines."""
    return text.replace("\r", " ").replace("\n", " ")


def write_sentences(sentences: Iterable[str], path: str | os.PathLike | None) -> None:
    """Write one sentence a line to a UTF-8 file, or to standard output for `None` or "-"."""
    lines: Iterator[str] = (_one_line(sentence) + "\n" for sentence in sentences)
    if path is None or str(path) == "-":
        stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=True)
        stdout.writelines(lines)
        stdout.flush()
        stdout.detach()  # leave sys.stdout's buffer open
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(lines)


def score_translations(
    translations: Sequence[str],
    reference_paths: Sequence[str | os.PathLike],
    moses_lang: str | None = None,
    **bleu_kwargs,
) -> dict:
    """sacreBLEU BLEU and chrF of `translations` against line-aligned reference files (`metrics.compute_bleu`);
    with `moses_lang`, the record a run reports instead (`metrics.reported_scores`: also BLEU on lowercased
    Moses-tokenized text of that language, the published Multi30k convention; of `bleu_kwargs` it takes
    `lowercase` only).

    Raises `ValueError` naming the file whose line count differs.
    """
    references = [list(read_lines(path)) for path in reference_paths]
    for path, stream in zip(reference_paths, references, strict=True):
        if len(stream) != len(translations):
            raise ValueError(f"{len(translations)} translations but {path} has {len(stream)} lines")
    per_segment = [list(refs) for refs in zip(*references, strict=True)]
    if moses_lang is not None:
        lowercase = bleu_kwargs.pop("lowercase", False)
        if bleu_kwargs:
            raise ValueError(f"moses_lang reports the fixed record; drop {sorted(bleu_kwargs)}")
        return reported_scores(translations, per_segment, moses_lang, lowercase=lowercase)
    return compute_bleu(translations, per_segment, **bleu_kwargs)


__all__ = [
    "LENGTH_PENALTY",
    "NUM_BEAMS",
    "default_device",
    "load_translation_model",
    "make_batches",
    "read_sentences",
    "score_translations",
    "translate",
    "write_sentences",
]
