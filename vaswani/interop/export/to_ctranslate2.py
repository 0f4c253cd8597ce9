"""A `vaswani` folder to a CTranslate2 model, through CTranslate2's own transformers converter.

CTranslate2's `TransformersConverter` reads a Hugging Face folder and hands the model to the loader registered for
its configuration class (`@register_loader("MarianConfig")` and so on). `VaswaniLoader` is that loader for
`VaswaniConfig`: it builds CTranslate2's `TransformerSpec` and fills it with the weights through the BART loader's
methods, since the parameter names are BART's. What differs from BART and Marian:

- Positions: CTranslate2 computes its own sinusoids (sines first, fairseq's frequencies) unless the specification
  holds a table. The paper's (interleaved) table of `max_position_embeddings` rows, with `position_offset` and the
  configured layout and frequencies, is written into both stacks; a learned table is copied as it is. Sequences
  longer than the table cannot be decoded by the export.
- No attention biases (the paper's W^Q, W^K, W^V, W^O, §3.2.2) unless `attention_bias`; no final LayerNorms in the
  post-norm layout; the LayerNorm epsilon of the config.
- Vocabularies: the tokenizer's tokens, padded with unused tokens up to the embedding size (a BPE vocabulary may
  stop short of `vocab_size`); separate source and target vocabularies when the model has them.

CTranslate2's beam search divides a finished hypothesis' log-probability by |Y|^alpha (`length_penalty`), the "power"
form of `generation_vaswani.length_penalty_factor`, where |Y| leaves `</s>` out unless `return_end_token=True` (which
`vaswani.interop.engines` passes, so that |Y| counts it as transformers does), and stops a sentence once `beam_size` hypotheses
have finished (transformers' `early_stopping=True`). It has no ((5 + |Y|) / 6)^alpha form (the paper's): asked for it,
`vaswani.interop.engines` warns and decodes with |Y|^alpha.
"""

import ctranslate2
import torch
from ctranslate2.converters import transformers as ct2_transformers
from ctranslate2.specs import common_spec, transformer_spec

from ...configuration_vaswani import VaswaniConfig
from ...modeling_vaswani import sinusoidal_positional_encoding
from ...recipe.model_folders import load_model

# VaswaniConfig.activation_function -> CTranslate2's; "tanh" has no CTranslate2 counterpart.
ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELU,
    "gelu_new": common_spec.Activation.GELUTanh,
    "silu": common_spec.Activation.SWISH,
    "swish": common_spec.Activation.SWISH,
}
UNUSED_TOKEN = "<vaswani_unused_{}>"


def position_table(stack, config):
    """The encodings of positions 0 .. max_position_embeddings - 1 as the model adds them, (positions, d_model)."""
    positions = stack.embed_positions
    if config.position_embedding_type == "learned":
        return positions.weight[positions.offset :].detach()
    numbers = torch.arange(config.max_position_embeddings) + config.position_offset
    return sinusoidal_positional_encoding(
        numbers, config.d_model, config.sinusoid_layout, config.sinusoid_frequencies
    )


def padded_vocabulary(tokenizer, size, side):
    """The tokenizer's tokens in id order, padded with unused tokens to the model's `size` embedding rows."""
    vocabulary = tokenizer.get_vocab()
    tokens = sorted(vocabulary, key=vocabulary.get)
    if len(tokens) > size:
        raise ValueError(
            f"the {side} tokenizer has {len(tokens)} tokens but the model's {side} vocabulary {size}"
        )
    extra = [UNUSED_TOKEN.format(i) for i in range(size - len(tokens))]
    if vocabulary.keys() & extra:
        raise ValueError(f"the {side} tokenizer already holds a token named like {UNUSED_TOKEN}")
    return tokens + extra


@ct2_transformers.register_loader("VaswaniConfig")
class VaswaniLoader(ct2_transformers.BartLoader):
    """CTranslate2's loader for `VaswaniConfig` (see the module docstring). `tokenizer` is the pair
    `(source_tokenizer, target_tokenizer)` of `tokenization.load_tokenizers`."""

    architecture_name = "AutoModelForSeq2SeqLM"  # `vaswani.register()` registers the model there

    def get_model_spec(self, model):
        config = model.config
        if config.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"activation_function={config.activation_function!r} has no CTranslate2 counterpart "
                f"(supported: {sorted(ACTIVATIONS)})"
            )
        common = dict(pre_norm=config.normalize_before, activation=ACTIVATIONS[config.activation_function])
        spec = transformer_spec.TransformerSpec(
            transformer_spec.TransformerEncoderSpec(
                config.encoder_layers, config.encoder_attention_heads, **common
            ),
            transformer_spec.TransformerDecoderSpec(
                config.decoder_layers, config.decoder_attention_heads, **common
            ),
        )
        self.set_encoder(spec.encoder, model.model.encoder)
        self.set_decoder(spec.decoder, model.model.decoder)
        self.set_linear(spec.decoder.projection, model.lm_head)  # with its bias when `output_bias`
        return spec

    def set_common_layers(self, spec, stack):
        """Embeddings x sqrt(d_model) (§3.4), our position table (§3.5), the final LayerNorm of the pre-norm layout."""
        spec.scale_embeddings = stack.embed_scale
        spec.position_encodings.encodings = position_table(stack, stack.config)
        embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
        self.set_embeddings(embeddings, stack.embed_tokens)
        if stack.layer_norm is not None:
            self.set_layer_norm(spec.layer_norm, stack.layer_norm)

    def set_config(self, config, model, tokenizer):
        _, target = tokenizer
        ids = model.config
        # A model without a beginning-of-sentence id (a converted Marian model) starts with its decoder start token.
        bos = ids.bos_token_id if ids.bos_token_id is not None else ids.decoder_start_token_id
        config.bos_token, config.eos_token, config.decoder_start_token = target.convert_ids_to_tokens(
            [bos, ids.eos_token_id, ids.decoder_start_token_id]
        )
        config.unk_token = target.unk_token
        config.layer_norm_epsilon = ids.layer_norm_eps
        # The tokenizers append </s> to every source themselves; nothing to add.
        config.add_source_bos = config.add_source_eos = False

    def get_vocabulary(self, model, tokenizer):
        source, target = tokenizer
        return (
            padded_vocabulary(source, model.config.vocab_size, "source"),
            padded_vocabulary(target, model.config.decoder_vocab_size, "target"),
        )

    def set_vocabulary(self, spec, tokens):
        source, target = tokens
        spec.register_source_vocabulary(source)
        spec.register_target_vocabulary(target)


class VaswaniConverter(ct2_transformers.TransformersConverter):
    """CTranslate2's transformers converter, loading the model in float32 (CTranslate2 quantizes it) and the
    tokenizer(s) of this package (a joint vocabulary or `source/` + `target/`) that `tokenizers` holds, as
    `tokenization.load_model_tokenizers` gives them (set before `convert`)."""

    def load_model(self, model_class, model_name_or_path, **kwargs):
        kwargs["dtype"] = torch.float32
        return load_model(model_name_or_path, **kwargs)  # in eval mode, as `from_pretrained` leaves a model

    def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
        return self.tokenizers


def export_ctranslate2(model_path, output_dir, quantization, tokenizers):
    """Convert `model_path` to a CTranslate2 model with weights in `quantization` (float32, int8, bfloat16, ...) in
    the existing folder `output_dir` (`vaswani.interop.export.export` builds it beside the destination and writes the
    metadata); returns the metadata fields of this engine."""
    from ... import register

    register()  # VaswaniConfig with AutoConfig, which the converter reads first
    converter = VaswaniConverter(str(model_path))
    converter.tokenizers = tokenizers
    converter.convert(str(output_dir), quantization=quantization, force=True)
    return {
        "quantization": quantization,
        "max_positions": VaswaniConfig.from_pretrained(model_path).max_position_embeddings,
        "engine_version": ctranslate2.__version__,
    }
