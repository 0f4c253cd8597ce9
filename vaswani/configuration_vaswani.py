"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The defaults are the paper's base model (Table 3, first row). Every choice that departs from the paper is a named
field whose default is the paper's behaviour, documented here and where it acts in `modeling_vaswani.py`.

This file is copied next to `modeling_vaswani.py` into saved model folders, so it imports only torch and transformers
(and huggingface_hub's `strict`, which transformers' own configurations use). As `MarianConfig`, it is a `@strict` dataclass:
each field's type is checked when it is set, and the `validate_*` methods check the values when the config is built
and again when transformers saves it.
"""

import math

import transformers
from huggingface_hub.dataclasses import strict
from torch.torch_version import TorchVersion
from transformers import PreTrainedConfig

# The oldest transformers these files are tested on (pyproject.toml says the same). Earlier 5.x releases give wrong
# outputs with a static cache under torch.compile (5.0-5.3) and fail half-precision loading (5.3). Hub folders carry
# these files and run on the user's transformers, so an older one gets this error instead of wrong translations.
MIN_TRANSFORMERS_VERSION = "5.5.0"


# compared as `packaging` compares versions (the files import torch and transformers only), as
# `generation_vaswani` compares them
if TorchVersion(transformers.__version__) < MIN_TRANSFORMERS_VERSION:
    raise ImportError(
        f"The Vaswani model needs transformers >= {MIN_TRANSFORMERS_VERSION}, but {transformers.__version__} is "
        f"installed: pip install -U 'transformers>={MIN_TRANSFORMERS_VERSION}'."
    )


def _preset(d_model, layers, heads, ffn_dim, dropout):
    """N layers, h heads and d_ff on each side (the paper's stacks are symmetric)."""
    return dict(
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        dropout=dropout,
    )


# Table 3 of the paper, as data. `small` and `tiny` are not in the paper: CPU-sized models for Multi30k-sized
# corpora, kept in the same family (post-norm, sinusoidal, shared embeddings).
PRESETS = {
    # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1; 65M parameters on EN-DE.
    "base": _preset(512, 6, 8, 2048, 0.1),
    # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (EN-DE); 213M parameters.
    "big": _preset(1024, 6, 16, 4096, 0.3),
    # Not in the paper: a 3-layer model for one CPU (7.6M parameters with an 8000-token vocabulary).
    "small": _preset(256, 3, 4, 1024, 0.1),
    # Not in the paper: the Transformer-Tiny that Wu et al. (2021) train on Multi30k (2.3M parameters with an
    # 8000-token vocabulary); the model of RESULTS.md.
    "tiny": _preset(128, 4, 4, 256, 0.3),
}

POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
# The fields a built model's modules follow: changed on the config after a model was built, it would train, evaluate
# and save as another model (`utils_vaswani.follow_config` refuses). Vocabulary sizes change with the model's own
# resizing methods; token ids, the cache flag and the initialisation do not shape the modules, and the dropout rates
# (`DROPOUT_FIELDS`) only regularise training: the model follows those when they change.
ARCHITECTURE_FIELDS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "activation_function",
    "attention_bias",
    "output_bias",
    "max_position_embeddings",
    "position_embedding_type",
    "sinusoid_layout",
    "sinusoid_frequencies",
    "position_offset",
    "scale_embedding",
    "normalize_before",
    "layer_norm_eps",
    "share_encoder_decoder_embeddings",
    "tie_word_embeddings",
)
DROPOUT_FIELDS = ("dropout", "attention_dropout", "activation_dropout")
SINUSOID_LAYOUTS = ("interleaved", "concatenated")
SINUSOID_FREQUENCIES = ("paper", "fairseq")
ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu", "swish", "tanh")
POSITIVE_INTEGERS = (
    "vocab_size",
    "decoder_vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
)


@strict
class VaswaniConfig(PreTrainedConfig):
    r"""
    Configuration of [`VaswaniModel`] and [`VaswaniForConditionalGeneration`]. Defaults give the base model of
    "Attention Is All You Need" with a shared source-target vocabulary of 37000 tokens (§5.1).

    Args:
        vocab_size (`int`, defaults to 37000):
            Size of the (shared) vocabulary; the source vocabulary when `decoder_vocab_size` is set. §5.1: byte-pair
            encoding with a shared source-target vocabulary of about 37000 tokens for EN-DE.
        decoder_vocab_size (`int`, *optional*):
            Size of the target vocabulary, `vocab_size` when not given. With `share_encoder_decoder_embeddings` (the
            paper) it must be `vocab_size`; a different size needs `share_encoder_decoder_embeddings=False`.
        d_model (`int`, defaults to 512): d_model, the width of every sublayer output and embedding (§3.1).
        encoder_layers (`int`, defaults to 6): N, encoder layers (§3.1).
        decoder_layers (`int`, defaults to 6): N, decoder layers (§3.1).
        encoder_attention_heads (`int`, defaults to 8): h, heads in encoder self-attention (§3.2.2).
        decoder_attention_heads (`int`, defaults to 8): h, heads in decoder self- and cross-attention (§3.2.2).
        encoder_ffn_dim (`int`, defaults to 2048): d_ff, inner size of the encoder FFN (§3.3).
        decoder_ffn_dim (`int`, defaults to 2048): d_ff, inner size of the decoder FFN (§3.3).
        activation_function (`str`, defaults to `"relu"`):
            The FFN non-linearity: max(0, xW1 + b1)W2 + b2 is ReLU (§3.3). Other values (Marian's `swish`, `gelu`)
            depart from the paper.
        dropout (`float`, defaults to 0.1):
            P_drop, on every sublayer output before the residual add and on the sums of embeddings and positional
            encodings (§5.4). Base 0.1, big 0.3 on EN-DE.
        attention_dropout (`float`, defaults to 0.0):
            Dropout on attention probabilities. Not in the paper (0 keeps it off); used by tensor2tensor.
        activation_dropout (`float`, defaults to 0.0):
            Dropout after the FFN non-linearity. Not in the paper (0 keeps it off); used by fairseq.
        attention_bias (`bool`, defaults to `False`):
            Biases in the Q/K/V/output projections. The paper's W^Q, W^K, W^V, W^O have none (§3.2.2); `True` gives
            the fairseq/Marian/`torch.nn` layout.
        output_bias (`bool`, defaults to `False`):
            A bias on the pre-softmax projection (Marian's `final_logits_bias`). The paper's projection shares the
            embedding matrix and has none (§3.4).
        max_position_embeddings (`int`, defaults to 1024):
            Size of the learned position table (`position_embedding_type="learned"`), the hard limit on sequence
            length there. Sinusoids have no limit (§3.5: they "extrapolate to sequence lengths longer than the ones
            encountered during training").
        position_embedding_type (`str`, defaults to `"sinusoidal"`):
            `"sinusoidal"`, the fixed encodings of §3.5, or `"learned"`, the learned positions of Table 3 row (E).
        sinusoid_layout (`str`, defaults to `"interleaved"`):
            `"interleaved"`: PE(pos, 2i) = sin(pos w_i), PE(pos, 2i+1) = cos(pos w_i), as §3.5 writes it.
            `"concatenated"`: all sines in the first half of the dimensions, all cosines in the second (Marian,
            fairseq and tensor2tensor).
        sinusoid_frequencies (`str`, defaults to `"paper"`):
            `"paper"`: w_i = 1 / 10000^(2i / d_model) (§3.5). `"fairseq"`: w_i = 1 / 10000^(i / (d_model/2 - 1)),
            which reaches 1 / 10000 at the last pair (fairseq and tensor2tensor).
        position_offset (`int`, defaults to 0):
            The position number of the first token. The paper counts from 0; fairseq (and its ports, FSMT) count
            from `padding_idx + 1`.
        scale_embedding (`bool`, defaults to `True`):
            Multiply token embeddings by sqrt(d_model) (§3.4).
        normalize_before (`bool`, defaults to `False`):
            `False` is the paper's post-norm residual block LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4). `True`
            is the pre-norm block x + Dropout(Sublayer(LayerNorm(x))) of the Annotated Transformer's code and of
            tensor2tensor's later defaults, with a final LayerNorm on the encoder and decoder outputs.
        layer_norm_eps (`float`, defaults to 1e-5):
            LayerNorm epsilon (not given in the paper; PyTorch's default).
        share_encoder_decoder_embeddings (`bool`, defaults to `True`):
            One embedding matrix for source and target tokens (§3.4, with the shared vocabulary of §5.1).
        tie_word_embeddings (`bool`, defaults to `True`):
            The pre-softmax projection shares the target embedding matrix (§3.4). `False` gives it a matrix of its
            own, over the shared or the target vocabulary.
        init_std (`float`, *optional*):
            Standard deviation of the normal initialisation of embeddings; `None` gives d_model^-0.5 (the paper gives
            none; this is tensor2tensor's and fairseq's, which suits the sqrt(d_model) scaling). Linear layers use
            Xavier-uniform initialisation.
        qkv_init_gain (`float`, defaults to 1.0):
            The gain of the Xavier-uniform initialisation of every attention's W^Q, W^K and W^V (the paper gives
            none; 1.0 is tensor2tensor's). fairseq uses 1/sqrt(2): each d_model x d_model matrix then starts as
            the three would stacked in one 3d_model x d_model matrix of gain 1.
        pad_token_id / bos_token_id / eos_token_id / decoder_start_token_id (`int`):
            Special token ids (0, 1, 2, 1): those of the tokenizers that `vaswani.recipe.tokenization` trains.
        use_cache (`bool`, defaults to `True`): return key/value caches for fast decoding.

    Label smoothing (eps_ls = 0.1, §5.4) is a property of the training recipe, not of the model: the model's loss is
    the plain cross-entropy, as in every transformers model, and `vaswani.recipe.losses` smooths it
    (`--label_smoothing_factor`, 0.1 by default).

    Example:

    ```python
    >>> from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    >>> config = VaswaniConfig.from_preset("base", vocab_size=37000)
    >>> model = VaswaniForConditionalGeneration(config)
    ```
    """

    model_type = "vaswani"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    decoder_vocab_size: int | None = None
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    attention_bias: bool = False
    output_bias: bool = False
    max_position_embeddings: int = 1024
    position_embedding_type: str = "sinusoidal"
    sinusoid_layout: str = "interleaved"
    sinusoid_frequencies: str = "paper"
    position_offset: int = 0
    scale_embedding: bool = True
    normalize_before: bool = False
    layer_norm_eps: float | int = 1e-5
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    init_std: float | int | None = None
    qkv_init_gain: float | int = 1.0
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 1
    use_cache: bool = True
    is_encoder_decoder: bool = True

    def __post_init__(self, **kwargs):
        # Folders saved before the loss moved to the recipe carry `label_smoothing`: it means nothing here.
        kwargs.pop("label_smoothing", None)
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        self.validate_fields()  # a ValueError naming the field, before anything else is set
        super().__post_init__(**kwargs)

    def validate_fields(self):
        """Raise `ValueError` naming the field when the configuration cannot work (the types are `@strict`'s). Run
        when the config is built, by the model's constructor (fields may have been changed since) and, as a
        `@strict` validator, when transformers saves the config."""
        for name in POSITIVE_INTEGERS:
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)!r}.")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name) != 0:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{name}` ({getattr(self, name)}): "
                    "each head gets d_k = d_model / h dimensions (§3.2.2)."
                )
        for name in DROPOUT_FIELDS:
            if not 0.0 <= getattr(self, name) <= 1.0:  # NaN too
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {getattr(self, name)!r}.")
        for name in ("layer_norm_eps", "qkv_init_gain", "init_std"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:  # `init_std` may be None
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if self.position_offset < 0:
            raise ValueError(
                f"`position_offset` must be a non-negative integer, got {self.position_offset!r}."
            )
        for name, allowed in (
            ("position_embedding_type", POSITION_EMBEDDING_TYPES),
            ("sinusoid_layout", SINUSOID_LAYOUTS),
            ("sinusoid_frequencies", SINUSOID_FREQUENCIES),
            ("activation_function", ACTIVATIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, got {getattr(self, name)!r}.")
        if self.sinusoid_frequencies == "fairseq" and self.d_model < 4:
            raise ValueError(
                "`sinusoid_frequencies='fairseq'` needs `d_model` >= 4 (it divides by d_model/2 - 1)."
            )
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                "`share_encoder_decoder_embeddings=True` needs one vocabulary, but `decoder_vocab_size` "
                f"({self.decoder_vocab_size}) != `vocab_size` ({self.vocab_size}); set "
                "`share_encoder_decoder_embeddings=False` for separate vocabularies."
            )
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < min(self.vocab_size, self.decoder_vocab_size):
                raise ValueError(f"`{name}` ({value}) is outside the vocabulary.")

    @classmethod
    def from_preset(cls, name, **overrides):
        """Build a configuration from a named preset (`"base"`, `"big"` of Table 3, or `"small"`, `"tiny"`) plus
        overrides."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})


__all__ = ["ARCHITECTURE_FIELDS", "DROPOUT_FIELDS", "VaswaniConfig", "PRESETS"]
