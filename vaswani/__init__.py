"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing the package registers the classes with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` build and load `model_type="vaswani"` in this process; saved
folders also carry the code (`auto_map`) for `trust_remote_code=True` where the package is not installed.

The package's folders are its layers (docs/ARCHITECTURE.md):

- `vaswani/` itself: the model, the files every saved model folder carries (`configuration_vaswani.py`,
  `modeling_vaswani.py`, `generation_vaswani.py`, `pipeline_vaswani.py`, `utils_vaswani.py`: torch and transformers
  only), and `kernels.py`, the opt-in CPU kernels (`use_cpu_kernels`), which no folder carries;
- `vaswani.recipe`: the paper's training recipe (data, BPE, batches, trainer, schedule, loss, checkpoints, averaging,
  decoding and BLEU, and the run of `vaswani-train`);
- `vaswani.interop`: the model in other engines and from other models (CTranslate2 and ONNX exports, Marian and
  fairseq conversion);
- `vaswani.publishing`: the Hub (model card, upload); `vaswani.commands`: the console commands; `vaswani.common`:
  errors and atomic file writes, shared by all of them.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from ._moved import install as _install_moved_modules
from .configuration_vaswani import PRESETS, VaswaniConfig
from .kernels import use_cpu_kernels  # registers attn_implementation="vaswani_sdpa"
from .modeling_vaswani import (
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    shift_tokens_right,
)

__version__ = "0.1.0"

_install_moved_modules()  # `import vaswani.data` etc. still find the modules that moved into subpackages

AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
# Saved folders carry the model's code and an `auto_map` naming these classes: `save_pretrained` writes them
# (`utils_vaswani.CODE_FILES`), so a folder loads where this package is not installed.

__all__ = [
    "PRESETS",
    "VaswaniConfig",
    "VaswaniPreTrainedModel",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
    "shift_tokens_right",
    "use_cpu_kernels",
]
