"""A `vaswani` folder to two ONNX graphs, written by `torch.onnx.export` (the dynamo-based exporter).

- `encoder.onnx`: `input_ids`, `attention_mask` (B, S) -> `last_hidden_state` (B, S, d_model) and, for every decoder
  layer i, the encoder-decoder attention keys and values `cross_key.i`, `cross_value.i` (B, h, S, d_k): computed once
  per sentence, as the PyTorch model's cache holds them.
- `decoder.onnx`: `decoder_input_ids` (B, T), `encoder_attention_mask` (B, S), the self-attention cache of earlier
  steps `past_key.i`, `past_value.i` (B, h, P, d_k; P = 0 at the first step) and `cross_key.i`, `cross_value.i` ->
  `logits` (B, T, target vocabulary) and the cache with this step appended, `present_key.i`, `present_value.i`
  (B, h, P + T, d_k). Positions continue from P.

Both graphs run the model's own modules, traced: the encoder, then the decoder and `lm_head` with an
`EncoderDecoderCache` made of the input tensors, so the arithmetic is the PyTorch model's (eager attention, float32).
All sizes are dynamic. `vaswani.interop.engines.OnnxEngine` runs them with ONNX Runtime.
"""

import logging
import warnings

import onnx
import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from ...recipe.model_folders import load_model

logger = logging.getLogger(__name__)

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"


def cache_names(prefix, layers):
    """`{prefix}_key.0 .. {prefix}_key.{layers-1}`, then the values: the order of the graphs' cache inputs/outputs."""
    return [f"{prefix}_{kind}.{i}" for kind in ("key", "value") for i in range(layers)]


class EncoderGraph(nn.Module):
    """The encoder (§3.1), and the keys and values that each decoder layer's encoder-decoder attention reads."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()
        self.cross_attentions = nn.ModuleList(layer.encoder_attn for layer in model.get_decoder().layers)

    def forward(self, input_ids, attention_mask):
        memory = self.encoder(input_ids, attention_mask).last_hidden_state  # (B, S, d)
        # the keys, then the values, (B, h, S, d_k) each
        return (
            memory,
            [attention.split_heads(attention.k_proj(memory)) for attention in self.cross_attentions],
            [attention.split_heads(attention.v_proj(memory)) for attention in self.cross_attentions],
        )


class DecoderGraph(nn.Module):
    """One decoding call: the decoder and the pre-softmax projection over new tokens, given the cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(
        self, decoder_input_ids, encoder_attention_mask, past_keys, past_values, cross_keys, cross_values
    ):
        config = self.model.config
        cache = EncoderDecoderCache(
            DynamicCache(zip(past_keys, past_values, strict=True), config=config),
            DynamicCache(zip(cross_keys, cross_values, strict=True), config=config),
        )
        # the encoder-decoder attention reads its keys and values from the cache
        cache.is_updated = dict.fromkeys(range(len(cross_keys)), True)
        # The encoder output itself is never read once its keys and values are cached: only its (B, S) shape is.
        memory = cross_keys[0].new_zeros(*encoder_attention_mask.shape, 0)
        outputs = self.model(
            decoder_input_ids=decoder_input_ids,
            attention_mask=encoder_attention_mask,
            encoder_outputs=(memory,),
            cache=cache,
            use_cache=True,
        )
        layers = cache.self_attention_cache.layers
        return outputs.logits, [layer.keys for layer in layers], [layer.values for layer in layers]


def example_inputs(config):
    """Inputs to trace with: sizes above 1 (torch.export specialises sizes 0 and 1) and different from each other."""
    batch, source, past, target = 2, 5, 3, 2
    heads, layers = config.decoder_attention_heads, config.decoder_layers
    # One tensor object per input: the exporter would read an object passed twice as one input used twice.
    cache = lambda length: [torch.zeros(batch, heads, length, config.d_model // heads) for _ in range(layers)]  # noqa: E731
    mask = torch.ones(batch, source, dtype=torch.long)
    decoder = (torch.full((batch, target), 4), mask, cache(past), cache(past), cache(source), cache(source))
    return (4 * mask, mask), decoder


def export_graphs(model, output_dir):
    """Trace the two graphs of `model` (float32, eager attention, eval mode) into `output_dir`."""
    layers = model.config.decoder_layers
    batch, source, past, target = (torch.export.Dim(name) for name in ("batch", "source", "past", "target"))
    encoder_inputs, decoder_inputs = example_inputs(model.config)
    tokens, cross = {0: batch, 1: source}, cache_names("cross", layers)
    past_cache, cross_cache = [{0: batch, 2: past}] * layers, [{0: batch, 2: source}] * layers
    _export(
        EncoderGraph(model),
        encoder_inputs,
        output_dir / ENCODER_FILE,
        ["input_ids", "attention_mask"],
        ["last_hidden_state", *cross],
        (tokens, tokens),
    )
    _export(
        DecoderGraph(model),
        decoder_inputs,
        output_dir / DECODER_FILE,
        ["decoder_input_ids", "encoder_attention_mask", *cache_names("past", layers), *cross],
        ["logits", *cache_names("present", layers)],
        ({0: batch, 1: target}, tokens, past_cache, past_cache, cross_cache, cross_cache),
    )


def _export(module, inputs, path, input_names, output_names, dynamic_shapes):
    logger.info("Exporting %s", path.name)
    with warnings.catch_warnings():
        # One Dim object names the same size in several inputs; the exporter warns that it keeps one name. The
        # exporter itself still calls a `_pytree` name that torch deprecates.
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        torch.onnx.export(
            module.eval(),
            inputs,
            path,
            dynamo=True,
            verbose=False,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
        )


def export_onnx(model_path, output_dir):
    """Export `model_path` to `encoder.onnx` and `decoder.onnx` in the existing folder `output_dir` (see the module
    docstring; `vaswani.interop.export.export` builds it beside the destination and writes the metadata); returns
    the metadata fields of this engine."""
    # `load_model` registers model_type="vaswani" with AutoModelForSeq2SeqLM
    model = load_model(model_path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        export_graphs(model, output_dir)
    config = model.config
    return {
        "decoder_layers": config.decoder_layers,
        "decoder_attention_heads": config.decoder_attention_heads,
        "head_dim": config.d_model // config.decoder_attention_heads,
        "engine_version": onnx.__version__,
    }
