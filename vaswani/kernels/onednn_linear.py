"""`Linear`: `nn.Linear` whose float32 CPU products (forward and input gradient) go through oneDNN's GEMM, faster than
MKL's on CPUs where MKL runs without its AVX-512 kernels (AMD), and on Intel's from 16 rows on. Reference: `nn.Linear`
/ `F.linear` (`tests/test_kernels.py`). oneDNN's linear is a private torch operator, guarded by `_ONEDNN_AVAILABLE`."""

import functools
import os
import platform

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import is_torchdynamo_compiling


class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b in float32, the forward product and the input gradient in oneDNN's GEMM."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad  # needs_bias: False for a bias of None
        grad_2d = grad.reshape(-1, grad.shape[-1])  # (N, out)
        # dL/dx = dL/dy W: a "linear" with weight W^T of shape (in, out). dL/dW = (dL/dy)^T x: (out, N) @ (N, in), by
        # torch's `mm`, which reads both operands transposed in place; oneDNN's linear would first copy them to be
        # contiguous, which costs more than its faster GEMM saves here.
        return (
            torch.ops.mkldnn._linear_pointwise(grad, weight.t(), None, "none", [], "") if needs_x else None,
            grad_2d.t().mm(x.reshape(-1, x.shape[-1])) if needs_weight else None,
            grad_2d.sum(0) if needs_bias else None,
        )


_ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")

# On an Intel CPU, MKL's float32 GEMM (torch's own, `F.linear`) runs its AVX-512 kernels and beats oneDNN's on a few
# rows: 1.1-4.5x below 16 rows for weights up to 4M entries; for larger ones (an output projection over a vocabulary)
# 1.6x at 2 rows, 0.93x at 1, and slower from 4 rows on. From 16 rows on oneDNN's is as fast or up to 1.8x faster
# (`python -m bench kernels --what linear`, 2 threads, Intel Xeon). Those few rows are the decoding steps of one
# sentence (greedy, or its 4 beams).
MKL_FEWER_ROWS = 16
MKL_FEWER_ROWS_LARGE = 4
MKL_LARGE_WEIGHT = 1 << 22


@functools.cache
def _cpuinfo():
    """The first processor's fields in /proc/cpuinfo (Linux: `vendor_id`, `flags`, ...); empty where there is none."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the end of the first processor's block
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    return fields


@functools.cache  # asked at every float32 linear call
def _intel_cpu():
    """Whether this CPU is Intel's: the vendor of /proc/cpuinfo (Linux), else the platform's processor string."""
    vendor = _cpuinfo().get("vendor_id")
    return "GenuineIntel" in (platform.processor() if vendor is None else vendor)


# What the kernels ask of oneDNN's instruction set: each feature with the CPU flags that provide it and the words of
# oneDNN's ISA names (`ONEDNN_MAX_CPU_ISA`) whose levels include it. VNNI's multiply-add keeps 32-bit sums; without
# it oneDNN's int8 kernels add byte products in saturating 16-bit pairs.
_ONEDNN_FEATURES = {
    "avx512": (("avx512f",), ("AVX512", "AVX10")),
    "vnni": (
        ("avx512_vnni", "avx_vnni", "amx_int8"),
        ("VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10", "AMX"),
    ),
    "amx_int8": (("amx_int8",), ("AMX",)),
}


@functools.cache  # asked at every float32 linear call
def onednn_features():
    """The features of `_ONEDNN_FEATURES` that oneDNN's kernels use here: the CPU's, capped as oneDNN caps its own
    dispatch by `ONEDNN_MAX_CPU_ISA` (or `DNNL_MAX_CPU_ISA`), so that a restricted level is seen as a CPU of that level
    would be seen. Empty without oneDNN."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    # as /proc/cpuinfo names them: `avx512_vnni`, `amx_int8`, ...
    flags = set(_cpuinfo().get("flags", "").split())
    return frozenset(
        name
        for name, (provided_by, levels) in _ONEDNN_FEATURES.items()
        if _ONEDNN_AVAILABLE
        and flags.intersection(provided_by)
        and (cap in ("ALL", "DEFAULT") or any(word in cap for word in levels))
    )


def _mkl_is_faster(x, weight):
    """Whether MKL's GEMM beats oneDNN's on this product: always where oneDNN runs without AVX-512, and on an Intel
    CPU, whose MKL runs its AVX-512 kernels, for a few rows (`MKL_FEWER_ROWS`)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return "avx512" not in onednn_features() or (
        rows < MKL_FEWER_ROWS
        and _intel_cpu()
        and (rows < MKL_FEWER_ROWS_LARGE or weight.numel() < MKL_LARGE_WEIGHT)
    )


def _eager_cpu(x):
    """Whether `x` is on the CPU outside `torch.compile`, which picks its own kernels: where the kernels apply."""
    return not is_torchdynamo_compiling() and x.device.type == "cpu"


def _is_plain(weight):
    """A tensor of torch's own, not a subclass such as torchao's quantized weights."""
    return type(weight) in (torch.Tensor, nn.Parameter)


def _shared_result(module, x):
    """`module`'s result on `x` from the group of projections `use_cpu_kernels` put it in (`StackedProjections`,
    `SharedInputProjections`), or None where it computes alone."""
    shared = module.__dict__.get("_vaswani_shared_input")
    return None if shared is None else shared(module, x)


def onednn_linear_applies(x, weight):
    """Whether `Linear` takes oneDNN for this call: a plain float32 weight (not a quantized tensor subclass) on the CPU,
    outside `torch.compile` and CPU autocast (whose bfloat16 product already goes to oneDNN), with oneDNN enabled
    (`torch.backends.mkldnn.flags(enabled=False)` turns it off), and not a product of a few rows on an Intel CPU, where
    MKL's is faster (`MKL_FEWER_ROWS`)."""
    return (
        _eager_cpu(x)  # first: dynamo cannot trace the flag queries below
        and _is_plain(weight)
        and x.dtype == weight.dtype == torch.float32
        and _ONEDNN_AVAILABLE
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled("cpu")
        and not _mkl_is_faster(x, weight)
    )


class Linear(nn.Linear):
    """`nn.Linear` whose float32 CPU products go through oneDNN (forward and input gradient).

    torch's float32 CPU GEMM is MKL's, which runs without its AVX-512 kernels on non-Intel CPUs: on an AMD EPYC
    oneDNN's is about twice as fast. On an Intel CPU, oneDNN's is faster from 16 rows on, MKL's below (decoding one
    sentence), and those calls stay with `F.linear`. Same parameters, same arithmetic to rounding;
    `isinstance(m, nn.Linear)`, PEFT's LoRA wrapping and checkpoints see an `nn.Linear` (`type(m) is nn.Linear` does
    not: `use_plain_modules` undoes it).
    """

    def forward(self, x):
        y = _shared_result(self, x)
        if y is None:
            linear = _OneDNNLinearFunction.apply if onednn_linear_applies(x, self.weight) else F.linear
            y = linear(x, self.weight, self.bias)
        return y
