"""The label-smoothed cross-entropy (§5.4) in one pass of chunks that stay in cache, with one (N, V) buffer
(`label_smoothed_cross_entropy`), and with the output projection inside the chunks, without the (N, V) logits
(`linear_label_smoothed_cross_entropy`, the trainer's `--fused_output_loss`). Reference: `F.cross_entropy(...,
label_smoothing=eps, reduction="sum")` (`tests/test_kernels.py`). aten's `_softmax.out` is private."""

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
    largest = z.amax(-1)
    row_loss = (1.0 - eps) * z.gather(1, target).squeeze(1)
    if eps:
        row_loss = row_loss + (eps / vocab) * z.sum(-1)
    # aten's softmax with an output buffer (the chunk's, reused; may be `z` itself)
    p = torch.ops.aten._softmax.out(
        z, -1, False, out=grad if grad is not None and grad.dtype == torch.float32 else buffer
    )
    row_loss = largest - p.amax(-1).log_() - row_loss  # lse - (1 - eps) z_t - eps mean z
    total = row_loss.masked_fill_(ignored, 0.0).sum()
    if grad is not None:
        p.scatter_add_(1, target, p.new_full(target.shape, eps - 1.0))
        if eps:
            p.sub_(eps / vocab)
        if p is not grad:
            grad.copy_(p)
        # The ignored rows' gradient is zero. On the CPU the zeroing is skipped when no row is ignored; on an
        # accelerator, asking would make the host wait for the device at every chunk, which costs more than it saves.
        if grad.device.type != "cpu":
            grad.masked_fill_(ignored.unsqueeze(1), 0.0)
        elif ignored.any():
            grad.index_fill_(0, ignored.nonzero().squeeze(1), 0.0)
    return total


def _flatten(x, labels, name):
    """`x` (..., D) as rows (N, D) and `labels` (...) as (N,) on its device; labels of another length are refused."""
    x = x.reshape(-1, x.shape[-1])
    labels = labels.reshape(-1).to(x.device)
    if len(labels) != len(x):
        raise ValueError(f"labels have {len(labels)} positions, {name} {len(x)}.")
    return x, labels


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy over rows of logits (N, V), and its gradient, in one pass of chunks: the
    logits are `hidden` itself when `weight` is None, else hidden W^T + b, computed chunk by chunk.

    Per row with target t (rows labelled -100 count 0): loss = -(1 - eps) * log p_t - eps * mean_v(log p_v), with
    p = softmax(z), in float32 whatever the dtype of the logits. With lse = log sum_v exp(z_v), log p_v = z_v - lse, so
    loss = lse - (1 - eps) * z_t - eps * mean_v(z_v): one softmax per chunk gives both the loss and the gradient,
    softmax(z) - eps / V - (1 - eps) * onehot(t) (`_chunk_loss`). lse is read off the softmax at the row's largest
    logit, lse = max_v z_v - log max_v p_v, where that probability is at least 1 / V and cannot underflow.

    Every gradient is computed in the forward pass, chunk by chunk, so that neither the float32 probabilities (N, V)
    nor their gradient are ever held in full: given logits, their gradient is written into one tensor of their shape
    and dtype; with `weight`, the chunk's gradient G, stored over the chunk's logits in their dtype, gives the chunk's
    rows of dL/dhidden = G W and its share of dL/dW = G^T hidden (and dL/db, the column sums of G), accumulated in
    float32. A float32 buffer for the chunk holds the logits cast to float32 (unless they are float32) and their
    softmax. The backward only scales the gradients by the upstream one, in place, so the graph can be
    differentiated once (`retain_graph` is refused with an error)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, eps, chunk_elements):
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        float32 = dict(dtype=torch.float32, device=hidden.device)
        vocab = hidden.shape[1] if weight is None else len(weight)
        if chunk_elements is None:  # on the CPU a chunk that stays in cache, elsewhere fewer kernel launches
            chunk_elements = (
                1 << 26 if hidden.device.type != "cpu" else 1 << 21 if weight is None else 1 << 22
            )
        chunk_rows = max(1, chunk_elements // vocab)
        shape = (min(chunk_rows, len(hidden)), vocab)
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, **float32) if needs_weight else None
        grad_bias = torch.zeros(vocab, **float32) if needs_bias else None
        total = torch.zeros((), **float32)
        chunk = None if weight is None else hidden.new_empty(shape)  # the chunk's logits, then their gradient
        # float32 logits need no buffer: their softmax goes into their gradient (logits given) or over them (the chunk)
        scratch = hidden.dtype != torch.float32 or (weight is None and not needs_hidden)
        buffer = torch.empty(shape, **float32) if scratch else chunk
        for start in range(0, len(hidden), chunk_rows):
            part = slice(start, start + chunk_rows)
            h = hidden[part]
            n = len(h)
            if weight is None:  # the logits given: their gradient written into dL/dhidden
                logits, grad = h, None if grad_hidden is None else grad_hidden[part]
            else:  # the chunk's gradient G over its logits
                logits = torch.ops.aten.linear.out(h, weight, bias, out=chunk[:n])
                grad = logits if needs_hidden or needs_weight or needs_bias else None
            total += _chunk_loss(logits, labels[part], eps, None if buffer is None else buffer[:n], grad)
            if needs_hidden and weight is not None:
                torch.mm(logits, weight, out=grad_hidden[part])
            if needs_weight:
                grad_weight += logits.t().mm(h)
            if needs_bias:
                grad_bias += logits.sum(0, dtype=torch.float32)
        # the product (`linear.out`) refuses a weight or bias of another dtype than hidden's
        ctx.used, ctx.dtype = False, hidden.dtype
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        if ctx.used:
            raise RuntimeError(
                "The fused cross-entropy keeps one gradient buffer and scales it in place: it can be backpropagated "
                "once (do not pass `retain_graph=True` through it; compute `F.cross_entropy(outputs.logits, ...)` "
                "yourself for that)."
            )
        ctx.used = True
        # dL/dhidden in hidden's dtype; dL/dW and dL/db, accumulated in float32, in the parameters' dtypes
        grads = [
            None if grad is None else grad.mul_(grad_total.to(grad.dtype)).to(ctx.dtype)
            for grad in ctx.saved_tensors
        ]
        return *grads, None, None, None


def label_smoothed_cross_entropy(logits, labels, epsilon=0.0, chunk_elements=None):
    """Sum over the rows with labels != -100 of the cross-entropy of `logits` (..., V) against `labels` (...),
    label-smoothed by `epsilon` (§5.4), in float32: `F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(),
    ignore_index=-100, reduction="sum", label_smoothing=epsilon)` to rounding, with less memory. `chunk_elements` logits
    are processed at a time: by default 2**21 on the CPU (a chunk that stays in cache), 2**26 elsewhere (fewer kernel
    launches)."""
    logits, labels = _flatten(logits, labels, "logits")
    if is_torchdynamo_compiling():
        # Under `torch.compile` the reference itself: inductor fuses it into its own kernels, where the Python loop
        # and data-dependent branch above would split the graph.
        # (F.cross_entropy's ignore_index is -100 by default)
        return F.cross_entropy(logits.float(), labels, reduction="sum", label_smoothing=epsilon)
    return _LabelSmoothedCrossEntropy.apply(logits, None, None, labels, float(epsilon), chunk_elements)


def linear_label_smoothed_cross_entropy(
    hidden,
    weight,
    bias,
    labels,
    epsilon=0.0,
    chunk_elements=None,
):
    """`label_smoothed_cross_entropy(F.linear(hidden, weight, bias), labels, epsilon)` to rounding, without ever
    holding the (N, V) logits or their gradient: the output projection and the loss computed together, chunk by chunk
    of `chunk_elements` logits (by default 2**22 on the CPU, a chunk that stays in the last-level cache; 2**26
    elsewhere). Under autocast the product takes the autocast dtype, as `F.linear` would (weights and gradients
    keep theirs); the loss is float32. On the CPU in bfloat16 a training step of the `tiny` preset with a vocabulary
    of 8000 takes 8% less time than with the projection followed by `label_smoothed_cross_entropy` (BENCHMARKS.md).
    Token ids outside [0, V) other than -100 are refused."""
    hidden, labels = _flatten(hidden, labels, "hidden states")
    vocab = len(weight)
    if is_torchdynamo_compiling():
        return label_smoothed_cross_entropy(F.linear(hidden, weight, bias), labels, epsilon)
    kept = labels != -100
    outside = kept & ((labels < 0) | (labels >= vocab))
    if outside.any():
        raise ValueError(
            f"labels hold token ids outside the vocabulary [0, {vocab}) (and not -100), e.g. "
            f"{labels[outside][0].item()}."
        )
    device = hidden.device.type
    if device == "cpu" and not kept.all():
        # Ignored positions (padding) add nothing to the loss and get zero gradients: their rows are left out of the
        # products (about 6% of the en->de recipe's target positions). Elsewhere, asking would make the host wait
        # for the device.
        rows = kept.nonzero().squeeze(1)
        hidden, labels = hidden.index_select(0, rows), labels.index_select(0, rows)
    if torch.is_autocast_enabled(device):  # the product in the autocast dtype, as F.linear under autocast
        dtype = torch.get_autocast_dtype(device)
        hidden, weight, bias = (None if t is None else t.to(dtype) for t in (hidden, weight, bias))
    with torch.autocast(device, enabled=False):
        return _LabelSmoothedCrossEntropy.apply(hidden, weight, bias, labels, float(epsilon), chunk_elements)
