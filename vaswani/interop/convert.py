"""Import a pretrained OPUS-MT or fairseq WMT translation model as a `vaswani` model (the `vaswani-convert` command
is `vaswani.commands.convert`).

    vaswani-convert --model_name_or_path Helsinki-NLP/opus-mt-de-en --output_dir models/opus-mt-de-en
    vaswani-convert --model_name_or_path path/to/wmt19-de-en --output_dir models/wmt19-de-en

The source is a folder (or Hub id) of a transformers `MarianMTModel` (the OPUS-MT checkpoints) or
`FSMTForConditionalGeneration` (fairseq's WMT19 models): config, weights and tokenizer. The output is a `vaswani` model
folder: safetensors weights, a config whose fields say how the model departs from the paper, the code files for
`trust_remote_code=True`, the source's generation settings, its tokenizer and the translation pipeline, so that

    pipeline("translation", model="models/opus-mt-de-en", trust_remote_code=True)

translates where this package is not installed. Both families are the paper's post-norm encoder-decoder; what they do
beyond it becomes `VaswaniConfig` fields, never special cases in the model:

| source | `VaswaniConfig` |
|---|---|
| sines before cosines (both) | `sinusoid_layout="concatenated"` |
| fairseq's frequencies 1 / 10000^(i / (d/2 - 1)) (FSMT) | `sinusoid_frequencies="fairseq"` |
| positions numbered from `padding_idx + 1` (FSMT) | `position_offset=pad_token_id + 1` |
| biases in the attention projections (both) | `attention_bias=True` |
| Marian's `final_logits_bias` | `output_bias=True` (`lm_head.bias`) |
| `activation_function` (Marian: swish or gelu) | `activation_function` |
| `scale_embedding` | `scale_embedding` |
| separate source and target vocabularies (FSMT, some Marian) | `share_encoder_decoder_embeddings=False`, `decoder_vocab_size` |
| an output projection of its own (FSMT's `output_projection`) | `tie_word_embeddings=False` |

Which embeddings are one matrix is read from the loaded source model: what it ties stays tied, what it keeps apart
stays apart. Decoding settings travel in `generation_config.json`: the source's own (beam size, `max_length`,
Marian's `bad_words_ids=[[pad]]`, ...) with `length_penalty_form="power"`, transformers' |Y|^alpha that both families
were decoded with, so that `generate()` gives the source model's output (the paper's form is the default otherwise).

Variants that cannot be represented are refused with a `ValueError` naming what differs: other model types
(MBart, BART, ...), decoder-only checkpoints, activations the model lacks, legacy BART/Marian options that change the
forward (`normalize_before`, `normalize_embedding`, `add_final_layer_norm`, `static_position_embeddings=False`,
`add_bias_logits`, ...), odd `d_model` with fairseq sinusoids, and checkpoints with weights missing or left over.
LayerDrop, a training-time regularizer the model lacks, is dropped with a warning. FSMT's position tables are
parameters that fine-tuning moves: a table that is no longer the sinusoids becomes a learned one
(`position_embedding_type="learned"`, the table's length the limit, where FSMT would recompute sinusoids beyond it). After converting, the two models' logits are compared on a probe sentence, and the
conversion fails if they differ.

Limits: positions here are computed from each token's index, not from the padding. fairseq (FSMT) gives padded
positions the padding row and numbers a left-padded row's tokens from its first real token, and masks pad tokens of
full-sequence decoder inputs; Marian does neither. Outputs match the source at real (non-pad) positions with unpadded
or right-padded inputs (what the tokenizers and `generate()` produce); compare logits there. The tokenizers need the
`convert` extra: `pip install "vaswani-transformer[convert]"` (sentencepiece for Marian, sacremoses for FSMT).
"""

import copy
import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from ..common.fileio import atomic_folder
from ..configuration_vaswani import ACTIVATIONS, VaswaniConfig
from ..modeling_vaswani import VaswaniForConditionalGeneration, sinusoidal_positional_encoding
from ..recipe.model_folders import check_model_path, load_model

logger = logging.getLogger(__name__)

# The source classes, by `model_type`; both load with `AutoModelForSeq2SeqLM`.
SOURCE_ARCHITECTURES = {"marian": "MarianMTModel", "fsmt": "FSMTForConditionalGeneration"}
# Options of older Marian/BART/fairseq configs with the value that transformers' Marian and FSMT classes compute; any
# other value describes a forward those classes (and this converter) do not run.
FORWARD_ASSUMPTIONS = {
    "normalize_before": False,
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "layernorm_embedding": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
    "do_blenderbot_90_layernorm": False,
}
# Fields with the same name and meaning in MarianConfig, FSMTConfig and VaswaniConfig.
SAME_FIELDS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "activation_function",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "max_position_embeddings",
    "scale_embedding",
    "init_std",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
)
# A stored position table may differ from the computed sinusoids by float32 rounding (about 6e-5 at position 1000);
# a trained table differs by far more.
POSITION_TABLE_TOLERANCE = 1e-3
# Largest logit difference on the probe sentence that still counts as the same model (float32; half precision: ten
# times its epsilon). The tests hold random models to 1e-5; OPUS-MT-sized ones convert within 4e-6.
PARITY_TOLERANCE = 1e-4


# --------------------------------------------------------------------------------------------------------------------
# Configuration: what the source does beyond the paper, as VaswaniConfig fields
# --------------------------------------------------------------------------------------------------------------------
def check_source_config(config):
    """Raise `ValueError` naming the attribute and its value when the source cannot become a `vaswani` model."""
    model_type = config.model_type
    if model_type not in SOURCE_ARCHITECTURES:
        raise ValueError(
            f"model_type {model_type!r} cannot be converted: only {', '.join(SOURCE_ARCHITECTURES)} "
            f"({', '.join(SOURCE_ARCHITECTURES.values())}) are the paper's architecture"
        )
    expected = SOURCE_ARCHITECTURES[model_type]
    if expected not in (config.architectures or [expected]):
        raise ValueError(
            f"architectures {config.architectures} is not an encoder-decoder {expected}: only translation checkpoints convert"
        )
    for name, value in FORWARD_ASSUMPTIONS.items():
        if getattr(config, name, value) != value:
            raise ValueError(
                f"{name}={getattr(config, name)!r} is not supported: transformers' {expected} and the vaswani "
                f"model compute {name}={value!r}"
            )
    if config.activation_function not in ACTIVATIONS:
        raise ValueError(
            f"activation_function={config.activation_function!r} is not supported: the vaswani model has "
            f"{', '.join(ACTIVATIONS)}"
        )
    if model_type == "fsmt" and config.d_model % 2:
        raise ValueError(
            f"d_model={config.d_model} is odd: fairseq's sinusoids pad an odd width with a zero dimension, which "
            "sinusoid_frequencies='fairseq' does not"
        )


def vaswani_config(config, share_embeddings, tie_output):
    """The `VaswaniConfig` of a Marian or FSMT configuration. `share_embeddings`: the source's encoder and decoder embed
    tokens with one matrix; `tie_output`: its output projection is the decoder's embedding matrix. `config` passed
    `check_source_config`. What both families share with the paper keeps `VaswaniConfig`'s default: post-norm layers,
    sinusoidal positions, LayerNorm epsilon 1e-5 (`nn.LayerNorm`'s), the cache in decoding."""
    fsmt = config.model_type == "fsmt"
    if fsmt:
        vocab_size, decoder_vocab_size = config.src_vocab_size, config.tgt_vocab_size
    else:
        vocab_size = config.vocab_size
        decoder_vocab_size = (
            vocab_size if config.share_encoder_decoder_embeddings else config.decoder_vocab_size
        )
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        if getattr(config, name):
            logger.warning(
                "%s=%s is dropped: LayerDrop skips layers in training only, and the vaswani model has none",
                name,
                getattr(config, name),
            )
    return VaswaniConfig(
        **{name: getattr(config, name) for name in SAME_FIELDS},
        vocab_size=vocab_size,
        decoder_vocab_size=decoder_vocab_size,
        attention_bias=True,
        output_bias=not fsmt,  # Marian's final_logits_bias
        sinusoid_layout="concatenated",
        sinusoid_frequencies="fairseq" if fsmt else "paper",
        position_offset=config.pad_token_id + 1 if fsmt else 0,
        share_encoder_decoder_embeddings=share_embeddings,
        tie_word_embeddings=tie_output,
    )


# --------------------------------------------------------------------------------------------------------------------
# Weights: a rename table, plus the checks that nothing is lost
# --------------------------------------------------------------------------------------------------------------------
# vaswani name -> source name where they differ; every other weight has the same name in both (transformers' seq2seq
# family naming, which `modeling_vaswani` follows).
RENAMES = {
    "marian": {"lm_head.bias": "final_logits_bias"},
    "fsmt": {
        "lm_head.weight": "model.decoder.output_projection.weight",
        "model.shared.weight": "model.encoder.embed_tokens.weight",  # one matrix when FSMT ties its embeddings
    },
}
POSITION_TABLES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def convert_model(source):
    """The `vaswani` model computing what `source` (a loaded `MarianMTModel` or `FSMTForConditionalGeneration`)
    computes, with the source's generation settings and `length_penalty_form="power"`."""
    check_source_config(source.config)
    renames = RENAMES[source.config.model_type]
    # FSMT's `get_output_embeddings()` returns the decoder's embedding, not its output projection: look up by name.
    decoder_embeddings = source.get_parameter("model.decoder.embed_tokens.weight")
    config = vaswani_config(
        source.config,
        share_embeddings=source.get_parameter("model.encoder.embed_tokens.weight") is decoder_embeddings,
        tie_output=source.get_parameter(renames.get("lm_head.weight", "lm_head.weight"))
        is decoder_embeddings,
    )
    weights = source.state_dict()
    # how far the source's position tables (both of one length) are from the sinusoids, at the positions used
    offset = config.position_offset
    tables = torch.stack([weights[name][offset:].float() for name in POSITION_TABLES])
    expected = sinusoidal_positional_encoding(
        torch.arange(offset, offset + tables.shape[1]),
        config.d_model,
        config.sinusoid_layout,
        config.sinusoid_frequencies,
    )
    difference = (tables - expected).abs().max().item()
    if difference > POSITION_TABLE_TOLERANCE:
        # FSMT's tables are parameters that fine-tuning moves; the moved table becomes a learned one (Table 3 row E).
        config.position_embedding_type = "learned"
        config.max_position_embeddings = len(weights[POSITION_TABLES[0]]) - offset
        logger.warning(
            "The source's position tables differ from the sinusoids by up to %.3g (trained with the model): they "
            "become learned positions (position_embedding_type='learned'), which end at %d positions",
            difference,
            config.max_position_embeddings,
        )
    model = VaswaniForConditionalGeneration(config).to(source.dtype).eval()
    mapped = {name: weights[renames.get(name, name)] for name in model.state_dict()}
    if config.output_bias:
        mapped["lm_head.bias"] = mapped["lm_head.bias"].flatten()  # final_logits_bias is (1, V)
    # Left out when the model has no place for them: sinusoidal position tables (computed on the fly) and Marian's
    # `model.shared`, which it keeps even where nothing ties it to the embeddings in use.
    unused = {*POSITION_TABLES, "model.shared.weight", *(renames.get(name, name) for name in mapped)}
    left_over = sorted(set(weights) - unused)
    if left_over:
        raise ValueError(f"source weights with no place in the vaswani model: {', '.join(left_over)}")
    model.load_state_dict(mapped)  # strict
    generation = model.generation_config = copy.deepcopy(source.generation_config)
    # transformers' |Y| ** alpha, the length penalty both families were decoded with (`generation_vaswani`)
    generation.length_penalty_form = "power"
    # kept on reload: a generation config marked as made from the model config drops `length_penalty_form`
    generation._from_model_config = False
    return model


# --------------------------------------------------------------------------------------------------------------------
# Parity: the proof that the conversion is exact
# --------------------------------------------------------------------------------------------------------------------
def check_parity(source, converted):
    """Raise `ValueError` when the converted model's logits on a probe sentence differ from the source's; returns the
    largest difference. The probe: a source sentence and a decoder prefix of 9 ordinary (non-special) tokens each,
    every 7th of the vocabulary's from a third of the way in, without padding (so without a mask).
    `use_cache=False`: FSMT applies its causal mask only then."""
    config = converted.config
    special = {config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id}

    def ordinary(vocab_size):
        ids = [i for i in range(vocab_size) if i not in special]
        return [ids[(len(ids) // 3 + 7 * k) % len(ids)] for k in range(9)]

    inputs = dict(
        input_ids=torch.tensor([ordinary(config.vocab_size) + [config.eos_token_id]]),
        decoder_input_ids=torch.tensor(
            [[config.decoder_start_token_id] + ordinary(config.decoder_vocab_size)]
        ),
    )
    with torch.no_grad():
        expected, actual = (model(**inputs, use_cache=False).logits.float() for model in (source, converted))
    difference = (expected - actual).abs().max().item()
    tolerance = max(PARITY_TOLERANCE, 10 * torch.finfo(source.dtype).eps)  # float32: 1e-4
    if not difference <= tolerance:
        raise ValueError(
            f"the converted model's logits differ from the source's by {difference:.3g} (tolerance {tolerance:g})"
        )
    logger.info("Logits of the converted model match the source's: largest difference %.2g", difference)
    return difference


# --------------------------------------------------------------------------------------------------------------------
# The folder
# --------------------------------------------------------------------------------------------------------------------
def convert(model_name_or_path, output_dir, overwrite_output_dir=False):
    """Write the `vaswani` model folder of a `MarianMTModel` or `FSMTForConditionalGeneration` folder (or Hub id):
    weights, config, code, generation config, tokenizer and translation pipeline. The folder appears whole or not at
    all; an existing one is replaced only with `overwrite_output_dir`."""
    output_dir = Path(output_dir)
    if (
        output_dir.exists()
        and (not output_dir.is_dir() or any(output_dir.iterdir()))
        and not overwrite_output_dir
    ):
        raise FileExistsError(
            f"{output_dir} exists and is not empty: pass --overwrite_output_dir to replace it"
        )
    # Unsupported configurations are refused before the weights are read, and checkpoints whose weights transformers
    # had to invent or throw away by `load_model` (a checkpoint of another shape does not load).
    check_model_path(model_name_or_path)  # a local folder, or a Hub model: named at once when it is neither
    check_source_config(AutoConfig.from_pretrained(model_name_or_path))
    source = load_model(model_name_or_path)  # in eval mode, as `from_pretrained` leaves a model
    try:  # Marian's tokenizer needs sentencepiece, FSMT's sacremoses
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    except ImportError as error:
        raise ImportError(
            f"the tokenizer of {model_name_or_path} needs a missing package ({' '.join(str(error).split())}): "
            'pip install "vaswani-transformer[convert]"'
        ) from None
    model = convert_model(source)
    check_parity(source, model)
    with atomic_folder(output_dir) as building:
        model.save_pretrained(building)
        tokenizer.save_pretrained(building)
    logger.info("Converted %s (%s) to %s", model_name_or_path, type(source).__name__, output_dir)
    return output_dir
