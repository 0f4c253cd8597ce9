"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing the package registers the classes with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` build and load `model_type="vaswani"` in this process; saved
folders also carry the code (`auto_map`) for `trust_remote_code=True` where the package is not installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vaswani import PRESETS, VaswaniConfig
from .kernels import use_cpu_kernels  # registers attn_implementation="vaswani_sdpa"
from .modeling_vaswani import (
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    shift_tokens_right,
)

__version__ = "0.1.0"

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
