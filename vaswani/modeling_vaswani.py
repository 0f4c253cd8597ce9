"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

File order follows the paper from the leaves up: positional encodings (§3.5) → scaled dot-product and multi-head
attention (§3.2) → encoder and decoder layers (§3.1, §3.3) → encoder and decoder stacks (§3.4 embeddings) → the
encoder-decoder model → the model with its pre-softmax projection for generation.

Module names follow transformers' seq2seq family (BART/Marian: `shared`, `embed_tokens`, `self_attn.q_proj`,
`encoder_attn`, `fc1`/`fc2`, `*_layer_norm`, `lm_head`), so checkpoints convert with a rename table and PEFT's
defaults (`q_proj`, `v_proj`) apply.

This file is copied into saved model folders for `trust_remote_code`: it imports only torch, transformers and its
sibling `configuration_vaswani.py`.
"""

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_torchdynamo_compiling, logging

from .configuration_vaswani import VaswaniConfig

logger = logging.get_logger(__name__)


# --------------------------------------------------------------------------------------------------------------------
# Input checks: bad input gets a clear error here instead of an index error deep inside torch.
# --------------------------------------------------------------------------------------------------------------------
def _check_token_ids(ids: torch.Tensor | None, vocab_size: int, name: str) -> None:
    if ids is None or is_torchdynamo_compiling() or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`{name}` holds token ids outside the vocabulary [0, {vocab_size}): min {low}, max {high}. "
            "Check that the tokenizer matches the model (`-100` belongs in `labels` only)."
        )


def _check_mask(mask: torch.Tensor | None, expected: tuple[int, int], name: str, of: str) -> None:
    if mask is None or mask.dim() == 4:  # 4-D masks are taken as already prepared
        return
    if tuple(mask.shape) != tuple(expected):
        raise ValueError(
            f"`{name}` has shape {tuple(mask.shape)} but {of} needs (batch_size, length) = {tuple(expected)}."
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: decoder inputs are the labels shifted one step right behind the start token (§3.1: the
    decoder's "output embeddings are offset by one position"). The -100 of ignored label positions become padding."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


# --------------------------------------------------------------------------------------------------------------------
# §3.5 Positional encoding
# --------------------------------------------------------------------------------------------------------------------
class VaswaniSinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)) (§3.5).

    Sines on even and cosines on odd dimensions, interleaved as in the paper (Marian and tensor2tensor concatenate
    the two halves instead). A table of `num_positions` rows is precomputed; positions past it are computed on the
    fly, so any length works. The table is a non-persistent buffer, recomputed by `_init_weights` after loading.
    """

    def __init__(self, d_model: int, num_positions: int):
        super().__init__()
        self.d_model = d_model
        self.num_positions = num_positions
        self.register_buffer("table", self.compute(torch.arange(num_positions), d_model), persistent=False)

    @staticmethod
    def compute(positions: torch.Tensor, d_model: int) -> torch.Tensor:
        """(T,) integer positions -> (T, d_model) encodings, in float32."""
        exponent = torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device) / d_model
        inv_freq = torch.pow(10000.0, -exponent)  # (ceil(d/2),) = 1 / 10000^(2i/d_model)
        angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, ceil(d/2))
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[
            :, :d_model
        ]  # (T, d) interleaved

    def forward(self, past_length: int | torch.Tensor, seq_len: int) -> torch.Tensor:
        """Encodings of positions past_length .. past_length + seq_len - 1, shape (seq_len, d_model)."""
        if isinstance(past_length, int) and past_length + seq_len <= self.num_positions:
            return self.table[past_length : past_length + seq_len]
        positions = torch.arange(seq_len, device=self.table.device) + past_length
        return self.compute(positions, self.d_model).to(self.table.dtype)


class VaswaniLearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute positions: the alternative of Table 3 row (E), `position_embedding_type="learned"`."""

    def forward(self, past_length: int | torch.Tensor, seq_len: int) -> torch.Tensor:
        if isinstance(past_length, int) and past_length + seq_len > self.num_embeddings:
            raise ValueError(
                f"Sequence of {past_length + seq_len} positions is longer than the learned position table "
                f"(`max_position_embeddings`={self.num_embeddings}). Use sinusoidal positions or a larger table."
            )
        positions = torch.arange(seq_len, device=self.weight.device) + past_length
        return super().forward(positions)  # (seq_len, d_model)


def _make_positions(config: VaswaniConfig) -> nn.Module:
    if config.position_embedding_type == "learned":
        return VaswaniLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
    return VaswaniSinusoidalPositionalEncoding(config.d_model, config.max_position_embeddings)


# --------------------------------------------------------------------------------------------------------------------
# Linear layers: every W of the model (W^Q, W^K, W^V, W^O, W1, W2 and the pre-softmax projection)
# --------------------------------------------------------------------------------------------------------------------
class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b in float32 with the forward product and the input gradient in oneDNN's GEMM."""

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
            # contiguous, which costs more than its faster GEMM saves here (1.1-1.4x, `bench.bench_kernels`).
            grad_weight = grad_2d.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_x, grad_weight, grad_bias


class VaswaniLinear(nn.Linear):
    """`nn.Linear` whose float32 products on the CPU go through oneDNN (forward and input gradient).

    torch's default float32 CPU GEMM is MKL's, which runs without its AVX-512 kernels on non-Intel CPUs: on an AMD
    EPYC (Zen 4) oneDNN's float32 GEMM is about twice as fast (BENCHMARKS.md). The arithmetic is the same float32
    GEMM, so results agree with `F.linear` to rounding. Other cases take `F.linear` unchanged: other dtypes (under
    CPU autocast the bfloat16 product already goes to oneDNN), GPUs, `torch.compile` (which picks its own kernels)
    and `torch.backends.mkldnn.flags(enabled=False)`. It is still an `nn.Linear` with the same parameters, so
    `isinstance` checks, PEFT's LoRA wrapping and checkpoints see no difference.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            not is_torchdynamo_compiling()  # first: dynamo cannot trace the flag queries below (a graph break each)
            and x.device.type == "cpu"
            and x.dtype == self.weight.dtype == torch.float32
            and _ONEDNN_AVAILABLE
            and torch._C._get_mkldnn_enabled()
            and not torch.is_autocast_enabled("cpu")
        ):
            return _OneDNNLinearFunction.apply(x, self.weight, self.bias)
        return super().forward(x)


_ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


# --------------------------------------------------------------------------------------------------------------------
# Dropout (§5.4)
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


def apply_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the mask drawn faster on the CPU.

    torch's CPU dropout draws its mask with `bernoulli_`, which is slow: in a training step of the en->de model of
    RESULTS.md (d_model 128, 8192-token batches, bf16 autocast, two cores) it took a quarter of the step. Drawing
    uniforms and comparing them with p gives the same distribution (each element kept with probability 1 - p,
    kept elements scaled by 1 / (1 - p)) faster: that model's training steps run 1.23x as fast (`bench.ab_dropout`,
    BENCHMARKS.md). Only the random stream differs: a seed still fixes the masks, but not the masks `F.dropout`
    would draw. GPUs (whose dropout is one fused kernel), `torch.compile`, p = 0 and p = 1 take `F.dropout`
    unchanged.
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
# §3.2 Attention
# --------------------------------------------------------------------------------------------------------------------
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, softmax(QK^T / sqrt(d_k)) V (§3.2.1, Eq. 1), in plain torch.

    query (B, h, Tq, d_k), key/value (B, h, Tk, d_k); `attention_mask` is a boolean (True = attend) or additive
    mask broadcastable to (B, 1, Tq, Tk). Scores are taken to float32 before masking and softmax, so the most
    negative fill value cannot overflow in fp16 and a fully masked row gives uniform weights, never NaN.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scaling  # (B, h, Tq, Tk)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
        else:
            scores = scores + attention_mask.float()
    weights = F.softmax(scores, dim=-1).to(query.dtype)
    weights = apply_dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, Tq, h, d_k)
    return output, weights


# Two cases where torch's CPU flash-attention kernel (what SDPA runs on the CPU) is slower than the same formula in
# batched matmuls (`eager_attention_forward`, float32 softmax), measured by `bench.bench_kernels` (BENCHMARKS.md):
# - half-precision training: forward + backward with the kernel is 4-5x slower in bfloat16 at sentence lengths
#   (32 keys), 1.4-1.5x at 128; past about 128 keys the kernel is faster and uses less memory;
# - a single query per sentence (each step of incremental decoding): matmuls 1.9-2.0x faster at 20-60 keys, 1.2x at
#   256, equal at 1024, in any dtype.
_MATMUL_ATTENTION_MAX_KEYS = 128


def _prefer_matmul_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    queries_per_row: int | None = None,
) -> bool:
    """Whether the "sdpa" implementation should compute this call with matmuls: on the CPU (not under
    `torch.compile`), for one query per decoder row (`queries_per_row`; a decoding step, where the beams of a source
    may share its encoder-decoder attention call), or in half precision while gradients are recorded with short
    keys. Same math; only the kernel differs. A causal call without a mask must have as many queries as keys (or
    one query), so that `_matmul_attention_for_sdpa_masks` can make its mask."""
    if query.device.type != "cpu" or is_torchdynamo_compiling():
        return False
    if attention_mask is None and module.is_causal and query.shape[-2] not in (1, key.shape[-2]):
        return False
    if (queries_per_row if queries_per_row is not None else query.shape[-2]) == 1:
        return True
    return (
        query.dtype in (torch.bfloat16, torch.float16)
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad)
        and key.shape[-2] <= _MATMUL_ATTENTION_MAX_KEYS
    )


def _matmul_attention_for_sdpa_masks(module, query, key, value, attention_mask, **kwargs):
    """`eager_attention_forward` given the masks made for SDPA, which leave causal attention to the kernel's
    `is_causal` (mask None): that case (as many queries as keys, see `_prefer_matmul_attention`) gets its
    lower-triangular mask."""
    if attention_mask is None and module.is_causal and query.shape[-2] > 1:
        attention_mask = torch.ones(
            query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device
        ).tril()
    return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)


class VaswaniAttention(nn.Module):
    """Multi-head attention (§3.2.2): h heads of d_k = d_model / h dimensions, projected by W^Q, W^K, W^V and W^O.

    Used three ways (§3.2.3): encoder self-attention, masked decoder self-attention (`is_causal`), and
    encoder-decoder attention (`is_cross_attention`: queries from the decoder, keys and values from the encoder
    output, computed once per sequence and kept in the cache during generation).

    The score computation goes through transformers' attention interface (`config._attn_implementation`: `"sdpa"`
    by default, `"eager"` for attention maps, or flash/flex kernels where installed).
    """

    def __init__(
        self,
        config: VaswaniConfig,
        num_heads: int,
        dropout: float,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.embed_dim = config.d_model
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads  # d_k = d_v = d_model / h
        self.scaling = self.head_dim**-0.5  # 1 / sqrt(d_k)
        self.dropout = dropout
        self.is_causal = is_causal  # read by the SDPA integration; must be set on every attention module
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        bias = config.attention_bias  # the paper's projections have no bias (§3.2.2)
        self.q_proj = VaswaniLinear(self.embed_dim, self.embed_dim, bias=bias)
        self.k_proj = VaswaniLinear(self.embed_dim, self.embed_dim, bias=bias)
        self.v_proj = VaswaniLinear(self.embed_dim, self.embed_dim, bias=bias)
        self.out_proj = VaswaniLinear(self.embed_dim, self.embed_dim, bias=bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(
            1, 2
        )  # (B, T, d) -> (B, h, T, d_k)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, _ = hidden_states.shape
        group = 1
        if (
            self.is_cross_attention
            and key_value_states is not None
            and key_value_states.shape[0] != batch_size
        ):
            # Several decoder rows per source (beam search, several samples): the decoder's batch is `group`
            # consecutive rows per encoder row (see `VaswaniDecoder`). Their queries attend to one copy of that
            # source's keys and values as one sequence of group x Tq queries: same result per row, computed and
            # cached at the encoder's batch size instead of `group` identical copies.
            group = batch_size // key_value_states.shape[0]
            hidden_states = hidden_states.reshape(batch_size // group, group * seq_len, self.embed_dim)
        query = self._heads(self.q_proj(hidden_states))  # (B, h, Tq, d_k)

        if self.is_cross_attention:
            layer_cache = cache.cross_attention_cache if cache is not None else None
            if cache is not None and cache.is_updated.get(self.layer_idx):
                # Encoder keys and values were computed at the first decoding step: reuse them.
                key = layer_cache.layers[self.layer_idx].keys
                value = layer_cache.layers[self.layer_idx].values
            else:
                key = self._heads(self.k_proj(key_value_states))  # (B, h, Ts, d_k)
                value = self._heads(self.v_proj(key_value_states))
                if cache is not None:
                    key, value = layer_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        else:
            key = self._heads(self.k_proj(hidden_states))  # (B, h, Tq, d_k)
            value = self._heads(self.v_proj(hidden_states))
            if cache is not None:
                layer_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                key, value = layer_cache.update(key, value, self.layer_idx)  # (B, h, T_past + Tq, d_k)

        # "eager" (or an unregistered name) falls back to this file's implementation. Written as `get_interface`:
        # transformers looks for that call to allow `model.set_attn_implementation(...)` after loading.
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if self.config._attn_implementation == "sdpa" and _prefer_matmul_attention(
            self, query, key, attention_mask, queries_per_row=seq_len
        ):
            attention_interface = _matmul_attention_for_sdpa_masks
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = output.reshape(batch_size, seq_len, self.embed_dim)  # (B, Tq, h, d_k) -> (B, Tq, d_model)
        if group > 1 and weights is not None:
            # (B / g, h, g x Tq, Ts) -> (B, h, Tq, Ts): one map per decoder row
            weights = weights.unflatten(2, (group, seq_len)).transpose(1, 2).flatten(0, 1)
        return self.out_proj(output), weights


# --------------------------------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder layers, §3.3 position-wise feed-forward networks
# --------------------------------------------------------------------------------------------------------------------
class VaswaniLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: the residual connection around each sublayer and the FFN.

    Post-norm (the paper, §3.1 and §5.4): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (`config.normalize_before`, the seed documents' layout): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: VaswaniConfig, ffn_dim: int):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout  # P_drop on each sublayer output (§5.4)
        self.activation_dropout = config.activation_dropout  # not in the paper; 0 by default
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = VaswaniLinear(config.d_model, ffn_dim)  # W1, b1
        self.fc2 = VaswaniLinear(ffn_dim, config.d_model)  # W2, b2
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def sublayer_input(self, norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        return norm(x) if self.normalize_before else x

    def sublayer_output(self, norm: nn.LayerNorm, residual: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = residual + apply_dropout(y, p=self.dropout, training=self.training)
        return x if self.normalize_before else norm(x)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """FFN(x) = max(0, xW1 + b1)W2 + b2 (§3.3, Eq. 2) as a residual sublayer."""
        y = self.activation_fn(self.fc1(self.sublayer_input(self.final_layer_norm, x)))
        y = self.fc2(apply_dropout(y, p=self.activation_dropout, training=self.training))
        return self.sublayer_output(self.final_layer_norm, x, y)


class VaswaniEncoderLayer(VaswaniLayer):
    """Encoder layer (§3.1): multi-head self-attention, then the position-wise FFN."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__(config, config.encoder_ffn_dim)
        self.self_attn = VaswaniAttention(
            config, config.encoder_attention_heads, config.attention_dropout, layer_idx=layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, weights = self.self_attn(
            self.sublayer_input(self.self_attn_layer_norm, hidden_states),
            attention_mask=attention_mask,
            **kwargs,
        )
        hidden_states = self.sublayer_output(self.self_attn_layer_norm, hidden_states, y)
        return self.feed_forward(hidden_states), weights


class VaswaniDecoderLayer(VaswaniLayer):
    """Decoder layer (§3.1): masked self-attention, encoder-decoder attention over the encoder output, FFN."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__(config, config.decoder_ffn_dim)
        heads, drop = config.decoder_attention_heads, config.attention_dropout
        self.self_attn = VaswaniAttention(config, heads, drop, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VaswaniAttention(
            config, heads, drop, is_cross_attention=True, layer_idx=layer_idx
        )
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        y, self_weights = self.self_attn(
            self.sublayer_input(self.self_attn_layer_norm, hidden_states),
            attention_mask=attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.sublayer_output(self.self_attn_layer_norm, hidden_states, y)
        y, cross_weights = self.encoder_attn(
            self.sublayer_input(self.encoder_attn_layer_norm, hidden_states),
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.sublayer_output(self.encoder_attn_layer_norm, hidden_states, y)
        return self.feed_forward(hidden_states), self_weights, cross_weights


# --------------------------------------------------------------------------------------------------------------------
# Pretrained base: initialisation, loading, Auto-class plumbing
# --------------------------------------------------------------------------------------------------------------------
class VaswaniPreTrainedModel(PreTrainedModel):
    config: VaswaniConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as usual, with an `auto_map` naming both model classes, so that `AutoModel` and
        `AutoModelForSeq2SeqLM` load the folder with `trust_remote_code=True` (transformers writes only the class
        being saved)."""
        self.config.auto_map = {
            **(getattr(self.config, "auto_map", None) or {}),
            "AutoModel": "modeling_vaswani.VaswaniModel",
            "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
        }
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        """The paper gives no initialisation. Linear layers: Xavier-uniform, zero biases (tensor2tensor, fairseq).
        Embeddings: N(0, d_model^-0.5) (or `config.init_std`), which the sqrt(d_model) scaling of §3.4 brings to
        unit size; the padding row is zero. Sinusoids are recomputed: loading builds the model on the meta device
        and refills non-persistent buffers with garbage."""
        std = self.config.init_std or self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, VaswaniLearnedPositionalEmbedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VaswaniSinusoidalPositionalEncoding):
            table = module.compute(
                torch.arange(module.num_positions, device=module.table.device), module.d_model
            )
            init.copy_(module.table, table)


# --------------------------------------------------------------------------------------------------------------------
# Encoder and decoder stacks, §3.1 and §3.4
# --------------------------------------------------------------------------------------------------------------------
class VaswaniStack(nn.Module):
    """What the encoder and decoder stacks share: token embeddings scaled by sqrt(d_model) (§3.4) plus positional
    encodings (§3.5) with dropout on the sum (§5.4), N layers, and, in the pre-norm layout only, a final LayerNorm
    (post-norm layers already end normalised)."""

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding, layer_class: type, num_layers: int):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = _make_positions(config)
        self.dropout = config.dropout
        self.layers = nn.ModuleList([layer_class(config, i) for i in range(num_layers)])
        self.layer_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        )

    def token_embeddings(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, name: str):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Give exactly one of `{name}` and its embeddings.")
        if inputs_embeds is not None:
            return inputs_embeds
        _check_token_ids(input_ids, self.embed_tokens.num_embeddings, name)
        return self.embed_tokens(input_ids)

    def embed(self, inputs_embeds: torch.Tensor, past_length: int | torch.Tensor = 0) -> torch.Tensor:
        positions = self.embed_positions(past_length, inputs_embeds.shape[1])  # (T, d_model)
        hidden_states = inputs_embeds * self.embed_scale + positions  # (B, T, d_model)
        return apply_dropout(hidden_states, p=self.dropout, training=self.training)

    def final_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(hidden_states) if self.layer_norm is not None else hidden_states


class VaswaniEncoder(VaswaniStack):
    """N encoder layers over the embedded source (§3.1)."""

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding):
        super().__init__(config, embed_tokens, VaswaniEncoderLayer, config.encoder_layers)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        inputs_embeds = self.token_embeddings(input_ids, inputs_embeds, "input_ids")
        batch_size, seq_len = inputs_embeds.shape[:2]
        _check_mask(
            attention_mask, (batch_size, seq_len), "attention_mask", "the source of shape (batch, length)"
        )

        hidden_states = self.embed(inputs_embeds)  # (B, S, d_model)
        mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )

        all_hidden, all_attn = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden_states,)
            hidden_states, weights = layer(hidden_states, mask, **kwargs)
            if output_attentions:
                all_attn += (weights,)
        hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            all_hidden += (hidden_states,)
        return BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attn if output_attentions else None,
        )


class VaswaniDecoder(VaswaniStack):
    """N decoder layers; self-attention is masked so position i sees only positions < i + 1 (§3.1, §3.2.3).

    The decoder batch may be a multiple g of the encoder batch: rows b*g .. b*g + g - 1 then decode source b (the
    layout of `generate()`'s beams and samples, which this model does not copy, see
    `VaswaniForConditionalGeneration._expand_inputs_for_generation`).
    """

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding):
        super().__init__(config, embed_tokens, VaswaniDecoderLayer, config.decoder_layers)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder output, 'memory').")
        inputs_embeds = self.token_embeddings(input_ids, inputs_embeds, "decoder_input_ids")
        batch_size, seq_len = inputs_embeds.shape[:2]

        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        if not isinstance(past_length, torch.Tensor):
            _check_mask(
                attention_mask,
                (batch_size, past_length + seq_len),
                "decoder_attention_mask",
                "the target (past and current tokens)",
            )
        _check_mask(
            encoder_attention_mask,
            encoder_hidden_states.shape[:2],
            "attention_mask",
            "the encoder output of shape (batch, source length)",
        )
        encoder_batch = encoder_hidden_states.shape[0]
        if batch_size % encoder_batch:
            raise ValueError(
                f"The decoder batch ({batch_size}) must be the encoder batch ({encoder_batch}) or a multiple of it "
                "(each source's decoder rows consecutive, as `generate()` lays out beams and samples)."
            )

        hidden_states = self.embed(inputs_embeds, past_length)  # (B, T, d_model)
        self_attn_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=self_attn_cache,
        )
        cross_mask = create_bidirectional_mask(  # per source: the decoder rows of one source share one call
            config=self.config,
            inputs_embeds=hidden_states.reshape(encoder_batch, -1, hidden_states.shape[-1]),
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        all_hidden, all_self, all_cross = (), (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden_states,)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=cross_mask,
                cache=cache,
                **kwargs,
            )
            if output_attentions:
                all_self += (self_weights,)
                all_cross += (cross_weights,)
        hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            all_hidden += (hidden_states,)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_self if output_attentions else None,
            cross_attentions=all_cross if output_attentions else None,
        )


# --------------------------------------------------------------------------------------------------------------------
# The encoder-decoder model (Figure 1)
# --------------------------------------------------------------------------------------------------------------------
class VaswaniModel(VaswaniPreTrainedModel):
    """The bare encoder-decoder of Figure 1, returning the decoder's last hidden states.

    With `share_encoder_decoder_embeddings` (the paper, §3.4) one matrix `shared` embeds source and target tokens.
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            encoder_embed = decoder_embed = self.shared
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }
        else:
            encoder_embed = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            decoder_embed = nn.Embedding(config.decoder_vocab_size, config.d_model, config.pad_token_id)
            self._tied_weights_keys = None
        self.encoder = VaswaniEncoder(config, encoder_embed)
        self.decoder = VaswaniDecoder(config, decoder_embed)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value

    def get_encoder(self, modality=None):
        return self.encoder

    def get_decoder(self, modality=None):
        return self.decoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`): source token ids.
        attention_mask (`torch.Tensor` of shape `(batch_size, source_length)`): 1 for real tokens, 0 for padding.
        decoder_input_ids (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, start token first.
        decoder_attention_mask (`torch.Tensor` of shape `(batch_size, past + target_length)`, *optional*): padding
            of the target; the causal mask is always applied.
        encoder_outputs (*optional*): a precomputed encoder output (as `generate()` passes).
        cache (`EncoderDecoderCache`, *optional*): self-attention keys/values of earlier steps and the cross-attention
            keys/values of the encoder output (`past_key_values` is accepted as an alias).
        """
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        else:
            kwargs.pop("past_key_values", None)
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        output_attentions = (
            output_attentions if output_attentions is not None else self.config.output_attentions
        )
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# --------------------------------------------------------------------------------------------------------------------
# §5.4 Label smoothing: the training loss
# --------------------------------------------------------------------------------------------------------------------
class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy over rows of `logits` (N, V), and its gradient, in one pass of chunks.

    Per row with target t (rows labelled -100 count 0): loss = -(1 - eps) * log p_t - eps * mean_v(log p_v), with
    log p = log_softmax(z) -- exactly `F.cross_entropy(..., label_smoothing=eps, reduction="sum")`, computed in
    float32 whatever the dtype of `logits`. Its gradient, softmax(z) - eps / V - (1 - eps) * onehot(t), is written
    during the forward pass into one tensor of the logits' shape and dtype, chunk by chunk, so that neither the
    float32 log-probabilities (N, V) nor their gradient are ever held in full: one (N, V) tensor where
    `F.cross_entropy` holds two or three, and fewer passes over memory (BENCHMARKS.md). The backward only scales it,
    in place, so a graph through this loss can be differentiated once (`retain_graph` is refused with an error).
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
            row_loss = (eps - 1.0) * log_p.gather(1, target) - eps * log_p.mean(dim=-1, keepdim=True)
            total += row_loss.masked_fill(ignored.unsqueeze(1), 0.0).sum()
            if g is not None:  # p - eps / V - (1 - eps) * onehot(t), float32 until stored
                log_p.exp_().sub_(eps / vocab).scatter_add_(
                    1, target, log_p.new_full(target.shape, eps - 1.0)
                )
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
                "The label-smoothed loss keeps one gradient buffer and scales it in place: it can be "
                "backpropagated once (do not pass `retain_graph=True` through `VaswaniForConditionalGeneration`'s "
                "loss; compute `F.cross_entropy(outputs.logits, ...)` yourself for that)."
            )
        ctx.used = True
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_total.to(grad.dtype)), None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float, chunk_elements: int | None = None
) -> torch.Tensor:
    """Sum over the non-ignored rows (labels != -100) of the label-smoothed cross-entropy (§5.4) of `logits`
    (..., V) against `labels` (...), in float32. Equal to `F.cross_entropy(logits.flatten(0, -2).float(),
    labels.flatten(), ignore_index=-100, reduction="sum", label_smoothing=epsilon)` to rounding, with less memory
    (see `_LabelSmoothedCrossEntropy`). `chunk_elements` sets how many logits are processed at a time; by default
    2**21 on the CPU (a chunk that stays in cache) and 2**26 elsewhere (on a GPU each chunk costs kernel launches,
    so a batch of 4096 positions x 37000 logits takes 3 chunks instead of 74)."""
    logits = logits.reshape(-1, logits.shape[-1])
    labels = labels.reshape(-1).to(logits.device)
    if labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels have {labels.shape[0]} positions, logits {logits.shape[0]}.")
    if is_torchdynamo_compiling():
        # Under `torch.compile` the formula itself: inductor fuses it into its own kernels, where the hand-fused
        # function's Python loop and data-dependent branch would split the graph.
        return F.cross_entropy(
            logits.float(), labels, ignore_index=-100, reduction="sum", label_smoothing=epsilon
        )
    if chunk_elements is None:
        chunk_elements = 1 << 21 if logits.device.type == "cpu" else 1 << 26
    chunk_rows = max(1, chunk_elements // logits.shape[1])
    return _LabelSmoothedCrossEntropy.apply(logits, labels, float(epsilon), chunk_rows)


# --------------------------------------------------------------------------------------------------------------------
# §6.1 Beam search's length penalty
# --------------------------------------------------------------------------------------------------------------------
PAPER_LENGTH_PENALTY_FORM = "gnmt"  # the default wherever a form is not named
LENGTH_PENALTY_FORMS = (PAPER_LENGTH_PENALTY_FORM, "power")


def length_penalty_factor(length: int, alpha: float, form: str = PAPER_LENGTH_PENALTY_FORM) -> float:
    """lp(Y), by which beam search divides a hypothesis' summed log-probability so that lengths compare fairly.

    §6.1 uses "length penalty alpha = 0.6" and cites Wu et al. (2016), whose penalty (their eq. 14, also
    tensor2tensor's) is `"gnmt"`: ((5 + |Y|) / 6) ** alpha. transformers' `generate()` divides by |Y| ** alpha
    instead (`"power"`, also fairseq's `--lenpen`), which favours long hypotheses more. |Y| counts the generated
    tokens, end-of-sentence included.
    """
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "power":
        return float(length) ** alpha
    raise ValueError(f"`length_penalty_form` must be one of {LENGTH_PENALTY_FORMS}, not {form!r}.")


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """The Transformer with its pre-softmax linear projection (§3.4), for training with `labels` and `generate()`.

    The projection `lm_head` shares the decoder embedding matrix when `tie_word_embeddings` (the paper). With
    `labels`, the loss is label-smoothed cross-entropy (eps_ls = `config.label_smoothing`, §5.4) over the target
    tokens, labels of -100 ignored; under gradient accumulation the Trainer passes `num_items_in_batch` and the
    summed loss is divided by it, so accumulated steps weigh every token equally.
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = VaswaniLinear(config.d_model, config.decoder_vocab_size, bias=False)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        else:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.post_init()
        # The paper's decoding (§6.1): beam search with beam size 4 and length penalty alpha = 0.6, in the form of
        # Wu et al. (2016) that it cites (`length_penalty_form`, see `length_penalty_factor`). Saved as
        # generation_config.json; a loaded generation_config.json takes precedence.
        self.generation_config.num_beams = 4
        self.generation_config.length_penalty = 0.6
        self.generation_config.length_penalty_form = PAPER_LENGTH_PENALTY_FORM
        # A generation config marked as made from the model config drops settings transformers does not know
        # (`length_penalty_form`) when it is loaded again; this one holds the model's own settings.
        self.generation_config._from_model_config = False
        self._length_penalty_form = PAPER_LENGTH_PENALTY_FORM

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_encoder(self, modality=None):
        return self.model.encoder

    def get_decoder(self, modality=None):
        return self.model.decoder

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.share_encoder_decoder_embeddings:  # one vocabulary: the target side follows the source
            self.config.decoder_vocab_size = embeddings.weight.shape[0]
        return embeddings

    def _expand_inputs_for_generation(
        self, expand_size: int = 1, is_encoder_decoder: bool = False, input_ids=None, **model_kwargs
    ):
        """`generate()`'s copying of the inputs for each beam or sample, without copying the encoder's side.

        transformers' version repeats the encoder output and its mask `expand_size` times, so every beam holds its
        own identical copy of the encoder-decoder attention keys and values (computed, cached and read
        `expand_size` times over). Here only the decoder inputs are repeated; the decoder recognises a batch that
        is a multiple of the encoder's and lets each source's rows attend to its one copy (`VaswaniAttention`).
        Results are those of the copied layout (tests compare both).
        """
        if expand_size == 1 or not is_encoder_decoder or model_kwargs.get("encoder_outputs") is None:
            return super()._expand_inputs_for_generation(
                expand_size=expand_size,
                is_encoder_decoder=is_encoder_decoder,
                input_ids=input_ids,
                **model_kwargs,
            )
        kept = {
            key: model_kwargs.pop(key) for key in ("encoder_outputs", "attention_mask") if key in model_kwargs
        }
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size=expand_size, is_encoder_decoder=False, input_ids=input_ids, **model_kwargs
        )
        model_kwargs.update(kept)
        return input_ids, model_kwargs

    def generate(self, *args, **kwargs):
        """transformers' `generate()`. A generation config saved before `length_penalty_form` existed, or built
        without it, gets the paper's form first: transformers would otherwise reject `length_penalty_form=...` as an
        argument the model does not use."""
        if getattr(self.generation_config, "length_penalty_form", None) is None:
            self.generation_config.length_penalty_form = PAPER_LENGTH_PENALTY_FORM
        given = kwargs.get("generation_config")
        if given is not None and getattr(given, "length_penalty_form", None) is None:
            kwargs["generation_config"] = given = copy.deepcopy(given)  # the caller's object stays as it was
            given.length_penalty_form = PAPER_LENGTH_PENALTY_FORM
        return super().generate(*args, **kwargs)

    def _beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs):
        """transformers' beam search, with the length penalty of `generation_config.length_penalty_form`.

        `"gnmt"` (the paper's, and the default when a generation config names no form) or `"power"` (transformers'
        own). transformers divides by |Y| ** alpha in two places, `_update_finished_beams` and
        `_check_early_stop_heuristic`; the overrides below rescale the scores they are given so that the division
        becomes one by `length_penalty_factor(|Y|, alpha, form)`. The search itself is transformers'.
        """
        form = getattr(generation_config, "length_penalty_form", None) or PAPER_LENGTH_PENALTY_FORM
        length_penalty_factor(1, 1.0, form)  # a bad form is named before any work
        previous, self._length_penalty_form = self._length_penalty_form, form
        try:
            return super()._beam_search(
                input_ids, logits_processor, stopping_criteria, generation_config=generation_config, **kwargs
            )
        finally:
            self._length_penalty_form = previous

    def _rescale_for_length_penalty(self, scores: torch.Tensor, length: int, alpha: float) -> torch.Tensor:
        """`scores` such that transformers' division by `length ** alpha` divides them by our lp(Y) instead."""
        if self._length_penalty_form == "power" or alpha == 0:
            return scores
        return scores * (length**alpha / length_penalty_factor(length, alpha, self._length_penalty_form))

    def _update_finished_beams(
        self, *, topk_log_probs, cur_len, decoder_prompt_len, length_penalty, **kwargs
    ):
        # transformers scores a hypothesis that ends at this step by log-probability / (cur_len + 1 - prompt) ** alpha
        length = cur_len + 1 - decoder_prompt_len
        return super()._update_finished_beams(
            topk_log_probs=self._rescale_for_length_penalty(topk_log_probs, length, length_penalty),
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            length_penalty=length_penalty,
            **kwargs,
        )

    def _check_early_stop_heuristic(
        self,
        *,
        running_beam_scores,
        cur_len,
        max_length,
        decoder_prompt_len,
        early_stopping,
        length_penalty,
        **kwargs,
    ):
        # the length at which transformers bounds the best running hypothesis' final score
        if early_stopping == "never" and length_penalty > 0.0:
            length = max_length - decoder_prompt_len
        else:
            length = cur_len - decoder_prompt_len
        return super()._check_early_stop_heuristic(
            running_beam_scores=self._rescale_for_length_penalty(running_beam_scores, length, length_penalty),
            cur_len=cur_len,
            max_length=max_length,
            decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
            **kwargs,
        )

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's reordering of the cache after each step (called by `generate()`).

        Only the decoder self-attention keys and values are reordered. `beam_idx` moves beams within their own
        sentence, and all beams of a sentence attend to the same encoder output: the cross-attention cache holds
        it once per sentence (see `_expand_inputs_for_generation`) or, when the caller copied it per beam,
        identical rows, which reordering (as the generic `EncoderDecoderCache` does) would copy to the same values.
        """
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*): target ids ending with the
            end-of-sentence token, -100 where ignored. Decoder inputs are made from them by shifting right unless
            `decoder_input_ids` are given.
        num_items_in_batch (*optional*): the number of target tokens across accumulated micro-batches (passed by
            the Trainer); the loss is then the summed loss divided by it.
        """
        if labels is not None:
            _check_token_ids(labels.masked_fill(labels == -100, 0), self.config.decoder_vocab_size, "labels")
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, target vocab)
        loss = None
        if labels is not None:
            loss = self.label_smoothed_loss(logits, labels, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def label_smoothed_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Label-smoothed cross-entropy (§5.4): (1 - eps) * NLL + eps * mean over the vocabulary of -log p.

        Mean over non-ignored target tokens, or sum / `num_items_in_batch` when given. Computed in float32 by
        `label_smoothed_cross_entropy`, which equals `F.cross_entropy(..., label_smoothing=eps)` with less memory.
        """
        total = label_smoothed_cross_entropy(logits, labels, self.config.label_smoothing)
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum()
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch


__all__ = [
    "VaswaniPreTrainedModel",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
]
