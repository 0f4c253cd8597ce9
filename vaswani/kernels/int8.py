"""`Int8Linear` and `Int8OutputLinear`: torchao's int8 weights (transformers' `TorchAoConfig(
Int8DynamicActivationInt8WeightConfig())`) through torch's int8 GEMMs, in torchao's arithmetic op for op, without its
per-call Python. Reference: torchao's `F.linear` on the same weights (`tests/test_int8.py`).

And the projections that take one input computed as one product: `SharedInputProjections` (int8) and its float
subclass `StackedProjections` (CPU autocast)."""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .onednn_linear import _ONEDNN_AVAILABLE, Linear, _eager_cpu, _is_plain, _shared_result, onednn_features


def torchao_int8_dynamic(weight):
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
        and scale.numel() == len(qdata)
        and scale.dtype == torch.float32
        and (zero_point is None or not zero_point.any())
    )


def _quantize_rows(x, reduce_range=False):
    """torchao's symmetric per-row int8 quantization of a 2-D float32 tensor, op for op: scale = max|row| /
    ((qmax - qmin) / 2), at least float32's eps, and `round(x * (1 / scale))` clamped to [qmin, qmax], which is
    [-128, 127], or [-64, 63] with `reduce_range`."""
    qmin, qmax = (-64, 63) if reduce_range else (-128, 127)
    scale = x.abs().amax(-1, keepdim=True).div_((qmax - qmin) / 2).clamp_(min=torch.finfo(torch.float32).eps)
    return torch.round(x * (1.0 / scale)).clamp_(qmin, qmax).to(torch.int8), scale


# oneDNN's int8 linear on a weight packed once beats `torch._int_mm`, which repacks its weight at every call, from
# about a million weights on (the feed-forward layers and the output projection), and on smaller weights from about
# five million rows x weights (a 512 x 512 projection from 24 rows on: beam search's steps, a batch's encoder); below,
# `_int_mm` is faster (`python -m bench kernels --what int8`, 2 threads, Intel Xeon with AMX). On an AMD EPYC (no AMX:
# unsigned rows, `_signed_rows_native`) `_int_mm` is 1.0-4.2x faster below 320 rows for the 512-input weights up to
# 2048 outputs, the packed weight 1.05-1.13x faster at 320 rows (`bench/results/kernels_int8_amd.json`); the
# thresholds are the Xeon's.
PACKED_INT8_MIN_WEIGHTS = 1 << 20
PACKED_INT8_MIN_PRODUCT = 5 << 20
_ONEDNN_INT8_AVAILABLE = (
    _ONEDNN_AVAILABLE
    and hasattr(torch.ops.onednn, "qlinear_prepack")
    and hasattr(torch.ops.onednn, "qlinear_pointwise")
)


@functools.cache  # one entry per layer width
def _unit_scales(rows):
    """Per-row weight scales of 1 and zero points of 0 for oneDNN's int8 linear (never written)."""
    return torch.ones(rows), torch.zeros(rows, dtype=torch.long)


@functools.cache
def _signed_rows_native():
    """Whether oneDNN's int8 linear multiplies signed int8 rows in its fast kernels here: with AMX's int8 tiles
    (`onednn_features`). Its VNNI kernels multiply unsigned by signed bytes only; signed rows there fall to its
    reference kernel, about 1000x slower (an AMD EPYC: 3.2 s against 1.3 ms for 16 rows of the 37000 x 512 output
    projection)."""
    return "amx_int8" in onednn_features()


@functools.cache
def _exact(packed):
    """Whether `_int8_product` gives the exact integer product here, by the packed weight or by `torch._int_mm`:
    tried once on the sums that overflow 16 bits (rows of -128 and of 127 against weights of 127 and of -127). Both run
    oneDNN's int8 kernels, which without VNNI (AVX2, AVX-512 without VNNI) add byte products in saturating 16-bit
    pairs; there `Int8Linear` leaves its layers to torchao's own `F.linear`, and the packed weight is not used."""
    if packed and not (_ONEDNN_INT8_AVAILABLE and "vnni" in onednn_features()):
        return False
    extremes = torch.tensor([-128, 127, -127], dtype=torch.int8)
    rows, weight = extremes[:2, None].repeat(4, 64), extremes[1:, None].repeat(4, 64)
    with torch.inference_mode():
        product = _int8_product(
            rows, weight, torch.ops.onednn.qlinear_prepack(weight, None) if packed else None
        )
    return torch.equal(product, (rows.long() @ weight.long().t()).float())


def exact_int8_products():
    """Whether the int8 kernels run here: on a CPU whose int8 GEMM is exact (`_exact`). Elsewhere `Int8Linear`
    leaves its layers to torchao and `use_cpu_kernels` keeps the output projection in float32."""
    return _exact(False)


def _int8_product(quantized, qdata, packed):
    """quantized @ qdata^T in int32, exactly, returned as float32 (`.to(torch.float32)` of the int32 product): by
    `torch._int_mm`, or by oneDNN's int8 linear on `packed` (`torch.ops.onednn.qlinear_prepack(qdata)`) with unit
    scales, whose float32 output is the same conversion of the same integers. Without AMX (`_signed_rows_native`)
    oneDNN takes the rows as unsigned bytes with zero point 128: q + 128 (the sign bit flipped), from which it
    subtracts 128 x the weight's column sums, the same integers."""
    if packed is None:
        return torch._int_mm(quantized, qdata.t()).to(torch.float32)
    ones, zeros = _unit_scales(len(qdata))
    native = _signed_rows_native()
    rows, zero_point = (quantized, 0) if native else (quantized.view(torch.uint8).bitwise_xor(128), 128)
    return torch.ops.onednn.qlinear_pointwise(
        rows, 1.0, zero_point, packed, ones, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


def int8_linear(x, weight, bias, packed=None):
    """`F.linear(x, weight, bias)` for a `torchao_int8_dynamic` weight, in torchao's arithmetic op for op: each row of
    x quantized to int8 (`_quantize_rows`; [-64, 63] with `reduce_range`), the int32 product (exact: `_int8_product`),
    then scaled by the row's scale and the weight's, and the bias added. torchao computes the same product and scales;
    its cost on the CPU is the Python of its tensor subclass and general quantization primitives at every call, which
    for one decoding step's small matrices is several times the product itself."""
    return _int8_linear(x, weight.qdata, weight.scale, bias, weight.act_quant_kwargs.reduce_range, packed)


def _int8_linear(x, qdata, weight_scale, bias, reduce_range, packed):
    rows = x.reshape(-1, x.shape[-1])
    quantized, scale = _quantize_rows(rows, reduce_range)
    y = _int8_product(quantized, qdata, packed).mul_(scale).mul_(weight_scale.reshape(-1))
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _int8_applies(x):
    """Whether `Int8Linear` takes `int8_linear` for this call: float32 input on the CPU, outside `torch.compile`, on
    a CPU whose int8 GEMM is exact (`_exact`)."""
    return _eager_cpu(x) and x.dtype == torch.float32 and exact_int8_products()


def _identity(tensor):
    """Where `tensor`'s data lives and how often it was written in place (inference tensors keep no count), to tell
    when a copy made from it is stale."""
    return tensor.data_ptr(), -1 if tensor.is_inference() else tensor._version


def _cached(owner, name, tensors, make):
    """`make()`, kept in `owner.__dict__[name]` (outside any state dict) and made again when one of the `tensors` it
    is made from has moved or been written in place (`_identity`)."""
    key = [_identity(t) for t in tensors]
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        cached = owner.__dict__[name] = (key, make())
    return cached[1]


def _packed(module, qdata, x):
    """`qdata` packed for oneDNN's int8 linear, once per weight (kept on the module, outside its state dict), for a
    call on input `x` where that is faster (`PACKED_INT8_MIN_WEIGHTS`, `PACKED_INT8_MIN_PRODUCT`); else None."""
    weights, rows = qdata.numel(), x.numel() // x.shape[-1]
    if not _exact(True) or (weights < PACKED_INT8_MIN_WEIGHTS and rows * weights < PACKED_INT8_MIN_PRODUCT):
        return None
    return _cached(
        module, "_vaswani_packed_int8", [qdata], lambda: torch.ops.onednn.qlinear_prepack(qdata, None)
    )


class SharedInputProjections:
    """The query, key and value projections of one self-attention layer (`Int8Linear`s of the same input size and
    activation quantization), which the model calls one after the other on the same input: the first call computes
    all three in one int8 product over their stacked weights, the input's rows quantized once, and hands the key's
    and the value's results to their own calls on that input. Each output row and column is computed as its own
    layer computes it (the same quantized rows, the same integer sums, the same scales), so the results are equal to
    the bit; a call on another input, or on this one after an in-place change that its version counter shows,
    computes alone. `use_cpu_kernels` groups the projections; inference tensors carry no version counter, so a model
    must not change the input in place between the three calls (`VaswaniAttention` does not)."""

    contiguous = True

    def __init__(self, *modules):  # query, key, value in the order the model calls them
        self.modules = modules
        self.pending = {}  # id(module) -> (the module's result, the input, its identity)
        for module in modules:
            module.__dict__["_vaswani_shared_input"] = self

    @staticmethod
    def applies(*modules):
        """Whether these `Int8Linear`s can be computed as one: torchao int8 weights of one input size, one
        activation range, and biases on all or none."""
        return all(type(m) is Int8Linear for m in modules) and (
            len(
                {
                    (m.in_features, bool(m.weight.act_quant_kwargs.reduce_range), m.bias is None)
                    for m in modules
                }
            )
            == 1
        )

    def __call__(self, module, x):
        """The result of `module` on `x`, or None where `module` must compute it alone. The first module's call
        computes all of them and keeps the others' results for their calls on `x`."""
        if module is self.modules[0]:
            parts = self._products(x).split([m.out_features for m in self.modules], dim=-1)
            given = x, _identity(x)  # held with the results, so the input goes with the last one taken
            self.pending = {id(m): (part, *given) for m, part in zip(self.modules, parts, strict=True)}
        part, given, identity = self.pending.pop(id(module), (None, None, None))
        if part is not None and given is x and identity == _identity(x):
            # each its own contiguous tensor, as a layer alone returns it: attention kernels may round differently
            # on views with the stacked product's strides (`StackedProjections`' autocast training keeps the views)
            return part.contiguous() if self.contiguous else part
        return None

    def _products(self, x):
        """All three products of `x`, side by side, by the three weights stacked (int8 rows, scales, biases; remade
        when any of them changes)."""
        # (int8 rows, scales, bias) of each; biases on all three or none (`applies`)
        parts = [(m.weight.qdata, m.weight.scale.reshape(-1), m.bias) for m in self.modules]
        qdata, scale, bias = _cached(
            self,
            "_stacked_weights",
            [t for part in parts for t in part if t is not None],
            lambda: [
                None if stack[0] is None else torch.cat(stack).detach() for stack in zip(*parts, strict=True)
            ],
        )
        reduce_range = self.modules[0].weight.act_quant_kwargs.reduce_range
        return _int8_linear(x, qdata, scale, bias, reduce_range, _packed(self, qdata, x))


class StackedProjections(SharedInputProjections):
    """`Linear`s that the model calls one after the other on the same input, in this order (other calls between
    them allowed): the first call computes all of them in one `F.linear` over their stacked weights (and biases) and
    hands the others their columns of the result when they are called on that input. Under autocast each output
    column is the same dot product of the same bf16 input and weight row as the layer's own, so the outputs are
    equal to the rounding of the GEMM; gradients reach each weight through the stacking. A call on another input, or
    on this one after an in-place change that its version counter shows, computes alone, as does any call outside
    CPU autocast. `use_cpu_kernels` groups the projections: a self-attention's W^Q, W^K, W^V, and the W^K and W^V of
    every encoder-decoder attention, which all take the encoder's output. In CPU autocast (bf16 training) that is one
    input cast instead of one per projection, one GEMM of 3 x d_model (or 2 x layers x d_model) columns instead of one
    per projection, one input-gradient GEMM and cast in the backward. Reference: each `nn.Linear` alone
    (`tests/test_kernels.py`)."""

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


class Int8Linear(nn.Linear):
    """`nn.Linear` holding torchao's int8 weight (`torchao_int8_dynamic`), whose float32 CPU calls go through
    `int8_linear`: the same int8 arithmetic as torchao's `F.linear`, in a few torch operators and an int8 GEMM (with
    the other projections of its attention layer in one, `SharedInputProjections`, where `use_cpu_kernels` grouped
    them). Elsewhere (a GPU, `torch.compile`, bfloat16) torchao's own `F.linear`."""

    def forward(self, x):
        if not _int8_applies(x):
            return F.linear(x, self.weight, self.bias)
        y = _shared_result(self, x)
        return int8_linear(x, self.weight, self.bias, _packed(self, self.weight.qdata, x)) if y is None else y


class Int8OutputLinear(Linear):
    """The float32 output projection of a model whose other linear layers are torchao int8 (`Int8Linear`): its
    float32 CPU calls quantize an int8 copy of the weight as torchao quantizes the others (`_quantize_rows`, once per
    weight) and go through the same arithmetic. transformers leaves a projection tied to the embeddings in float32;
    the float32 weight, its tie and what `save_pretrained` writes stay as they are. Elsewhere, `Linear`."""

    def forward(self, x):
        weight = self.weight
        if not (_int8_applies(x) and _is_plain(weight) and weight.dtype == torch.float32):
            return super().forward(x)
        qdata, weight_scale = _cached(
            self, "_vaswani_int8_weight", [weight], lambda: _quantize_rows(weight.detach())
        )
        return _int8_linear(x, qdata, weight_scale, self.bias, False, _packed(self, qdata, x))
