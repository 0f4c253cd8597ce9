"""Publish a trained model to the Hugging Face Hub so that plain `transformers` can load and run it.

`publish` turns a trained model folder (what `Trainer.save_model` writes: `config.json`, safetensors weights and,
usually, the tokenizer) into the folder that goes to the Hub, and uploads it in one commit:

- `model.safetensors` (never pickle files) and `config.json`, whose `auto_map` names `AutoConfig`, `AutoModel` and
  `AutoModelForSeq2SeqLM`, and whose `custom_pipelines` names the translation pipeline;
- the code files (`configuration_vaswani.py`, `modeling_vaswani.py`, its siblings and `pipeline_vaswani.py`), so that
  `trust_remote_code=True` works where this package is not installed;
- `generation_config.json` with the model folder's decoding settings, the paper's where it has none (beam size 4,
  length penalty 0.6 in the form ((5 + |Y|) / 6) ** alpha that §6.1 cites);
- the tokenizer (`tokenizer.json`, `tokenizer_config.json`);
- `README.md`, the model card rendered from `hub_card.md` with metadata and a `model-index` of the run's scores.

The folder is built completely and checked before anything is uploaded. Bad input (an invalid repo id, no token,
a model folder without weights or tokenizer) raises before the first call to the Hub.

Two JSON files describe the run. Every key is optional unless noted; other keys (such as the rest of what
`vaswani.metrics.compute_bleu` returns) are ignored; keys may carry a `test_`, `eval_` or `predict_` prefix, as
`Trainer` metrics do:

- evaluation results (`EvalResults`): `bleu` (required), `bleu_signature` (sacreBLEU's signature string), `chrf`,
  `chrf_signature`, `bleu_lowercase_moses_tokenized` and its `_signature` (BLEU comparable to published Multi30k
  figures), `bleu_tokenized` and its `_signature` (the paper's tokenized BLEU with compounds split, as on WMT), `dataset` (Hub id, short name or local path), `dataset_name` (display name), `dataset_config` (e.g.
  `"de-en"`), `split` (default `"test"`), `num_beams`, `length_penalty` and `length_penalty_form` (how the test set was
  decoded);
- training summary (`TrainingSummary`): `source_lang` and `target_lang` (required), `dataset`, `preset`, `steps`,
  `batch_tokens`, `schedule`, `warmup_steps`, `peak_learning_rate`, `hardware`, `precision` (e.g. `"fp32"`,
  `"bf16 autocast"`), `label_smoothing` (ε_ls of the training loss), `train_runtime` (seconds).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import CommitInfo, EvalResult, HfApi, ModelCard, ModelCardData, get_token
from huggingface_hub.utils import validate_repo_id
from transformers import PreTrainedTokenizerFast

from .fileio import atomic_folder
from .generation_vaswani import PAPER_DECODING
from .modeling_vaswani import VaswaniForConditionalGeneration
from .tokenization import lowercases
from .utils_vaswani import AUTO_MAP, CODE_FILES, CUSTOM_PIPELINES

logger = logging.getLogger(__name__)

# Package data: installed with the package (pyproject's package-data), so publishing works from any install.
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "hub_card.md"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Deleted from the repo in the same commit, so that a re-published repo holds no stale pickled weights.
PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt"]
AUTO_CLASSES = AUTO_MAP
TAGS = ["translation", "transformer", "attention-is-all-you-need", "vaswani", "custom_code"]
_METRIC_PREFIXES = ("test_", "eval_", "predict_")
# One sentence per source language for the card's usage example.
_EXAMPLES = {
    "de": "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "en": "A man is riding a bicycle through the city.",
    "fr": "Un homme traverse la ville à vélo.",
}


class PublishError(ValueError):
    """The inputs cannot make a valid published model; raised before anything is uploaded."""


# --------------------------------------------------------------------------------------------------------------------
# What the run reports: evaluation results and training summary
# --------------------------------------------------------------------------------------------------------------------
def _from_dict(cls, values: dict, what: str, path: str | os.PathLike | None = None):
    known = {field.name for field in dataclasses.fields(cls)}
    kwargs, unknown = {}, []
    for key, value in values.items():
        name = next(
            (key[len(p) :] for p in _METRIC_PREFIXES if key.startswith(p) and key[len(p) :] in known), key
        )
        if name in known:
            kwargs[name] = value
        else:
            unknown.append(key)
    if unknown:
        logger.info("Ignoring keys the card does not use in the %s: %s", what, sorted(unknown))
    where = f"The {what} file {str(path)!r}" if path is not None else f"The {what}"
    try:
        return cls(**kwargs)
    except TypeError as error:  # a required field is missing
        raise PublishError(f"{where} lacks a required key: {error}") from None
    except ValueError as error:  # a value the card cannot state
        raise PublishError(f"{where}: {error}") from None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_json(path: str | os.PathLike, what: str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise PublishError(f"No {what} file at {str(path)!r}.")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise PublishError(f"The {what} file {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise PublishError(f"The {what} file {str(path)!r} must hold a JSON object.")
    return values


@dataclass
class EvalResults:
    """Scores of the published model on a test set, as computed by sacreBLEU (corpus level, 0-100)."""

    bleu: float
    bleu_signature: str | None = None
    chrf: float | None = None
    chrf_signature: str | None = None
    bleu_lowercase_moses_tokenized: float | None = None
    bleu_lowercase_moses_tokenized_signature: str | None = None
    bleu_tokenized: float | None = None
    bleu_tokenized_signature: str | None = None
    dataset: str | None = None
    dataset_name: str | None = None
    dataset_config: str | None = None
    split: str = "test"
    num_beams: int | None = None
    length_penalty: float | None = None
    length_penalty_form: str | None = None

    def __post_init__(self):
        for name in ("bleu", "chrf", "bleu_lowercase_moses_tokenized", "bleu_tokenized"):
            value = getattr(self, name)
            if value is None and name != "bleu":
                continue
            if not _is_number(value) or not 0 <= value <= 100:
                raise ValueError(f"{name!r} must be a score between 0 and 100, got {value!r}")
        if self.num_beams is not None and (not isinstance(self.num_beams, int) or self.num_beams < 1):
            raise ValueError(f"'num_beams' must be a positive integer, got {self.num_beams!r}")
        if self.length_penalty is not None and not _is_number(self.length_penalty):
            raise ValueError(f"'length_penalty' must be a number, got {self.length_penalty!r}")
        for name in (
            "bleu_signature",
            "chrf_signature",
            "dataset",
            "dataset_name",
            "split",
            "length_penalty_form",
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name!r} must be a string, got {value!r}")

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> EvalResults:
        return _from_dict(cls, _read_json(path, "evaluation results"), "evaluation results", path)


@dataclass
class TrainingSummary:
    """How the published model was trained: what the card reports as the training recipe."""

    source_lang: str
    target_lang: str
    dataset: str | None = None
    preset: str | None = None
    steps: int | None = None
    batch_tokens: int | None = None
    schedule: str | None = None
    warmup_steps: int | None = None
    peak_learning_rate: float | None = None
    hardware: str | None = None
    precision: str | None = None
    label_smoothing: float | None = None
    train_runtime: float | None = None

    def __post_init__(self):
        for name in ("source_lang", "target_lang"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name!r} must be a language code, got {getattr(self, name)!r}")
        for name in ("steps", "batch_tokens", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name!r} must be a whole number, got {value!r}")
        for name in ("peak_learning_rate", "label_smoothing", "train_runtime"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value < 0):
                raise ValueError(f"{name!r} must be a non-negative number, got {value!r}")

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> TrainingSummary:
        return _from_dict(cls, _read_json(path, "training summary"), "training summary", path)

    @property
    def train_time(self) -> str | None:
        """`train_runtime` for people: "3 h 05 min", "12 min", "40 s"."""
        if self.train_runtime is None:
            return None
        seconds = round(self.train_runtime)
        hours, minutes = seconds // 3600, seconds % 3600 // 60
        if hours:
            return f"{hours} h {minutes:02d} min"
        return f"{minutes} min" if minutes else f"{seconds} s"


# --------------------------------------------------------------------------------------------------------------------
# Checks on the inputs, all before anything is built or uploaded
# --------------------------------------------------------------------------------------------------------------------
def check_repo_id(repo_id: str) -> None:
    """Raise `PublishError` unless `repo_id` is a valid model repo id ("name" or "namespace/name")."""
    try:
        validate_repo_id(repo_id)
    except ValueError as error:  # HFValidationError
        raise PublishError(f"Invalid repo id {repo_id!r}: {error}") from None


def resolve_token(token: str | None = None) -> str:
    """The token to upload with: `token`, else `HF_TOKEN` or the one saved by `hf auth login`."""
    token = token or get_token()
    if not token:
        raise PublishError(
            "No Hugging Face token: pass `token` (`--token`), set the HF_TOKEN environment variable, "
            "or log in with `hf auth login`."
        )
    return token


def check_model_dir(model_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None) -> None:
    """Raise `PublishError` unless `model_dir` holds a config and weights and `tokenizer_dir` a fast tokenizer."""
    model_dir = Path(model_dir)
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else model_dir
    if not (model_dir / "config.json").is_file():
        raise PublishError(f"{str(model_dir)!r} is not a model folder: it has no config.json.")
    if not any((model_dir / name).is_file() for name in WEIGHT_FILES):
        raise PublishError(
            f"{str(model_dir)!r} has no weights (none of {', '.join(WEIGHT_FILES)}): pass the folder that "
            "`Trainer.save_model` or `save_pretrained` wrote."
        )
    if not (tokenizer_dir / "tokenizer.json").is_file():
        if (tokenizer_dir / "source").is_dir() or (tokenizer_dir / "target").is_dir():
            raise PublishError(
                f"{str(tokenizer_dir)!r} holds separate source and target tokenizers; a published model "
                "needs one shared tokenizer (tokenizer.json)."
            )
        raise PublishError(
            f"{str(tokenizer_dir)!r} has no tokenizer (tokenizer.json): save the tokenizer with the model or "
            "pass `tokenizer_dir`."
        )


def _check_tokenizer(tokenizer: PreTrainedTokenizerFast, model: VaswaniForConditionalGeneration) -> None:
    config = model.config
    for name in ("pad_token_id", "eos_token_id"):
        if getattr(tokenizer, name) != getattr(config, name):
            raise PublishError(
                f"The tokenizer's {name} ({getattr(tokenizer, name)}) differs from the model's ({getattr(config, name)})."
            )
    if len(tokenizer) > config.vocab_size:
        raise PublishError(f"The tokenizer has {len(tokenizer)} tokens, the model only {config.vocab_size}.")


# --------------------------------------------------------------------------------------------------------------------
# The model card
# --------------------------------------------------------------------------------------------------------------------
def _is_hub_dataset(name: str) -> bool:
    """Whether `name` reads as a Hub dataset id ("wmt14", "bentrevett/multi30k") rather than a local path."""
    if Path(name).is_absolute() or name.startswith(".") or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except ValueError:
        return False
    return True


def _dataset_type(name: str) -> str:
    """The model-index `dataset.type`: the Hub id, or the folder or file name of a local dataset."""
    return name if _is_hub_dataset(name) else Path(name).name.split(".")[0] or "custom"


# The license of a card whose publisher chose none: "other", with the card saying that the training data's terms
# apply. A permissive default would license weights trained on data whose terms forbid it (Multi30k is for
# non-commercial research and education only).
UNSET_LICENSE = "other"


def card_metadata(
    model_name: str,
    results: EvalResults | None,
    summary: TrainingSummary | None,
    license: str | None = None,
    dataset_tags: list[str] | None = None,
) -> ModelCardData:
    """The card's YAML metadata: languages, license, datasets, metrics, tags and the `model-index` of `results`.
    `dataset_tags`: the Hub ids of the training data when it was read from a local copy (a local folder has no Hub
    id the card could name)."""
    eval_results = None
    hub_name = dataset_tags[0] if dataset_tags else None
    if results is not None:
        named = results.dataset or (summary.dataset if summary else None) or "custom"
        dataset_type = hub_name if hub_name and not _is_hub_dataset(named) else _dataset_type(named)
        common = dict(
            task_type="translation",
            task_name="Translation",
            dataset_type=dataset_type,
            dataset_name=results.dataset_name or dataset_type,
            dataset_config=results.dataset_config,
            dataset_split=results.split,
        )
        scores = [
            ("bleu", "BLEU (sacreBLEU)", results.bleu, results.bleu_signature),
            ("chrf", "chrF (sacreBLEU)", results.chrf, results.chrf_signature),
            (
                "bleu",
                "BLEU (lowercased, Moses-tokenized)",
                results.bleu_lowercase_moses_tokenized,
                results.bleu_lowercase_moses_tokenized_signature,
            ),
            (
                "bleu",
                "BLEU (Moses-tokenized, compounds split: the paper's)",
                results.bleu_tokenized,
                results.bleu_tokenized_signature,
            ),
        ]
        eval_results = [
            EvalResult(
                metric_type=kind, metric_name=name, metric_value=round(value, 2), metric_config=sig, **common
            )
            for kind, name, value, sig in scores
            if value is not None
        ]
    named = {
        summary.dataset if summary else None,
        results.dataset if results else None,
        *(dataset_tags or []),
    }
    datasets = [d for d in named if d and _is_hub_dataset(d)]
    return ModelCardData(
        model_name=model_name,
        language=[summary.source_lang, summary.target_lang] if summary else None,
        license=license or UNSET_LICENSE,
        datasets=sorted(datasets) or None,
        metrics=["bleu", "chrf"],
        tags=list(TAGS),
        library_name="transformers",
        pipeline_tag="translation",
        eval_results=eval_results,
    )


def _training_data(summary: TrainingSummary | None, dataset_tags: list[str] | None) -> str | None:
    """How the card names the training data: its Hub id, else the name of its local folder or file."""
    if summary is None or not summary.dataset:
        return dataset_tags[0] if dataset_tags else None
    if _is_hub_dataset(summary.dataset) or not dataset_tags:
        return _dataset_type(summary.dataset)
    return dataset_tags[0]


def render_card(
    model: VaswaniForConditionalGeneration,
    repo_id: str,
    results: EvalResults | None = None,
    summary: TrainingSummary | None = None,
    template_path: str | os.PathLike | None = None,
    license: str | None = None,
    example_text: str | None = None,
    lowercase: bool = False,
    dataset_tags: list[str] | None = None,
) -> ModelCard:
    """Render the model card from the Jinja template `hub_card.md` (or `template_path`) and check it. `lowercase`:
    the tokenizer lowercases what it encodes (`train_bpe_tokenizer(lowercase=True)`), which the card states."""
    template_path = Path(template_path) if template_path is not None else DEFAULT_TEMPLATE
    if not template_path.is_file():
        raise PublishError(f"No model card template at {str(template_path)!r}.")
    model_name = repo_id.rstrip("/").split("/")[-1]
    data = card_metadata(model_name, results, summary, license=license, dataset_tags=dataset_tags)
    config = model.config
    if example_text is None:
        example_text = _EXAMPLES.get(summary.source_lang if summary else "", "Hello world!")
    card = ModelCard.from_template(
        data,
        template_path=str(template_path),
        repo_id=repo_id,
        # Python string literals for the usage example: JSON strings are valid Python.
        repo_literal=json.dumps(repo_id, ensure_ascii=False),
        example_literal=json.dumps(example_text, ensure_ascii=False),
        model_name=model_name,
        config=config,
        num_parameters=f"{model.num_parameters():,}",
        num_parameters_millions=f"{model.num_parameters() / 1e6:.1f}M",
        generation=model.generation_config,
        results=results,
        summary=summary,
        training_data=_training_data(summary, dataset_tags),
        license_chosen=bool(license),
        test_data=data.eval_results[0].dataset_name if data.eval_results else None,
        example_text=example_text,
        lowercase=lowercase,
    )
    validate_card(str(card))
    return card


def validate_card(text: str) -> ModelCard:
    """Check a card offline (`ModelCard.validate` asks the Hub): its YAML parses into valid `ModelCardData`, the
    `model-index` into `EvalResult`s, and it names the library, task and license; every placeholder was filled."""
    card = ModelCard(text)  # raises on a malformed model-index
    data = card.data
    missing = [key for key in ("library_name", "pipeline_tag", "license") if not getattr(data, key, None)]
    if missing:
        raise PublishError(f"The model card metadata lacks {missing}.")
    if data.library_name != "transformers" or data.pipeline_tag != "translation":
        raise PublishError(
            "The model card must declare `library_name: transformers` and `pipeline_tag: translation`."
        )
    ModelCardData(**data.to_dict())  # round trip: the metadata rebuilds from its own dict
    if "{{" in card.text or "{%" in card.text:
        raise PublishError("The model card has unrendered template placeholders.")
    return card


# --------------------------------------------------------------------------------------------------------------------
# The folder that is published
# --------------------------------------------------------------------------------------------------------------------
def _saved_generation(model_dir) -> dict:
    """The keys the folder's `generation_config.json` sets (empty without one)."""
    path = Path(model_dir, "generation_config.json")
    return json.loads(path.read_text()) if path.exists() else {}


def build_folder(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    repo_id: str | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    results: EvalResults | None = None,
    summary: TrainingSummary | None = None,
    template_path: str | os.PathLike | None = None,
    license: str | None = None,
    example_text: str | None = None,
    dataset_tags: list[str] | None = None,
) -> Path:
    """Write the folder to publish into `output_dir` (which must be new or empty) and check it.

    `repo_id` names the model in the card's usage example; without one, the example loads `output_dir`.
    """
    check_model_dir(model_dir, tokenizer_dir)
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise PublishError(f"{str(output_dir)!r} is not empty: the published folder must hold nothing else.")
    if summary is None:
        logger.warning("No training summary: the card will not state the languages or the training recipe.")
    if results is None:
        logger.warning("No evaluation results: the card will have no model-index.")

    model = VaswaniForConditionalGeneration.from_pretrained(model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        tokenizer_dir if tokenizer_dir is not None else model_dir
    )
    _check_tokenizer(tokenizer, model)
    model.config.use_cache = True  # Trainer saves use_cache=False; decoding wants the cache
    # The folder's own decoding (vaswani-train --length_penalty may have chosen alpha on validation), the paper's for
    # what it does not say. setattr, not update(): a generation config saved before `length_penalty_form` existed
    # lacks the key, and update() skips keys it lacks; nor may it stay marked as made from the model config, whose
    # loading drops it.
    saved = _saved_generation(model_dir)
    for key, value in PAPER_DECODING.items():
        setattr(model.generation_config, key, saved.get(key, value))
    model.generation_config._from_model_config = False

    card = render_card(
        model,
        repo_id or str(output_dir.resolve()),
        results=results,
        summary=summary,
        template_path=template_path,
        license=license,
        example_text=example_text,
        lowercase=lowercases(tokenizer),
        dataset_tags=dataset_tags,
    )
    # Built beside `output_dir` and renamed into place once checked: a folder there is complete.
    with atomic_folder(output_dir) as building:
        # weights, configs, code, pipeline, custom_generate (utils_vaswani.CODE_FILES)
        model.save_pretrained(building)
        tokenizer.save_pretrained(building)
        card.save(building / "README.md")
        check_folder(building)
    return output_dir


def check_folder(folder: str | os.PathLike) -> None:
    """Raise `PublishError` unless `folder` is exactly what is published: safetensors weights, no pickles, the code
    files, a config whose `auto_map` and `custom_pipelines` point at them, the tokenizer, and a valid card."""
    folder = Path(folder)
    names = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    required = {"config.json", "generation_config.json", "README.md", *CODE_FILES, *TOKENIZER_FILES}
    if missing := sorted(required - names):
        raise PublishError(f"{str(folder)!r} lacks {missing}.")
    shards = {name for name in names if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors", name)}
    if not shards:
        raise PublishError(f"{str(folder)!r} has no safetensors weights.")
    if len(shards) > 1:
        required.add("model.safetensors.index.json")
    if extra := sorted(names - required - shards):
        raise PublishError(f"{str(folder)!r} holds files that should not be published: {extra}.")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if config.get("auto_map") != AUTO_CLASSES:
        raise PublishError(f"config.json has auto_map {config.get('auto_map')}, expected {AUTO_CLASSES}.")
    impl = config.get("custom_pipelines", {}).get("translation", {}).get("impl")
    if impl != CUSTOM_PIPELINES["translation"]["impl"]:
        raise PublishError(f"config.json does not register the translation pipeline (found {impl!r}).")
    validate_card((folder / "README.md").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------------------------------
# Upload and the one-call entry point
# --------------------------------------------------------------------------------------------------------------------
def upload_folder(
    folder: str | os.PathLike,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
) -> CommitInfo:
    """Upload a checked folder to `repo_id` in one commit, creating the repo (and branch `revision`) if needed.

    `private` applies when the repo is created; an existing repo keeps its visibility. Pickled files already in the
    repo are deleted in the same commit.
    """
    check_repo_id(repo_id)
    token = resolve_token(token)
    check_folder(folder)
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    if revision is not None and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        repo_type="model",
        revision=revision,
        commit_message=commit_message or "Upload Transformer (Vaswani et al., 2017) translation model",
        delete_patterns=PICKLE_PATTERNS,
        create_pr=create_pr,
    )


@dataclass
class Published:
    """What `publish` did: the folder it built (None when it was a temporary one) and the commit, if it pushed."""

    folder: Path | None
    commit: CommitInfo | None


def publish(
    model_dir: str | os.PathLike,
    repo_id: str | None = None,
    output_dir: str | os.PathLike | None = None,
    *,
    dry_run: bool = False,
    tokenizer_dir: str | os.PathLike | None = None,
    results: EvalResults | str | os.PathLike | None = None,
    summary: TrainingSummary | str | os.PathLike | None = None,
    private: bool | None = None,
    revision: str | None = None,
    token: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    template_path: str | os.PathLike | None = None,
    license: str | None = None,
    example_text: str | None = None,
    dataset_tags: list[str] | None = None,
) -> Published:
    """Build the publishable folder from a trained model folder and push it to `repo_id` in one commit.

    - `repo_id` only: build in a temporary folder, push.
    - `repo_id` and `output_dir`: build in `output_dir` (kept), push.
    - `output_dir` only, or `dry_run=True`: build in `output_dir`, push nothing.

    A `repo_id` without namespace goes to the token's user (one `whoami` call). `results` and `summary` are
    `EvalResults` / `TrainingSummary` objects or paths of their JSON files. Every check
    (repo id, token, input folders, output folder) runs before the model is loaded, and the built folder is checked
    before it is uploaded.
    """
    push = repo_id is not None and not dry_run
    if repo_id is None and output_dir is None:
        raise PublishError("Nothing to do: give a `repo_id` to push to, or an `output_dir` for a dry run.")
    if dry_run and output_dir is None:
        raise PublishError("A dry run writes the folder to `output_dir`; give one.")
    if repo_id is not None:
        check_repo_id(repo_id)
    if push:
        token = resolve_token(token)
        if "/" not in repo_id:  # the card's usage example needs the full id: the token's user namespace
            repo_id = f"{HfApi(token=token).whoami()['name']}/{repo_id}"
    check_model_dir(model_dir, tokenizer_dir)
    if results is not None and not isinstance(results, EvalResults):
        results = EvalResults.from_json(results)
    if summary is not None and not isinstance(summary, TrainingSummary):
        summary = TrainingSummary.from_json(summary)
    build = dict(
        model_dir=model_dir,
        repo_id=repo_id,
        tokenizer_dir=tokenizer_dir,
        results=results,
        summary=summary,
        template_path=template_path,
        license=license,
        example_text=example_text,
        dataset_tags=dataset_tags,
    )
    upload = dict(
        repo_id=repo_id,
        token=token,
        private=private,
        revision=revision,
        commit_message=commit_message,
        create_pr=create_pr,
    )
    if output_dir is not None:
        folder = build_folder(output_dir=output_dir, **build)
        commit = upload_folder(folder, **upload) if push else None
        return Published(folder=folder, commit=commit)
    with tempfile.TemporaryDirectory(prefix="vaswani-publish-") as tmp:
        folder = build_folder(output_dir=tmp, **build)
        return Published(folder=None, commit=upload_folder(folder, **upload))


__all__ = [
    "EvalResults",
    "TrainingSummary",
    "PublishError",
    "Published",
    "publish",
    "build_folder",
    "check_folder",
    "check_model_dir",
    "check_repo_id",
    "resolve_token",
    "render_card",
    "card_metadata",
    "validate_card",
    "upload_folder",
]
