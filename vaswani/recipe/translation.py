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

import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from tqdm.auto import tqdm
from transformers import PreTrainedModel, TorchAoConfig

from ..common.fileio import atomic_write
from ..generation_vaswani import (
    EXTRA_OUTPUT_TOKENS,
    PAPER_LENGTH_PENALTY_FORM,
    PAPER_NUM_BEAMS,
)
from ..kernels import exact_int8_products, use_cpu_kernels
from .data import read_lines
from .metrics import compute_bleu, reported_scores
from .model_folders import load_model
from .tokenization import load_model_tokenizers

logger = logging.getLogger(__name__)


def length_penalty_form_of(model, requested=None):
    """The length penalty form a beam search of `model` uses: `requested`, else its generation config's, else the
    paper's ("gnmt") for this package's models, which default to it, and transformers' |Y| ** alpha ("power") for
    any other model."""
    form = requested or getattr(model.generation_config, "length_penalty_form", None)
    if form:  # an exported engine (ONNX, CTranslate2) has a generation config but no model config
        return form
    return PAPER_LENGTH_PENALTY_FORM if getattr(model.config, "model_type", None) == "vaswani" else "power"


def length_penalty_of(model, requested=None):
    """The length penalty alpha a beam search of `model` uses: `requested`, else its generation config's."""
    value = getattr(model.generation_config, "length_penalty", None) if requested is None else requested
    return 1.0 if value is None else float(value)  # transformers' default when the config has none


def load_translation_model(
    model_path, tokenizer_path=None, device=None, bf16=False, int8=False, **model_kwargs
):
    """Load `(model, source_tokenizer, target_tokenizer)` for inference, the model in eval mode on `device`.

    The tokenizer(s) come from `tokenizer_path`, else from the model folder: a joint vocabulary
    (`tokenizer.json`) or separate ones (`source/` and `target/`), see `tokenization.load_tokenizers`.
    `bf16` casts the weights to bfloat16. `int8` (the CPU, the default device then) loads the linear layers in int8
    through transformers' torchao quantization, `TorchAoConfig(Int8DynamicActivationInt8WeightConfig())` (torchao;
    `pip install vaswani-transformer[int8]`): int8 weights with one scale per output row, the input quantized per row
    at each call. A folder saved quantized loads in int8 without it.
    `model_kwargs` go to `from_pretrained`. On the CPU the model runs this package's CPU kernels
    (`kernels.use_cpu_kernels`: its linear layers, int8 ones through an int8 GEMM with the tied output projection
    in int8 too, and, unless `attn_implementation` is given, the "vaswani_sdpa" attention).

    Raises `FileNotFoundError` / `ValueError` naming the folder or file (`model_folders.load_model`): a name that is
    neither a local folder nor a reachable Hub model, a folder without `config.json`, a config that is not JSON, a
    weights file that is cut short or corrupt, weights that do not match the config.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() and not int8 else "cpu"))
    if int8:
        if bf16 or device.type != "cpu":
            raise ValueError(f"int8 decoding runs in float32 on the CPU: not with bf16={bf16} on {device}")
        if not exact_int8_products():
            raise ValueError(
                "int8 decoding needs a CPU with VNNI or AMX: without them oneDNN's int8 products (torchao's too) "
                "add byte products in saturating 16-bit pairs, so they are not exact; decode in float32"
            )
        try:
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig
        except ImportError as error:
            raise ImportError(
                "int8 decoding loads the model through transformers' torchao quantization: "
                "pip install vaswani-transformer[int8] (or pip install torchao)"
            ) from error
        model_kwargs.update(
            quantization_config=TorchAoConfig(Int8DynamicActivationInt8WeightConfig()), device_map="cpu"
        )
    model = (
        load_model(model_path, **model_kwargs)
        .to(device=device, dtype=torch.bfloat16 if bf16 else None)
        .eval()
    )
    if device.type == "cpu":
        use_cpu_kernels(model, attention=model_kwargs.get("attn_implementation") is None)
    if tokenizer_path is None and not Path(model_path).is_dir():
        # a Hub model: its tokenizer files, from the cache
        tokenizer_path = snapshot_download(str(model_path), allow_patterns=TOKENIZER_PATTERNS)
    source_tokenizer, target_tokenizer = load_model_tokenizers(model_path, tokenizer_path)
    logger.info(
        "Loaded %s (%s%s) on %s; tokenizer(s) from %s",
        model_path,
        model.dtype,
        ", int8 linear layers" if int8 else "",
        device,
        tokenizer_path or model_path,
    )
    return model, source_tokenizer, target_tokenizer


# The files a Hub model's tokenizer may need (joint, source/ + target/, or a converted model's sentencepiece / vocab).
TOKENIZER_PATTERNS = ["*.json", "*.spm", "*.model", "*.txt", "source/*", "target/*"]


def check_decoding(num_beams, length_penalty, max_new_tokens=None, n_best=1):
    """Raise `ValueError` naming the setting that beam search cannot run with."""
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be at least 1, got {num_beams!r}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens!r}")
    if n_best < 1 or n_best > num_beams:
        raise ValueError(f"n_best must be between 1 and num_beams ({num_beams}), got {n_best!r}")


def make_batches(lengths, batch_size, max_tokens=None):
    """Group the indices of `lengths`, longest first, into batches.

    A batch holds at most `batch_size` sentences and, if `max_tokens` is given, at most `max_tokens` padded source
    tokens (sentences x longest length); a sentence longer than `max_tokens` gets a batch of its own.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    batches = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: ties keep input order
        current = batches[-1] if batches else []
        # Sorted longest first, so the batch's first sentence is its longest.
        if (
            current
            and len(current) < batch_size
            and (len(current) + 1) * lengths[current[0]] <= (max_tokens or math.inf)
        ):
            current.append(i)
        else:
            batches.append([i])
    return batches


@dataclass
class Hypothesis:
    """One translation and its score: for beam search the beam's score, the summed log-probability divided by the
    length penalty lp(Y) (§6.1, `generation_vaswani.length_penalty_factor`); for greedy decoding the summed
    log-probability."""

    text: str
    score: float


def translate(sentences, model, source_tokenizer, target_tokenizer=None, **options):
    """Translate `sentences`, returning one translation per sentence in the same order.

    Args:
        sentences: source sentences; empty or all-whitespace ones translate to "".
        model: an encoder-decoder with `generate()`, in eval mode, on the device to translate on; or an exported
            model (`vaswani.interop.engines`).
        source_tokenizer: encodes the sources; `target_tokenizer` (default: the same) decodes the outputs.
        options: `translate_n_best`'s: `batch_size` (at most this many sentences per `generate` call), `max_tokens`
            (if given, also at most this many padded source tokens per call), `num_beams` (§6.1's beam size 4 by
            default), `length_penalty` (alpha; `None` takes the model's generation config: §6.1's 0.6 for a model
            this package trained, unless `vaswani-train --length_penalty` chose another on validation),
            `length_penalty_form` ("gnmt": ((5 + |Y|) / 6) ** alpha, the form §6.1 cites, or "power": |Y| ** alpha,
            transformers'; `None` leaves the model's generation config to decide, the paper's for this package's
            models; see `generation_vaswani.length_penalty_factor`), `max_new_tokens` (a fixed output limit; `None`
            gives §6.1's input length + 50, where the input length is the longest source of the
            batch), `show_progress` (a tqdm bar over sentences) and further arguments of `model.generate` (e.g.
            `early_stopping`).
    """
    n_best = translate_n_best(
        sentences, model, source_tokenizer, target_tokenizer, with_scores=False, **options
    )
    return [hypotheses[0].text for hypotheses in n_best]


@torch.inference_mode()
def translate_n_best(
    sentences,
    model,
    source_tokenizer,
    target_tokenizer=None,
    n_best=1,
    batch_size=64,
    max_tokens=None,
    num_beams=PAPER_NUM_BEAMS,
    length_penalty=None,
    max_new_tokens=None,
    show_progress=True,
    with_scores=True,
    max_source_length=None,
    **generate_kwargs,
):
    """The `n_best` best translations of each sentence, best first, with their scores (`Hypothesis`), as
    fairseq-generate's H lines or OpenNMT's `-n_best`, in input order. `n_best` is at most `num_beams`. An empty
    sentence gives `n_best` empty translations of score 0 without decoding. `max_source_length` truncates longer
    sources (default: none is cut). The other arguments are `translate`'s; with `with_scores=False` the scores are not
    computed (0.0). `model` may be an exported model (`vaswani.interop.engines`), which decodes the same batches."""
    # None leaves a setting to the model's generation config
    generate_kwargs = {key: value for key, value in generate_kwargs.items() if value is not None}
    length_penalty = length_penalty_of(model, length_penalty)
    check_decoding(num_beams, length_penalty, max_new_tokens, n_best)
    # CTranslate2 says what it cannot apply before the first sentence
    if hasattr(model, "note_length_penalty"):
        model.note_length_penalty(num_beams, length_penalty, generate_kwargs.get("length_penalty_form"))
    sentences = list(sentences)  # e.g. a `datasets` column
    target_tokenizer = target_tokenizer or source_tokenizer
    results = [[Hypothesis("", 0.0)] * n_best for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    cut = dict(truncation=bool(max_source_length), max_length=max_source_length)  # None: no source is cut
    encoded = source_tokenizer([sentences[i] for i in todo], **cut)["input_ids"] if todo else []
    with tqdm(total=len(sentences), desc="Translating", unit="sent", disable=not show_progress) as progress:
        progress.update(len(sentences) - len(todo))  # the empty lines
        for batch in make_batches([len(ids) for ids in encoded], batch_size, max_tokens):
            sources = [encoded[j] for j in batch]
            settings = dict(
                num_beams=num_beams,
                num_return_sequences=n_best,
                length_penalty=length_penalty,
                max_new_tokens=max_new_tokens or max(map(len, sources)) + EXTRA_OUTPUT_TOKENS,
                **generate_kwargs,
            )
            if isinstance(model, PreTrainedModel):
                rows = _generate(model, source_tokenizer, sources, with_scores, settings)
            else:  # an export (`vaswani.interop.engines`): (ids, score) rows per source
                rows = model.generate(sources, with_scores=with_scores, **settings)
            for j, hypotheses in zip(batch, rows, strict=True):
                results[todo[j]] = [
                    Hypothesis(target_tokenizer.decode(ids, skip_special_tokens=True), float(score))
                    for ids, score in hypotheses
                ]
            progress.update(len(batch))
    return results


def _generate(model, tokenizer, sources, with_scores, settings):
    """`model.generate` on a batch of id lists: `num_return_sequences` (ids, score) rows per source. The score of
    beam search is the beam's own; of greedy search, the summed log-probabilities of the tokens up to `</s>`."""
    inputs = tokenizer.pad({"input_ids": sources}, return_tensors="pt").to(model.device)
    output = model.generate(
        **inputs, **settings, output_scores=with_scores, return_dict_in_generate=with_scores
    )
    if not with_scores:
        sequences, scores = output, [0.0] * len(output)
    elif settings["num_beams"] > 1:
        sequences, scores = output.sequences, output.sequences_scores.tolist()
    else:
        sequences = output.sequences
        steps = model.compute_transition_scores(sequences, output.scores, normalize_logits=True)  # (B, T)
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, int) else (eos[0] if eos else -1)  # -1: no token ends a row
        # a token counts up to and including the first </s>; after it, the rows are padding
        is_eos = (sequences[:, -steps.shape[1] :] == eos).long()
        scores = steps.masked_fill(is_eos.cumsum(dim=1) - is_eos > 0, 0.0).sum(dim=1).tolist()
    rows, n = list(zip(sequences.tolist(), scores, strict=True)), settings["num_return_sequences"]
    return [rows[k : k + n] for k in range(0, len(rows), n)]


def read_sentences(path):
    """The lines of a UTF-8 file (`.gz` allowed), or of standard input for `None` or "-". A line that is not UTF-8
    raises `ValueError` naming the file (or standard input) and the line."""
    return list(stdin_lines() if path is None or str(path) == "-" else read_lines(path))


def stdin_lines():
    """The lines of standard input as they arrive (UTF-8, without line ends); `ValueError` names a bad line."""
    for number, raw in enumerate(iter(sys.stdin.buffer.readline, b""), start=1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"standard input, line {number}: not UTF-8 text ({error.reason} at byte {error.start} of the line)"
            ) from None


def write_sentences(sentences, path):
    """Write one sentence a line to a UTF-8 file, or to standard output for `None` or "-". A line break inside a
    sentence (one the decoder produced) is written as a space: it would shift all later lines.

    A file appears whole when everything is written (`fileio.atomic_write`): a kill leaves the earlier file as it
    was, and two processes writing one path leave one complete file, never a mix."""
    ended = (sentence.replace("\r", " ").replace("\n", " ") + "\n" for sentence in sentences)
    if path is None or str(path) == "-":
        sys.stdout.buffer.writelines(line.encode() for line in ended)  # UTF-8 whatever the locale
        sys.stdout.buffer.flush()
        return
    with atomic_write(path) as f:
        f.writelines(ended)


def score_translations(translations, reference_paths, moses_lang=None, lowercase=False):
    """sacreBLEU BLEU and chrF of `translations` against line-aligned reference files (`metrics.compute_bleu`),
    case-insensitive with `lowercase`; with `moses_lang`, the record a run reports instead (`metrics.reported_scores`:
    also BLEU on lowercased Moses-tokenized text of that language, the published Multi30k convention).

    Raises `ValueError` naming the file whose line count differs.
    """
    if not translations:
        raise ValueError("No translations to score: the input was empty")
    references = [list(read_lines(path)) for path in reference_paths]
    for path, stream in zip(reference_paths, references, strict=True):
        if len(stream) != len(translations):
            raise ValueError(f"{len(translations)} translations but {path} has {len(stream)} lines")
    per_segment = list(zip(*references, strict=True))
    if moses_lang is None:
        return compute_bleu(translations, per_segment, lowercase=lowercase)
    return reported_scores(translations, per_segment, moses_lang, lowercase)
