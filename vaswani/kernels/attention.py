"""`attn_implementation="vaswani_sdpa"`: transformers' "sdpa" attention, with the calls where batched matmuls beat
torch's CPU flash-attention kernel computed by `matmul_attention` (the model's own `eager_attention_forward`, with
short softmax rows padded to where torch's CPU softmax is fast). Registered with
transformers' `AttentionInterface` when `vaswani.kernels` is imported. Reference: "sdpa" and "eager"
(`tests/test_kernels.py`)."""

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torchdynamo_compiling

from ..modeling_vaswani import attention_scores

FAST_ATTENTION = "vaswani_sdpa"

# Beyond this many keys, torch's CPU SDPA kernel beats batched matmuls in half-precision training.
MATMUL_ATTENTION_MAX_KEYS = 128
# torch's CPU softmax over fewer elements than one float32 vector of its dispatch level (16 with AVX-512, 8 with AVX2;
# `torch.backends.cpu.get_cpu_capability()`) takes a path about 10x slower per element, and its backward about 18x
# (`python -m bench kernels --what short-softmax`; rows of 8-15 at AVX2 are as fast as 16): `matmul_attention`
# pads shorter rows of scores to this many with -inf. No padding where torch's kernels are not vectorised.
SOFTMAX_MIN_KEYS = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 0)


def prefers_matmul_attention(module, query, key, attention_mask):
    """Where batched matmuls beat torch's CPU SDPA kernel (a flash-attention kernel), measured by
    `python -m bench kernels`: one query per row (each step of incremental decoding: about 2x at 20-60 keys, equal at
    1024), and forward + backward in bfloat16/float16 with at most `MATMUL_ATTENTION_MAX_KEYS` keys (4-5x at 32 keys).
    A causal call without a mask must have one query or as many queries as keys, so that its mask can be drawn.

    The same under `torch.compile`: inductor does not replace SDPA on the CPU, it calls the same flash-attention
    kernel, whose backward took half of a compiled training step at the recipe's shape
    (`bench/ab_compiled_training.py` at commit 82d9f03); the matmuls are plain torch operators that it traces and
    fuses. The choice guards on the key length, so a compiled step with dynamic shapes compiles once for at most 128
    keys and once for more."""
    if query.device.type != "cpu" or (
        attention_mask is None and module.is_causal and query.shape[-2] not in (1, key.shape[-2])
    ):
        return False
    return query.shape[-2] == 1 or (
        query.dtype in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad)
        and key.shape[-2] <= MATMUL_ATTENTION_MAX_KEYS
    )


def vaswani_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' "sdpa" attention, with the calls that `prefers_matmul_attention` picks computed by
    `matmul_attention` (the model's `eager_attention_forward`: Eq. 1 in batched matmuls, float32 softmax): same
    arithmetic, another kernel. SDPA's masks leave causal attention to the kernel's `is_causal` (mask None); those
    calls get their lower-triangular mask here."""
    if not prefers_matmul_attention(module, query, key, attention_mask):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
    if attention_mask is None and module.is_causal and query.shape[-2] > 1:
        attention_mask = query.new_ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
    return matmul_attention(module, query, key, value, attention_mask, **kwargs)


def matmul_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling,
    dropout=0.0,
    **kwargs,
):
    """The model's `eager_attention_forward` (Eq. 1 in batched matmuls, float32 softmax), operator for operator,
    except that a softmax over fewer than `SOFTMAX_MIN_KEYS` keys is taken over the scores padded to that many with
    -inf, and the weights of the real keys kept: the padding gets exactly zero weight and gradient, so the weights,
    the output and every gradient are the eager function's to the rounding of the softmax's sums (a row whose every
    key is masked too: uniform over its keys, zero gradient). Not under `torch.compile`, whose softmax is
    inductor's own."""
    scores = attention_scores(query, key, attention_mask, scaling)  # the eager function's
    keys = scores.shape[-1]
    if keys < SOFTMAX_MIN_KEYS and not is_torchdynamo_compiling():
        scores = F.pad(scores, (0, SOFTMAX_MIN_KEYS - keys), value=-torch.inf)
    weights = torch.softmax(scores, dim=-1)[..., :keys].to(query.dtype)
    weights = F.dropout(weights, dropout, module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, Tq, h, d_k)
    return output, weights


AttentionInterface.register(FAST_ATTENTION, vaswani_sdpa_attention)
AttentionMaskInterface.register(FAST_ATTENTION, sdpa_mask)
