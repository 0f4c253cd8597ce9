"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing the package registers the classes with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` build and load `model_type="vaswani"` in this process; saved
folders also carry the code (`auto_map`) for `trust_remote_code=True` where the package is not installed.

The package's folders are its layers (docs/ARCHITECTURE.md):

- `vaswani/` itself: the model, the files every saved model folder carries (`configuration_vaswani.py`,
  `modeling_vaswani.py`, `generation_vaswani.py`, `pipeline_vaswani.py`, `utils_vaswani.py`: torch and transformers
  only) and `auto_registration.py`;
- `vaswani.kernels`: the opt-in CPU kernels (`use_cpu_kernels`), which no folder carries;
- `vaswani.recipe`: the paper's training recipe (data, BPE, batches, trainer, schedule, loss, checkpoints, averaging,
  decoding and BLEU, and the run of `vaswani-train`);
- `vaswani.interop`: the model in other engines and from other models (CTranslate2 and ONNX exports, Marian and
  fairseq conversion);
- `vaswani.publishing`: the Hub (model card, upload); `vaswani.commands`: the console commands; `vaswani.common`:
  errors, atomic file writes and the flags' choices, shared by all of them.

The names below are imported when first used (`vaswani.VaswaniConfig`), and the registration happens as soon as
transformers' Auto classes are loaded (`vaswani.auto_registration`): `import vaswani` itself loads neither torch nor
transformers, so that the command-line tools start quickly.
"""

import importlib

from ._moved import install as _install_moved_modules
from .auto_registration import register_when_auto_classes_load

__version__ = "0.1.0"

_install_moved_modules()  # `import vaswani.data` etc. still find the modules that moved into subpackages

# name -> the module that defines it, imported on first use (`__getattr__`)
_LAZY = {
    "PRESETS": "configuration_vaswani",
    "VaswaniConfig": "configuration_vaswani",
    "VaswaniPreTrainedModel": "modeling_vaswani",
    "VaswaniModel": "modeling_vaswani",
    "VaswaniForConditionalGeneration": "modeling_vaswani",
    "shift_tokens_right": "modeling_vaswani",
    "use_cpu_kernels": "kernels",  # its module registers attn_implementation="vaswani_sdpa"
    "use_plain_modules": "kernels",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


# Saved folders carry the model's code and an `auto_map` naming these classes: `save_pretrained` writes them
# (`utils_vaswani.CODE_FILES`), so a folder loads where this package is not installed.
register_when_auto_classes_load()

__all__ = [
    "PRESETS",
    "VaswaniConfig",
    "VaswaniPreTrainedModel",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
    "shift_tokens_right",
    "use_cpu_kernels",
    "use_plain_modules",
]
