"""What every model folder the recipe and its tools write carries besides the weights: the model's code files with the
`auto_map` naming them, and the translation pipeline.

transformers 5 has no `translation` pipeline of its own; a folder whose `config.json` names a custom one under
`custom_pipelines`, with the pipeline's code beside it, gives

    pipeline("translation", model=folder, trust_remote_code=True)

`add_translation_pipeline(folder)` makes any model folder such a folder: the Trainer's checkpoints and final model
(`VaswaniTrainer._save`), averaged checkpoints (`averaging.average_checkpoints`), and the folders of other tools
(conversion, export) that call it after `save_pretrained`. Published folders get the same entry from
`hub.build_folder`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .fileio import write_text
from .utils_vaswani import AUTO_MAP, CODE_FILES, CUSTOM_PIPELINES

_PACKAGE = Path(__file__).resolve().parent


def add_translation_pipeline(folder: str | os.PathLike) -> None:
    """Write the model's and the translation pipeline's code into a saved model folder, and name them in its
    `config.json` (`auto_map`, `custom_pipelines`).

    Raises `ValueError` naming the file when `folder` holds no readable `config.json` of this package's model.
    Every write is atomic (`fileio`).
    """
    folder = Path(folder)
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{folder} is not a model folder: {config_path} is missing") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from None
    if config.get("model_type") != "vaswani":
        raise ValueError(
            f"{config_path} is not a vaswani model's configuration (model_type {config.get('model_type')!r})"
        )
    for name, source in CODE_FILES.items():
        code = (_PACKAGE / source).read_text(encoding="utf-8")
        target = folder / name
        if not target.is_file() or target.read_text(encoding="utf-8") != code:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_text(target, code)
    pipelines = {**(config.get("custom_pipelines") or {}), **CUSTOM_PIPELINES}
    auto_map = {**(config.get("auto_map") or {}), **AUTO_MAP}
    if config.get("custom_pipelines") != pipelines or config.get("auto_map") != auto_map:
        config["custom_pipelines"] = pipelines
        config["auto_map"] = auto_map
        # transformers' own layout of config.json
        write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")


__all__ = ["CODE_FILES", "CUSTOM_PIPELINES", "add_translation_pipeline"]
