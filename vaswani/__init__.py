"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

The package's folders are its layers (docs/ARCHITECTURE.md):

- `vaswani/` itself: the model, the files every saved model folder carries (`configuration_vaswani.py`,
  `modeling_vaswani.py`, `generation_vaswani.py`, `pipeline_vaswani.py`, `utils_vaswani.py`: torch and transformers
  only);
- `vaswani.kernels`: the opt-in CPU kernels (`use_cpu_kernels`), which no folder carries;
- `vaswani.recipe`: the paper's training recipe (data, BPE, batches, trainer, schedule, loss, checkpoints, averaging,
  decoding and BLEU, and the run of `vaswani-train`);
- `vaswani.interop`: the model in other engines and from other models (CTranslate2 and ONNX exports, Marian and
  fairseq conversion);
- `vaswani.publishing`: the Hub (model card, upload); `vaswani.commands`: the console commands; `vaswani.common`:
  errors, atomic file writes and the flags' choices, shared by all of them.

`import vaswani` loads neither torch nor transformers, so that the command-line tools start quickly. The names below
are imported when first used (`vaswani.VaswaniConfig`, `from vaswani import ...`), and that first use registers the
classes with transformers' Auto classes (`register`): `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` then build
and load `model_type="vaswani"` in this process. Where transformers' Auto classes are loaded before `import vaswani`,
the import registers at once. `vaswani.register()` registers explicitly. Saved folders also carry the code
(`auto_map`) for `trust_remote_code=True` where the package is not installed.

    import vaswani
    from transformers import AutoModelForSeq2SeqLM
    vaswani.register()  # or: from vaswani import VaswaniConfig
    AutoModelForSeq2SeqLM.from_pretrained("runs/de-en/averaged")
"""

import importlib
import sys

__version__ = "0.1.0"

# name -> the module that defines it, imported on first use (`__getattr__`)
_LAZY = {
    "PRESETS": "configuration_vaswani",
    "VaswaniConfig": "configuration_vaswani",
    "VaswaniPreTrainedModel": "modeling_vaswani",
    "VaswaniModel": "modeling_vaswani",
    "VaswaniForConditionalGeneration": "modeling_vaswani",
    "shift_tokens_right": "modeling_vaswani",
    "VaswaniTranslationPipeline": "pipeline_vaswani",
    "use_cpu_kernels": "kernels",  # its module registers attn_implementation="vaswani_sdpa"
    "use_plain_modules": "kernels",
}


def register():
    """Register `model_type="vaswani"` with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`, and
    `attn_implementation="vaswani_sdpa"` (`vaswani.kernels`), with transformers' public `register` methods. Calling it
    again changes nothing."""
    from .configuration_vaswani import VaswaniConfig  # noqa: I001 (first: it checks the transformers version)

    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    from . import kernels  # noqa: F401 (registers attn_implementation="vaswani_sdpa")
    from .modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel

    AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
    AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    register()
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


# With transformers' Auto classes (and torch) loaded already, registering costs little: do it now.
if "transformers.models.auto.configuration_auto" in sys.modules:
    register()

__all__ = [*_LAZY, "register"]
