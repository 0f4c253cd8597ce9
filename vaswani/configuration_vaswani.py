"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The defaults are the paper's base model (Table 3, first row). Every choice that departs from the paper is a named
field whose default is the paper's behaviour, documented here and where it acts in `modeling_vaswani.py`.

This file is copied next to `modeling_vaswani.py` into saved model folders, so it imports only transformers.
"""

from transformers import PreTrainedConfig

# Table 3 of the paper, as data. `small` is not in the paper: it is a CPU-sized model for quick experiments
# (Multi30k-sized corpora), kept in the same family (post-norm, sinusoidal, shared embeddings).
PRESETS: dict[str, dict] = {
    # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1; 65M parameters on EN-DE.
    "base": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        dropout=0.1,
    ),
    # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (EN-DE); 213M parameters.
    "big": dict(
        d_model=1024,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        dropout=0.3,
    ),
    # Not in the paper: a 3-layer model for one CPU (7.6M parameters with an 8000-token vocabulary).
    "small": dict(
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        dropout=0.1,
    ),
}

_POSITION_TYPES = ("sinusoidal", "learned")
_ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu", "swish", "tanh")


class VaswaniConfig(PreTrainedConfig):
    r"""
    Configuration of [`VaswaniModel`] and [`VaswaniForConditionalGeneration`]. Defaults give the base model of
    "Attention Is All You Need" with a shared source-target vocabulary of 37000 tokens (§5.1).

    Args:
        vocab_size (`int`, defaults to 37000):
            Size of the (shared) vocabulary; the source vocabulary when `decoder_vocab_size` differs. §5.1: byte-pair
            encoding with a shared source-target vocabulary of about 37000 tokens for EN-DE.
        decoder_vocab_size (`int`, *optional*):
            Size of the target vocabulary. `None` means the same as `vocab_size`. A different size (separate source and
            target vocabularies, as in the seed documents' `src_vocab`/`tgt_vocab`) requires
            `share_encoder_decoder_embeddings=False`.
        d_model (`int`, defaults to 512):
            d_model, the width of every sublayer output and embedding (§3.1, base 512, big 1024).
        encoder_layers (`int`, defaults to 6): N, encoder layers (§3.1).
        decoder_layers (`int`, defaults to 6): N, decoder layers (§3.1).
        encoder_attention_heads (`int`, defaults to 8): h, heads in encoder self-attention (§3.2.2).
        decoder_attention_heads (`int`, defaults to 8): h, heads in decoder self- and cross-attention (§3.2.2).
        encoder_ffn_dim (`int`, defaults to 2048): d_ff, inner size of the encoder FFN (§3.3).
        decoder_ffn_dim (`int`, defaults to 2048): d_ff, inner size of the decoder FFN (§3.3).
        activation_function (`str`, defaults to `"relu"`):
            The FFN non-linearity: max(0, xW1 + b1)W2 + b2 is ReLU (§3.3). Other values depart from the paper.
        dropout (`float`, defaults to 0.1):
            P_drop, applied to every sublayer output before the residual add and to the sums of embeddings and
            positional encodings (§5.4). Base 0.1, big 0.3 on EN-DE.
        attention_dropout (`float`, defaults to 0.0):
            Dropout on attention probabilities. Not in the paper (0 keeps it off); used by tensor2tensor.
        activation_dropout (`float`, defaults to 0.0):
            Dropout after the FFN non-linearity. Not in the paper (0 keeps it off); used by fairseq.
        attention_bias (`bool`, defaults to `False`):
            Biases in the Q/K/V/output projections. The paper's projections W^Q, W^K, W^V, W^O have none (§3.2.2);
            `True` gives the fairseq/Marian/`torch.nn` layout.
        max_position_embeddings (`int`, defaults to 1024):
            Size of the learned position table (`position_embedding_type="learned"`), the hard limit on sequence
            length there. With sinusoids it is only the size of the precomputed table: longer sequences compute their
            encodings on the fly (§3.5, "extrapolate to sequence lengths longer than the ones encountered").
        position_embedding_type (`str`, defaults to `"sinusoidal"`):
            `"sinusoidal"`: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5).
            `"learned"`: learned absolute positions, the alternative of Table 3 row (E).
        scale_embedding (`bool`, defaults to `True`):
            Multiply token embeddings by sqrt(d_model) (§3.4).
        normalize_before (`bool`, defaults to `False`):
            `False` is the paper's post-norm residual block LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4). `True`
            gives the pre-norm block x + Dropout(Sublayer(LayerNorm(x))) of the seed documents (and of tensor2tensor's
            later defaults), with a final LayerNorm on the encoder and decoder outputs.
        layer_norm_eps (`float`, defaults to 1e-5):
            LayerNorm epsilon (not given in the paper; PyTorch's default).
        share_encoder_decoder_embeddings (`bool`, defaults to `True`):
            One embedding matrix for encoder and decoder inputs (§3.4, with the shared vocabulary of §5.1). Needs
            `tie_word_embeddings=True` (as fairseq's `--share-all-embeddings`).
        tie_word_embeddings (`bool`, defaults to `True`):
            The pre-softmax projection shares the decoder embedding matrix (§3.4).
        label_smoothing (`float`, defaults to 0.1):
            eps_ls of the training loss computed when `labels` are given (§5.4). The loss is then not the plain
            negative log-likelihood; set 0.0 for that.
        init_std (`float`, *optional*):
            Standard deviation of the normal initialisation of embeddings; `None` gives d_model^-0.5 (the paper gives no
            initialisation; this is tensor2tensor's and fairseq's, which suits the sqrt(d_model) scaling). Linear
            layers use Xavier-uniform initialisation.
        pad_token_id / bos_token_id / eos_token_id / decoder_start_token_id (`int`):
            Special token ids (0, 1, 2, 1): matching the tokenizers that `vaswani.tokenization` trains.
        use_cache (`bool`, defaults to `True`): return key/value caches for fast decoding.

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
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    attention_bias: bool = False
    max_position_embeddings: int = 1024
    position_embedding_type: str = "sinusoidal"
    scale_embedding: bool = True
    normalize_before: bool = False
    layer_norm_eps: float = 1e-5
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    label_smoothing: float = 0.1
    init_std: float | None = None
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 1
    use_cache: bool = True
    is_encoder_decoder: bool = True

    def __post_init__(self, **kwargs):
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        self.validate_fields()
        super().__post_init__(**kwargs)

    def validate_fields(self) -> None:
        """Raise `ValueError` naming the field when the configuration cannot work."""
        positive = (
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
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name) != 0:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{name}` ({getattr(self, name)}): "
                    "each head gets d_k = d_model / h dimensions (§3.2.2)."
                )
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {value!r}.")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be positive, got {self.layer_norm_eps!r}.")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"`init_std` must be positive or None, got {self.init_std!r}.")
        if self.position_embedding_type not in _POSITION_TYPES:
            raise ValueError(
                f"`position_embedding_type` must be one of {_POSITION_TYPES}, got {self.position_embedding_type!r}."
            )
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"`activation_function` must be one of {_ACTIVATIONS}, got {self.activation_function!r}."
            )
        if self.share_encoder_decoder_embeddings:
            if self.decoder_vocab_size != self.vocab_size:
                raise ValueError(
                    "`share_encoder_decoder_embeddings=True` needs one vocabulary, but `vocab_size` "
                    f"({self.vocab_size}) != `decoder_vocab_size` ({self.decoder_vocab_size}); "
                    "set `share_encoder_decoder_embeddings=False` for separate vocabularies."
                )
            if not self.tie_word_embeddings:
                raise ValueError(
                    "`share_encoder_decoder_embeddings=True` ties all three embedding matrices (§3.4) and needs "
                    "`tie_word_embeddings=True`."
                )
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < min(self.vocab_size, self.decoder_vocab_size):
                raise ValueError(f"`{name}` ({value}) is outside the vocabulary.")

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VaswaniConfig":
        """Build a configuration from a named preset (`"base"`, `"big"` of Table 3, or `"small"`) plus overrides."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})


__all__ = ["VaswaniConfig", "PRESETS"]
