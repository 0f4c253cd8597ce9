"""Faster kernels for `modeling_vaswani.py`: the same arithmetic as the plain-torch lines they stand in for.

Each entry below names its reference, and `tests/test_kernels.py` checks it against that reference by name:

| here | reference | where it is faster (figures: BENCHMARKS.md) |
|---|---|---|
| `Linear` | `nn.Linear` / `F.linear` | float32 on CPUs where MKL's GEMM lacks its AVX-512 kernels (AMD): oneDNN's GEMM |
| `dropout` | `F.dropout` | CPU training: a uniform draw compared with p instead of `bernoulli_` |
| `label_smoothed_cross_entropy` | `F.cross_entropy(..., label_smoothing=eps, reduction="sum")` | less memory: one (N, V) buffer |
| `attn_implementation="vaswani_sdpa"` | `"sdpa"` | CPU decoding steps and short half-precision training: matmuls |

Every fast path steps aside (to the reference) under `torch.compile`, which picks its own kernels, and off the CPU.

This file is copied next to `modeling_vaswani.py` into saved model folders (a relative import of that file), so it
imports only torch and transformers.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torchdynamo_compiling


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


def onednn_linear_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `Linear` takes oneDNN for this call: float32 on the CPU, outside `torch.compile` and CPU autocast (whose
    bfloat16 product already goes to oneDNN), with oneDNN enabled (`torch.backends.mkldnn.flags(enabled=False)`
    turns it off)."""
    return (
        not is_torchdynamo_compiling()  # first: dynamo cannot trace the flag queries below
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and _ONEDNN_AVAILABLE
        and torch._C._get_mkldnn_enabled()
        and not torch.is_autocast_enabled("cpu")
    )


class Linear(nn.Linear):
    """`nn.Linear` whose float32 CPU products go through oneDNN (forward and input gradient).

    torch's float32 CPU GEMM is MKL's, which runs without its AVX-512 kernels on non-Intel CPUs: on an AMD EPYC
    oneDNN's is about twice as fast. Same parameters, same arithmetic to rounding; `isinstance(m, nn.Linear)`, PEFT's
    LoRA wrapping and checkpoints see an `nn.Linear`.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if onednn_linear_applies(x, self.weight):
            return _OneDNNLinearFunction.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


# --------------------------------------------------------------------------------------------------------------------
# Dropout: the keep mask drawn as uniform >= p
# --------------------------------------------------------------------------------------------------------------------
class _UniformMaskDropoutFunction(torch.autograd.Function):
    """Dropout whose keep mask is drawn as `uniform >= p`: Bernoulli(1 - p) per element, scaled by 1 / (1 - p)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        # 0 where dropped, 1 / (1 - p) in x's dtype where kept: torch's own dropout scales by the same rounded factor.
        mask = torch.rand(x.shape, device=x.device).ge_(p).to(x.dtype).mul_(1.0 / (1.0 - p))
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the mask drawn faster on the CPU.

    torch's CPU dropout draws its mask with `bernoulli_`, which took a quarter of a training step of a small model on
    two cores. Uniforms compared with p give the same distribution (each element kept with probability 1 - p, kept
    elements scaled by 1 / (1 - p)); only the random stream differs (a seed still fixes the masks). GPUs (one fused
    kernel), `torch.compile`, p = 0 and p = 1 take `F.dropout`.
    """
    if (
        training
        and 0.0 < p < 1.0
        and not is_torchdynamo_compiling()
        and x.device.type == "cpu"
        and x.is_floating_point()
    ):
        return _UniformMaskDropoutFunction.apply(x, p)
    return F.dropout(x, p=p, training=training)


# --------------------------------------------------------------------------------------------------------------------
# The loss: (label-smoothed) cross-entropy with one (N, V) buffer
# --------------------------------------------------------------------------------------------------------------------
class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy over rows of `logits` (N, V), and its gradient, in one pass of chunks.

    Per row with target t (rows labelled -100 count 0): loss = -(1 - eps) * log p_t - eps * mean_v(log p_v), with
    log p = log_softmax(z), in float32 whatever the dtype of `logits`. Its gradient, softmax(z) - eps / V -
    (1 - eps) * onehot(t), is written during the forward pass into one tensor of the logits' shape and dtype, chunk by
    chunk, so that neither the float32 log-probabilities (N, V) nor their gradient are ever held in full. The backward
    only scales it, in place, so the graph can be differentiated once (`retain_graph` is refused with an error).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, eps: float, chunk_rows: int) -> torch.Tensor:
        rows, vocab = logits.shape
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, rows, chunk_rows):
            z = logits[start : start + chunk_rows]
            target = labels[start : start + chunk_rows]
            ignored = target == -100
            target = target.masked_fill(ignored, 0).unsqueeze(1)
            g = grad[start : start + chunk_rows] if grad is not None else None
            if g is not None and g.dtype == torch.float32:
                log_p = torch.ops.aten._log_softmax.out(z, -1, False, out=g)  # log p, written into the buffer
            else:
                log_p = torch.log_softmax(z, dim=-1, dtype=torch.float32)
            row_loss = (eps - 1.0) * log_p.gather(1, target)
            if eps:
                row_loss = row_loss - eps * log_p.mean(dim=-1, keepdim=True)
            total += row_loss.masked_fill(ignored.unsqueeze(1), 0.0).sum()
            if g is not None:  # p - eps / V - (1 - eps) * onehot(t), float32 until stored
                log_p.exp_()
                if eps:
                    log_p.sub_(eps / vocab)
                log_p.scatter_add_(1, target, log_p.new_full(target.shape, eps - 1.0))
                if log_p is not g:
                    g.copy_(log_p)
                # On the CPU, skip the pass when no row is ignored; on an accelerator, asking would make the host
                # wait for the device at every chunk, which costs more than the pass.
                if g.device.type != "cpu" or ignored.any():
                    g.masked_fill_(ignored.unsqueeze(1), 0.0)
        ctx.used = False
        if grad is not None:
            ctx.save_for_backward(grad)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        if ctx.used:
            raise RuntimeError(
                "The fused cross-entropy keeps one gradient buffer and scales it in place: it can be backpropagated "
                "once (do not pass `retain_graph=True` through it; compute `F.cross_entropy(outputs.logits, ...)` "
                "yourself for that)."
            )
        ctx.used = True
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
    from .modeling_vaswani import (
        eager_attention_forward,  # the reference, imported when first needed (no cycle)
    )

    if attention_mask is None and module.is_causal and query.shape[-2] > 1:
        attention_mask = torch.ones(
            query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device
        ).tril()
    return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(FAST_ATTENTION, vaswani_sdpa_attention)
AttentionMaskInterface.register(FAST_ATTENTION, sdpa_mask)


__all__ = ["FAST_ATTENTION", "Linear", "dropout", "label_smoothed_cross_entropy", "vaswani_sdpa_attention"]
