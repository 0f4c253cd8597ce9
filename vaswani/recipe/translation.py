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
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import torch
from huggingface_hub import get_hf_file_metadata, hf_hub_url, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError
from huggingface_hub.repocard import metadata_load
from huggingface_hub.utils import validate_repo_id
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel, PreTrainedTokenizerBase

from ..common.errors import UsageError
from ..common.fileio import atomic_write, read_json
from ..generation_vaswani import (
    EXTRA_OUTPUT_TOKENS,
    PAPER_LENGTH_PENALTY,
    PAPER_LENGTH_PENALTY_FORM,
    PAPER_NUM_BEAMS,
)
from ..kernels import use_cpu_kernels
from .averaging import check_safetensors
from .data import read_lines
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


def length_penalty_of(model: PreTrainedModel, requested: float | None = None) -> float:
    """The length penalty alpha a beam search of `model` uses: `requested`, else its generation config's."""
    if requested is not None:
        return requested
    value = getattr(model.generation_config, "length_penalty", None)
    return 1.0 if value is None else float(value)  # transformers' default when the config has none


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
    `bf16` casts the weights to bfloat16. `model_kwargs` go to `from_pretrained`. On the CPU the model runs this
    package's CPU kernels (`kernels.use_cpu_kernels`: its linear layers and, unless `attn_implementation` is given,
    the "vaswani_sdpa" attention).

    Raises `FileNotFoundError` / `ValueError` naming the folder or file (`check_model_path`), before anything loads:
    a name that is neither a local folder nor a reachable Hub model, a folder without `config.json`, a config that is
    not JSON, a weights file that is cut short or corrupt.
    """
    device = torch.device(device or default_device())
    check_model_path(model_path)
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_path, **model_kwargs)
    except (OSError, ValueError) as error:
        raise type(error)(f"Cannot load the model {model_path}: {' '.join(str(error).split())}") from error
    model = model.to(device=device, dtype=torch.bfloat16 if bf16 else None).eval()
    if device.type == "cpu":
        use_cpu_kernels(model, attention="attn_implementation" not in model_kwargs)
    if (
        tokenizer_path is None and not Path(model_path).is_dir()
    ):  # a Hub model: its tokenizer files, from the cache
        tokenizer_path = snapshot_download(str(model_path), allow_patterns=TOKENIZER_PATTERNS)
    source_tokenizer, target_tokenizer = load_tokenizers(tokenizer_path or model_path)
    logger.info(
        "Loaded %s (%s) on %s; tokenizer(s) from %s",
        model_path,
        model.dtype,
        device,
        tokenizer_path or model_path,
    )
    return model, source_tokenizer, target_tokenizer


# The files a Hub model's tokenizer may need (joint, source/ + target/, or a converted model's sentencepiece / vocab).
TOKENIZER_PATTERNS = ["*.json", "*.spm", "*.model", "*.txt", "source/*", "target/*"]


def _looks_local(name: str) -> bool:
    """Whether a model name can only be a local path: it starts with "/", "./", "../" or "~", holds more than one
    separator, ends with one, or is no valid Hub repo id ("name" or "namespace/name")."""
    if Path(name).is_absolute() or name.startswith((".", "~")) or name.endswith(("/", os.sep)):
        return True
    if name.count("/") > 1 or (os.sep != "/" and os.sep in name):
        return True
    try:
        validate_repo_id(name)
    except ValueError:
        return True
    return False


def check_model_path(model_path: str | os.PathLike) -> None:
    """Raise, naming the path, when `model_path` is not a usable model folder: a file, a folder without `config.json`,
    a `config.json` or `generation_config.json` that is not valid JSON, safetensors weights that are cut short or
    corrupt; or a name that is neither a local folder nor a model on the Hub (`check_hub_model`)."""
    path = Path(model_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a model folder: it has no config.json")
        for name in ("config.json", "generation_config.json"):
            if (path / name).is_file():
                read_json(path / name)
        for weights in sorted(path.glob("*.safetensors")):
            check_safetensors(weights)
        return
    if path.exists():
        raise ValueError(f"{path} is a file: give the model's folder")
    check_hub_model(str(model_path))


def check_hub_model(name: str) -> None:
    """Return when `name`, which is no local folder, can be a model on the Hub: one in the local cache, or one the
    Hub holds. Otherwise raise `FileNotFoundError` naming both places at once: a name that can only be a path (see
    `_looks_local`), a name not in the cache while offline (`HF_HUB_OFFLINE=1`), a repository the Hub does not have,
    or a Hub that cannot be reached (one request, no retries: transformers' loading retries for about a minute).
    A gated repository is left to `from_pretrained`, which says how to ask for access."""
    missing = f"No model folder at {name}"
    if _looks_local(name):
        raise FileNotFoundError(
            f"{missing}: no such path (and {name!r} is not a Hub model id 'namespace/name')"
        )
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # downloaded before: from_pretrained finds it, online or not
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"{missing}: no such path, and the Hub model {name} is not in the local cache "
            "(offline: HF_HUB_OFFLINE is set)"
        )
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"))  # one HEAD request, no retries
    except GatedRepoError:
        return
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{missing}: no such path, and the Hub has no model {name} (nor one this login may read)"
        ) from None
    except EntryNotFoundError:
        raise FileNotFoundError(
            f"{missing}: no such path, and the Hub repository {name} has no config.json (not a model)"
        ) from None
    except Exception as error:  # the HTTP client's connection errors and timeouts, a server error
        raise FileNotFoundError(
            f"{missing}: no such path, and the Hub could not be reached to look for a model of that name "
            f"({' '.join(str(error).split()) or type(error).__name__})"
        ) from None


@dataclass(frozen=True)
class ModelLanguages:
    """The languages a model folder records: its direction (`source` into `target`) when the record says which is
    which, else only the languages it knows (`known`, as a model card's `language` list gives them); `recorded_in`
    names the file."""

    known: tuple[str, ...]
    recorded_in: Path
    source: str | None = None
    target: str | None = None

    def describe(self) -> str:
        if self.source and self.target:
            return f"translates {self.source} into {self.target} (as {self.recorded_in} records)"
        return f"knows {', '.join(self.known)} (as {self.recorded_in} records)"


# The keys under which configs and tokenizer configs record a direction: transformers' Marian tokenizer
# (`source_lang`, `target_lang`), NLLB / M2M-style tokenizers (`src_lang`, `tgt_lang`), FSMT's `langs` pair.
_DIRECTION_KEYS = (("source_lang", "target_lang"), ("src_lang", "tgt_lang"))
_RECORDING_FILES = (
    "vaswani_export.json",  # an export, from the model it was exported from
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "source/tokenizer_config.json",
    "training_summary.json",  # a run folder: vaswani-train's summary
)


def _direction(record: dict) -> tuple[str, str] | None:
    if isinstance(record.get("languages"), dict):  # vaswani_export.json
        record = record["languages"]
    for source_key, target_key in _DIRECTION_KEYS:
        source, target = record.get(source_key), record.get(target_key)
        if isinstance(source, str) and isinstance(target, str) and source and target:
            return source, target
    langs = record.get("langs")
    if isinstance(langs, list) and len(langs) == 2 and all(isinstance(code, str) and code for code in langs):
        return langs[0], langs[1]
    return None


def model_languages(model_path: str | os.PathLike) -> ModelLanguages | None:
    """The languages a local model folder (or an export) records, or None when it records none. Read, in order: an
    export's `vaswani_export.json`, `config.json`, `generation_config.json`, the tokenizer's config (Marian, FSMT,
    NLLB-style keys), `training_summary.json` of the folder or, for a run's `averaged/` or `checkpoint-<step>/`
    folder, of the run folder around it; last the model card's `language` list (`README.md`), which says the
    languages but not the direction."""
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    candidates = [folder / name for name in _RECORDING_FILES]
    if folder.name == "averaged" or folder.name.startswith("checkpoint-"):
        candidates.append(folder.parent / "training_summary.json")
    for path in candidates:
        if not path.is_file():
            continue
        record = read_json(path)
        direction = _direction(record) if isinstance(record, dict) else None
        if direction:
            return ModelLanguages(direction, path, *direction)
        known = (record.get("languages") or {}).get("known") if path.name == "vaswani_export.json" else None
        if known:  # an export of a model whose card named its languages without a direction
            return ModelLanguages(tuple(known), path)
    card = folder / "README.md"
    if card.is_file():
        try:
            metadata = metadata_load(card) or {}
        except Exception:  # a card whose metadata is not YAML says nothing about languages
            metadata = {}
        languages = metadata.get("language")
        languages = [languages] if isinstance(languages, str) else languages
        if isinstance(languages, list) and languages and all(isinstance(code, str) for code in languages):
            tags = metadata.get("tags") or []
            if len(languages) == 2 and "vaswani" in tags:  # this package's cards list [source, target]
                return ModelLanguages(tuple(languages), card, *languages)
            return ModelLanguages(tuple(languages), card)
    return None


def _is_one_language(code: str) -> bool:
    """Whether a recorded code names one language (an ISO 639 code of 2 or 3 letters, with or without a region or
    script), not a group such as Marian's "ROMANCE" or ISO's "mul" (multiple) and "und" (undetermined)."""
    primary = code.replace("_", "-").split("-")[0]
    return 2 <= len(primary) <= 3 and primary.isalpha() and primary.lower() not in ("mul", "und")


def _same_language(given: str, recorded: str) -> bool:
    """Language codes compared without case, a region or script (`en-US` is `en`)."""
    primary = lambda code: code.lower().replace("_", "-").split("-")[0]  # noqa: E731
    return given.lower() == recorded.lower() or primary(given) == primary(recorded)


def check_model_languages(
    model_path: str | os.PathLike, source_lang: str | None, target_lang: str | None
) -> ModelLanguages | None:
    """Raise `UsageError` naming the flag when `source_lang` or `target_lang` (None: not given) is not a language the
    folder `model_path` records (`model_languages`), saying which it knows. Returns what it records (None: nothing;
    then the flags are not checked, and a warning says so when a flag was given)."""
    if source_lang is None and target_lang is None:
        return None
    languages = model_languages(model_path)
    if languages is None:
        if Path(model_path).is_dir():
            logger.warning(
                "%s records no languages (no source_lang/target_lang in its configs, no training_summary.json, "
                "no model card): --source_lang and --target_lang are not checked against the model",
                model_path,
            )
        return None
    for flag, given, recorded in (
        ("source_lang", source_lang, languages.source),
        ("target_lang", target_lang, languages.target),
    ):
        allowed = [recorded] if recorded else list(languages.known)
        if given is None or not all(_is_one_language(code) for code in allowed):
            continue  # e.g. Marian's "ROMANCE" or "mul": a group of languages, which this check cannot judge
        if not any(_same_language(given, code) for code in allowed):
            raise UsageError(f"--{flag} {given}: the model {model_path} {languages.describe()}")
    return languages


def check_decoding(
    num_beams: int, length_penalty: float, max_new_tokens: int | None = None, n_best: int = 1
) -> None:
    """Raise `ValueError` naming the setting that beam search cannot run with."""
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be at least 1, got {num_beams!r}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens!r}")
    if n_best < 1 or n_best > num_beams:
        raise ValueError(f"n_best must be between 1 and num_beams ({num_beams}), got {n_best!r}")


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


@dataclass
class Hypothesis:
    """One translation and its score: for beam search the beam's score, the summed log-probability divided by the
    length penalty lp(Y) (§6.1, `generation_vaswani.length_penalty_factor`); for greedy decoding the summed
    log-probability."""

    text: str
    score: float


@torch.inference_mode()
def translate(
    sentences: Iterable[str],
    model: PreTrainedModel,
    source_tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 64,
    max_tokens: int | None = None,
    num_beams: int = NUM_BEAMS,
    length_penalty: float | None = None,
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
        num_beams: §6.1's beam size 4 by default.
        length_penalty: alpha; `None` takes the model's generation config (§6.1's 0.6 for a model this package
            trained, unless `vaswani-train --length_penalty` chose another on validation).
        length_penalty_form: "gnmt" (((5 + |Y|) / 6) ** alpha, the form §6.1 cites) or "power" (|Y| ** alpha,
            transformers'); `None` leaves the model's generation config to decide (the paper's for this package's
            models). See `generation_vaswani.length_penalty_factor`.
        max_new_tokens: a fixed output limit; `None` gives §6.1's input length + `extra_output_tokens`, where
            the input length is the longest source of the batch.
        show_progress: a tqdm bar over sentences.
        generate_kwargs: further arguments of `model.generate` (e.g. `early_stopping`).
    """
    n_best = translate_n_best(
        sentences,
        model,
        source_tokenizer,
        target_tokenizer,
        n_best=1,
        batch_size=batch_size,
        max_tokens=max_tokens,
        num_beams=num_beams,
        length_penalty=length_penalty,
        length_penalty_form=length_penalty_form,
        max_new_tokens=max_new_tokens,
        extra_output_tokens=extra_output_tokens,
        show_progress=show_progress,
        with_scores=False,
        **generate_kwargs,
    )
    return [hypotheses[0].text for hypotheses in n_best]


@torch.inference_mode()
def translate_n_best(
    sentences: Iterable[str],
    model: PreTrainedModel,
    source_tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
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
    **generate_kwargs,
) -> list[list[Hypothesis]]:
    """The `n_best` best translations of each sentence, best first, with their scores (`Hypothesis`), as
    fairseq-generate's H lines or OpenNMT's `-n_best`. `n_best` is at most `num_beams`. An empty sentence gives
    `n_best` empty translations of score 0. `max_source_length` truncates longer sources (default: none is cut).
    The other arguments are `translate`'s; with `with_scores=False` the scores are not computed (0.0)."""
    length_penalty = length_penalty_of(model, length_penalty)
    check_decoding(num_beams, length_penalty, max_new_tokens, n_best)
    device = model.device
    if length_penalty_form is not None:
        generate_kwargs["length_penalty_form"] = length_penalty_form
    if with_scores:
        generate_kwargs.update(output_scores=True, return_dict_in_generate=True)

    def decode(sources: list[list[int]]) -> list[list[tuple[list[int], float]]]:
        inputs = source_tokenizer.pad({"input_ids": sources}, padding=True, return_tensors="pt").to(device)
        output = model.generate(
            **inputs,
            num_beams=num_beams,
            num_return_sequences=n_best,
            length_penalty=length_penalty,
            max_new_tokens=max_new_tokens or inputs["input_ids"].shape[1] + extra_output_tokens,
            **generate_kwargs,
        )
        sequences = output.sequences if with_scores else output
        scores = _sequence_scores(model, output, num_beams) if with_scores else [0.0] * len(sequences)
        rows = list(zip(sequences.tolist(), scores, strict=True))
        return [rows[k * n_best : (k + 1) * n_best] for k in range(len(sources))]

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


def decode_in_batches(
    sentences: Iterable[str],
    decode: Callable[[list[list[int]]], list[list[tuple[list[int], float]]]],
    source_tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None,
    n_best: int,
    batch_size: int,
    max_tokens: int | None,
    max_source_length: int | None,
    show_progress: bool,
) -> list[list[Hypothesis]]:
    """What every decoder of `translate_n_best` (the PyTorch model, or an exported one in `vaswani.interop.engines`) shares:
    encode, batch by length (`make_batches`), `decode` each batch's token ids into `n_best` (ids, score) rows per
    source, detokenize, and return them in input order; empty sentences give `n_best` empty translations of score
    0 without decoding."""
    sentences = list(sentences)  # e.g. a `datasets` column
    target_tokenizer = target_tokenizer or source_tokenizer
    results = [[Hypothesis("", 0.0)] * n_best for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    truncation = {"truncation": True, "max_length": max_source_length} if max_source_length else {}
    encoded = source_tokenizer([sentences[i] for i in todo], **truncation)["input_ids"] if todo else []
    with tqdm(total=len(sentences), desc="Translating", unit="sent", disable=not show_progress) as progress:
        progress.update(len(sentences) - len(todo))  # the empty lines
        for batch in make_batches([len(ids) for ids in encoded], batch_size, max_tokens):
            for j, rows in zip(batch, decode([encoded[j] for j in batch]), strict=True):
                texts = target_tokenizer.batch_decode([ids for ids, _ in rows], skip_special_tokens=True)
                results[todo[j]] = [
                    Hypothesis(text, float(score)) for text, (_, score) in zip(texts, rows, strict=True)
                ]
            progress.update(len(batch))
    return results


def _sequence_scores(model: PreTrainedModel, output, num_beams: int) -> list[float]:
    """Beam search: the beams' own scores. Greedy: the summed log-probabilities of the tokens up to `</s>`."""
    if num_beams > 1:
        return output.sequences_scores.tolist()
    steps = model.compute_transition_scores(output.sequences, output.scores, normalize_logits=True)  # (B, T)
    generated = output.sequences[:, -steps.shape[1] :]
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, int) else (eos[0] if eos else None)
    # a token counts up to and including the first </s>; after it, the rows are padding
    ended_before = torch.zeros_like(generated, dtype=torch.bool)
    if eos is not None:
        is_eos = (generated == eos).long()
        ended_before = (is_eos.cumsum(dim=1) - is_eos) > 0
    return steps.masked_fill(ended_before, 0.0).sum(dim=1).tolist()


def read_sentences(path: str | os.PathLike | None) -> list[str]:
    """The lines of a UTF-8 file (`.gz` allowed), or of standard input for `None` or "-". A line that is not UTF-8
    raises `ValueError` naming the file (or standard input) and the line."""
    if path is None or str(path) == "-":
        return list(stdin_lines())
    return list(read_lines(path))


def stdin_lines() -> Iterator[str]:
    """The lines of standard input as they arrive (UTF-8, without line ends); `ValueError` names a bad line."""
    for number, raw in enumerate(iter(sys.stdin.buffer.readline, b""), start=1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"standard input, line {number}: not UTF-8 text ({error.reason} at byte {error.start} of the line)"
            ) from None


def _one_line(text: str) -> str:
    """A translation as one output line: a line break the decoder produced would shift all later lines."""
    return text.replace("\r", " ").replace("\n", " ")


def write_sentences(sentences: Iterable[str], path: str | os.PathLike | None) -> None:
    """Write one sentence a line to a UTF-8 file, or to standard output for `None` or "-".

    A file appears whole when everything is written (`fileio.atomic_write`): a kill leaves the earlier file as it
    was, and two processes writing one path leave one complete file, never a mix."""
    write_lines((_one_line(sentence) for sentence in sentences), path)


def write_lines(lines: Iterable[str], path: str | os.PathLike | None) -> None:
    """Write lines (without their line end) to a UTF-8 file atomically, or to standard output for `None` or "-"."""
    ended: Iterator[str] = (line + "\n" for line in lines)
    if path is None or str(path) == "-":
        stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=True)
        stdout.writelines(ended)
        stdout.flush()
        stdout.detach()  # leave sys.stdout's buffer open
        return
    with atomic_write(path) as f:
        f.writelines(ended)


def format_n_best(index: int, hypotheses: Sequence[Hypothesis]) -> list[str]:
    """The output lines of one source's n-best list: `index<TAB>score<TAB>translation`, best first."""
    return [f"{index}\t{h.score:.4f}\t{_one_line(h.text)}" for h in hypotheses]


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
    if not translations:
        raise ValueError("No translations to score: the input was empty")
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
    "Hypothesis",
    "ModelLanguages",
    "check_model_languages",
    "check_decoding",
    "check_hub_model",
    "check_model_path",
    "default_device",
    "format_n_best",
    "length_penalty_of",
    "load_translation_model",
    "make_batches",
    "model_languages",
    "read_sentences",
    "score_translations",
    "stdin_lines",
    "translate",
    "translate_n_best",
    "write_lines",
    "write_sentences",
]
