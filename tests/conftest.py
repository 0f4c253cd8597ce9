import pytest
import torch

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration


def tiny_config(**overrides) -> VaswaniConfig:
    """Odd sizes everywhere and no dropout, so shape and equality bugs cannot hide."""
    fields = dict(
        vocab_size=53,
        d_model=15,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=3,
        decoder_attention_heads=5,
        encoder_ffn_dim=17,
        decoder_ffn_dim=19,
        dropout=0.0,
        max_position_embeddings=64,
    )
    fields.update(overrides)
    return VaswaniConfig(**fields)


# The shapes of the model whose contracts are tested: the paper, and each departure on in at least one of them.
SHAPES = {
    "paper": {},
    "pre-norm": {"normalize_before": True},
    "learned-positions-attention-bias": {"position_embedding_type": "learned", "attention_bias": True},
    "separate-vocabularies": {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 61},
    "marian-layout": {
        "sinusoid_layout": "concatenated",
        "output_bias": True,
        "activation_function": "swish",
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
}


def tiny_model(**overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(tiny_config(**overrides)).eval()


def batch(vocab_size: int = 53, batch_size: int = 3, src_len: int = 7, tgt_len: int = 6, seed: int = 0):
    """Random source/target ids above the special ids, with right padding on the source of later rows."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (batch_size, src_len), generator=g)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch_size):
        attention_mask[row, src_len - row :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = torch.randint(4, vocab_size, (batch_size, tgt_len), generator=g)
    return input_ids, attention_mask, labels


@pytest.fixture
def model():
    return tiny_model()


# `tests/hf_common/` runs under transformers' own test tree (`make hf-common`), not in this suite.
collect_ignore = ["hf_common"]
