"""Faster CPU kernels for the model: the same arithmetic as the plain-torch lines they stand in for, turned on by the
caller. A model is plain torch (`modeling_vaswani.py`); `use_cpu_kernels(model)` swaps its `nn.Linear` and
`nn.Dropout` modules for the classes below, in place, and chooses the `"vaswani_sdpa"` attention. The recipe's
tools make that call on the CPU, and `VaswaniTrainer` computes its label-smoothed loss with the two loss kernels.

Each entry below names its reference, and `tests/test_kernels.py` (`tests/test_int8.py` for int8) checks it against
that reference by name:

| here (file) | reference | where it is faster (figures: BENCHMARKS.md) |
|---|---|---|
| `Linear` (`onednn_linear.py`) | `nn.Linear` / `F.linear` | float32 on CPUs where MKL's GEMM lacks its AVX-512 kernels (AMD), and on Intel's from 16 rows on: oneDNN's GEMM |
| `Int8Linear`, `int8_linear` (`int8.py`) | torchao's `F.linear` on its int8 weights (`TorchAoConfig`) | CPU: int8 GEMMs (oneDNN's on weights packed once; a self-attention's Q, K, V in one, `SharedInputProjections`) without torchao's per-call Python |
| `Dropout`, `dropout` (`bit_dropout.py`) | `nn.Dropout`, `F.dropout` | CPU training: 15 random bits per element compared with p instead of `bernoulli_` |
| `label_smoothed_cross_entropy` (`loss.py`) | `F.cross_entropy(..., label_smoothing=eps, reduction="sum")` | CPU: one pass of chunks that stay in cache; less memory: one (N, V) buffer |
| `linear_label_smoothed_cross_entropy` (`loss.py`) | `label_smoothed_cross_entropy(F.linear(hidden, W, b), ...)` | CPU training in bf16 (the trainer's `--fused_output_loss`): the output projection inside the loss's chunks, no (N, V) logits |
| `StackedProjections` (`int8.py`) | each attention projection's `nn.Linear` alone | CPU autocast (bf16 training): the projections that share an input (a self-attention's Q, K, V; every encoder-decoder attention's K, V) in one GEMM, one input cast |
| `attn_implementation="vaswani_sdpa"` (`attention.py`) | `"sdpa"`, `"eager"` | CPU decoding steps and short half-precision training: matmuls; softmax rows of fewer than 16 keys padded |

One choice changes the arithmetic, and `use_cpu_kernels(model, int8_output=False)` declines it: in a model whose
linear layers are torchao int8, `Int8OutputLinear` computes the output projection that transformers keeps in float32
(tied to the embeddings) from an int8 copy, quantized as torchao quantizes the others.

Every fast path steps aside (to the reference) under `torch.compile`, which picks its own kernels, and off the CPU;
`"vaswani_sdpa"` chooses as in eager mode under `torch.compile` too, whose CPU SDPA is the same kernel.
Some use torch's private oneDNN and softmax operators, guarded: this package is never copied into saved model folders,
which hold the plain model only.
"""

import logging

import torch
from torch import nn

from ..modeling_vaswani import VaswaniAttention
from .attention import FAST_ATTENTION, matmul_attention, prefers_matmul_attention, vaswani_sdpa_attention
from .bit_dropout import Dropout, dropout, quantized_dropout_probability
from .int8 import (
    Int8Linear,
    Int8OutputLinear,
    SharedInputProjections,
    StackedProjections,
    exact_int8_products,
    int8_linear,
    torchao_int8_dynamic,
)
from .loss import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy
from .onednn_linear import Linear, _is_plain, onednn_features, onednn_linear_applies

logger = logging.getLogger(__name__)
_FAST_MODULES = {nn.Linear: Linear, nn.Dropout: Dropout}
_PLAIN_MODULES = {Linear: nn.Linear, Dropout: nn.Dropout, Int8Linear: nn.Linear, Int8OutputLinear: nn.Linear}
# What the kernels keep on a module, outside its state dict: a packed int8 weight, an int8 copy of a float32 weight,
# the group of projections it is computed with.
_CACHES = ("_vaswani_packed_int8", "_vaswani_int8_weight", "_vaswani_shared_input")


def _forget(module):
    for name in _CACHES:
        module.__dict__.pop(name, None)


def use_cpu_kernels(model, attention=True, int8_output=True):
    """Turn this module's kernels on in `model`, in place, and return it: every `nn.Linear` becomes a `Linear` and
    every `nn.Dropout` a `Dropout` (their class is changed, so parameters, ties, hooks and device stay as they are),
    and, with `attention`, a model on transformers' "sdpa" attention takes `"vaswani_sdpa"`. On a GPU, and under
    `torch.compile`, the swapped modules compute exactly what the plain ones do.

    A model loaded with `TorchAoConfig(Int8DynamicActivationInt8WeightConfig())`: its int8 linear layers become
    `Int8Linear` (torchao's arithmetic, faster), and with `int8_output` its output projection, which transformers
    keeps in float32 when it is tied to the embeddings, becomes an `Int8OutputLinear`, quantized as the other layers
    are (as CTranslate2's int8 does; `int8_output=False` keeps it float32). Layers holding other quantized weights
    stay as they are."""
    int8 = False
    for module in model.modules():
        _forget(module)  # regrouped below, remade at the next call
        fast = _FAST_MODULES.get(type(module))
        if fast is Linear and not _is_plain(module.weight):
            # torchao's dynamic int8 weights take Int8Linear; other quantized weights stay as they are
            fast = Int8Linear if torchao_int8_dynamic(module.weight) else None
        if fast is not None:
            module.__class__ = fast
        int8 = int8 or type(module) is Int8Linear
    # The projections that take one input, in one product: each self-attention's Q, K, V (int8 or float; an int8
    # group never applies to float layers, nor a float one to int8 layers), and the K and V of every
    # encoder-decoder attention, which all take the encoder's output (float). A group registers itself with them.
    attentions = [m for m in model.modules() if isinstance(m, VaswaniAttention)]
    groups = [
        (kind, (m.q_proj, m.k_proj, m.v_proj))
        for m in attentions
        if not m.is_cross_attention
        for kind in (SharedInputProjections, StackedProjections)
    ]
    memory = [p for m in attentions if m.is_cross_attention for p in (m.k_proj, m.v_proj)]
    for kind, projections in [*groups, (StackedProjections, memory)]:
        if kind.applies(*projections):
            kind(*projections)
    if int8 and not exact_int8_products():
        logger.warning(
            "This CPU's int8 products are not exact (no VNNI: oneDNN adds byte products in saturating 16-bit "
            "pairs); the int8 layers stay torchao's, which computes them the same way"
        )
    output = getattr(model, "get_output_embeddings", lambda: None)()
    if type(output) in (Linear, Int8OutputLinear):
        quantized = int8 and int8_output and exact_int8_products() and output.weight.dtype == torch.float32
        output.__class__ = Int8OutputLinear if quantized else Linear
    if attention and getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(FAST_ATTENTION)
    return model


def use_plain_modules(model):
    """Undo `use_cpu_kernels`: the modules become `nn.Linear` and `nn.Dropout` again and `"vaswani_sdpa"` attention
    becomes "sdpa"."""
    for module in model.modules():
        if type(module) in _PLAIN_MODULES:
            module.__class__ = _PLAIN_MODULES[type(module)]
            _forget(module)
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == FAST_ATTENTION:
        model.set_attn_implementation("sdpa")
    return model


__all__ = [
    "FAST_ATTENTION",
    "Dropout",
    "Int8Linear",
    "Int8OutputLinear",
    "Linear",
    "SharedInputProjections",
    "StackedProjections",
    "dropout",
    "int8_linear",
    "label_smoothed_cross_entropy",
    "linear_label_smoothed_cross_entropy",
    "matmul_attention",
    "onednn_features",
    "onednn_linear_applies",
    "prefers_matmul_attention",
    "quantized_dropout_probability",
    "torchao_int8_dynamic",
    "use_cpu_kernels",
    "use_plain_modules",
    "vaswani_sdpa_attention",
]
