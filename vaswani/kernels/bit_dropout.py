"""`Dropout` and `dropout`: the keep mask drawn from 15 random bits per element, four elements per 64-bit draw of
torch's generator, in place of `bernoulli_`. Reference: `nn.Dropout` / `F.dropout` (`tests/test_kernels.py`)."""

import torch
import torch.nn.functional as F
from torch import nn

from .onednn_linear import _eager_cpu

# The keep mask is drawn from random bits, 15 per element: four elements from each 64-bit draw of torch's generator
# (`random_()` on int64 fills 63 bits; the low 15 of each 16-bit lane are uniform). An element is kept when its 15
# bits, read as an integer in [0, 2**15), are at least round(p * 2**15).
_LEVELS = 1 << 15


def quantized_dropout_probability(p):
    """The drop probability that `dropout` applies on its fast path: p rounded to a multiple of 2**-15 (within
    1.6e-5 of p). Kept elements are scaled by 1 / (1 - this), so that the output's expectation is x exactly."""
    return round(p * _LEVELS) / _LEVELS


def dropout(x, p, training):
    """`F.dropout(x, p, training)`, with the mask drawn faster on the CPU.

    torch's CPU dropout draws its mask with `bernoulli_`, which took a quarter of a training step of a small model on
    two cores, and a float32 uniform per element costs one draw of the generator each. Here four elements share one
    64-bit draw, 15 bits each: every element is kept with probability 1 - p' and kept elements are scaled by
    1 / (1 - p'), where p' is p rounded to a multiple of 2**-15 (`quantized_dropout_probability`; 0.3 becomes
    0.29999, and the expectation stays x). Only the random stream differs from torch's; a seed still fixes the
    masks. GPUs (one fused kernel), `torch.compile`, and p within 2**-16 of 0 or 1 (p = 0 and p = 1 included) take
    `F.dropout`.
    """
    threshold = round(p * _LEVELS)
    if training and 0 < threshold < _LEVELS and _eager_cpu(x) and x.is_floating_point():
        # Bernoulli(1 - p') per element; kept elements scaled by 1 / (1 - p') in x's dtype, as torch's dropout rounds
        # the same factor. The product's own backward takes the gradient through the same mask.
        n = x.numel()
        draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # on the CPU, as x
        bits = draws.view(torch.int16)[:n].view(x.shape).bitwise_and_(_LEVELS - 1)
        return x * bits.ge_(threshold).to(x.dtype).mul_(_LEVELS / (_LEVELS - threshold))
    return F.dropout(x, p, training)


class Dropout(nn.Dropout):
    """`nn.Dropout` whose CPU training masks come from `dropout`'s 15 random bits per element."""

    def forward(self, x):
        return dropout(x, self.p, self.training)
