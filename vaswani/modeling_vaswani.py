"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

The file follows the paper from the leaves up:
    §3.5 positional encoding -> §3.2.1 scaled dot-product attention (Eq. 1) -> §3.2.2 multi-head attention ->
    §3.3 position-wise feed-forward network and §3.1 residual sublayers -> §3.1 encoder and decoder layers ->
    §3.4 embeddings and the encoder and decoder stacks -> Figure 1, the encoder-decoder -> the pre-softmax linear
    projection (§3.4) with its loss, for training and `generate()`.

Module names follow transformers' seq2seq family (BART/Marian: `shared`, `embed_tokens`, `self_attn.q_proj`,
`encoder_attn`, `fc1`/`fc2`, `*_layer_norm`, `lm_head`), so checkpoints convert with a rename table and PEFT's
defaults (`q_proj`, `v_proj`) apply. The model is plain torch: `nn.Linear`, `nn.Dropout`, `F.cross_entropy`.
Faster CPU kernels for the same arithmetic are the caller's choice (`vaswani.kernels.use_cpu_kernels(model)`, which
the recipe's tools make); they are not part of this file nor of a saved folder.

Siblings, copied with this file into every saved folder for `trust_remote_code` (`utils_vaswani.CODE_FILES`), import
only torch and transformers: `configuration_vaswani.py`, `generation_vaswani.py` (the paper's decoding, §6.1, also
saved as the folder's `custom_generate/generate.py`), `pipeline_vaswani.py` (the translation pipeline) and
`utils_vaswani.py` (input checks, names across transformers releases, saving a whole folder). They work with
transformers 5.5 and later (`configuration_vaswani.MIN_TRANSFORMERS_VERSION`).
"""

import math

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.loss.loss_utils import fixed_cross_entropy
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration_vaswani import ARCHITECTURE_FIELDS, DROPOUT_FIELDS, VaswaniConfig
from .generation_vaswani import CACHE_NAME, drop_trainer_defaults
from .generation_vaswani import generate as paper_generate
from .pipeline_vaswani import VaswaniTranslationPipeline  # noqa: F401 (travels with this file: CODE_FILES)
from .utils_vaswani import (
    AUTO_MAP,
    CUSTOM_PIPELINES,
    cache_argument,
    causal_mask,
    check_decoder_inputs,
    check_embedding_inputs,
    check_mask,
    flag,
    follow_config,
    resized_rows,
    tied_weights_saved_once,
    write_model_code,
)


def shift_tokens_right(labels, pad_token_id, decoder_start_token_id):
    """Teacher forcing: decoder inputs are the labels shifted one step right behind the start token (§3.1: the
    decoder's "output embeddings are offset by one position"). The -100 of ignored label positions become padding."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


# --------------------------------------------------------------------------------------------------------------------
# §3.5 Positional encoding
# --------------------------------------------------------------------------------------------------------------------
def sinusoidal_positional_encoding(positions, d_model, layout="interleaved", frequencies="paper"):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)) (§3.5).

    (T,) positions -> (T, d_model) encodings in float32. `layout="concatenated"` puts all sines before all cosines
    and `frequencies="fairseq"` spaces the frequencies as 1 / 10000^(i / (d_model/2 - 1)) (fairseq, tensor2tensor,
    Marian's layout): `VaswaniConfig.sinusoid_layout` and `sinusoid_frequencies`.
    """
    half = (d_model + 1) // 2
    i = torch.arange(half, dtype=torch.float32, device=positions.device)
    exponent = 2 * i / d_model if frequencies == "paper" else i / (half - 1)
    angles = positions[:, None].float() * torch.pow(10000.0, -exponent)  # (T, half)
    if layout == "interleaved":  # sin, cos, sin, ...
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]
    return torch.cat((angles.sin(), angles.cos()[:, : d_model - half]), dim=-1)  # sin ... sin, cos ... cos


class VaswaniSinusoidalPositionalEncoding(nn.Module):
    """The fixed encodings of §3.5, computed for the positions asked for: no table, so any length works and nothing
    needs restoring after loading."""

    def __init__(self, d_model, layout="interleaved", frequencies="paper", offset=0):
        super().__init__()
        self.d_model, self.layout, self.frequencies, self.offset = d_model, layout, frequencies, offset

    def forward(self, past_length, seq_len, device):
        """Encodings of positions past_length .. past_length + seq_len - 1 (plus the offset), (seq_len, d_model)."""
        positions = torch.arange(seq_len, device=device) + past_length + self.offset
        return sinusoidal_positional_encoding(positions, self.d_model, self.layout, self.frequencies)


class VaswaniLearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute positions: the alternative of Table 3 row (E), `position_embedding_type="learned"`."""

    def __init__(self, num_positions, d_model, offset=0):
        super().__init__(num_positions + offset, d_model)
        self.offset = offset

    def forward(self, past_length, seq_len, device):
        # a static cache counts its past on the device: reading it would cost a host-device sync
        if not torch.is_tensor(past_length) and past_length + seq_len + self.offset > self.num_embeddings:
            raise ValueError(
                f"A sequence of {past_length + seq_len} positions is longer than the learned position table "
                f"(`max_position_embeddings`={self.num_embeddings - self.offset}). Use sinusoidal positions or a "
                "larger table."
            )
        positions = torch.arange(seq_len, device=device) + past_length + self.offset
        return super().forward(positions)  # (seq_len, d_model)


# --------------------------------------------------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention
# --------------------------------------------------------------------------------------------------------------------
def attention_scores(query, key, attention_mask, scaling):
    """QK^T / sqrt(d_k) in float32, (B, h, Tq, Tk), masked positions at float32's most negative value (a boolean
    mask) or plus an additive mask."""
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
        else:
            scores = scores + attention_mask.float()
    return scores


def eager_attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling,
    dropout=0.0,
    **kwargs,
):
    """Attention(Q, K, V) = softmax(QK^T / sqrt(d_k)) V (Eq. 1), in plain torch (`attn_implementation="eager"`).

    query (B, h, Tq, d_k), key/value (B, h, Tk, d_k); `attention_mask` is boolean (True = attend) or additive,
    broadcastable to (B, 1, Tq, Tk). Scores are taken to float32 before masking and softmax, so the most negative fill
    value cannot overflow in fp16 and a fully masked row gives uniform weights, never NaN.
    """
    scores = attention_scores(query, key, attention_mask, scaling)
    weights = torch.softmax(scores, dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, Tq, h, d_k)
    return output, weights


# --------------------------------------------------------------------------------------------------------------------
# §3.2.2 Multi-head attention
# --------------------------------------------------------------------------------------------------------------------
class VaswaniAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2),
    with h heads of d_k = d_v = d_model / h dimensions.

    Used three ways (§3.2.3): encoder self-attention, masked decoder self-attention (`is_causal`), and
    encoder-decoder attention (`is_cross_attention`: queries from the decoder, keys and values from the encoder
    output, computed once per sentence and kept in the cache during generation).

    Eq. 1 runs through transformers' attention interface, chosen by `config._attn_implementation`: `"sdpa"` by
    default, `"eager"` (`eager_attention_forward`, which returns attention maps), the flash and flex kernels where
    they are installed, or any registered one (`"vaswani_sdpa"`, faster on the CPU: `vaswani.kernels`).
    """

    def __init__(self, config, num_heads, is_causal=False, is_cross_attention=False, layer_idx=0):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads  # d_k = d_v = d_model / h
        self.scaling = self.head_dim**-0.5  # 1 / sqrt(d_k)
        # read by transformers' SDPA integration: every attention module must set it
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        d, bias = config.d_model, config.attention_bias  # the paper's W^Q, W^K, W^V, W^O have no bias
        self.q_proj = nn.Linear(d, d, bias=bias)  # W^Q for all heads
        self.k_proj = nn.Linear(d, d, bias=bias)  # W^K
        self.v_proj = nn.Linear(d, d, bias=bias)  # W^V
        self.out_proj = nn.Linear(d, d, bias=bias)  # W^O
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            projection.is_query_key_value = True  # initialised with `config.qkv_init_gain`

    def split_heads(self, x):  # (B, T, d) -> (B, h, T, d_k)
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states,
        key_value_states=None,
        attention_mask=None,
        cache=None,
        **kwargs,
    ):
        query = self.split_heads(self.q_proj(hidden_states))  # (B, h, Tq, d_k)
        if self.is_cross_attention and cache is not None and cache.is_updated.get(self.layer_idx):
            # the encoder output's keys and values, computed at the first decoding step
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = layer.keys, layer.values
        else:
            source = key_value_states if self.is_cross_attention else hidden_states
            key = self.split_heads(self.k_proj(source))  # (B, h, Tk, d_k)
            value = self.split_heads(self.v_proj(source))
            if self.is_cross_attention and cache is not None:
                key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
            elif cache is not None:  # append to the earlier steps' keys and values: (B, h, T_past + Tq, d_k)
                key, value = cache.self_attention_cache.update(key, value, self.layer_idx)

        attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        dropout = self.config.attention_dropout if self.training else 0.0  # not in the paper; 0 by default
        output, weights = attention(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        # Concat(head_1, ..., head_h): (B, Tq, d_model)
        return self.out_proj(output.reshape(*hidden_states.shape[:-1], -1)), weights


# --------------------------------------------------------------------------------------------------------------------
# §3.1 Residual sublayers, §3.3 position-wise feed-forward network
# --------------------------------------------------------------------------------------------------------------------
class VaswaniLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: the residual connection around each sublayer, and the FFN.

    Post-norm (the paper, §3.1 and §5.4): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (`config.normalize_before`): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config, ffn_dim):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = nn.Dropout(config.dropout)  # P_drop on each sublayer output (§5.4)
        self.activation_dropout = nn.Dropout(config.activation_dropout)  # not in the paper; 0 by default
        self.activation_fn = ACT2FN[config.activation_function]  # ReLU in the paper
        self.fc1 = nn.Linear(config.d_model, ffn_dim)  # W1, b1: d_model -> d_ff
        self.fc2 = nn.Linear(ffn_dim, config.d_model)  # W2, b2: d_ff -> d_model
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def sublayer_input(self, norm, x):
        return norm(x) if self.normalize_before else x

    def sublayer_output(self, norm, residual, y):
        x = residual + self.dropout(y)
        return x if self.normalize_before else norm(x)

    def feed_forward(self, x):
        """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. 2), as a residual sublayer."""
        y = self.activation_fn(self.fc1(self.sublayer_input(self.final_layer_norm, x)))  # (B, T, d_ff)
        y = self.fc2(self.activation_dropout(y))  # (B, T, d_model)
        return self.sublayer_output(self.final_layer_norm, x, y)


# --------------------------------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder layers
# --------------------------------------------------------------------------------------------------------------------
class VaswaniEncoderLayer(VaswaniLayer):
    """Encoder layer (§3.1): multi-head self-attention, then the position-wise FFN."""

    def __init__(self, config, layer_idx):
        super().__init__(config, config.encoder_ffn_dim)
        self.self_attn = VaswaniAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        x = self.sublayer_input(self.self_attn_layer_norm, hidden_states)
        y, weights = self.self_attn(x, attention_mask=attention_mask, **kwargs)
        hidden_states = self.sublayer_output(self.self_attn_layer_norm, hidden_states, y)
        return self.feed_forward(hidden_states), weights


class VaswaniDecoderLayer(VaswaniLayer):
    """Decoder layer (§3.1): masked self-attention, encoder-decoder attention over the encoder output, then the FFN."""

    def __init__(self, config, layer_idx):
        super().__init__(config, config.decoder_ffn_dim)
        heads = config.decoder_attention_heads
        self.self_attn = VaswaniAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VaswaniAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        **kwargs,
    ):
        x = self.sublayer_input(self.self_attn_layer_norm, hidden_states)
        y, self_weights = self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = self.sublayer_output(self.self_attn_layer_norm, hidden_states, y)
        x = self.sublayer_input(self.encoder_attn_layer_norm, hidden_states)
        y, cross_weights = self.encoder_attn(
            x,
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
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def __init__(self, config, *args, **kwargs):
        # One vocabulary, one size: `config.vocab_size = n` sets both (transformers' common tests build models so).
        if config.share_encoder_decoder_embeddings:
            config.decoder_vocab_size = config.vocab_size
        config.validate_fields()  # fields may have been changed since the config was built
        super().__init__(config, *args, **kwargs)
        # the fields the modules follow, for `follow_config` (in training and saving)
        self._built_as = {name: getattr(config, name) for name in ARCHITECTURE_FIELDS + DROPOUT_FIELDS}

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as usual, plus what makes the folder whole wherever the model came from (`CODE_FILES`): an `auto_map`
        naming both model classes (transformers writes only the class being saved), the translation pipeline
        (`pipeline("translation", model=folder, trust_remote_code=True)`; transformers 5 has none of its own), and
        the paper's decoding as the folder's `custom_generate/generate.py`. A config that cannot work, or that was
        changed after the model was built (`follow_config`), is refused before anything is written. Not saved:
        the `max_length` of 20 that transformers' Seq2SeqTrainer writes (`drop_trainer_defaults`)."""
        self.config.validate_fields()
        follow_config(self)
        self._keys_to_ignore_on_save = tied_weights_saved_once(self)
        drop_trainer_defaults(getattr(self, "generation_config", None))  # the bare model has none
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **AUTO_MAP}
        self.config.custom_pipelines = {
            **(getattr(self.config, "custom_pipelines", None) or {}),
            **CUSTOM_PIPELINES,
        }
        saved = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            write_model_code(save_directory)
        return saved

    def get_expanded_tied_weights_keys(self, all_submodels=False):
        """The `{target: source}` weights that transformers ties: the model's `_tied_weights_keys`, which name the
        output projection only with `tie_word_embeddings`. transformers ties nothing when `tie_word_embeddings=False`;
        here the source and target embeddings stay one matrix whenever `share_encoder_decoder_embeddings` (§3.4), so
        that an untied output projection still has one embedding matrix under it."""
        return {**super().get_expanded_tied_weights_keys(all_submodels), **(self._tied_weights_keys or {})}

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resize the (source) vocabulary. With one shared vocabulary (the paper) transformers' resizing applies to
        all its uses; with separate vocabularies only the source side changes (the target side:
        `resize_decoder_token_embeddings`)."""
        output = self.get_output_embeddings()
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        # transformers set `vocab_size`; with one shared vocabulary the target side is the same
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = self.config.vocab_size
        elif output is not None:  # transformers resized it with the source side; the target side is unchanged
            self.set_output_embeddings(output)
        return embeddings

    def resize_decoder_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None):
        """Resize the target vocabulary of separate vocabularies: the decoder embedding and the output projection."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "One vocabulary is shared (`share_encoder_decoder_embeddings=True`): use `resize_token_embeddings`."
            )
        decoder = self.base_model.decoder
        resized_rows(decoder.embed_tokens, new_num_tokens, pad_to_multiple_of)
        self.config.decoder_vocab_size = decoder.embed_tokens.num_embeddings
        output = self.get_output_embeddings()
        if self.config.tie_word_embeddings:
            self.tie_weights()
        elif output is not None:
            resized_rows(output, new_num_tokens, pad_to_multiple_of)
        return decoder.embed_tokens

    def _init_weights(self, module):
        """The paper gives no initialisation. Linear layers: Xavier-uniform, zero biases (tensor2tensor, fairseq);
        W^Q, W^K, W^V (marked `is_query_key_value`) with the gain `config.qkv_init_gain`.
        Embeddings: N(0, d_model^-0.5) (or `config.init_std`), which the sqrt(d_model) scaling of §3.4 brings to unit
        size; the padding row is zero."""
        std = self.config.init_std or self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            gain = self.config.qkv_init_gain if getattr(module, "is_query_key_value", False) else 1.0
            init.xavier_uniform_(module.weight, gain=gain)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


# --------------------------------------------------------------------------------------------------------------------
# §3.4 Embeddings, and the encoder and decoder stacks (§3.1)
# --------------------------------------------------------------------------------------------------------------------
class VaswaniStack(nn.Module):
    """What the encoder and decoder stacks share: token embeddings multiplied by sqrt(d_model) (§3.4) plus positional
    encodings (§3.5), dropout on the sum (§5.4), N layers, and, in the pre-norm layout only, a final LayerNorm
    (post-norm layers already end normalised)."""

    def __init__(self, config, embed_tokens):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        if config.position_embedding_type == "learned":
            self.embed_positions = VaswaniLearnedPositionalEmbedding(
                config.max_position_embeddings, config.d_model, config.position_offset
            )
        else:
            self.embed_positions = VaswaniSinusoidalPositionalEncoding(
                config.d_model, config.sinusoid_layout, config.sinusoid_frequencies, config.position_offset
            )
        self.dropout = nn.Dropout(config.dropout)  # P_drop on the sums (§5.4)
        num_layers = getattr(config, self.num_layers)
        self.layers = nn.ModuleList([self.layer_class(config, i) for i in range(num_layers)])
        self.layer_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        )
        self.gradient_checkpointing = False

    def embed(self, input_ids, inputs_embeds, name, past_length=0):
        """Token embeddings x sqrt(d_model) + positional encodings, then dropout: (B, T) ids -> (B, T, d_model)."""
        check_embedding_inputs(input_ids, inputs_embeds, name, self.embed_tokens)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        positions = self.embed_positions(past_length, inputs_embeds.shape[1], inputs_embeds.device)  # (T, d)
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        return self.dropout(hidden_states)

    def run_layers(
        self,
        output_class,
        hidden_states,
        *args,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        fields=None,
        **kwargs,
    ):
        """The N layers, then the final LayerNorm of the pre-norm layout, as `output_class` (with the other `fields`)
        or its tuple: each layer's input and attention maps (self-attention, and encoder-decoder attention in the
        decoder) when asked for."""
        all_hidden, all_weights = [], []
        for layer in self.layers:
            all_hidden.append(hidden_states)
            hidden_states, *weights = layer(hidden_states, *args, **kwargs)
            all_weights.append(weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        # the self-attention maps of every layer, then (in the decoder) the encoder-decoder ones
        attentions = (
            zip(*all_weights, strict=True)
            if flag(output_attentions, self.config, "output_attentions")
            else ()
        )
        output = output_class(
            last_hidden_state=hidden_states,
            hidden_states=(*all_hidden, hidden_states) if flag(output_hidden_states, self.config) else None,
            **dict(zip(("attentions", "cross_attentions"), attentions, strict=False)),
            **(fields or {}),
        )
        return output if flag(return_dict, self.config, "return_dict") else output.to_tuple()


class VaswaniEncoder(VaswaniStack):
    """The encoder: N layers of self-attention and FFN over the embedded source (§3.1)."""

    layer_class, num_layers = VaswaniEncoderLayer, "encoder_layers"

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        **kwargs,
    ):
        hidden_states = self.embed(input_ids, inputs_embeds, "input_ids")  # (B, S, d_model)
        check_mask(attention_mask, hidden_states.shape[:2], "attention_mask", "the source (batch, length)")
        mask = create_bidirectional_mask(self.config, hidden_states, attention_mask)
        return self.run_layers(BaseModelOutput, hidden_states, mask, **kwargs)


class VaswaniDecoder(VaswaniStack):
    """The decoder: N layers whose self-attention is masked, so that position i sees only positions up to i
    (§3.1, §3.2.3), attending to the encoder output ("memory")."""

    layer_class, num_layers = VaswaniDecoderLayer, "decoder_layers"

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        **kwargs,
    ):
        cache = cache_argument(cache, kwargs)
        kwargs.pop("cache_position", None)  # positions come from the cache's length
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder output, 'memory').")
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise ValueError(
                f"The decoder's cache must be an `EncoderDecoderCache`, got {type(cache).__name__}."
            )
        past_length = cache.get_seq_length() if cache is not None else 0

        # (B, T, d_model)
        hidden_states = self.embed(input_ids, inputs_embeds, "decoder_input_ids", past_length)
        check_decoder_inputs(
            attention_mask, encoder_attention_mask, encoder_hidden_states, hidden_states, past_length
        )
        self_mask = causal_mask(self.config, hidden_states, attention_mask, cache)
        cross_mask = create_bidirectional_mask(
            self.config, hidden_states, encoder_attention_mask, encoder_hidden_states
        )
        return self.run_layers(
            BaseModelOutputWithPastAndCrossAttentions,
            hidden_states,
            self_mask,
            encoder_hidden_states,
            cross_mask,
            cache,
            fields={CACHE_NAME: cache if use_cache else None},
            **kwargs,
        )


# --------------------------------------------------------------------------------------------------------------------
# Figure 1: the encoder-decoder
# --------------------------------------------------------------------------------------------------------------------
class VaswaniModel(VaswaniPreTrainedModel):
    """The bare encoder-decoder of Figure 1, returning the decoder's last hidden states.

    With `share_encoder_decoder_embeddings` (the paper, §3.4) one matrix `shared` embeds source and target tokens.
    """

    def __init__(self, config):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:  # one matrix for source and target tokens, tied below
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }
        encoder_embed = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        decoder_embed = nn.Embedding(config.decoder_vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VaswaniEncoder(config, encoder_embed)
        self.decoder = VaswaniDecoder(config, decoder_embed)
        self.post_init()
        self._keys_to_ignore_on_save = set(self.all_tied_weights_keys)  # (`tied_weights_saved_once`)

    def get_input_embeddings(self):
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value):
        self.encoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.shared = self.decoder.embed_tokens = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`): source token ids.
        attention_mask (`torch.Tensor` of shape `(batch_size, source_length)`): 1 for real tokens, 0 for padding.
        decoder_input_ids (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, start token first.
        decoder_attention_mask (`torch.Tensor` of shape `(batch_size, past + target_length)`, *optional*): padding
            of the target; the causal mask is always applied.
        encoder_outputs (*optional*): a precomputed encoder output (as `generate()` passes).
        cache (`EncoderDecoderCache`, *optional*): self- and encoder-decoder attention keys/values of earlier steps
            (`past_key_values` before transformers 5.24, accepted too).
        """
        if self.training:  # a changed dropout rate applies, a changed architecture is refused before a step
            follow_config(self)
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        outputs = dict(
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True
        )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask, inputs_embeds, **outputs)
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
            **outputs,
            **kwargs,
        )
        # the decoder's fields (its hidden states and self-attention maps as `decoder_*`), then the encoder's
        decoder_fields = {
            f"decoder_{name}" if name in ("hidden_states", "attentions") else name: value
            for name, value in decoder_outputs.items()
        }
        output = Seq2SeqModelOutput(
            **decoder_fields, **{f"encoder_{name}": value for name, value in encoder_outputs.items()}
        )
        return output if flag(return_dict, self.config, "return_dict") else output.to_tuple()


# --------------------------------------------------------------------------------------------------------------------
# §3.4 The pre-softmax linear projection: training loss and generation
# --------------------------------------------------------------------------------------------------------------------
class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """The Transformer with its pre-softmax linear projection (§3.4), for training with `labels` and `generate()`.

    The projection `lm_head` shares the target embedding matrix when `tie_word_embeddings` (the paper). With
    `labels`, the loss is the cross-entropy over the target tokens (labels of -100 ignored), as in every transformers
    model; label smoothing (§5.4) belongs to the training recipe. `generate()` decodes as §6.1 does when the
    generation config says so (`generation_vaswani.paper_decoding`, which the recipe writes into every model it
    trains); a model built from a config decodes greedily, as every transformers model does, until told otherwise.
    """

    def __init__(self, config):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=config.output_bias)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        else:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        if not config.tie_word_embeddings:  # a projection of its own is no tied weight (Marian's layout)
            self._tied_weights_keys.pop("lm_head.weight")
        self.post_init()
        self._keys_to_ignore_on_save = set(self.all_tied_weights_keys)  # (`tied_weights_saved_once`)

    def prepare_decoder_input_ids_from_labels(self, labels):
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ):
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*): target ids ending with the
            end-of-sentence token, -100 where ignored. Decoder inputs are made from them by shifting right unless
            `decoder_input_ids` are given.
        num_items_in_batch (*optional*): the number of target tokens across accumulated micro-batches (passed by
            the Trainer); the loss is then the summed loss divided by it.
        """
        if labels is not None:
            if labels.numel() == 0:
                raise ValueError(
                    f"`labels` is empty (shape {tuple(labels.shape)}): give at least one token per row."
                )
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
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, target vocabulary)
        loss = None if labels is None else cross_entropy(logits, labels, num_items_in_batch)
        # the model's outputs (the fields that are set) but its last hidden state, which the logits replace
        fields = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        output = Seq2SeqLMOutput(loss=loss, logits=logits, **fields)
        return output if flag(return_dict, self.config, "return_dict") else output.to_tuple()

    def generate(self, *args, **kwargs):
        """transformers' `generate()` with the paper's decoding rules (`generation_vaswani.generate`): beam search
        divides by the length penalty in the form of `length_penalty_form` (a generation setting): `"gnmt"`,
        ((5 + |Y|) / 6) ** alpha, the paper's and the default, or `"power"`, transformers' |Y| ** alpha; without a
        maximum length from the call or the generation config, at most input length + 50 new tokens (§6.1). Folders loaded
        with `trust_remote_code=True` get the same function from their `custom_generate/generate.py`."""
        return paper_generate(*args, model=self, **kwargs)


def cross_entropy(logits, labels, num_items_in_batch=None):
    """Cross-entropy of the logits against the labels (-100 ignored), in float32: the mean over target tokens, or the
    sum divided by `num_items_in_batch` (the target tokens of all micro-batches of a gradient-accumulation step)."""
    # transformers' own reduction (its masked-LM loss, without that loss's `view`s); no target token: the mean is
    # 0 / 0, NaN, as Marian's loss is
    return fixed_cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten().to(logits.device), num_items_in_batch
    )


__all__ = ["VaswaniPreTrainedModel", "VaswaniModel", "VaswaniForConditionalGeneration"]
