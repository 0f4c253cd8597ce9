"""Export a trained `vaswani` folder to an inference engine: CTranslate2 or ONNX (the `vaswani-export` command is
`vaswani.commands.export`).

    vaswani-export --model_name_or_path runs/de-en/averaged --engine ctranslate2 --quantization int8 \
        --output_dir runs/de-en/ct2-int8
    vaswani-export --model_name_or_path runs/de-en/averaged --engine onnx --output_dir runs/de-en/onnx

- `ctranslate2` (`to_ctranslate2.py`): CTranslate2's own transformers converter, with a loader registered for
  `VaswaniConfig`; weights in float32, int8, bfloat16 or any other CTranslate2 quantization.
- `onnx` (`to_onnx.py`): an encoder graph and a decoder graph whose self-attention cache is an input and an output,
  written by `torch.onnx.export` (the dynamo-based exporter) and run with ONNX Runtime.

Both write the tokenizer(s) next to the model and `vaswani_export.json`, which `vaswani.interop.engines` reads to decode
(the file is written last). An export is built beside its output folder and renamed into place when complete: a
failed or killed export leaves the folder as it was (an earlier export stays whole), never a partial one.
`vaswani-translate --engine ctranslate2|onnx --model_name_or_path <exported folder>` decodes it. The engines are optional extras
(`pip install vaswani-transformer[ctranslate2]` or `[onnx]`): they are imported when an export or an engine runs,
never by `import vaswani`.
"""

import json
import logging
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig

from ...common.fileio import atomic_folder, read_json
from ...common.flag_choices import CTRANSLATE2_QUANTIZATIONS, ENGINES  # noqa: F401 (this module's names too)
from ...configuration_vaswani import VaswaniConfig
from ...generation_vaswani import PAPER_LENGTH_PENALTY_FORM
from ...recipe.model_folders import check_model_path, model_languages
from ...recipe.tokenization import load_model_tokenizers, save_tokenizers

logger = logging.getLogger(__name__)

METADATA_FILE = "vaswani_export.json"


def decoding_settings(model_path):
    """The decoding a folder asks for in its generation config (§6.1's beam 4, alpha 0.6 and its length-penalty form
    when the recipe trained it), as the exported model's defaults."""
    try:
        config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # a folder without generation_config.json decodes as transformers' defaults
        config = GenerationConfig()
    return {  # transformers' defaults where the folder sets nothing (a converted model's config may not)
        "num_beams": config.num_beams or 1,
        "length_penalty": 1.0 if config.length_penalty is None else config.length_penalty,
        "length_penalty_form": getattr(config, "length_penalty_form", None) or PAPER_LENGTH_PENALTY_FORM,
        # transformers reads None as False: stop a sentence by the heuristic, not at the first `num_beams` hypotheses
        "early_stopping": config.early_stopping or False,
    }


def check_vaswani_model(model_path):
    """Refuse, naming what the folder holds, a model of another kind (a Marian or FSMT folder: convert it first)."""
    path = Path(model_path) / "config.json"
    model_type = read_json(path).get("model_type") if path.is_file() else "vaswani"
    if model_type != "vaswani":
        raise ValueError(
            f"{model_path} holds a {model_type!r} model, not a vaswani one: convert it first "
            f"(vaswani-convert --model_name_or_path {model_path} --output_dir <folder>), then export that folder"
        )


def write_metadata(folder, engine, model_path, tokenizers, decoding, **fields):
    """Write the tokenizer(s) and `vaswani_export.json` (special ids, default decoding, versions) into the export."""
    save_tokenizers(*tokenizers, folder)
    config = VaswaniConfig.from_pretrained(model_path)
    languages = model_languages(model_path)
    metadata = {
        "engine": engine,
        "source_model": str(model_path),
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        "decoding": decoding,
        # what the model records of its languages (`model_folders.model_languages`), for vaswani-translate to check
        "languages": {
            "source_lang": languages.source,
            "target_lang": languages.target,
            "known": list(languages.known),
            "recorded_in": str(languages.recorded_in),
        }
        if languages
        else None,
        **fields,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (folder / METADATA_FILE).write_text(json.dumps(metadata, indent=2), encoding="utf-8")


def read_metadata(folder):
    """The `vaswani_export.json` of an exported folder; a `ValueError` naming the file when it is missing."""
    path = Path(folder) / METADATA_FILE
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"No export folder at {folder}: no such folder")
    if not path.is_file():
        raise ValueError(f"{path} not found: {folder} is not a complete folder written by vaswani-export")
    return read_json(path)


def export(
    model_path,
    output_dir,
    engine,
    quantization=None,
    tokenizer_path=None,
    force=False,
):
    """Export `model_path` (a `vaswani` folder) for `engine` into `output_dir`; returns `output_dir`. An existing
    `output_dir` is refused unless `force` (then the new export replaces it when complete).

    `quantization` is CTranslate2's weight type (default float32); the ONNX graphs are float32.
    The tokenizer comes from `tokenizer_path`, else from the model folder."""
    check_model_path(model_path)
    check_vaswani_model(model_path)
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {engine!r}")
    if engine == "onnx" and quantization not in (None, "float32"):
        raise ValueError(f"--quantization {quantization} applies to ctranslate2; ONNX graphs are float32")
    output_dir = Path(output_dir)
    if output_dir.exists() and not force:
        raise FileExistsError(f"{output_dir} already exists: pass --overwrite_output_dir to replace it")
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(f"{output_dir} is a file: give a folder for the export")
    # a missing, broken or other tokenizer: named before the export
    tokenizers = load_model_tokenizers(model_path, tokenizer_path)
    decoding = decoding_settings(model_path)
    with atomic_folder(output_dir) as building:
        if engine == "ctranslate2":
            from .to_ctranslate2 import export_ctranslate2

            fields = export_ctranslate2(model_path, building, quantization or "float32", tokenizers)
        else:
            from .to_onnx import export_onnx

            fields = export_onnx(model_path, building)
        write_metadata(building, engine, model_path, tokenizers, decoding, **fields)
    logger.info("Exported %s to %s (%s)", model_path, output_dir, engine)
    alpha, form = decoding["length_penalty"], decoding["length_penalty_form"]
    if engine == "ctranslate2" and form != "power" and alpha:
        logger.warning(
            "CTranslate2 has only the length penalty |Y|^alpha: a beam search of this export divides by |Y|^%s, not "
            "by the model's %s form ((5 + |Y|) / 6)^%s (an --engine onnx export decodes with it)",
            alpha,
            form,
            alpha,
        )
    return output_dir
