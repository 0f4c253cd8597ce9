"""Faster CPU kernels for the model: the same arithmetic as the plain-torch lines they stand in for, turned on by the
caller. A model is plain torch (`modeling_vaswani.py`); `use_cpu_kernels(model)` swaps its `nn.Linear` and
`nn.Dropout` modules for the two classes below, in place, and chooses the `"vaswani_sdpa"` attention. The recipe's
tools make that call on the CPU, and `VaswaniTrainer` computes its label-smoothed loss with the two loss kernels.

Each entry below names its reference, and `tests/test_kernels.py` (`tests/test_int8.py` for int8) checks it against
that reference by name:

| here | reference | where it is faster (figures: BENCHMARKS.md) |
|---|---|---|
| `Linear` | `nn.Linear` / `F.linear` | float32 on CPUs where MKL's GEMM lacks its AVX-512 kernels (AMD): oneDNN's GEMM |
| `Int8Linear`, `int8_linear` | torchao's `F.linear` on its int8 weights (`TorchAoConfig`) | CPU: int8 GEMMs (oneDNN's on weights packed once) without torchao's per-call Python |
| `Dropout`, `dropout` | `nn.Dropout`, `F.dropout` | CPU training: 15 random bits per element compared with p instead of `bernoulli_` |
| `label_smoothed_cross_entropy` | `F.cross_entropy(..., label_smoothing=eps, reduction="sum")` | CPU: one pass of chunks that stay in cache; less memory: one (N, V) buffer |
| `linear_label_smoothed_cross_entropy` | `label_smoothed_cross_entropy(F.linear(hidden, W, b), ...)` | CPU training in bf16 (the trainer's `--fused_output_loss`): the output projection inside the loss's chunks, no (N, V) logits |
| `attn_implementation="vaswani_sdpa"` | `"sdpa"` | CPU decoding steps and short half-precision training: matmuls |

One choice changes the arithmetic, and `use_cpu_kernels(model, int8_output=False)` declines it: in a model whose
linear layers are torchao int8, `Int8OutputLinear` computes the output projection that transformers keeps in float32
(tied to the embeddings) from an int8 copy, quantized as torchao quantizes the others.

Every fast path steps aside (to the reference) under `torch.compile`, which picks its own kernels, and off the CPU.
Some use torch's private oneDNN and softmax operators, guarded: this module is never copied into saved model folders,
which hold the plain model only.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torchdynamo_compiling

from .modeling_vaswani import eager_attention_forward


# --------------------------------------------------------------------------------------------------------------------
# Linear: y = x W^T + b with oneDNN's float32 GEMM on the CPU
# --------------------------------------------------------------------------------------------------------------------
class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b in float32, the forward product and the input gradient in oneDNN's GEMM."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        grad_2d = grad.reshape(-1, grad.shape[-1])  # (N, out)
        if ctx.needs_input_grad[0]:  # dL/dx = dL/dy W: a "linear" with weight W^T of shape (in, out)
            grad_x = torch.ops.mkldnn._linear_pointwise(grad, weight.t(), None, "none", [], "")
        if ctx.needs_input_grad[1]:  # dL/dW = (dL/dy)^T x: (out, N) @ (N, in)
            # torch's `mm` reads both operands transposed in place; oneDNN's linear would first copy them to be
            # contiguous, which costs more than its faster GEMM saves here.
            grad_weight = grad_2d.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_x, grad_weight, grad_bias


_ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _is_plain(weight: torch.Tensor) -> bool:
    """A tensor of torch's own, not a subclass such as torchao's quantized weights."""
    return type(weight) in (torch.Tensor, nn.Parameter)


def onednn_linear_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `Linear` takes oneDNN for this call: a plain float32 weight (not a quantized tensor subclass) on the CPU,
    outside `torch.compile` and CPU autocast (whose bfloat16 product already goes to oneDNN), with oneDNN enabled
    (`torch.backends.mkldnn.flags(enabled=False)` turns it off)."""
    return (
        not is_torchdynamo_compiling()  # first: dynamo cannot trace the flag queries below
        and x.device.type == "cpu"
        and _is_plain(weight)
        and x.dtype == weight.dtype == torch.float32
        and _ONEDNN_AVAILABLE
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled("cpu")
    )


class Linear(nn.Linear):
    """`nn.Linear` whose float32 CPU products go through oneDNN (forward and input gradient).

    torch's float32 CPU GEMM is MKL's, which runs without its AVX-512 kernels on non-Intel CPUs: on an AMD EPYC
    oneDNN's is about twice as fast. Same parameters, same arithmetic to rounding; `isinstance(m, nn.Linear)`, PEFT's
    LoRA wrapping and checkpoints see an `nn.Linear` (`type(m) is nn.Linear` does not: `use_plain_modules` undoes it).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if onednn_linear_applies(x, self.weight):
            return _OneDNNLinearFunction.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


# --------------------------------------------------------------------------------------------------------------------
# Int8Linear: torchao's int8 weights (transformers' `TorchAoConfig`) through torch's int8 GEMM
# --------------------------------------------------------------------------------------------------------------------
def torchao_int8_dynamic(weight: torch.Tensor) -> bool:
    """Whether `weight` is what `from_pretrained(..., quantization_config=TorchAoConfig(
    Int8DynamicActivationInt8WeightConfig()))` puts in a linear layer: torchao's `Int8Tensor` of a float32 matrix, one
    symmetric scale per output row, activations quantized on the fly per row and symmetric (torchao's defaults), with
    no static activation scale or pre-scale. Read from the tensor's attributes, without importing torchao."""
    if type(weight).__name__ != "Int8Tensor" or not type(weight).__module__.startswith("torchao."):
        return False
    act = getattr(weight, "act_quant_kwargs", None)
    qdata, scale, zero_point = weight.qdata, weight.scale, getattr(weight, "zero_point", None)
    return (
        act is not None
        and type(act.granularity).__name__ == "PerRow"
        and getattr(act.mapping_type, "name", None) == "SYMMETRIC"
        and weight.act_quant_scale is None
        and weight.act_pre_scale is None
        and weight.dtype == torch.float32
        and qdata.dim() == 2
        and list(weight.block_size) == [1, qdata.shape[1]]
        and scale.numel() == qdata.shape[0]
        and scale.dtype == torch.float32
        and (zero_point is None or not zero_point.any())
    )


def _quantize_rows(x: torch.Tensor, qmin: int = -128, qmax: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's symmetric per-row int8 quantization of a 2-D float32 tensor, op for op: scale = max|row| /
    ((qmax - qmin) / 2), at least float32's eps, and `round(x * (1 / scale))` clamped to [qmin, qmax]."""
    scale = x.abs().amax(-1, keepdim=True).div_((qmax - qmin) / 2).clamp_(min=torch.finfo(torch.float32).eps)
    return torch.round(x * (1.0 / scale)).clamp_(qmin, qmax).to(torch.int8), scale


# oneDNN's int8 linear on a weight packed once beats `torch._int_mm`, which repacks its weight at every call, from
# about a million weights on (the feed-forward layers and the output projection); below, `_int_mm` is faster.
PACKED_INT8_MIN_WEIGHTS = 1 << 20
_ONEDNN_INT8_AVAILABLE = (
    _ONEDNN_AVAILABLE
    and hasattr(torch.ops.onednn, "qlinear_prepack")
    and hasattr(torch.ops.onednn, "qlinear_pointwise")
)


@functools.lru_cache(maxsize=64)
def _unit_scales(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row weight scales of 1 and zero points of 0 for oneDNN's int8 linear (never written)."""
    return torch.ones(rows), torch.zeros(rows, dtype=torch.long)


def _int8_product(quantized: torch.Tensor, qdata: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """quantized @ qdata^T in int32, exactly, returned as float32 (`.to(torch.float32)` of the int32 product): by
    `torch._int_mm`, or by oneDNN's int8 linear on `packed` (`torch.ops.onednn.qlinear_prepack(qdata)`) with unit
    scales, whose float32 output is the same conversion of the same integers."""
    if packed is None:
        return torch._int_mm(quantized, qdata.t()).to(torch.float32)
    ones, zeros = _unit_scales(qdata.shape[0])
    return torch.ops.onednn.qlinear_pointwise(
        quantized, 1.0, 0, packed, ones, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


def int8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a `torchao_int8_dynamic` weight, in torchao's arithmetic op for op: each row of
    x quantized to int8 (`_quantize_rows`; [-64, 63] with `reduce_range`), the int32 product (exact: `_int8_product`),
    then scaled by the row's scale and the weight's, and the bias added. torchao computes the same product and scales;
    its cost on the CPU is the Python of its tensor subclass and general quantization primitives at every call, which
    for one decoding step's small matrices is several times the product itself."""
    return _int8_linear(x, weight.qdata, weight.scale, bias, weight.act_quant_kwargs.reduce_range, packed)


def _int8_linear(x, qdata, weight_scale, bias, reduce_range: bool, packed) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    quantized, scale = _quantize_rows(rows, *((-64, 63) if reduce_range else (-128, 127)))
    y = _int8_product(quantized, qdata, packed).mul_(scale).mul_(weight_scale.reshape(-1))
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


def int8_linear_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `Int8Linear` takes `int8_linear` for this call: float32 input on the CPU, outside `torch.compile`."""
    return not is_torchdynamo_compiling() and x.device.type == "cpu" and x.dtype == torch.float32


def _identity(tensor: torch.Tensor) -> tuple[int, int]:
    """Where `tensor`'s data lives and how often it was written in place (inference tensors keep no count), to tell
    when a copy made from it is stale."""
    return tensor.data_ptr(), -1 if tensor.is_inference() else tensor._version


def _packed(module: nn.Module, qdata: torch.Tensor) -> torch.Tensor | None:
    """`qdata` packed for oneDNN's int8 linear, once per weight (kept on the module, outside its state dict), where
    that is faster (`PACKED_INT8_MIN_WEIGHTS`); else None."""
    if not _ONEDNN_INT8_AVAILABLE or qdata.numel() < PACKED_INT8_MIN_WEIGHTS:
        return None
    key = _identity(qdata)
    cached = module.__dict__.get("_vaswani_packed_int8")
    if cached is None or cached[0] != key:
        cached = (key, torch.ops.onednn.qlinear_prepack(qdata, None))
        module.__dict__["_vaswani_packed_int8"] = cached
    return cached[1]


class Int8Linear(nn.Linear):
    """`nn.Linear` holding torchao's int8 weight (`torchao_int8_dynamic`), whose float32 CPU calls go through
    `int8_linear`: the same int8 arithmetic as torchao's `F.linear`, in a few torch operators and an int8 GEMM.
    Elsewhere (a GPU, `torch.compile`, bfloat16) torchao's own `F.linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if int8_linear_applies(x, self.weight):
            return int8_linear(x, self.weight, self.bias, _packed(self, self.weight.qdata))
        return F.linear(x, self.weight, self.bias)


class Int8OutputLinear(Linear):
    """The float32 output projection of a model whose other linear layers are torchao int8 (`Int8Linear`): its
    float32 CPU calls quantize an int8 copy of the weight as torchao quantizes the others (`_quantize_rows`, once per
    weight) and go through the same arithmetic. transformers leaves a projection tied to the embeddings in float32;
    the float32 weight, its tie and what `save_pretrained` writes stay as they are. Elsewhere, `Linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if not (int8_linear_applies(x, weight) and _is_plain(weight) and weight.dtype == torch.float32):
            return super().forward(x)
        key = _identity(weight)
        cached = self.__dict__.get("_vaswani_int8_weight")
        if cached is None or cached[0] != key:
            cached = (key, *_quantize_rows(weight.detach()))
            self.__dict__["_vaswani_int8_weight"] = cached
        _, qdata, weight_scale = cached
        return _int8_linear(x, qdata, weight_scale, self.bias, False, _packed(self, qdata))


# --------------------------------------------------------------------------------------------------------------------
# Dropout: the keep mask drawn from 15 random bits per element
# --------------------------------------------------------------------------------------------------------------------
# The keep mask is drawn from random bits, 15 per element: four elements from each 64-bit draw of torch's generator
# (`random_()` on int64 fills 63 bits; the low 15 of each 16-bit lane are uniform). An element is kept when its 15
# bits, read as an integer in [0, 2**15), are at least round(p * 2**15).
_MASK_BITS = 15


def quantized_dropout_probability(p: float) -> float:
    """The drop probability that `dropout` applies on its fast path: p rounded to a multiple of 2**-15 (within
    1.6e-5 of p). Kept elements are scaled by 1 / (1 - this), so that the output's expectation is x exactly."""
    return round(p * (1 << _MASK_BITS)) / (1 << _MASK_BITS)


class _BitMaskDropoutFunction(torch.autograd.Function):
    """Dropout whose keep mask is drawn from 15 random bits per element: Bernoulli(1 - p') per element with p' =
    `quantized_dropout_probability(p)`, kept elements scaled by 1 / (1 - p')."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        threshold = round(p * (1 << _MASK_BITS))
        n = x.numel()
        draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_()
        bits = draws.view(torch.int16)[:n].view(x.shape).bitwise_and_((1 << _MASK_BITS) - 1)
        # 0 where dropped, 1 / (1 - p') in x's dtype where kept: torch's dropout scales by the same rounded factor.
        mask = bits.ge_(threshold).to(x.dtype).mul_((1 << _MASK_BITS) / ((1 << _MASK_BITS) - threshold))
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the mask drawn faster on the CPU.

    torch's CPU dropout draws its mask with `bernoulli_`, which took a quarter of a training step of a small model on
    two cores, and a float32 uniform per element costs one draw of the generator each. Here four elements share one
    64-bit draw, 15 bits each: every element is kept with probability 1 - p' and kept elements are scaled by
    1 / (1 - p'), where p' is p rounded to a multiple of 2**-15 (`quantized_dropout_probability`; 0.3 becomes
    0.29999, and the expectation stays x). Only the random stream differs from torch's; a seed still fixes the
    masks. GPUs (one fused kernel), `torch.compile`, and p within 2**-16 of 0 or 1 (p = 0 and p = 1 included) take
    `F.dropout`.
    """
    if (
        training
        and 0 < round(p * (1 << _MASK_BITS)) < (1 << _MASK_BITS)
        and not is_torchdynamo_compiling()
        and x.device.type == "cpu"
        and x.is_floating_point()
    ):
        return _BitMaskDropoutFunction.apply(x, p)
    return F.dropout(x, p=p, training=training)


class Dropout(nn.Dropout):
    """`nn.Dropout` whose CPU training masks come from `dropout`'s 15 random bits per element."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


# --------------------------------------------------------------------------------------------------------------------
# The loss: (label-smoothed) cross-entropy with one (N, V) buffer
# --------------------------------------------------------------------------------------------------------------------
def _smoothed_rows(
    z: torch.Tensor,
    target: torch.Tensor,
    ignored: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    gradient: bool,
) -> torch.Tensor:
    """The summed label-smoothed loss of one float32 chunk of logits `z` (n, V) against `target` (n, 1), rows
    `ignored` counting 0. softmax(z) is written to `out` (float32, n x V, may be `z` itself); with `gradient`, turned
    there into the chunk's gradient softmax(z) - eps / V - (1 - eps) * onehot(t), ignored rows included (the caller
    zeroes them where it stores them)."""
    vocab = z.shape[1]
    largest = z.amax(dim=-1, keepdim=True)
    row_loss = (1.0 - eps) * z.gather(1, target)
    if eps:
        row_loss = row_loss + (eps / vocab) * z.sum(dim=-1, keepdim=True)
    p = _softmax_into(z, out)
    row_loss = largest - p.amax(dim=-1, keepdim=True).log_() - row_loss  # lse - (1 - eps) z_t - eps mean z
    total = row_loss.masked_fill_(ignored.unsqueeze(1), 0.0).sum()
    if gradient:
        p.scatter_add_(1, target, p.new_full(target.shape, eps - 1.0))
        if eps:
            p.sub_(eps / vocab)
    return total


# aten's softmax with an output buffer (the chunk's, reused); a torch without it copies into the buffer instead.
_SOFTMAX_OUT = getattr(getattr(torch.ops.aten, "_softmax", None), "out", None)


def _softmax_into(z: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """softmax(z) over the last dimension, written into `out` (which may be `z` itself)."""
    if _SOFTMAX_OUT is not None:
        return _SOFTMAX_OUT(z, -1, False, out=out)
    return out.copy_(torch.softmax(z, dim=-1))


def _zero_ignored_rows(g: torch.Tensor, ignored: torch.Tensor) -> None:
    """Zero the gradient rows of ignored positions. On the CPU the zeroing is skipped when no row is ignored; on an
    accelerator, asking would make the host wait for the device at every chunk, which costs more than the zeroing."""
    if g.device.type != "cpu":
        g.masked_fill_(ignored.unsqueeze(1), 0.0)
    elif ignored.any():
        g.index_fill_(0, ignored.nonzero().squeeze(1), 0.0)


def _chunk_targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(target ids as an (n, 1) index with ignored positions at 0, the ignored mask) of a chunk of labels."""
    ignored = labels == -100
    return labels.masked_fill(ignored, 0).unsqueeze(1), ignored


def _refuse_second_backward(ctx) -> None:
    if ctx.used:
        raise RuntimeError(
            "The fused cross-entropy keeps one gradient buffer and scales it in place: it can be backpropagated "
            "once (do not pass `retain_graph=True` through it; compute `F.cross_entropy(outputs.logits, ...)` "
            "yourself for that)."
        )
    ctx.used = True


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy over rows of `logits` (N, V), and its gradient, in one pass of chunks.

    Per row with target t (rows labelled -100 count 0): loss = -(1 - eps) * log p_t - eps * mean_v(log p_v), with
    p = softmax(z), in float32 whatever the dtype of `logits`. With lse = log sum_v exp(z_v), log p_v = z_v - lse, so
    loss = lse - (1 - eps) * z_t - eps * mean_v(z_v): one softmax per chunk gives both the loss and the gradient,
    softmax(z) - eps / V - (1 - eps) * onehot(t). lse is read off the softmax at the row's largest logit, lse = max_v
    z_v - log max_v p_v, where that probability is at least 1 / V and cannot underflow. The gradient is written during
    the forward pass into one tensor of the logits' shape and dtype, chunk by chunk, so that neither the float32
    probabilities (N, V) nor their gradient are ever held in full. The backward only scales it, in place, so the graph
    can be differentiated once (`retain_graph` is refused with an error).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, eps: float, chunk_rows: int) -> torch.Tensor:
        rows, vocab = logits.shape
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        in_float32 = logits.dtype == torch.float32
        # One float32 chunk, reused: the chunk's logits (cast once when they are not float32), then their softmax.
        buffer = None
        if not in_float32 or grad is None:
            buffer = torch.empty(min(chunk_rows, rows), vocab, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, chunk_rows):
            z = logits[start : start + chunk_rows]
            target, ignored = _chunk_targets(labels[start : start + chunk_rows])
            g = grad[start : start + chunk_rows] if grad is not None else None
            z = z if in_float32 else buffer[: z.shape[0]].copy_(z)
            # softmax(z), then the gradient: into the gradient buffer when that is float32, else over z in the chunk.
            p = g if (in_float32 and g is not None) else buffer[: z.shape[0]]
            total += _smoothed_rows(z, target, ignored, eps, out=p, gradient=g is not None)
            if g is not None:
                if p is not g:
                    g.copy_(p)
                _zero_ignored_rows(g, ignored)
        ctx.used = False
        if grad is not None:
            ctx.save_for_backward(grad)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        _refuse_second_backward(ctx)
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_total.to(grad.dtype)), None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.0, chunk_elements: int | None = None
) -> torch.Tensor:
    """Sum over the rows with labels != -100 of the cross-entropy of `logits` (..., V) against `labels` (...),
    label-smoothed by `epsilon` (§5.4), in float32: `F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(),
    ignore_index=-100, reduction="sum", label_smoothing=epsilon)` to rounding, with less memory. `chunk_elements` logits
    are processed at a time: by default 2**21 on the CPU (a chunk that stays in cache), 2**26 elsewhere (fewer kernel
    launches)."""
    logits = logits.reshape(-1, logits.shape[-1])
    labels = labels.reshape(-1).to(logits.device)
    if labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels have {labels.shape[0]} positions, logits {logits.shape[0]}.")
    if is_torchdynamo_compiling():
        # Under `torch.compile` the reference itself: inductor fuses it into its own kernels, where the Python loop
        # and data-dependent branch above would split the graph.
        return F.cross_entropy(
            logits.float(), labels, ignore_index=-100, reduction="sum", label_smoothing=epsilon
        )
    if chunk_elements is None:
        chunk_elements = 1 << 21 if logits.device.type == "cpu" else 1 << 26
    chunk_rows = max(1, chunk_elements // logits.shape[1])
    return _LabelSmoothedCrossEntropy.apply(logits, labels, float(epsilon), chunk_rows)


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    """`_LabelSmoothedCrossEntropy` of the logits hidden W^T + b, without the (N, V) logits: per chunk of rows, the
    chunk's logits (in the dtype of `hidden`), their loss and gradient in float32 (`_smoothed_rows`), and from that
    gradient, stored back in the logits' dtype, the chunk's rows of dL/dhidden = G W and its share of dL/dW = G^T
    hidden (and dL/db, the column sums of G), accumulated in float32. All of it is computed in the forward pass, in
    a buffer for the chunk's logits and, unless they are float32, one float32 copy of them; the backward scales the
    three gradients by the upstream one."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, eps: float, chunk_rows: int) -> torch.Tensor:
        rows, vocab = hidden.shape[0], weight.shape[0]
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        gradient = needs_hidden or needs_weight or needs_bias
        float32 = dict(dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, **float32) if needs_weight else None
        grad_bias = torch.zeros(vocab, **float32) if needs_bias else None
        total = torch.zeros((), **float32)
        chunk = torch.empty(min(chunk_rows, rows), vocab, dtype=hidden.dtype, device=hidden.device)
        in_float32 = hidden.dtype == torch.float32
        buffer = chunk if in_float32 else torch.empty(chunk.shape, **float32)
        for start in range(0, rows, chunk_rows):
            h = hidden[start : start + chunk_rows]
            n = h.shape[0]
            target, ignored = _chunk_targets(labels[start : start + chunk_rows])
            if bias is None:
                logits = torch.mm(h, weight.t(), out=chunk[:n])
            else:
                logits = torch.addmm(bias, h, weight.t(), out=chunk[:n])
            z = logits if in_float32 else buffer[:n].copy_(logits)
            total += _smoothed_rows(z, target, ignored, eps, out=z, gradient=gradient)
            if not gradient:
                continue
            g = z if in_float32 else logits.copy_(z)  # the chunk's dL/dlogits, in the logits' dtype
            _zero_ignored_rows(g, ignored)
            if needs_hidden:
                torch.mm(g, weight, out=grad_hidden[start : start + n])
            if needs_weight:
                grad_weight += g.t().mm(h)
            if needs_bias:
                grad_bias += g.sum(0, dtype=torch.float32)
        ctx.used = False
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        _refuse_second_backward(ctx)
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        if grad_hidden is not None:
            grad_hidden = grad_hidden.mul_(grad_total.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_total).to(weight_dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.mul_(grad_total).to(bias_dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_label_smoothed_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    epsilon: float = 0.0,
    chunk_elements: int | None = None,
) -> torch.Tensor:
    """`label_smoothed_cross_entropy(F.linear(hidden, weight, bias), labels, epsilon)` to rounding, without ever
    holding the (N, V) logits or their gradient: the output projection and the loss computed together, chunk by chunk
    of `chunk_elements` logits (by default 2**22 on the CPU, a chunk that stays in the last-level cache; 2**26
    elsewhere). Under autocast the product takes the autocast dtype, as `F.linear` would (weights and gradients
    keep theirs); the loss is float32. On the CPU in bfloat16 a training step of the `tiny` preset with a vocabulary
    of 8000 takes 8% less time than with the projection followed by `label_smoothed_cross_entropy` (BENCHMARKS.md).
    Token ids outside [0, V) other than -100 are refused."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1).to(hidden.device)
    vocab = weight.shape[0]
    if labels.shape[0] != hidden.shape[0]:
        raise ValueError(f"labels have {labels.shape[0]} positions, hidden states {hidden.shape[0]}.")
    if is_torchdynamo_compiling():
        return label_smoothed_cross_entropy(F.linear(hidden, weight, bias), labels, epsilon)
    outside = (labels != -100) & ((labels < 0) | (labels >= vocab))
    if outside.any():
        raise ValueError(
            f"labels hold token ids outside the vocabulary [0, {vocab}) (and not -100), e.g. "
            f"{labels[outside][0].item()}."
        )
    device = hidden.device.type
    if torch.is_autocast_enabled(device):  # the product in the autocast dtype, as F.linear under autocast
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    if chunk_elements is None:
        chunk_elements = 1 << 22 if device == "cpu" else 1 << 26
    chunk_rows = max(1, chunk_elements // vocab)
    with torch.autocast(device, enabled=False):
        return _LinearLabelSmoothedCrossEntropy.apply(
            hidden, weight, bias, labels, float(epsilon), chunk_rows
        )


# --------------------------------------------------------------------------------------------------------------------
# Attention: attn_implementation="vaswani_sdpa"
# --------------------------------------------------------------------------------------------------------------------
FAST_ATTENTION = "vaswani_sdpa"

# Beyond this many keys, torch's CPU SDPA kernel beats batched matmuls in half-precision training.
MATMUL_ATTENTION_MAX_KEYS = 128


def prefers_matmul_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, attention_mask
) -> bool:
    """Where batched matmuls beat torch's CPU SDPA kernel (a flash-attention kernel), measured by
    `bench.bench_kernels`: one query per row (each step of incremental decoding: about 2x at 20-60 keys, equal at
    1024), and forward + backward in bfloat16/float16 with at most `MATMUL_ATTENTION_MAX_KEYS` keys (4-5x at 32 keys).
    A causal call without a mask must have one query or as many queries as keys, so that its mask can be drawn."""
    if query.device.type != "cpu" or is_torchdynamo_compiling():
        return False
    if attention_mask is None and module.is_causal and query.shape[-2] not in (1, key.shape[-2]):
        return False
    if query.shape[-2] == 1:
        return True
    return (
        query.dtype in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad)
        and key.shape[-2] <= MATMUL_ATTENTION_MAX_KEYS
    )


def vaswani_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' "sdpa" attention, with the calls that `prefers_matmul_attention` picks computed by the model's
    own `eager_attention_forward` (Eq. 1 in batched matmuls, float32 softmax): same arithmetic, another kernel. SDPA's
    masks leave causal attention to the kernel's `is_causal` (mask None); those calls get their lower-triangular mask
    here."""
    if not prefers_matmul_attention(module, query, key, attention_mask):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
    if attention_mask is None and module.is_causal and query.shape[-2] > 1:
        attention_mask = torch.ones(
            query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device
        ).tril()
    return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(FAST_ATTENTION, vaswani_sdpa_attention)
AttentionMaskInterface.register(FAST_ATTENTION, sdpa_mask)


# --------------------------------------------------------------------------------------------------------------------
# Turning the kernels on and off in a built model
# --------------------------------------------------------------------------------------------------------------------
_FAST_MODULES = {nn.Linear: Linear, nn.Dropout: Dropout}


def use_cpu_kernels(model: nn.Module, attention: bool = True, int8_output: bool = True) -> nn.Module:
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
        fast = _FAST_MODULES.get(type(module))
        if fast is Linear and not _is_plain(module.weight):
            # torchao's dynamic int8 weights take Int8Linear; other quantized weights stay as they are
            fast = Int8Linear if torchao_int8_dynamic(module.weight) else None
        if fast is not None:
            module.__class__ = fast
        int8 = int8 or type(module) is Int8Linear
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if int8 and int8_output and type(output) is Linear and output.weight.dtype == torch.float32:
        output.__class__ = Int8OutputLinear
    elif not int8_output and type(output) is Int8OutputLinear:
        output.__class__ = Linear
        output.__dict__.pop("_vaswani_int8_weight", None)
        output.__dict__.pop("_vaswani_packed_int8", None)
    config = getattr(model, "config", None)
    if attention and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(FAST_ATTENTION)
    return model


def use_plain_modules(model: nn.Module) -> nn.Module:
    """Undo `use_cpu_kernels`: the modules become `nn.Linear` and `nn.Dropout` again and `"vaswani_sdpa"` attention
    becomes "sdpa"."""
    plain = {fast: plain for plain, fast in _FAST_MODULES.items()} | {
        Int8Linear: nn.Linear,
        Int8OutputLinear: nn.Linear,
    }
    for module in model.modules():
        if type(module) in plain:
            module.__class__ = plain[type(module)]
            module.__dict__.pop("_vaswani_packed_int8", None)
            module.__dict__.pop("_vaswani_int8_weight", None)
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == FAST_ATTENTION:
        model.set_attn_implementation("sdpa")
    return model


__all__ = [
    "FAST_ATTENTION",
    "Dropout",
    "Int8Linear",
    "Int8OutputLinear",
    "Linear",
    "dropout",
    "int8_linear",
    "label_smoothed_cross_entropy",
    "linear_label_smoothed_cross_entropy",
    "quantized_dropout_probability",
    "use_cpu_kernels",
    "use_plain_modules",
    "vaswani_sdpa_attention",
]
