"""The model card of a published model and what it reports: the run's evaluation results and training summary.

`render_card` fills the Jinja template `hub_card.md` (package data) with the model's configuration and decoding, the
scores and the training recipe, and `validate_card` checks a card offline; `vaswani.publishing.hub.publish` puts it in the
published folder as `README.md`.

Two JSON files describe the run. Every key is optional unless noted; other keys (such as the rest of what
`vaswani.recipe.metrics.compute_bleu` returns) are ignored; keys may carry a `test_`, `eval_` or `predict_` prefix, as
`Trainer` metrics do:

- evaluation results (`EvalResults`): `bleu` (required), `bleu_signature` (sacreBLEU's signature string), `chrf`,
  `chrf_signature`, `bleu_lowercase_moses_tokenized` and its `_signature` (BLEU comparable to published Multi30k
  figures), `bleu_tokenized` and its `_signature` (the paper's tokenized BLEU with compounds split, as on WMT),
  `dataset` (Hub id, short name or local path), `dataset_name` (display name), `dataset_config` (e.g.
  `"de-en"`), `split` (default `"test"`), `num_beams`, `length_penalty` and `length_penalty_form` (how the test set was
  decoded);
- training summary (`TrainingSummary`): `source_lang` and `target_lang` (required), `dataset`, `preset`, `steps`,
  `batch_tokens`, `schedule`, `warmup_steps`, `peak_learning_rate`, `hardware`, `precision` (e.g. `"fp32"`,
  `"bf16 autocast"`), `label_smoothing` (ε_ls of the training loss), `train_runtime` (seconds).
"""

import dataclasses
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import validate_repo_id

from ..common.errors import PublishError

logger = logging.getLogger(__name__)

# Package data: installed with the package (pyproject's package-data), so publishing works from any install.
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "hub_card.md"
_METRIC_PREFIX = re.compile("^(test|eval|predict)_")
# One sentence per source language for the card's usage example.
_EXAMPLES = {
    "de": "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "en": "A man is riding a bicycle through the city.",
    "fr": "Un homme traverse la ville à vélo.",
}


# --------------------------------------------------------------------------------------------------------------------
# What the run reports: evaluation results and training summary
# --------------------------------------------------------------------------------------------------------------------
def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_SCORE = (lambda value: _is_number(value) and 0 <= value <= 100, "a score between 0 and 100")
_STRING = (lambda value: isinstance(value, str), "a string")
_WHOLE = (lambda value: type(value) is int and value >= 0, "a whole number")  # an int, not a bool
_NON_NEGATIVE = (lambda value: _is_number(value) and value >= 0, "a non-negative number")
_LANGUAGE = (lambda value: value and isinstance(value, str), "a language code")
# What each field of the run's records must hold: (test, what the error says it must be).
_RULES = {
    **dict.fromkeys(("bleu", "chrf", "bleu_lowercase_moses_tokenized", "bleu_tokenized"), _SCORE),
    **dict.fromkeys(
        ("bleu_signature", "chrf_signature", "dataset", "dataset_name", "split", "length_penalty_form"),
        _STRING,
    ),
    "num_beams": (lambda value: isinstance(value, int) and value >= 1, "a positive integer"),
    "length_penalty": (_is_number, "a number"),
    **dict.fromkeys(("source_lang", "target_lang"), _LANGUAGE),
    **dict.fromkeys(("steps", "batch_tokens", "warmup_steps"), _WHOLE),
    **dict.fromkeys(("peak_learning_rate", "label_smoothing", "train_runtime"), _NON_NEGATIVE),
}


class _RunRecord:
    """A JSON file of the run read as a dataclass: each field checked by its rule in `_RULES` (None passes for a
    field with a default), `ValueError` naming the first that fails."""

    def __post_init__(self):
        for name, field in self.__dataclass_fields__.items():
            value = getattr(self, name)
            if name in _RULES and (value is not None or field.default is dataclasses.MISSING):
                test, what = _RULES[name]
                if not test(value):
                    raise ValueError(f"{name!r} must be {what}, got {value!r}")

    @classmethod
    def from_json(cls, path):
        """The record in a JSON file of the run: keys with a `Trainer` prefix (`test_`, ...) read as theirs, other
        keys ignored (logged); `PublishError` names the file that is missing, not a JSON object, or lacks or breaks
        a field."""
        where = f"The {cls.what} file {str(path)!r}"
        if not Path(path).is_file():
            raise PublishError(f"No {cls.what} file at {str(path)!r}.")
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except ValueError as error:  # UnicodeDecodeError too
            raise PublishError(f"{where} is not valid JSON: {error}") from None
        if not isinstance(values, dict):
            raise PublishError(f"{where} must hold a JSON object.")
        # "bleu", or "test_bleu" read as "bleu"
        unknown = sorted(key for key in values if _METRIC_PREFIX.sub("", key) not in cls.__dataclass_fields__)
        if unknown:
            logger.info("Ignoring keys the card does not use in the %s: %s", cls.what, unknown)
        kwargs = {_METRIC_PREFIX.sub("", key): value for key, value in values.items() if key not in unknown}
        try:
            return cls(**kwargs)
        except TypeError as error:  # a required field is missing
            raise PublishError(f"{where} lacks a required key: {error}") from None
        except ValueError as error:  # a value the card cannot state
            raise PublishError(f"{where}: {error}") from None


@dataclass
class EvalResults(_RunRecord):
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

    what = "evaluation results"


@dataclass
class TrainingSummary(_RunRecord):
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

    what = "training summary"

    @property
    def train_time(self):
        """`train_runtime` for people: "3 h 05 min", "12 min", "40 s"."""
        if self.train_runtime is None:
            return None
        seconds = round(self.train_runtime)
        hours, minutes = divmod(seconds // 60, 60)
        if hours:
            return f"{hours} h {minutes:02d} min"
        return f"{minutes} min" if minutes else f"{seconds} s"


# --------------------------------------------------------------------------------------------------------------------
# The model card
# --------------------------------------------------------------------------------------------------------------------
def is_repo_id(name):
    """Whether `name` is a valid Hub repo id ("name" or "namespace/name"); one that is not ("/data", "./x", "~/x",
    "a/b/c", "x/") can only be a local path."""
    try:
        validate_repo_id(name)
    except ValueError:
        return False
    return True


def _is_hub_dataset(name):
    """Whether `name` reads as a Hub dataset id ("wmt14", "bentrevett/multi30k") rather than a local path."""
    return is_repo_id(name) and not Path(name).exists()


def _dataset_id(named, dataset_tags):
    """How the card names a dataset (the model-index `dataset.type`, the training data): its Hub id; for a local
    copy, the first of `dataset_tags` (the Hub ids of the data), else the folder or file name."""
    if named and _is_hub_dataset(named):
        return named
    if dataset_tags:
        return dataset_tags[0]
    return named and (Path(named).name.split(".")[0] or "custom")


# The license of a card whose publisher chose none: "other", with the card saying that the training data's terms
# apply. A permissive default would license weights trained on data whose terms forbid it (Multi30k is for
# non-commercial research and education only).
UNSET_LICENSE = "other"


def card_metadata(model_name, results, summary, license, dataset_tags):
    """The card's YAML metadata: languages, license, datasets, metrics, tags and the `model-index` of `results`.
    `dataset_tags`: the Hub ids of the training data when it was read from a local copy (a local folder has no Hub
    id the card could name)."""
    eval_results = None
    if results:
        dataset_type = _dataset_id(results.dataset or (summary and summary.dataset) or "custom", dataset_tags)
        common = dict(
            task_type="translation",
            task_name="Translation",
            dataset_type=dataset_type,
            dataset_name=results.dataset_name or dataset_type,
            dataset_config=results.dataset_config,
            dataset_split=results.split,
        )
        scores = [  # (metric type, name on the card, EvalResults field, whose signature is the field + "_signature")
            ("bleu", "BLEU (sacreBLEU)", "bleu"),
            ("chrf", "chrF (sacreBLEU)", "chrf"),
            ("bleu", "BLEU (lowercased, Moses-tokenized)", "bleu_lowercase_moses_tokenized"),
            ("bleu", "BLEU (Moses-tokenized, compounds split: the paper's)", "bleu_tokenized"),
        ]
        eval_results = [
            EvalResult(
                metric_type=kind,
                metric_name=name,
                metric_value=round(getattr(results, key), 2),
                metric_config=getattr(results, f"{key}_signature"),
                **common,
            )
            for kind, name, key in scores
            if getattr(results, key) is not None
        ]
    named = {
        summary and summary.dataset,
        results and results.dataset,
        *(dataset_tags or []),
    }
    datasets = sorted(d for d in named if d and _is_hub_dataset(d))
    return ModelCardData(
        model_name=model_name,
        language=[summary.source_lang, summary.target_lang] if summary else None,
        license=license or UNSET_LICENSE,
        datasets=datasets or None,
        metrics=["bleu", "chrf"],
        tags=["translation", "transformer", "attention-is-all-you-need", "vaswani", "custom_code"],
        library_name="transformers",
        pipeline_tag="translation",
        eval_results=eval_results,
    )


def lowercases(tokenizer):
    """Whether the tokenizer lowercases what it encodes (`train_bpe_tokenizer(lowercase=True)`)."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    return normalizer is not None and normalizer.normalize_str("A").strip() == "a"


def render_card(
    model,
    repo_id,
    results=None,
    summary=None,
    template_path=None,
    license=None,
    example_text=None,
    lowercase=False,
    dataset_tags=None,
):
    """Render the model card from the Jinja template `hub_card.md` (or `template_path`) and check it. `lowercase`:
    the tokenizer lowercases what it encodes (`train_bpe_tokenizer(lowercase=True)`), which the card states."""
    template_path = Path(template_path or DEFAULT_TEMPLATE)
    if not template_path.is_file():
        raise PublishError(f"No model card template at {str(template_path)!r}.")
    model_name = repo_id.rstrip("/").split("/")[-1]
    data = card_metadata(model_name, results, summary, license, dataset_tags)
    if example_text is None:
        example_text = _EXAMPLES.get(summary.source_lang if summary else "", "Hello world!")
    card = ModelCard.from_template(
        data,
        template_path=template_path,
        repo_id=repo_id,
        # Python string literals for the usage example: JSON strings are valid Python.
        repo_literal=json.dumps(repo_id, ensure_ascii=False),
        example_literal=json.dumps(example_text, ensure_ascii=False),
        model_name=model_name,
        config=model.config,
        num_parameters=f"{model.num_parameters():,}",
        num_parameters_millions=f"{model.num_parameters() / 1e6:.1f}M",
        generation=model.generation_config,
        results=results,
        summary=summary,
        training_data=_dataset_id(summary and summary.dataset, dataset_tags),
        license_chosen=bool(license),
        test_data=data.eval_results[0].dataset_name if data.eval_results else None,
        example_text=example_text,
        lowercase=lowercase,
    )
    validate_card(str(card))
    return card


def validate_card(text):
    """Check a card offline (`ModelCard.validate` asks the Hub): its YAML parses into valid `ModelCardData`, the
    `model-index` into `EvalResult`s, and it names the library, task and license; every placeholder was filled."""
    card = ModelCard(text)  # raises on a malformed model-index
    data = card.data
    missing = [key for key in ("library_name", "pipeline_tag", "license") if not getattr(data, key)]
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
