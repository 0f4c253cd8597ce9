"""The label-smoothed cross-entropy (§5.4) in one pass of chunks that stay in cache, with one (N, V) buffer
(`label_smoothed_cross_entropy`), and with the output projection inside the chunks, without the (N, V) logits
(`linear_label_smoothed_cross_entropy`, the trainer's `--fused_output_loss`). Reference: `F.cross_entropy(...,
label_smoothing=eps, reduction="sum")` (`tests/test_kernels.py`). aten's `_softmax.out` is private, guarded."""

import torch
import torch.nn.functional as F
from transformers.utils import is_torchdynamo_compiling


def _chunk_loss(logits, labels, eps, buffer, grad):
    """The summed label-smoothed loss, in float32, of one chunk of `logits` (n, V) against `labels` (n), rows
    labelled -100 counting 0; with `grad` (n, V, the logits' dtype; may be `logits` itself), the chunk's gradient
    softmax(z) - eps / V - (1 - eps) * onehot(t) written there, ignored rows zero. `buffer` (n, V, float32; may be
    `logits` itself) holds the logits cast to float32 unless they are float32, and softmax(z) unless `grad` is
    float32, which takes it directly."""
    ignored = labels == -100
    target = labels.masked_fill(ignored, 0).unsqueeze(1)
    z = logits if logits.dtype == torch.float32 else buffer.copy_(logits)
    vocab = z.shape[1]
    largest = z.amax(dim=-1, keepdim=True)
    row_loss = (1.0 - eps) * z.gather(1, target)
    if eps:
        row_loss = row_loss + (eps / vocab) * z.sum(dim=-1, keepdim=True)
    p = _softmax_into(z, grad if grad is not None and grad.dtype == torch.float32 else buffer)
    row_loss = largest - p.amax(dim=-1, keepdim=True).log_() - row_loss  # lse - (1 - eps) z_t - eps mean z
    total = row_loss.masked_fill_(ignored.unsqueeze(1), 0.0).sum()
    if grad is not None:
        p.scatter_add_(1, target, p.new_full(target.shape, eps - 1.0))
        if eps:
            p.sub_(eps / vocab)
        if p is not grad:
            grad.copy_(p)
        _zero_ignored_rows(grad, ignored)
    return total


# aten's softmax with an output buffer (the chunk's, reused); a torch without it copies into the buffer instead.
_SOFTMAX_OUT = getattr(getattr(torch.ops.aten, "_softmax", None), "out", None)


def _softmax_into(z, out):
    """softmax(z) over the last dimension, written into `out` (which may be `z` itself)."""
    if _SOFTMAX_OUT is not None:
        return _SOFTMAX_OUT(z, -1, False, out=out)
    return out.copy_(torch.softmax(z, dim=-1))


def _zero_ignored_rows(g, ignored):
    """Zero the gradient rows of ignored positions. On the CPU the zeroing is skipped when no row is ignored; on an
    accelerator, asking would make the host wait for the device at every chunk, which costs more than the zeroing."""
    if g.device.type != "cpu":
        g.masked_fill_(ignored.unsqueeze(1), 0.0)
    elif ignored.any():
        g.index_fill_(0, ignored.nonzero().squeeze(1), 0.0)


def _flatten(x, labels, name):
    """`x` (..., D) as rows (N, D) and `labels` (...) as (N,) on its device; labels of another length are refused."""
    x = x.reshape(-1, x.shape[-1])
    labels = labels.reshape(-1).to(x.device)
    if labels.shape[0] != x.shape[0]:
        raise ValueError(f"labels have {labels.shape[0]} positions, {name} {x.shape[0]}.")
    return x, labels


def _chunk_rows(chunk_elements, cpu_default, device, vocab):
    """Rows of `chunk_elements` logits (by default `cpu_default` on the CPU, 2**26 elsewhere), at least one."""
    if chunk_elements is None:
        chunk_elements = cpu_default if device.type == "cpu" else 1 << 26
    return max(1, chunk_elements // vocab)


def _scaled_gradients(ctx, grad_total):
    """The backward of both fused losses: the gradients their forward computed (`ctx.saved_tensors`, None where not
    asked), scaled in place by the upstream gradient and returned in `ctx.dtypes`. A second backward is refused."""
    if ctx.used:
        raise RuntimeError(
            "The fused cross-entropy keeps one gradient buffer and scales it in place: it can be backpropagated "
            "once (do not pass `retain_graph=True` through it; compute `F.cross_entropy(outputs.logits, ...)` "
            "yourself for that)."
        )
    ctx.used = True
    return [
        None if grad is None else grad.mul_(grad_total.to(grad.dtype)).to(dtype)
        for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes, strict=True)
    ]


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
    def forward(ctx, logits, labels, eps, chunk_rows):
        rows, vocab = logits.shape
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        # One float32 chunk, reused: the chunk's logits (cast once when they are not float32), then their softmax
        # (written into the gradient instead when that is float32).
        buffer = None
        if logits.dtype != torch.float32 or grad is None:
            buffer = torch.empty(min(chunk_rows, rows), vocab, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, chunk_rows):
            chunk = slice(start, start + chunk_rows)
            scratch = None if buffer is None else buffer[: labels[chunk].shape[0]]
            total += _chunk_loss(
                logits[chunk], labels[chunk], eps, scratch, None if grad is None else grad[chunk]
            )
        ctx.used, ctx.dtypes = False, (logits.dtype,)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        return *_scaled_gradients(ctx, grad_total), None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.0, chunk_elements: int | None = None
) -> torch.Tensor:
    """Sum over the rows with labels != -100 of the cross-entropy of `logits` (..., V) against `labels` (...),
    label-smoothed by `epsilon` (§5.4), in float32: `F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(),
    ignore_index=-100, reduction="sum", label_smoothing=epsilon)` to rounding, with less memory. `chunk_elements` logits
    are processed at a time: by default 2**21 on the CPU (a chunk that stays in cache), 2**26 elsewhere (fewer kernel
    launches)."""
    logits, labels = _flatten(logits, labels, "logits")
    if is_torchdynamo_compiling():
        # Under `torch.compile` the reference itself: inductor fuses it into its own kernels, where the Python loop
        # and data-dependent branch above would split the graph.
        return F.cross_entropy(
            logits.float(), labels, ignore_index=-100, reduction="sum", label_smoothing=epsilon
        )
    chunk_rows = _chunk_rows(chunk_elements, 1 << 21, logits.device, logits.shape[1])
    return _LabelSmoothedCrossEntropy.apply(logits, labels, float(epsilon), chunk_rows)


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    """`_LabelSmoothedCrossEntropy` of the logits hidden W^T + b, without the (N, V) logits: per chunk of rows, the
    chunk's logits (in the dtype of `hidden`), their loss and gradient in float32 (`_chunk_loss`), and from that
    gradient, stored back in the logits' dtype, the chunk's rows of dL/dhidden = G W and its share of dL/dW = G^T
    hidden (and dL/db, the column sums of G), accumulated in float32. All of it is computed in the forward pass, in
    a buffer for the chunk's logits and, unless they are float32, one float32 copy of them; the backward scales the
    three gradients by the upstream one."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, eps, chunk_rows):
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
            if bias is None:
                logits = torch.mm(h, weight.t(), out=chunk[:n])
            else:
                logits = torch.addmm(bias, h, weight.t(), out=chunk[:n])
            # with a gradient, the chunk's dL/dlogits G, in the logits' dtype, over its logits
            total += _chunk_loss(
                logits, labels[start : start + n], eps, buffer[:n], logits if gradient else None
            )
            if needs_hidden:
                torch.mm(logits, weight, out=grad_hidden[start : start + n])
            if needs_weight:
                grad_weight += logits.t().mm(h)
            if needs_bias:
                grad_bias += logits.sum(0, dtype=torch.float32)
        ctx.used, ctx.dtypes = False, (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        # dL/dhidden in hidden's dtype; dL/dW and dL/db, accumulated in float32, in the parameters' dtypes
        return *_scaled_gradients(ctx, grad_total), None, None, None


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
    hidden, labels = _flatten(hidden, labels, "hidden states")
    vocab = weight.shape[0]
    if is_torchdynamo_compiling():
        return label_smoothed_cross_entropy(F.linear(hidden, weight, bias), labels, epsilon)
    outside = (labels != -100) & ((labels < 0) | (labels >= vocab))
    if outside.any():
        raise ValueError(
            f"labels hold token ids outside the vocabulary [0, {vocab}) (and not -100), e.g. "
            f"{labels[outside][0].item()}."
        )
    device = hidden.device.type
    ignored = labels == -100
    if device == "cpu" and ignored.any():
        # Ignored positions (padding) add nothing to the loss and get zero gradients: their rows are left out of the
        # products (about 6% of the en->de recipe's target positions). Elsewhere, asking would make the host wait
        # for the device.
        rows = (~ignored).nonzero().squeeze(1)
        hidden, labels = hidden.index_select(0, rows), labels.index_select(0, rows)
    if torch.is_autocast_enabled(device):  # the product in the autocast dtype, as F.linear under autocast
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    chunk_rows = _chunk_rows(chunk_elements, 1 << 22, hidden.device, vocab)
    with torch.autocast(device, enabled=False):
        return _LinearLabelSmoothedCrossEntropy.apply(
            hidden, weight, bias, labels, float(epsilon), chunk_rows
        )
