"""Model folders a tool is pointed at, checked before anything loads: a local folder or a Hub model, named at once
when it is neither (`check_model_path`); loaded only when its weights are the ones its config describes
(`load_model`, which every tool that loads a model calls); and the languages a folder records of itself, against which
`--source_lang`/`--target_lang` are checked (`model_languages`, `check_model_languages`)."""

import logging
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    RepositoryNotFoundError,
    StrictDataclassError,
)
from huggingface_hub.repocard import metadata_load
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM

from .. import register
from ..common.errors import UsageError
from ..common.fileio import read_json
from ..publishing.model_card import is_repo_id

logger = logging.getLogger(__name__)


def check_model_path(model_path):
    """Raise, naming the path, when `model_path` is not a usable model folder: a file, a folder without `config.json`,
    a `config.json` or `generation_config.json` that is not valid JSON, safetensors weights that are cut short or
    corrupt; or a name that is neither a local folder nor a model on the Hub (`check_hub_model`)."""
    path = Path(model_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a model folder: it has no config.json")
        for config in [path / "config.json", *path.glob("generation_config.json")]:
            read_json(config)
        for weights in sorted(path.glob("*.safetensors")):
            check_safetensors(weights)
        return
    if path.exists():
        raise ValueError(f"{path} is a file: give the model's folder")
    check_hub_model(str(model_path))


def check_safetensors(path):
    """Raise `ValueError` naming `path` unless it is a complete safetensors file (its header parses and every
    tensor it lists lies inside the file); no tensor data is read."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                f.get_slice(key)
    except Exception as error:  # safetensors raises its own error types for bad headers and short buffers
        raise ValueError(f"{path} is corrupt or truncated: {' '.join(str(error).split())}") from None


def first_names(names, few=3):
    """The first `few` of `names` in sorted order, then how many more: for messages that name what they found."""
    names = sorted(names)
    return ", ".join(names[:few]) + (f" and {len(names) - few} more" if len(names) > few else "")


def load_model(model_path, model_class=AutoModelForSeq2SeqLM, **kwargs):
    """`model_class.from_pretrained(model_path, **kwargs)` after `check_model_path`, refusing with a `ValueError` a
    folder whose weights are not those its config describes (weights transformers would invent, throw away or
    reshape: a mistyped config key falls back to the default), naming the first few; config keys the model does not
    know are logged as a warning."""
    check_model_path(model_path)
    register()  # model_type="vaswani" loads with this package's classes
    try:
        model, info = model_class.from_pretrained(
            model_path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
        )
    except (OSError, ValueError, StrictDataclassError) as error:  # the last: a config field of the wrong type
        kind = ValueError if isinstance(error, StrictDataclassError) else type(error)
        raise kind(f"Cannot load the model {model_path}: {' '.join(str(error).split())}") from error
    config_file = Path(model_path) / "config.json"
    if config_file.is_file():
        known = {"auto_map", "custom_pipelines", "quantization_config", *type(model.config)().to_dict()}
        if unknown := set(read_json(config_file)) - known:
            logger.warning(
                "%s has keys the model does not know, which it ignores: %s", config_file, first_names(unknown, 9)
            )
    wrong = [
        f"{kind} {first_names(names)}"
        for kind, names in (
            ("missing", info["missing_keys"]),
            ("unexpected", info["unexpected_keys"]),
            ("of another shape", [key for key, *_ in info["mismatched_keys"]]),
        )
        if names
    ]
    if wrong:
        raise ValueError(f"The weights of {model_path} do not match its config.json: {'; '.join(wrong)}")
    return model


def check_hub_model(name):
    """Return when `name`, which is no local folder, can be a model on the Hub: one in the local cache, or one the
    Hub holds. Otherwise raise `FileNotFoundError` naming both places at once: a name that can only be a path (no
    valid repo id: "./x", "/data", "~/x", "a/b/c"), a name not in the cache while offline (`HF_HUB_OFFLINE=1`), a
    repository the Hub does not have, or a Hub that cannot be reached (one request, no retries: transformers' loading
    retries for about a minute). A gated repository is left to `from_pretrained`, which says how to ask for access."""
    if not is_repo_id(name):
        raise FileNotFoundError(
            f"No model folder at {name}: no such path (and {name!r} is not a Hub model id 'namespace/name')"
        )
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # downloaded before: from_pretrained finds it, online or not
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        reason = f"the Hub model {name} is not in the local cache (offline: HF_HUB_OFFLINE is set)"
    else:
        try:
            get_hf_file_metadata(hf_hub_url(name, "config.json"))  # one HEAD request, no retries
            return
        except GatedRepoError:
            return
        except RepositoryNotFoundError:
            reason = f"the Hub has no model {name} (nor one this login may read)"
        except EntryNotFoundError:
            reason = f"the Hub repository {name} has no config.json (not a model)"
        except Exception as error:  # the HTTP client's connection errors and timeouts, a server error
            reason = (
                "the Hub could not be reached to look for a model of that name "
                f"({' '.join(str(error).split()) or type(error).__name__})"
            )
    raise FileNotFoundError(f"No model folder at {name}: no such path, and {reason}")


@dataclass(frozen=True)
class ModelLanguages:
    """The languages a model folder records: its direction (`source` into `target`) when the record says which is
    which, else only the languages it knows (`known`, as a model card's `language` list gives them); `recorded_in`
    names the file."""

    known: tuple[str, ...]
    recorded_in: Path
    source: str | None = None
    target: str | None = None


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


def _direction(record):
    pairs = [[record.get(key) for key in keys] for keys in _DIRECTION_KEYS] + [record.get("langs")]
    return next(
        (
            tuple(pair)
            for pair in pairs
            if isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(code, str) and code for code in pair)
        ),
        None,
    )


def model_languages(model_path):
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
    for path in filter(Path.is_file, candidates):
        record = read_json(path)
        if path.name == "vaswani_export.json":  # what the exported model recorded, under "languages"
            record = record.get("languages") or {}
        direction = _direction(record) if isinstance(record, dict) else None
        if direction:
            return ModelLanguages(direction, path, *direction)
        if path.name == "vaswani_export.json" and record.get("known"):
            # an export of a model whose card named its languages without a direction
            return ModelLanguages(tuple(record["known"]), path)
    card = folder / "README.md"
    if card.is_file():
        try:
            metadata = metadata_load(card) or {}
        except Exception:  # a card whose metadata is not YAML says nothing about languages
            metadata = {}
        languages = metadata.get("language")
        languages = [languages] if isinstance(languages, str) else languages
        if isinstance(languages, list) and languages and all(isinstance(code, str) for code in languages):
            # this package's cards list [source, target]
            direction = languages if len(languages) == 2 and "vaswani" in (metadata.get("tags") or []) else ()
            return ModelLanguages(tuple(languages), card, *direction)
    return None


def _primary(code):
    """A language code without case, region or script (`en-US` is `en`)."""
    return code.lower().replace("_", "-").split("-")[0]


def check_model_languages(model_path, source_lang, target_lang):
    """Raise `UsageError` naming the flag when `source_lang` or `target_lang` (None: not given) is not a language the
    folder `model_path` records (`model_languages`), saying which it knows. Where it records nothing the flags are not
    checked, and a warning says so when a flag was given."""
    if source_lang is None and target_lang is None:
        return
    languages = model_languages(model_path)
    if languages is None:
        if Path(model_path).is_dir():
            logger.warning(
                "%s records no languages (no source_lang/target_lang in its configs, no training_summary.json, "
                "no model card): --source_lang and --target_lang are not checked against the model",
                model_path,
            )
        return
    for flag, given, recorded in (
        ("source_lang", source_lang, languages.source),
        ("target_lang", target_lang, languages.target),
    ):
        allowed = {_primary(code) for code in ([recorded] if recorded else languages.known)}
        # Each must name one language (an ISO 639 code of 2 or 3 letters, with or without a region or script), not a
        # group such as Marian's "ROMANCE" or ISO's "mul" (multiple) and "und" (undetermined), which this check
        # cannot judge.
        one_each = all(
            2 <= len(code) <= 3 and code.isalpha() and code not in ("mul", "und") for code in allowed
        )
        if given is not None and one_each and _primary(given) not in allowed:
            what = (
                f"translates {languages.source} into {languages.target}"
                if languages.source  # (and target: a direction)
                else f"knows {', '.join(languages.known)}"
            )
            raise UsageError(
                f"--{flag} {given}: the model {model_path} {what} (as {languages.recorded_in} records)"
            )
