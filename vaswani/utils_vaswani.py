"""What `modeling_vaswani.py` needs besides the paper: what a saved folder carries, input checks that name the argument
at fault, the names that transformers 5 releases give the cache and the causal mask's arguments, the output flags,
the resizing of the target vocabulary, a built model's agreement with its config, and the code of a whole folder.

This file is copied with `modeling_vaswani.py` into saved model folders, so it imports only torch and transformers.
"""

import inspect
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask

from .configuration_vaswani import ARCHITECTURE_FIELDS, DROPOUT_FIELDS
from .generation_vaswani import CACHE_NAME

# What every saved folder carries besides its weights, configs and tokenizer, stated once: the files that
# `trust_remote_code=True` loads (folder name -> file of this package), the `auto_map` naming them for the Auto
# classes, and the translation pipeline. `VaswaniPreTrainedModel.save_pretrained` writes them. Each code file is a
# relative import of `modeling_vaswani.py` itself: loading a folder, transformers copies that file's own imports
# into its module cache (5.5 no deeper), where `write_model_code` of a model loaded from it finds them again.
CODE_FILES = {
    **{
        f"{name}_vaswani.py": f"{name}_vaswani.py"
        for name in ("configuration", "modeling", "generation", "pipeline", "utils")
    },
    # transformers' seam for a model's own decoding: from_pretrained(..., trust_remote_code=True) installs its
    # `generate` (GenerationMixin.load_custom_generate)
    "custom_generate/generate.py": "generation_vaswani.py",
}
AUTO_MAP = {
    "AutoConfig": "configuration_vaswani.VaswaniConfig",
    "AutoModel": "modeling_vaswani.VaswaniModel",
    "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
}
CUSTOM_PIPELINES = {
    "translation": {"impl": "pipeline_vaswani.VaswaniTranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"]}
}


def write_model_code(folder):
    """Copy the code files of `CODE_FILES` into a model folder (they sit beside this file, also in transformers'
    cache of a folder loaded with `trust_remote_code=True`, whose relative imports it copies)."""
    here = Path(__file__).resolve().parent
    for name, source in CODE_FILES.items():
        target = Path(folder, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(here / source, target)


def follow_config(model):
    """Keep a built model in agreement with its config: a dropout rate changed on the config (`DROPOUT_FIELDS`:
    regularisation in training only) applies to the model's own dropout modules (not PEFT's) from there on; any other
    field the modules follow (`ARCHITECTURE_FIELDS`) changed since the model was built is refused, naming it, as the
    model would train, evaluate and save as another one. The model calls it in each training forward (before a step
    is trained, no tensor read) and before it is saved."""
    built, config = model._built_as, model.config
    changed = [
        f"`{name}` from {built[name]!r} to {getattr(config, name)!r}"
        for name in ARCHITECTURE_FIELDS
        if getattr(config, name) != built[name]
    ]
    if changed:
        raise ValueError(
            f"The config was changed after the model was built ({', '.join(changed)}): the model's modules and "
            "weights follow the config they were built from, so it would train, evaluate and save as another model. "
            "Build a new model from the changed config, or change the fields back."
        )
    rates = {name: getattr(config, name) for name in DROPOUT_FIELDS}
    if rates.items() - built.items():
        # the model's own `dropout`, `activation_dropout`; `attention_dropout` is read at each call
        for name, module in model.named_modules():
            rate = rates.get(name.rpartition(".")[2])
            if isinstance(module, nn.Dropout) and rate is not None:
                module.p = rate
        built.update(rates)


def tied_weights_saved_once(model):
    """The tied weights (`all_tied_weights_keys`) that are one tensor with the weight they are tied to: a saved folder
    holds them once, under that weight. The model sets them as transformers' `_keys_to_ignore_on_save` before it is
    saved (a weight untied by hand since is saved as itself); when it is built, all of them (transformers ties them
    when it loads the weights; its Trainer compares them with the keys a resumed checkpoint lacks, to tell tied
    weights from missing ones)."""
    weights = dict(model.named_parameters(remove_duplicate=False))
    return {
        target
        for target, source in model.all_tied_weights_keys.items()
        if weights.get(target, target) is weights.get(source, source)
    }


def cache_argument(cache, kwargs):
    """The cache, given as `cache` or as the older `past_key_values` (removed from `kwargs`)."""
    old = kwargs.pop("past_key_values", None)
    if old is not None and CACHE_NAME == "cache":
        warnings.warn(
            "`past_key_values` is deprecated (transformers 5.24 renamed it); pass the cache as `cache`.",
            FutureWarning,
            stacklevel=3,
        )
    return cache if cache is not None else old


_CACHE_KEYWORD = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def causal_mask(config, hidden_states, attention_mask, cache):
    """transformers' causal mask for the current attention implementation (its cache argument is named as the
    installed release names it); the positions come from the cache's length."""
    self_cache = cache.self_attention_cache if cache is not None else None
    return create_causal_mask(config, hidden_states, attention_mask, **{_CACHE_KEYWORD: self_cache})


def resized_rows(module, rows, pad_to_multiple_of=None):
    """Resize an embedding (or output projection) in place to `rows` rows: the first rows kept, new rows (and
    biases) set to the mean of the old ones."""
    if pad_to_multiple_of is not None:
        if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0:
            raise ValueError(f"`pad_to_multiple_of` must be a positive integer, got {pad_to_multiple_of!r}.")
        rows = -(-rows // pad_to_multiple_of) * pad_to_multiple_of
    for name, old in module.named_parameters(recurse=False):  # (rows, ...)
        new_rows = old.mean(dim=0, keepdim=True).expand(max(rows - len(old), 0), *old.shape[1:])
        setattr(module, name, nn.Parameter(torch.cat([old[:rows], new_rows]).detach()))
    if isinstance(module, nn.Linear):
        module.out_features = rows
    else:
        module.num_embeddings = rows
        if module.padding_idx is not None and module.padding_idx >= rows:
            module.padding_idx = None


def flag(value, config, name="output_hidden_states"):
    """An output flag of the call, else the config's."""
    return getattr(config, name) if value is None else value


def check_embedding_inputs(input_ids, inputs_embeds, name, embed_tokens):
    """A clear error naming the argument for token ids or embeddings that a stack cannot embed: neither or both
    given, ids that are not (batch, length), embeddings that are not (batch, length, d_model), empty inputs. Shapes
    only: no value is read, so the check costs no host-device sync and compiles. Ids outside the vocabulary are named
    where data enters (`generation_vaswani.check_token_ids`); a direct forward gets torch's index error."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"Give exactly one of `{name}` and its embeddings.")
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(
                f"`{name}` must be a 2-D tensor (batch, length) of token ids, got shape {tuple(input_ids.shape)}."
            )
        if input_ids.numel() == 0:
            raise ValueError(
                f"`{name}` is empty (shape {tuple(input_ids.shape)}): give at least one token per row."
            )
        return
    width = embed_tokens.embedding_dim
    if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != width:
        raise ValueError(
            f"The embeddings given for `{name}` must have shape (batch, length, d_model={width}), got "
            f"{tuple(inputs_embeds.shape)}."
        )
    if 0 in inputs_embeds.shape[:2]:
        raise ValueError(f"The embeddings given for `{name}` are empty: shape {tuple(inputs_embeds.shape)}.")


def check_mask(mask, expected, name, of):
    # 4-D masks are taken as already prepared
    if mask is not None and mask.dim() != 4 and mask.shape != tuple(expected):
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)} but {of} needs {tuple(expected)}.")


def check_decoder_inputs(
    attention_mask, encoder_attention_mask, encoder_hidden_states, hidden_states, past_length
):
    """A clear error for decoder masks of the wrong shape (the target's covers past and current tokens) and a decoder
    batch that is not the encoder's. A static cache counts its past on the device: the target mask's
    length is then not checked, which would cost a host-device sync."""
    batch_size, seq_len = hidden_states.shape[:2]  # the embedded target (B, T, d_model)
    if torch.is_tensor(past_length):
        target = None if attention_mask is None else (batch_size, attention_mask.shape[-1])
    else:
        target = (batch_size, past_length + seq_len)
    check_mask(attention_mask, target, "decoder_attention_mask", "the target (past and current tokens)")
    source = encoder_hidden_states.shape[:2]
    check_mask(encoder_attention_mask, source, "attention_mask", "the encoder output (batch, source length)")
    if batch_size != source[0]:
        raise ValueError(f"The decoder batch ({batch_size}) must be the encoder batch ({source[0]}).")
