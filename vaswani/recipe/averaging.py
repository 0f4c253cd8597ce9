"""Checkpoint averaging (Vaswani et al., 2017, §6.1).

§6.1: "For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were
written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

Checkpoints are the Trainer's `checkpoint-<step>/` folders. Every floating-point tensor of their safetensors
state dicts is averaged, accumulated in float64 and stored in the checkpoints' dtype (that of the newest one);
other tensors (integer buffers, if a model has any) are taken from the newest checkpoint. The result is written
with `save_pretrained` from a model loaded from the newest checkpoint, so it is a normal model folder: same
config, tied weights stored once and tied again on load, plus the newest checkpoint's tokenizer files,
`generation_config.json` and any remote-code files.
"""

import fnmatch
import json
import logging
import shutil
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from tqdm.auto import tqdm

from ..common.fileio import atomic_folder
from .model_folders import load_model
from .tokenization import SOURCE_SUBDIR, TARGET_SUBDIR, load_tokenizers, save_tokenizers

logger = logging.getLogger(__name__)

# The files copied from the newest checkpoint: the generation config and those `save_pretrained` of a tokenizer may
# write (fast and slow ones).
COMPANION_PATTERNS = (
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "*.model",
    "chat_template*",
)


def find_checkpoints(run_dir):
    """The `checkpoint-<step>` folders of a run directory, oldest first (by step number, not by name); none when the
    folder is missing."""
    step = len("checkpoint-")
    found = [
        path for path in Path(run_dir).glob("checkpoint-*") if path.is_dir() and path.name[step:].isdecimal()
    ]
    return sorted(found, key=lambda path: int(path.name[step:]))


def last_checkpoints(run_dir, num_checkpoints):
    """The newest `num_checkpoints` checkpoint folders of a run, oldest first.

    Raises `ValueError` if the run has fewer (e.g. `save_total_limit` deleted them): asking for the paper's 5 and
    silently averaging 2 would give a different model.
    """
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"No such run directory: {run_dir}")
    checkpoints = find_checkpoints(run_dir)
    if len(checkpoints) < num_checkpoints:
        names = ", ".join(path.name for path in checkpoints) or "none"
        raise ValueError(
            f"Asked to average the last {num_checkpoints} checkpoints of {run_dir}, but it has "
            f"{len(checkpoints)} ({names})"
        )
    return checkpoints[-num_checkpoints:]


def _weight_files(checkpoint):
    """The safetensors file(s) of a checkpoint folder: `model.safetensors` or the shards of its index."""
    if (checkpoint / "model.safetensors").is_file():
        return [checkpoint / "model.safetensors"]
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"Cannot read the safetensors index {index}: {err}") from err
        names = sorted(set(weight_map.values()))
        outside = [name for name in names if Path(name).name != name or name in (".", "..")]
        if outside:  # e.g. "../other/model.safetensors": never read weights from outside the checkpoint
            raise ValueError(f"{index} names weight files outside its folder: {outside}")
        return [checkpoint / name for name in names]
    raise FileNotFoundError(f"No model.safetensors or model.safetensors.index.json in {checkpoint}")


def load_safetensors_state_dict(checkpoint):
    """The tensors stored in a checkpoint folder's safetensors file(s), on the CPU.

    Raises `ValueError` naming the file when it is missing, truncated or otherwise unreadable.
    """
    state_dict = {}
    for path in _weight_files(Path(checkpoint)):
        try:
            state_dict.update(load_file(path))
        except (SafetensorError, OSError, RuntimeError) as err:
            raise ValueError(f"Cannot read the safetensors file {path}: {err}") from err
    return state_dict


def average_state_dicts(checkpoints, show_progress=True):
    """The average of the checkpoints' safetensors state dicts.

    Floating-point tensors: the mean, summed in float64 and cast to the newest (last) checkpoint's dtype.
    Other tensors: the newest checkpoint's. All checkpoints must hold the same keys and shapes (`ValueError`
    naming the offending folder otherwise).
    """
    if not checkpoints:
        raise ValueError("No checkpoints to average")
    sums, shapes = {}, None
    for path in tqdm(checkpoints, desc="Averaging checkpoints", unit="ckpt", disable=not show_progress):
        state_dict = load_safetensors_state_dict(path)  # the last one read is the newest
        shapes = shapes or {key: tensor.shape for key, tensor in state_dict.items()}
        missing, extra = sorted(shapes.keys() - state_dict.keys()), sorted(state_dict.keys() - shapes.keys())
        if missing or extra:
            few = [f"{keys[:5]}{'...' if len(keys) > 5 else ''}" for keys in (missing, extra)]
            raise ValueError(
                f"Checkpoint {path} does not have the same tensors as {checkpoints[0]}: "
                f"missing {few[0]}, unexpected {few[1]}"
            )
        for key, tensor in state_dict.items():
            if tensor.shape != shapes[key]:
                raise ValueError(
                    f"Checkpoint {path}: tensor {key!r} has shape {tuple(tensor.shape)}, but "
                    f"{tuple(shapes[key])} in {checkpoints[0]}"
                )
            if tensor.is_floating_point():
                # in place after the first, in float64 (a float64 tensor of the first checkpoint is its own sum)
                sums[key] = sums[key].add_(tensor) if key in sums else tensor.double()
    return {
        key: (sums[key] / len(checkpoints)).to(tensor.dtype) if key in sums else tensor
        for key, tensor in state_dict.items()
    }


def _copy_companion_files(newest, output_dir):
    """Copy the tokenizer files, `generation_config.json` and remote-code files of `newest` to `output_dir`."""
    copied = []
    for path in sorted(newest.iterdir()):
        target = output_dir / path.name
        is_companion = path.is_file() and any(
            fnmatch.fnmatch(path.name, pattern) for pattern in COMPANION_PATTERNS
        )
        # Code the config refers to (e.g. a custom pipeline) that save_pretrained did not write itself.
        is_extra_code = path.suffix == ".py" and not target.exists()
        if is_companion or is_extra_code:
            shutil.copy2(path, target)
            copied.append(path.name)
        elif path.is_dir() and path.name in (SOURCE_SUBDIR, TARGET_SUBDIR):  # separate vocabularies
            shutil.copytree(path, target, dirs_exist_ok=True)
            copied.append(path.name + "/")
    return copied


def average_checkpoints(checkpoints, output_dir, show_progress=True, tokenizer_dir=None):
    """Average `checkpoints` (oldest first) and write the result as a model folder to `output_dir`.

    The folder loads with `AutoModelForSeq2SeqLM.from_pretrained` / `VaswaniForConditionalGeneration.from_pretrained`
    and carries the newest checkpoint's config, tokenizer files (joint, or `source/` and `target/`; those of
    `tokenizer_dir` when given) and `generation_config.json`, and the translation pipeline
    (which the model's `save_pretrained` writes). The folder is built beside `output_dir` and swapped in whole
    (`fileio.atomic_folder`): a kill leaves the earlier folder or the new one, never new files mixed with old ones.
    Returns `output_dir` as a `Path`.
    """
    paths = [Path(path) for path in checkpoints]
    output_dir = Path(output_dir)
    if output_dir.resolve() in {path.resolve() for path in paths}:
        raise ValueError(f"The output folder {output_dir} is one of the checkpoints being averaged")
    logger.info("Averaging %d checkpoints: %s", len(paths), ", ".join(path.name for path in paths))
    averaged = average_state_dicts(paths, show_progress)
    newest = paths[-1]
    # `load_model` refuses a folder whose stored tensors are not the model's; the averaged ones are the same tensors,
    # so the only keys left out are the tied ones.
    model = load_model(newest)
    model.load_state_dict(averaged, strict=False)
    model.config.use_cache = True  # the Trainer switches the cache off in the checkpoints it writes
    with atomic_folder(output_dir) as building:
        model.save_pretrained(building)
        copied = _copy_companion_files(newest, building)
        if tokenizer_dir:
            save_tokenizers(*load_tokenizers(tokenizer_dir), building)
    logger.info("Wrote the averaged model to %s (copied from %s: %s)", output_dir, newest, ", ".join(copied))
    return output_dir
