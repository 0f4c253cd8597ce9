"""Tiny tokenizers and models shared by the averaging, translation and plotting tests."""

import torch

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.generation_vaswani import paper_decoding
from vaswani.recipe.tokenization import train_bpe_tokenizer

SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf der Straße.",
    "A man rides a bike.",
    "Two dogs play in the snow.",
    "A woman reads a book in the park.",
    "Children play football in the street.",
]


def tiny_tokenizer(sentences=SENTENCES):
    return train_bpe_tokenizer(iter(sentences), vocab_size=300, min_frequency=1, show_progress=False)


def tiny_config(vocab_size: int, decoder_vocab_size: int | None = None, **overrides) -> VaswaniConfig:
    fields = dict(
        vocab_size=vocab_size,
        decoder_vocab_size=decoder_vocab_size,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        dropout=0.0,
    )
    if decoder_vocab_size not in (None, vocab_size):
        fields.update(share_encoder_decoder_embeddings=False)
    fields.update(overrides)
    return VaswaniConfig(**fields)


def tiny_model(vocab_size: int, seed: int = 0, **overrides) -> VaswaniForConditionalGeneration:
    """A random tiny model with the paper's decoding in its generation config, as the recipe trains them."""
    torch.manual_seed(seed)
    model = VaswaniForConditionalGeneration(tiny_config(vocab_size, **overrides)).eval()
    paper_decoding(model.generation_config)
    return model


def translation_model(vocab_size: int, seed: int = 4, **overrides) -> VaswaniForConditionalGeneration:
    """A random tiny model whose `</s>` logit is enlarged, so that some beam searches end early and others run
    to the length limit: outputs of different lengths, padded in a batch, as with a trained model (seed 4 gives
    eleven different outputs for the eleven test sentences)."""
    model = tiny_model(vocab_size, seed=seed, **overrides)
    with torch.no_grad():
        model.get_output_embeddings().weight[2] *= 1.3
    return model
