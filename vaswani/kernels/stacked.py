"""`StackedProjections`: the projections that the model applies to the same input (a self-attention's W^Q, W^K,
W^V; the W^K and W^V of every encoder-decoder attention, which all take the encoder's output), computed as one product
over their stacked weights in CPU autocast (bf16 training). One input cast instead of one per projection, one GEMM of
3 x d_model (or 2 x layers x d_model) columns instead of one per projection, one input-gradient GEMM and cast in the
backward. Reference: each `nn.Linear` alone (`tests/test_kernels.py`)."""

import torch
import torch.nn.functional as F

from .int8 import SharedInputProjections
from .onednn_linear import Linear, _eager_cpu, _is_plain


class StackedProjections(SharedInputProjections):
    """`Linear`s that the model calls one after the other on the same input, in this order (other calls between
    them allowed): the first call computes all of them in one `F.linear` over their stacked weights (and biases) and
    hands the others their columns of the result when they are called on that input. Under autocast each output
    column is the same dot product of the same bf16 input and weight row as the layer's own, so the outputs are
    equal to the rounding of the GEMM; gradients reach each weight through the stacking. A call on another input, or
    on this one after an in-place change that its version counter shows, computes alone, as does any call outside
    CPU autocast. `use_cpu_kernels` groups the projections."""

    contiguous = False

    @staticmethod
    def applies(*modules):
        """Whether these layers can be computed as one: `Linear`s with plain weights of one input size, dtype and
        device, and biases on all or none."""
        return (
            all(type(m) is Linear and _is_plain(m.weight) for m in modules)
            and len({(m.in_features, m.weight.dtype, m.weight.device, m.bias is None) for m in modules}) == 1
        )

    def __call__(self, module, x):
        """The result of `module` on `x`, or None where `module` must compute it alone: as
        `SharedInputProjections`, on the CPU under autocast only (where each projection alone casts the same input
        again), outside `torch.compile` (which fuses the casts itself)."""
        if not (_eager_cpu(x) and torch.is_autocast_enabled("cpu")):
            self.pending = {}
            return None
        return super().__call__(module, x)

    def _products(self, x):
        weight = torch.cat([m.weight for m in self.modules])
        bias = None if self.modules[0].bias is None else torch.cat([m.bias for m in self.modules])
        return F.linear(x, weight, bias)
