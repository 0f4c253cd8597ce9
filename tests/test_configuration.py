"""The configuration: presets from Table 3, parameter counts, and errors for configurations that cannot work."""

import subprocess
import sys

import pytest
import torch
from helpers import tiny_config
from huggingface_hub.errors import StrictDataclassFieldValidationError

from vaswani import PRESETS, VaswaniConfig, VaswaniForConditionalGeneration


def count_parameters(config: VaswaniConfig) -> int:
    with torch.device("meta"):
        model = VaswaniForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())  # tied matrices are counted once


# Exact counts with a shared vocabulary of 37000 (the README states them). The paper: 65M and 213M (Table 3).
@pytest.mark.parametrize("preset, exact, paper", [("base", 63_045_632, 65e6), ("big", 214_171_648, 213e6)])
def test_preset_parameter_counts_match_the_paper(preset, exact, paper):
    config = VaswaniConfig.from_preset(preset, vocab_size=37000)
    n = count_parameters(config)
    assert n == exact
    assert abs(n - paper) / paper < 0.05


def test_defaults_are_the_base_model():
    config = VaswaniConfig()
    base = VaswaniConfig.from_preset("base")
    for key, value in PRESETS["base"].items():
        assert getattr(config, key) == value == getattr(base, key)
    assert config.normalize_before is False
    assert config.position_embedding_type == "sinusoidal"
    assert config.scale_embedding and config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert config.activation_function == "relu"
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.hidden_size == 512 and config.num_attention_heads == 8 and config.num_hidden_layers == 6
    assert config.decoder_vocab_size == config.vocab_size


def test_cpu_presets_parameter_counts():
    """Not in the paper: `small`, and `tiny`, the Transformer-Tiny of the en->de anchor (RESULTS.md)."""
    for preset, expected in (("small", 7_568_384), ("tiny", 2_342_912)):
        config = VaswaniConfig.from_preset(preset, vocab_size=8000)
        assert sum(p.numel() for p in VaswaniForConditionalGeneration(config).parameters()) == expected
    assert VaswaniConfig.from_preset("tiny").dropout == 0.3


def test_big_preset_and_overrides():
    config = VaswaniConfig.from_preset("big", dropout=0.1, vocab_size=1000)
    assert (config.d_model, config.encoder_attention_heads, config.encoder_ffn_dim) == (1024, 16, 4096)
    assert config.dropout == 0.1 and config.vocab_size == 1000
    with pytest.raises(ValueError, match="preset"):
        VaswaniConfig.from_preset("huge")


def test_config_round_trip(tmp_path):
    config = tiny_config(normalize_before=True, position_embedding_type="learned")
    config.save_pretrained(tmp_path)
    again = VaswaniConfig.from_pretrained(tmp_path)
    assert again.to_dict() == config.to_dict()


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=16, encoder_attention_heads=3), "encoder_attention_heads"),
        (dict(d_model=16, encoder_attention_heads=4, decoder_attention_heads=5), "decoder_attention_heads"),
        (dict(d_model=0), "d_model"),
        (dict(encoder_layers=-1), "encoder_layers"),
        (dict(decoder_ffn_dim=0), "decoder_ffn_dim"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(dropout=1.5), "dropout"),
        (dict(attention_dropout=-0.1), "attention_dropout"),
        (dict(activation_dropout=2), "activation_dropout"),
        (dict(layer_norm_eps=float("nan")), "layer_norm_eps"),
        (dict(sinusoid_layout="sines-first"), "sinusoid_layout"),
        (dict(position_offset=-1), "position_offset"),
        (dict(position_embedding_type="rotary"), "position_embedding_type"),
        (dict(activation_function="swiglu"), "activation_function"),
        (dict(decoder_vocab_size=40), "share_encoder_decoder_embeddings"),
        (dict(pad_token_id=53), "pad_token_id"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps"),
        (dict(qkv_init_gain=0.0), "qkv_init_gain"),
        (dict(qkv_init_gain=float("inf")), "qkv_init_gain"),
    ],
)
def test_configs_that_cannot_work_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_an_older_transformers_gets_a_clear_error():
    """Saved folders carry these files to the user's transformers: below the tested range, a named ImportError."""
    code = "import transformers; transformers.__version__ = '5.3.0'; from vaswani import VaswaniConfig"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert (
        "ImportError: The Vaswani model needs transformers >= 5.5.0, but 5.3.0 is installed" in result.stderr
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("normalize_before", "false"),
        ("scale_embedding", "no"),
        ("tie_word_embeddings", "False"),
        ("use_cache", 1),
    ],
)
def test_a_boolean_field_refuses_anything_but_true_or_false(field, value):
    """A string such as "false" is truthy: taken as given, it would build the opposite model. The `@strict`
    config refuses it, naming the field and the value, when it is built and when the field is set."""
    expected = rf"Field '{field}' expected bool, got {type(value).__name__} \(value: {value!r}\)"
    with pytest.raises(StrictDataclassFieldValidationError, match=expected):
        VaswaniConfig(**{field: value})
    config = tiny_config()
    with pytest.raises(StrictDataclassFieldValidationError, match=expected):
        setattr(config, field, value)
    assert getattr(config, field) is getattr(tiny_config(), field)


@pytest.mark.parametrize(
    "field, value", [("activation_function", "gelu"), ("normalize_before", True), ("layer_norm_eps", 1e-3)]
)
def test_a_config_changed_after_the_model_was_built_is_not_saved(tmp_path, field, value):
    """The modules follow the config they were built from: saved with the changed one, the folder would load as
    another model. Nothing is written, not even the code files. Switching modes (`train()`, `eval()`) is torch's and
    transformers' own, and changes nothing."""
    model = VaswaniForConditionalGeneration(tiny_config())
    setattr(model.config, field, value)
    assert model.train().eval() is model
    with pytest.raises(
        ValueError, match=rf"changed after the model was built \(`{field}` from .* to {value!r}\)"
    ):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    setattr(model.config, field, getattr(tiny_config(), field))
    model.save_pretrained(tmp_path / "out")  # changed back: saved


def test_a_config_that_cannot_work_writes_nothing(tmp_path):
    model = VaswaniForConditionalGeneration(tiny_config())
    model.config.encoder_attention_heads = 4  # d_model 15 is not divisible by 4
    with pytest.raises(ValueError, match="divisible by `encoder_attention_heads`"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
