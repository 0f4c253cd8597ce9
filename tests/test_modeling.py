"""Behaviour of the model: masks, causality, caching, attention back-ends, gradients, the loss, dtypes, and the
contracts that transformers' common tests check (`tests/hf_common/`), stated here so that CI keeps them."""

import math
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import SHAPES, batch, tiny_config, tiny_model
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel, shift_tokens_right
from vaswani.modeling_vaswani import CACHE_NAME, sinusoidal_positional_encoding


def test_sinusoids_are_the_papers_formula():
    d_model = 16
    table = sinusoidal_positional_encoding(torch.arange(10), d_model)
    for pos in (0, 3, 9):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert sinusoidal_positional_encoding(torch.arange(10), 15).shape == (
        10,
        15,
    )  # odd widths end with a sine


def test_sinusoid_layouts_and_frequencies_of_marian_and_fairseq():
    """`concatenated` puts the sines first (Marian, fairseq); `fairseq` frequencies are 1 / 10000^(i / (d/2 - 1))."""
    d, positions = 8, torch.arange(5)
    paper = sinusoidal_positional_encoding(positions, d)
    marian = sinusoidal_positional_encoding(positions, d, layout="concatenated")
    torch.testing.assert_close(marian, torch.cat((paper[:, 0::2], paper[:, 1::2]), dim=-1))
    fairseq = sinusoidal_positional_encoding(positions, d, layout="concatenated", frequencies="fairseq")
    frequencies = torch.exp(torch.arange(4) * -(math.log(10000.0) / 3))
    angles = positions[:, None].float() * frequencies[None, :]
    torch.testing.assert_close(fairseq, torch.cat((angles.sin(), angles.cos()), dim=-1))


def test_position_offset_shifts_the_first_position():
    config = tiny_config(position_offset=2)
    shifted = VaswaniForConditionalGeneration(config).model.encoder.embed_positions(0, 4, torch.device("cpu"))
    plain = sinusoidal_positional_encoding(torch.arange(2, 6), config.d_model)
    torch.testing.assert_close(shifted, plain)


def test_sequences_longer_than_the_sinusoid_table_work(model):
    input_ids = torch.randint(4, 53, (1, 80))  # table holds 64 positions
    out = model(input_ids=input_ids, decoder_input_ids=input_ids[:, :70])
    assert torch.isfinite(out.logits).all()


def test_padding_does_not_change_real_tokens(model):
    input_ids, _, labels = batch()
    row = input_ids[:1, :4]
    alone = model(input_ids=row, labels=labels[:1]).logits
    padded_ids = torch.cat([row, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 4), torch.zeros(1, 5)], dim=1).long()
    padded = model(input_ids=padded_ids, attention_mask=mask, labels=labels[:1]).logits
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)
    # Target padding: real target positions are unchanged by extra padded positions after them.
    dec = shift_tokens_right(labels[:1], 0, 1)
    dec_padded = torch.cat([dec, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    dec_mask = torch.cat([torch.ones_like(dec), torch.zeros(1, 3, dtype=torch.long)], dim=1)
    a = model(input_ids=row, decoder_input_ids=dec).logits
    b = model(input_ids=row, decoder_input_ids=dec_padded, decoder_attention_mask=dec_mask).logits
    torch.testing.assert_close(a, b[:, : dec.shape[1]], atol=1e-5, rtol=1e-5)


def test_future_target_tokens_do_not_change_earlier_logits(model):
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    changed = dec.clone()
    changed[:, 3:] = torch.randint(4, 53, changed[:, 3:].shape)
    a = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec).logits
    b = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_incremental_decoding_with_cache_matches_full_pass(model):
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    full = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec, use_cache=False
    ).logits
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    steps = []
    for t in range(dec.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=attention_mask,
            decoder_input_ids=dec[:, t : t + 1],
            cache=cache,
            use_cache=True,
        )
        cache = out[CACHE_NAME]
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # Cross-attention keys were computed once, at the first step, for every layer.
    assert all(cache.is_updated[i] for i in range(model.config.decoder_layers))


def test_eager_equals_sdpa():
    torch.manual_seed(0)
    eager = VaswaniForConditionalGeneration(tiny_config(attn_implementation="eager")).eval()
    sdpa = VaswaniForConditionalGeneration(tiny_config(attn_implementation="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    input_ids, attention_mask, labels = batch()
    a = eager(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    b = sdpa(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.loss, b.loss)


def test_output_attentions_and_hidden_states_eager():
    config = tiny_config(attn_implementation="eager")
    model = VaswaniForConditionalGeneration(config).eval()
    input_ids, attention_mask, labels = batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels,
        output_attentions=True,
        output_hidden_states=True,
    )
    B, S, T = input_ids.shape[0], input_ids.shape[1], labels.shape[1]
    assert len(out.encoder_attentions) == config.encoder_layers
    assert out.encoder_attentions[0].shape == (B, config.encoder_attention_heads, S, S)
    assert len(out.decoder_attentions) == config.decoder_layers
    assert out.decoder_attentions[0].shape == (B, config.decoder_attention_heads, T, T)
    assert out.cross_attentions[0].shape == (B, config.decoder_attention_heads, T, S)
    assert len(out.encoder_hidden_states) == config.encoder_layers + 1
    assert len(out.decoder_hidden_states) == config.decoder_layers + 1
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
    # Probabilities: rows sum to one, padding gets no weight, the future gets no weight.
    torch.testing.assert_close(
        out.cross_attentions[0].sum(-1), torch.ones(B, config.decoder_attention_heads, T)
    )
    assert out.cross_attentions[0][2, :, :, S - 2 :].abs().max() == 0
    assert torch.triu(out.decoder_attentions[0][0, 0], diagonal=1).abs().max() == 0


def test_every_parameter_gets_a_finite_gradient():
    model = tiny_model(attention_bias=True).train()
    input_ids, attention_mask, labels = batch()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, attention_mask, labels = batch()
    grads = []
    for checkpointing in (False, True):
        model = tiny_model().train()
        if checkpointing:
            model.gradient_checkpointing_enable()  # every transformers 5 (activation_checkpointing_enable: 5.20+)
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_loss_is_the_plain_cross_entropy_against_the_labels_ignoring_minus_100(model):
    """As in every transformers model (`test_encoder_decoder_loss_no_double_shift`): the mean cross-entropy against
    `labels` themselves, not shifted again; label smoothing belongs to the training recipe."""
    input_ids, attention_mask, labels = batch()
    labels[0, -2:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    expected = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    # Decoder inputs come from the labels shifted right, -100 replaced by padding.
    dec = model.prepare_decoder_input_ids_from_labels(labels)
    assert dec[0, 0] == model.config.decoder_start_token_id
    assert torch.equal(dec[:, 1:][labels[:, :-1] != -100], labels[:, :-1][labels[:, :-1] != -100])
    assert (dec[0, -1] == model.config.pad_token_id).item()
    # No target token: the mean over none is NaN, as Marian's loss gives (raising would read the count on the host).
    nothing = model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.full_like(labels, -100))
    assert torch.isnan(nothing.loss)


def test_a_config_saved_with_label_smoothing_loads():
    assert not hasattr(VaswaniConfig(label_smoothing=0.1), "label_smoothing")  # a recipe setting now


def test_loss_is_correct_under_gradient_accumulation():
    """Two micro-batches with num_items_in_batch give the full batch's per-token loss and gradient."""
    input_ids, attention_mask, labels = batch(batch_size=4)
    labels[0, 2:] = -100  # uneven token counts between micro-batches
    model = tiny_model().train()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    num_items = (labels != -100).sum()
    total = 0.0
    for part in (slice(0, 2), slice(2, 4)):
        loss = model(
            input_ids=input_ids[part],
            attention_mask=attention_mask[part],
            labels=labels[part],
            num_items_in_batch=num_items,
        ).loss
        loss.backward()
        total += loss.item()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, full[name], atol=1e-6, rtol=1e-4)


def test_trainer_sees_loss_kwargs():
    import inspect

    params = inspect.signature(VaswaniForConditionalGeneration.forward).parameters
    assert "num_items_in_batch" in params and any(p.kind == p.VAR_KEYWORD for p in params.values())


def test_resize_token_embeddings_keeps_the_ties(model):
    model.resize_token_embeddings(61)
    assert model.config.vocab_size == 61 and model.config.decoder_vocab_size == 61
    shared = model.model.shared.weight
    assert shared.shape[0] == 61
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    out = model(input_ids=torch.tensor([[60, 5, 2]]), decoder_input_ids=torch.tensor([[1, 60]]))
    assert out.logits.shape[-1] == 61


def test_separate_vocabularies():
    model = tiny_model(vocab_size=41, decoder_vocab_size=37, share_encoder_decoder_embeddings=False)
    assert model.model.encoder.embed_tokens.weight.shape[0] == 41
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert model.model.encoder.embed_tokens.weight is not model.model.decoder.embed_tokens.weight
    out = model(input_ids=torch.tensor([[40, 5, 2]]), labels=torch.tensor([[36, 2]]))
    assert out.logits.shape == (1, 2, 37)
    with pytest.raises(IndexError):  # a source id, 40, in the target's labels: torch's own error in a forward
        model(input_ids=torch.tensor([[40, 5, 2]]), labels=torch.tensor([[40, 2]]))
    with pytest.raises(ValueError, match="decoder_input_ids"):  # named where data enters
        model.generate(
            torch.tensor([[40, 5, 2]]), decoder_input_ids=torch.tensor([[1, 40]]), max_new_tokens=2
        )
    untied = tiny_model(
        vocab_size=41,
        decoder_vocab_size=37,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
    )
    assert untied.lm_head.weight is not untied.model.decoder.embed_tokens.weight


def test_resizing_the_source_vocabulary_of_a_bare_model_leaves_its_target_vocabulary():
    config = tiny_config(vocab_size=41, decoder_vocab_size=37, share_encoder_decoder_embeddings=False)
    model = VaswaniModel(config)
    model.resize_token_embeddings(45)
    assert (model.config.vocab_size, model.encoder.embed_tokens.num_embeddings) == (45, 45)
    assert (model.config.decoder_vocab_size, model.decoder.embed_tokens.num_embeddings) == (37, 37)


def test_learned_positions():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=10)
    out = model(input_ids=torch.randint(4, 53, (2, 10)), labels=torch.randint(4, 53, (2, 10)))
    assert torch.isfinite(out.loss)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=torch.randint(4, 53, (2, 11)), labels=torch.randint(4, 53, (2, 3)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_half_precision_forward_is_finite_with_a_fully_padded_row(dtype, attn):
    model = VaswaniForConditionalGeneration(tiny_config(attn_implementation=attn)).eval().to(dtype)
    input_ids, attention_mask, labels = batch()
    attention_mask[1] = 0  # a row that is all padding
    input_ids[1] = 0
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.logits.dtype == dtype
    assert torch.isfinite(out.logits).all()
    assert torch.isfinite(out.loss)


def test_bf16_autocast_forward_and_backward():
    model = tiny_model().train()
    input_ids, attention_mask, labels = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_token_ids_outside_the_vocabulary_are_named_where_data_enters(model):
    """`generate()` names ids outside the vocabulary. A direct forward reads no token value on the host (no
    host-device sync), so there torch's own index error stops them, as in Marian's forward."""
    with pytest.raises(ValueError, match="input_ids.*outside the vocabulary"):
        model.generate(torch.tensor([[5, 53]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="input_ids.*outside the vocabulary"):
        model.generate(input_ids=torch.tensor([[5, -1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="decoder_input_ids.*outside the vocabulary"):
        model.generate(torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[1, 99]]), max_new_tokens=2)
    with pytest.raises(IndexError):
        model(input_ids=torch.tensor([[5, 53]]), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(IndexError):
        model(input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[1, 99]]))
    with pytest.raises(IndexError):
        model(input_ids=torch.tensor([[5, 6]]), labels=torch.tensor([[1, 53]]))


def test_mismatched_mask_shapes_are_named(model):
    input_ids, attention_mask, labels = batch()
    with pytest.raises(ValueError, match="attention_mask.*shape"):
        model(input_ids=input_ids, attention_mask=attention_mask[:, :-1], labels=labels)
    with pytest.raises(ValueError, match="decoder_attention_mask.*shape"):
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            decoder_attention_mask=torch.ones(3, 2),
        )


def test_attention_implementation_can_be_switched_after_loading(model):
    input_ids, attention_mask, labels = batch()
    sdpa = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert sdpa.encoder_attentions is None or sdpa.encoder_attentions[0] is None
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    eager = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    assert eager.cross_attentions[0] is not None
    torch.testing.assert_close(eager.logits, sdpa.logits, atol=1e-5, rtol=1e-5)


def test_training_step_compiles_as_one_graph_and_matches_eager():
    """`torch.compile(fullgraph=True)` refuses any graph break: the forward with `labels` (linear layers, attention,
    the label-smoothed loss) must trace whole, and its loss and gradients equal eager's. Graph breaks had split the
    model into 27 graphs (oneDNN flag queries in `VaswaniLinear`, the loss's data-dependent branch), which on a GPU
    left the loss outside the compiled graph (BENCHMARKS.md, GPU mode)."""
    torch._dynamo.reset()
    model = tiny_model().train()
    input_ids, attention_mask, labels = batch()
    labels = labels.clone()
    labels[0, -1] = -100  # an ignored position

    def loss_and_grads(forward):
        model.zero_grad(set_to_none=True)
        loss = forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager_loss, eager_grads = loss_and_grads(model)
    compiled_loss, compiled_grads = loss_and_grads(torch.compile(model, fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=1e-5)
    for compiled, eager in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------------------
# No host-device sync in a step: the input checks read shapes only, so they stay on under torch.compile
# --------------------------------------------------------------------------------------------------------------------
class _Syncs(TorchDispatchMode):
    """Records the Python stack of every `aten._local_scalar_dense` (a tensor's value read on the host: on a GPU, a
    host-device sync)."""

    def __init__(self):
        super().__init__()
        self.stacks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.stacks.append("".join(traceback.format_stack()))
        return func(*args, **(kwargs or {}))


def _training_step(model, input_ids, attention_mask, labels):
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    return loss


def _static_cache(model, batch_size: int, source_length: int, length: int = 8):
    cache = EncoderDecoderCache(
        StaticCache(config=model.config, max_cache_len=length),
        StaticCache(config=model.config, max_cache_len=source_length),
    )
    return cache


def _decoding_steps(step, model, input_ids, attention_mask, cache, steps: int = 3):
    """Cached greedy steps on `step` (the model's forward, eager or compiled), as `generate()` runs them."""
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    tokens = torch.full((input_ids.shape[0], 1), model.config.decoder_start_token_id)
    for _ in range(steps):
        out = step(
            encoder_outputs=encoder_outputs,
            attention_mask=attention_mask,
            decoder_input_ids=tokens[:, -1:],
            cache=cache,
            use_cache=True,
        )
        tokens = torch.cat([tokens, out.logits[:, -1:].argmax(-1)], dim=-1)
    return tokens


@pytest.mark.parametrize("shape", ["paper", "learned-positions-attention-bias"])
def test_a_training_step_and_a_cached_decoding_step_read_no_tensor_value_on_the_host(shape):
    """The model's own code makes no host-device sync: without a padding mask, a training step (forward and
    backward) and cached decoding steps read no tensor's value at all; with one, the only reads are transformers'
    own check that the mask can be skipped (`masking_utils`, which Marian's forward makes too; compiled, it is
    skipped)."""
    model = tiny_model(**SHAPES[shape]).train()
    input_ids, attention_mask, labels = batch()
    for mask in (None, attention_mask):
        with _Syncs() as syncs:
            _training_step(model, input_ids, mask, labels)
        assert all("masking_utils" in stack for stack in syncs.stacks), syncs.stacks[0]
        assert mask is not None or not syncs.stacks
    model.eval()
    with torch.no_grad():
        for mask in (None, attention_mask):
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            with _Syncs() as syncs:
                _decoding_steps(model, model, input_ids, mask, cache)
            assert all("masking_utils" in stack for stack in syncs.stacks), syncs.stacks[0]
            assert mask is not None or not syncs.stacks


def test_a_training_step_and_a_static_cache_decoding_step_compile_as_one_graph_with_every_check_on():
    """`torch.compile(fullgraph=True)` refuses any graph break, and so any read of a tensor's value: the training
    step and cached decoding steps on a static cache (`cache_implementation="static"`) trace whole, giving eager's
    results, and the input checks still run inside the compiled graph (a mask of the wrong shape is named)."""
    torch._dynamo.reset()
    model = tiny_model().train()
    input_ids, attention_mask, labels = batch()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    eager_loss = _training_step(model, input_ids, attention_mask, labels)
    torch.testing.assert_close(_training_step(compiled, input_ids, attention_mask, labels), eager_loss)
    # fullgraph: dynamo reports the check's ValueError, with its message, as the reason it cannot go on
    refused = (ValueError, torch._dynamo.exc.Unsupported)
    with pytest.raises(refused, match="`attention_mask` has shape"):
        compiled(input_ids=input_ids, attention_mask=attention_mask[:, :-1], labels=labels)

    model.eval()
    step = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        cache = _static_cache(model, *input_ids.shape)
        expected = _decoding_steps(model, model, input_ids, attention_mask, cache)
        cache = _static_cache(model, *input_ids.shape)
        assert torch.equal(_decoding_steps(step, model, input_ids, attention_mask, cache), expected)
        with pytest.raises(refused, match="`decoder_attention_mask` has shape"):
            step(
                input_ids=input_ids,
                attention_mask=attention_mask,
                decoder_input_ids=expected[:, :1],
                decoder_attention_mask=torch.ones(2, 5),
                cache=_static_cache(model, *input_ids.shape),
            )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_training_step_and_a_decoding_step_make_no_host_device_sync():
    """Under `torch.cuda.set_sync_debug_mode("error")` any sync raises: eager steps without a padding mask (with
    one, transformers' mask check reads it, as in Marian's forward) and compiled steps with one."""
    model = tiny_model().cuda().train()
    input_ids, attention_mask, labels = (t.cuda() for t in batch())
    compiled = torch.compile(model, fullgraph=True)
    _training_step(compiled, input_ids, attention_mask, labels)  # compiled outside the sync check
    model.eval()
    step = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        _decoding_steps(step, model, input_ids, attention_mask, _static_cache(model, *input_ids.shape))
    model.train()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _training_step(model, input_ids, None, labels)
        _training_step(compiled, input_ids, attention_mask, labels)
        model.eval()
        with torch.no_grad():
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            _decoding_steps(model, model, input_ids, None, cache)
            _decoding_steps(step, model, input_ids, attention_mask, _static_cache(model, *input_ids.shape))
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --------------------------------------------------------------------------------------------------------------------
# Contracts of a transformers model, on every shape
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_decodes_incrementally_as_in_one_pass_and_ignores_padding(shape):
    model = tiny_model(**SHAPES[shape])
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec).logits
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec[:, :2], use_cache=True
    )
    rest = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=dec[:, 2:],
        cache=out[CACHE_NAME],
    )
    torch.testing.assert_close(torch.cat((out.logits, rest.logits), dim=1), full, atol=1e-5, rtol=1e-5)
    alone = model(input_ids=input_ids[2:, :5], decoder_input_ids=dec[2:]).logits  # row 2 has 5 real tokens
    torch.testing.assert_close(alone, full[2:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_saves_and_loads_with_identical_logits(shape, tmp_path):
    model = tiny_model(**SHAPES[shape])
    model.save_pretrained(tmp_path)
    again, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    input_ids, attention_mask, labels = batch()
    kw = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert torch.equal(model(**kw).logits, again.eval()(**kw).logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_loads_in_half_precision_and_generates(shape, dtype, tmp_path):
    """`from_pretrained(folder, dtype=..., device_map=...)` and `from_config(config, dtype=...)`: every tensor of the
    forward pass in that dtype (the sinusoids too), finite logits, and beam search that runs."""
    tiny_model(**SHAPES[shape]).save_pretrained(tmp_path)
    input_ids, attention_mask, labels = batch()
    for model in (
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype, device_map="cpu"),
        AutoModelForSeq2SeqLM.from_config(tiny_config(**SHAPES[shape]), dtype=dtype),
    ):
        assert model.dtype == dtype
        out = model.eval()(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        assert out.logits.dtype == dtype and torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
        out = model.generate(input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=5)
        assert out.shape[0] == input_ids.shape[0]


def test_vocab_size_changed_after_construction_is_saved_and_loads(tmp_path):
    """`config.vocab_size = len(tokenizer)` on a shared vocabulary: the model built from it has one vocabulary of that
    size on both sides, and its config says so (transformers' common tests build models this way)."""
    config = tiny_config()
    config.vocab_size = 59
    model = VaswaniForConditionalGeneration(config)
    assert config.decoder_vocab_size == 59
    assert model.lm_head.weight.shape[0] == 59
    model.save_pretrained(tmp_path)
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert again.config.vocab_size == again.config.decoder_vocab_size == 59
    separate = tiny_config(share_encoder_decoder_embeddings=False, decoder_vocab_size=41)
    separate.vocab_size = 59
    assert separate.decoder_vocab_size == 41  # separate vocabularies keep their own sizes


def test_a_config_changed_into_one_that_cannot_work_is_refused_before_a_model_or_a_folder(tmp_path):
    config = tiny_config()
    config.d_model = 16  # 3 encoder heads do not divide it
    with pytest.raises(ValueError, match="d_model.*divisible by `encoder_attention_heads`"):
        VaswaniForConditionalGeneration(config)
    # transformers' own check when a `@strict` config is saved: its error names our validator's ValueError
    with pytest.raises(StrictDataclassClassValidationError, match="ValueError: `d_model`.*divisible"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_an_untied_output_projection_over_one_shared_vocabulary(tmp_path):
    """`tie_word_embeddings=False` with `share_encoder_decoder_embeddings=True`: one embedding matrix for source and
    target tokens, and a pre-softmax projection of its own (as Marian allows)."""
    model = tiny_model(tie_word_embeddings=False)
    embeddings = model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is embeddings
    assert model.model.decoder.embed_tokens.weight is embeddings
    assert model.lm_head.weight is not embeddings
    model.save_pretrained(tmp_path)
    again = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert again.model.encoder.embed_tokens.weight is again.model.decoder.embed_tokens.weight
    torch.testing.assert_close(again.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(again.lm_head.weight, again.model.shared.weight)


def test_the_cache_is_taken_under_its_deprecated_name_with_a_warning(model):
    """transformers 5.24 renamed `past_key_values` to `cache`; earlier releases pass the old name, which works."""
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    kw = dict(input_ids=input_ids, attention_mask=attention_mask)
    first = model(**kw, decoder_input_ids=dec[:, :2], use_cache=True)
    cache_name = "cache" if "cache" in first else "past_key_values"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = model(**kw, decoder_input_ids=dec[:, 2:], past_key_values=first[cache_name])
    if cache_name == "cache":
        assert any("`past_key_values` is deprecated" in str(w.message) for w in caught)
    full = model(**kw, decoder_input_ids=dec).logits
    torch.testing.assert_close(old.logits, full[:, 2:], atol=1e-5, rtol=1e-5)


def test_return_dict_false_gives_tuples(model):
    input_ids, attention_mask, labels = batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, return_dict=False)
    assert isinstance(out, tuple) and out[0].ndim == 0 and out[1].shape[-1] == 53
    bare = VaswaniModel(tiny_config())(input_ids=input_ids, decoder_input_ids=labels, return_dict=False)
    assert isinstance(bare, tuple)


def test_empty_inputs_are_named(model):
    with pytest.raises(ValueError, match="`input_ids` is empty"):
        model(
            input_ids=torch.zeros(2, 0, dtype=torch.long),
            decoder_input_ids=torch.ones(2, 1, dtype=torch.long),
        )
    with pytest.raises(ValueError, match="`input_ids` is empty"):
        model(
            input_ids=torch.zeros(0, 3, dtype=torch.long),
            decoder_input_ids=torch.ones(0, 1, dtype=torch.long),
        )
    with pytest.raises(ValueError, match="`labels` is empty"):
        model(input_ids=torch.ones(2, 3, dtype=torch.long), labels=torch.zeros(2, 0, dtype=torch.long))


def test_ids_and_embeddings_of_the_wrong_shape_are_named(model):
    """Not an index or matmul error inside torch: the argument, the shape given and the shape needed."""
    input_ids, attention_mask, labels = batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels)
    with pytest.raises(ValueError, match=r"`input_ids` must be a 2-D tensor \(batch, length\).*\(7,\)"):
        model(input_ids=input_ids[0], decoder_input_ids=dec)
    with pytest.raises(ValueError, match=r"`decoder_input_ids` must be a 2-D tensor.*\(3, 6, 1\)"):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec[..., None])
    embeds = torch.randn(3, 7, model.config.d_model + 1)
    with pytest.raises(
        ValueError, match=r"`input_ids` must have shape \(batch, length, d_model=15\), got \(3, 7, 16\)"
    ):
        model(inputs_embeds=embeds, attention_mask=attention_mask, decoder_input_ids=dec)
    with pytest.raises(
        ValueError, match=r"`decoder_input_ids` must have shape \(batch, length, d_model=15\)"
    ):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_inputs_embeds=torch.randn(3, 6))
    with pytest.raises(ValueError, match=r"decoder batch \(2\) must be the encoder batch \(3\)"):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec[:2])
