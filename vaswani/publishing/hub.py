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

The card and the two JSON files it reports (evaluation results, training summary) are `vaswani.publishing.model_card`'s.
"""

import logging
import tempfile
from collections import namedtuple
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.utils import validate_repo_id
from transformers import PreTrainedTokenizerFast

from ..common.errors import PublishError
from ..common.fileio import atomic_folder, read_json
from ..generation_vaswani import PAPER_DECODING
from ..modeling_vaswani import VaswaniForConditionalGeneration
from ..utils_vaswani import AUTO_MAP, CODE_FILES, CUSTOM_PIPELINES
from .model_card import EvalResults, TrainingSummary, lowercases, render_card, validate_card

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Deleted from the repo in the same commit, so that a re-published repo holds no stale pickled weights.
PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt"]


# --------------------------------------------------------------------------------------------------------------------
# Checks on the inputs, all before anything is built or uploaded
# --------------------------------------------------------------------------------------------------------------------
def check_repo_id(repo_id):
    """Raise `PublishError` unless `repo_id` is a valid model repo id ("name" or "namespace/name")."""
    try:
        validate_repo_id(repo_id)
    except ValueError as error:  # HFValidationError
        raise PublishError(f"Invalid repo id {repo_id!r}: {error}") from None


def check_model_dir(model_dir, tokenizer_dir=None):
    """Raise `PublishError` unless `model_dir` holds a config and weights and `tokenizer_dir` a fast tokenizer."""
    model_dir = Path(model_dir)
    tokenizer_dir = Path(tokenizer_dir or model_dir)
    if not model_dir.is_dir():
        raise PublishError(f"No model folder at {str(model_dir)!r}: no such folder.")
    if not (model_dir / "config.json").is_file():
        raise PublishError(f"{str(model_dir)!r} is not a model folder: it has no config.json.")
    for path in (model_dir / "config.json", model_dir / "generation_config.json"):
        if path.is_file():  # parses: a `ValueError` names a file that does not
            read_json(path)
    if not any((model_dir / name).is_file() for name in WEIGHT_FILES):
        raise PublishError(
            f"{str(model_dir)!r} has no weights (none of {', '.join(WEIGHT_FILES)}): pass the folder that "
            "`Trainer.save_model` or `save_pretrained` wrote."
        )
    # Separate ones, whatever else is there (such a run's folder also holds its target tokenizer as tokenizer.json).
    if (tokenizer_dir / "source").is_dir() or (tokenizer_dir / "target").is_dir():
        raise PublishError(
            f"{str(tokenizer_dir)!r} holds separate source and target tokenizers; a published model "
            "needs one shared tokenizer (tokenizer.json)."
        )
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise PublishError(
            f"{str(tokenizer_dir)!r} has no tokenizer (tokenizer.json): save the tokenizer with the model or "
            "pass `tokenizer_dir`."
        )


# --------------------------------------------------------------------------------------------------------------------
# The folder that is published
# --------------------------------------------------------------------------------------------------------------------
def build_folder(model_dir, output_dir, repo_id, tokenizer_dir, results, summary, model, **card):
    """Write the folder to publish into `output_dir` (which must be new or empty) and check it; `model_dir` and
    `tokenizer_dir` were checked (`check_model_dir`).

    `repo_id` names the model in the card's usage example; without one, the example loads `output_dir`. `model`: the
    folder's model loaded already (the tools load it checked against its config: `recipe.model_folders.load_model`),
    else loaded here.
    `card`: `render_card`'s `template_path`, `license`, `example_text` and `dataset_tags`.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise PublishError(f"{str(output_dir)!r} is not empty: the published folder must hold nothing else.")
    if summary is None:
        logger.warning("No training summary: the card will not state the languages or the training recipe.")
    if results is None:
        logger.warning("No evaluation results: the card will have no model-index.")

    model = model or VaswaniForConditionalGeneration.from_pretrained(model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir or model_dir)
    config = model.config
    for name in ("pad_token_id", "eos_token_id"):
        if getattr(tokenizer, name) != getattr(config, name):
            raise PublishError(
                f"The tokenizer's {name} ({getattr(tokenizer, name)}) differs from the model's ({getattr(config, name)})."
            )
    if len(tokenizer) > config.vocab_size:
        raise PublishError(f"The tokenizer has {len(tokenizer)} tokens, the model only {config.vocab_size}.")
    config.use_cache = True  # Trainer saves use_cache=False; decoding wants the cache
    # The folder's own decoding (vaswani-train --length_penalty may have chosen alpha on validation), the paper's for
    # what it does not say. setattr, not update(): a generation config saved before `length_penalty_form` existed
    # lacks the key, and update() skips keys it lacks; nor may it stay marked as made from the model config, whose
    # loading drops it.
    saved = Path(model_dir, "generation_config.json")
    saved = read_json(saved) if saved.exists() else {}
    for key, value in PAPER_DECODING.items():
        setattr(model.generation_config, key, saved.get(key, value))
    model.generation_config._from_model_config = False

    card = render_card(
        model, repo_id or str(output_dir.resolve()), results, summary, lowercase=lowercases(tokenizer), **card
    )
    # Built beside `output_dir` and renamed into place once checked: a folder there is complete.
    with atomic_folder(output_dir) as building:
        # weights, configs, code, pipeline, custom_generate (utils_vaswani.CODE_FILES)
        model.save_pretrained(building)
        tokenizer.save_pretrained(building)
        card.save(building / "README.md")
        check_folder(building)
    return output_dir


def check_folder(folder):
    """Raise `PublishError` unless `folder` is exactly what is published: safetensors weights, no pickles, the code
    files, a config whose `auto_map` and `custom_pipelines` point at them, the tokenizer, and a valid card."""
    folder = Path(folder)
    names = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    required = {"config.json", "generation_config.json", "README.md", *CODE_FILES, *TOKENIZER_FILES}
    if missing := sorted(required - names):
        raise PublishError(f"{str(folder)!r} lacks {missing}.")
    # one file: `save_pretrained` shards only above 50 GB
    if "model.safetensors" not in names:
        raise PublishError(f"{str(folder)!r} has no safetensors weights.")
    if extra := sorted(names - required - {"model.safetensors"}):
        raise PublishError(f"{str(folder)!r} holds files that should not be published: {extra}.")
    config = read_json(folder / "config.json")
    if config.get("auto_map") != AUTO_MAP:
        raise PublishError(f"config.json has auto_map {config.get('auto_map')}, expected {AUTO_MAP}.")
    impl = config.get("custom_pipelines", {}).get("translation", {}).get("impl")
    if impl != CUSTOM_PIPELINES["translation"]["impl"]:
        raise PublishError(f"config.json does not register the translation pipeline (found {impl!r}).")
    validate_card((folder / "README.md").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------------------------------
# Upload and the one-call entry point
# --------------------------------------------------------------------------------------------------------------------
def _upload(api, folder, repo_id, private, revision, commit_message, create_pr):
    """Upload the checked `folder` to `repo_id` in one commit, creating the repo (and branch `revision`) if needed.
    `private` applies when the repo is created; an existing repo keeps its visibility. Pickled files already in the
    repo are deleted in the same commit."""
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    if revision not in (None, "main"):
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        repo_type="model",
        revision=revision,
        commit_message=commit_message or "Upload Transformer (Vaswani et al., 2017) translation model",
        delete_patterns=PICKLE_PATTERNS,
        create_pr=create_pr,
    )


# What `publish` did: the folder it built (None when it was a temporary one) and the commit (`CommitInfo`), if it
# pushed.
Published = namedtuple("Published", "folder commit")


def publish(
    model_dir,
    repo_id=None,
    output_dir=None,
    *,
    dry_run=False,
    tokenizer_dir=None,
    results=None,
    summary=None,
    private=None,
    revision=None,
    token=None,
    commit_message=None,
    create_pr=False,
    model=None,
    **card,
):
    """Build the publishable folder from a trained model folder and push it to `repo_id` in one commit.

    - `repo_id` only: build in a temporary folder, push.
    - `repo_id` and `output_dir`: build in `output_dir` (kept), push.
    - `output_dir` only, or `dry_run=True`: build in `output_dir`, push nothing.

    A `repo_id` without namespace goes to the token's user (one `whoami` call). `results` and `summary` are
    `EvalResults` / `TrainingSummary` objects or paths of their JSON files; `model`, the folder's model loaded already
    (`build_folder`). `card`: `render_card`'s `template_path`, `license`, `example_text` and `dataset_tags`. Every
    check (repo id, token, input folders, output folder) runs before the model is loaded here, and the built folder is
    checked before it is uploaded.
    """
    push = repo_id is not None and not dry_run
    if repo_id is None and output_dir is None:
        raise PublishError("Nothing to do: give a `repo_id` to push to, or an `output_dir` for a dry run.")
    if dry_run and output_dir is None:
        raise PublishError("A dry run writes the folder to `output_dir`; give one.")
    check_model_dir(model_dir, tokenizer_dir)
    if repo_id is not None:
        check_repo_id(repo_id)
    if push:
        token = token or get_token()  # else HF_TOKEN or the one saved by `hf auth login`
        if not token:
            raise PublishError(
                "No Hugging Face token: pass `token` (`--token`), set the HF_TOKEN environment variable, "
                "or log in with `hf auth login`."
            )
        api = HfApi(token=token)
        if "/" not in repo_id:  # the card's usage example needs the full id: the token's user namespace
            repo_id = f"{api.whoami()['name']}/{repo_id}"
    if results is not None and not isinstance(results, EvalResults):
        results = EvalResults.from_json(results)
    if summary is not None and not isinstance(summary, TrainingSummary):
        summary = TrainingSummary.from_json(summary)
    with tempfile.TemporaryDirectory(prefix="vaswani-publish-") as tmp:
        folder = build_folder(
            model_dir, output_dir or tmp, repo_id, tokenizer_dir, results, summary, model, **card
        )
        commit = _upload(api, folder, repo_id, private, revision, commit_message, create_pr) if push else None
        return Published(folder if output_dir is not None else None, commit)
