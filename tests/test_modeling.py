"""Behaviour of the model: masks, causality, caching, attention back-ends, gradients, losses, dtypes."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import batch, tiny_config, tiny_model
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from vaswani import VaswaniForConditionalGeneration, shift_tokens_right
from vaswani.modeling_vaswani import (
    VaswaniSinusoidalPositionalEncoding,
    apply_dropout,
    label_smoothed_cross_entropy,
    length_penalty_factor,
)


def test_sinusoids_are_the_papers_formula():
    d_model = 16
    pe = VaswaniSinusoidalPositionalEncoding(d_model, num_positions=10)
    for pos in (0, 3, 9):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe.table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe.table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    # Past the table, positions are computed on the fly with the same formula.
    beyond = pe(8, 5)  # positions 8..12, the table holds 0..9
    full = VaswaniSinusoidalPositionalEncoding(d_model, num_positions=13).table[8:13]
    torch.testing.assert_close(beyond, full)


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
        cache = out.cache
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # Cross-attention keys were computed once, at the first step, for every layer.
    assert all(cache.is_updated[i] for i in range(model.config.decoder_layers))


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_cached_equals_uncached(model, num_beams):
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=12, num_beams=num_beams, do_sample=False)
    with_cache = model.generate(input_ids, use_cache=True, **kw)
    without = model.generate(input_ids, use_cache=False, **kw)
    assert torch.equal(with_cache, without)


def test_decoder_rows_in_groups_per_source_equal_copied_encoder_rows(model):
    """A decoder batch that is a multiple g of the encoder batch (g consecutive rows per source) gives the logits
    and attention maps of the same call with the encoder output and mask copied g times."""
    input_ids, attention_mask, _ = batch()
    group = 4
    encoder_outputs = model.get_encoder()(input_ids, attention_mask=attention_mask)
    copied = type(encoder_outputs)(
        last_hidden_state=encoder_outputs.last_hidden_state.repeat_interleave(group, 0)
    )
    decoder_input_ids = torch.randint(4, 53, (3 * group, 5), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("eager")
    try:
        kw = dict(decoder_input_ids=decoder_input_ids, output_attentions=True)
        shared = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask, **kw)
        reference = model(
            encoder_outputs=copied, attention_mask=attention_mask.repeat_interleave(group, 0), **kw
        )
    finally:
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(shared.logits, reference.logits)
    for ours, theirs in zip(shared.cross_attentions, reference.cross_attentions, strict=True):
        assert ours.shape == theirs.shape == (3 * group, 5, 5, 7)
        torch.testing.assert_close(ours, theirs)
    with pytest.raises(
        ValueError, match=r"decoder batch \(5\) must be the encoder batch \(3\) or a multiple"
    ):
        model(
            encoder_outputs=encoder_outputs,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:5],
        )


def _transformers_generic_beam_layout(monkeypatch):
    """Give the model transformers' own handling of beams: encoder side copied per beam, whole cache reordered."""
    from transformers import GenerationMixin

    def generic_reorder(self, cache, beam_idx):
        cache.reorder_cache(beam_idx)
        return cache

    monkeypatch.setattr(VaswaniForConditionalGeneration, "_reorder_cache", generic_reorder)
    monkeypatch.setattr(
        VaswaniForConditionalGeneration,
        "_expand_inputs_for_generation",
        GenerationMixin._expand_inputs_for_generation,
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(num_beams=4, num_return_sequences=2, length_penalty=0.6),
        dict(num_beams=3, cache_implementation="static"),
        dict(do_sample=True, num_beams=1, num_return_sequences=3),
    ],
    ids=["beam", "beam-static-cache", "sampling"],
)
def test_generation_keeps_one_copy_of_the_encoder_side_per_source(model, monkeypatch, options):
    """Beams and samples of a source share its encoder output and cross-attention keys and values (held once per
    source in the cache, never reordered); sequences and scores equal transformers' generic copied layout."""
    input_ids, attention_mask, _ = batch()
    kw = dict(
        attention_mask=attention_mask, max_new_tokens=10, output_scores=True, return_dict_in_generate=True
    )
    kw.update(options)
    torch.manual_seed(0)
    ours = model.generate(input_ids, **kw)
    cache = ours.past_key_values
    expanded = 3 * max(options["num_beams"], options.get("num_return_sequences", 1))
    assert cache.cross_attention_cache.layers[0].keys.shape[0] == 3
    assert cache.self_attention_cache.layers[0].keys.shape[0] == expanded

    _transformers_generic_beam_layout(monkeypatch)
    torch.manual_seed(0)
    reference = model.generate(input_ids, **kw)
    monkeypatch.undo()
    assert reference.past_key_values.cross_attention_cache.layers[0].keys.shape[0] == expanded
    assert torch.equal(ours.sequences, reference.sequences)
    for step_ours, step_reference in zip(ours.scores, reference.scores, strict=True):
        torch.testing.assert_close(step_ours, step_reference)


def test_beam_search_reorders_only_the_self_attention_cache(model):
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    cache.self_attention_cache.update(
        torch.arange(4.0).view(4, 1, 1, 1), torch.arange(4.0).view(4, 1, 1, 1), 0
    )
    cross = torch.randn(4, 1, 3, 1)
    cache.cross_attention_cache.update(cross, cross, 0)
    cross_keys = cache.cross_attention_cache.layers[0].keys
    model._reorder_cache(cache, torch.tensor([1, 1, 3, 2]))
    assert cache.self_attention_cache.layers[0].keys.flatten().tolist() == [1.0, 1.0, 3.0, 2.0]
    assert cache.cross_attention_cache.layers[0].keys is cross_keys


def test_decoding_steps_compute_sdpa_attention_with_matmuls(model, monkeypatch):
    """With the cache, each step has one query per sentence: "sdpa" computes it with matmuls (faster on the CPU);
    the generations equal those without the cache, where every step runs SDPA's kernel over the whole prefix."""
    from vaswani import modeling_vaswani

    calls = []
    original = modeling_vaswani._matmul_attention_for_sdpa_masks
    monkeypatch.setattr(
        modeling_vaswani,
        "_matmul_attention_for_sdpa_masks",
        lambda *a, **k: calls.append((a[0].is_cross_attention, a[1].shape)) or original(*a, **k),
    )
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=8, num_beams=4, do_sample=False)
    assert model.config._attn_implementation == "sdpa"
    with_cache = model.generate(input_ids, use_cache=True, **kw)
    # one query per beam: self-attention at 3 x 4 rows; encoder-decoder attention once per source, its 4 beams'
    # queries together
    expected = {(False, (12, 5, 1, 3)), (True, (3, 5, 4, 3))}
    assert calls and {(cross, tuple(shape)) for cross, shape in calls} == expected
    calls.clear()
    assert torch.equal(with_cache, model.generate(input_ids, use_cache=False, **kw))
    # without the cache only the first step (a one-token prefix) has one query per row
    assert {(cross, tuple(shape)) for cross, shape in calls} == expected


def test_generate_beam_options_and_sampling(model):
    input_ids, attention_mask, _ = batch()
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        num_beams=4,
        num_return_sequences=3,
        length_penalty=0.6,
        max_new_tokens=8,
    )
    assert out.shape[0] == 3 * input_ids.shape[0]
    assert (out[:, 0] == model.config.decoder_start_token_id).all()
    torch.manual_seed(1)
    sampled = model.generate(
        input_ids, attention_mask=attention_mask, do_sample=True, top_k=10, num_beams=1, max_new_tokens=8
    )
    torch.manual_seed(1)
    again = model.generate(
        input_ids, attention_mask=attention_mask, do_sample=True, top_k=10, num_beams=1, max_new_tokens=8
    )
    assert torch.equal(sampled, again)
    assert ((sampled >= 0) & (sampled < 53)).all()


def test_generation_defaults_are_the_papers(model):
    assert model.generation_config.num_beams == 4
    assert model.generation_config.length_penalty == 0.6
    assert model.generation_config.length_penalty_form == "gnmt"


def test_length_penalty_is_wu_et_al_by_default_and_transformers_power_on_request():
    # Wu et al. (2016) eq. 14, which §6.1 cites: ((5 + |Y|) / 6) ** alpha
    assert length_penalty_factor(1, 0.6) == 1.0
    assert length_penalty_factor(13, 0.6) == pytest.approx(3.0**0.6)
    assert length_penalty_factor(13, 0.6, "power") == pytest.approx(13**0.6)
    assert length_penalty_factor(13, 0.0) == 1.0
    with pytest.raises(ValueError, match="length_penalty_form.*'linear'"):
        length_penalty_factor(13, 0.6, "linear")


@pytest.mark.parametrize("form", [None, "gnmt", "power"])
def test_beam_search_scores_finished_hypotheses_with_the_length_penalty_form(model, form):
    """A returned hypothesis' score is its summed log-probability divided by lp(|Y|) of the chosen form."""
    input_ids, attention_mask, _ = batch()
    kw = {} if form is None else {"length_penalty_form": form}
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        num_beams=4,
        num_return_sequences=4,
        length_penalty=0.6,
        max_new_tokens=12,
        eos_token_id=list(range(2, 12)),  # a random model ends hypotheses at varied lengths
        output_scores=True,
        return_dict_in_generate=True,
        **kw,
    )
    steps = model.compute_transition_scores(
        out.sequences, out.scores, out.beam_indices, normalize_logits=False
    )
    generated = out.beam_indices != -1  # |Y|: the generated tokens, end-of-sentence included
    lengths = generated.sum(-1)
    assert lengths.min() < lengths.max()  # some hypotheses ended early, so lengths are compared
    summed = steps.masked_fill(~generated[:, : steps.shape[1]], 0).sum(-1)
    divisors = torch.tensor([length_penalty_factor(int(n), 0.6, form or "gnmt") for n in lengths])
    torch.testing.assert_close(out.sequences_scores, summed / divisors)
    other = "power" if form != "power" else "gnmt"
    other_divisors = torch.tensor([length_penalty_factor(int(n), 0.6, other) for n in lengths])
    assert not torch.allclose(out.sequences_scores, summed / other_divisors)


def test_the_early_stop_bound_uses_the_length_penalty_form(model):
    """transformers stops extending a sentence's beams once its best running hypothesis, length-penalised, cannot
    beat the worst finished one. Here the best running log-probability is -2.0 after 9 generated tokens and the worst
    finished score is -0.55: dividing by 9 ** 0.6 = 3.74 gives -0.53 (keep searching), by (14 / 6) ** 0.6 = 1.66
    gives -1.20 (stop)."""
    kw = dict(
        is_early_stop_heuristic_unsatisfied=torch.tensor([[True]]),
        running_beam_scores=torch.tensor([[-2.0, -3.0]]),
        beam_scores=torch.tensor([[-0.5, -0.55]]),
        is_sent_finished=torch.tensor([[True, True]]),
        cur_len=10,
        max_length=30,
        decoder_prompt_len=1,
        early_stopping=False,
        length_penalty=0.6,
    )
    decisions = {}
    for form in ("power", "gnmt"):
        model._length_penalty_form = form
        decisions[form] = bool(model._check_early_stop_heuristic(**kw))
    assert decisions == {"power": True, "gnmt": False}


def test_an_unknown_length_penalty_form_is_named(model):
    input_ids, attention_mask, _ = batch()
    with pytest.raises(ValueError, match="length_penalty_form.*'average'"):
        model.generate(input_ids, attention_mask=attention_mask, num_beams=2, length_penalty_form="average")
    assert model._length_penalty_form == "gnmt"


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
            model.activation_checkpointing_enable()
            assert model.is_activation_checkpointing
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_loss_is_label_smoothed_cross_entropy_ignoring_minus_100():
    model = tiny_model(label_smoothing=0.1)
    input_ids, attention_mask, labels = batch()
    labels[0, -2:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    logp = out.logits.log_softmax(-1)
    keep = labels != -100
    nll = -logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0][keep]
    smooth = -logp.mean(-1)[keep]
    expected = (0.9 * nll + 0.1 * smooth).mean()
    torch.testing.assert_close(out.loss, expected)
    # Decoder inputs come from the labels shifted right, -100 replaced by padding.
    dec = model.prepare_decoder_input_ids_from_labels(labels)
    assert dec[0, 0] == model.config.decoder_start_token_id
    assert torch.equal(dec[:, 1:][labels[:, :-1] != -100], labels[:, :-1][labels[:, :-1] != -100])
    assert (dec[0, -1] == model.config.pad_token_id).item()
    plain = tiny_model(label_smoothing=0.0)(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    torch.testing.assert_close(plain.loss, F.cross_entropy(plain.logits.flatten(0, 1), labels.flatten()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_label_smoothed_loss_equals_cross_entropy_value_and_gradient(dtype, eps):
    """The chunked loss and its precomputed gradient against autograd through `F.cross_entropy`: rows ignored
    inside and across chunk boundaries (chunks of 3 rows over 10), a scaled upstream gradient, bf16 logits."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 7, generator=generator) * 3).to(dtype)
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    labels[0, 2] = labels[1, 0] = labels[1, 1] = -100
    fused_in = logits.clone().requires_grad_()
    fused = label_smoothed_cross_entropy(fused_in, labels, eps, chunk_elements=3 * 7)
    (fused * 0.37).backward()
    plain_in = logits.clone().requires_grad_()
    plain = F.cross_entropy(
        plain_in.flatten(0, 1).float(),
        labels.flatten(),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=eps,
    )
    (plain * 0.37).backward()
    torch.testing.assert_close(fused, plain)
    assert fused_in.grad.dtype == dtype
    torch.testing.assert_close(fused_in.grad, plain_in.grad)
    assert fused_in.grad[0, 2].abs().sum() == 0 and fused_in.grad[1, :2].abs().sum() == 0
    with torch.no_grad():  # no gradient buffer without autograd, same value
        torch.testing.assert_close(label_smoothed_cross_entropy(logits, labels, eps), plain.detach())


def test_fused_label_smoothed_loss_refuses_a_second_backward():
    logits = torch.randn(4, 6, requires_grad=True)
    loss = label_smoothed_cross_entropy(logits, torch.tensor([1, 2, 3, -100]), 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backpropagated once"):
        loss.backward()
    with pytest.raises(ValueError, match="labels have 3 positions, logits 4"):
        label_smoothed_cross_entropy(logits, torch.tensor([1, 2, 3]), 0.1)


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
    with pytest.raises(ValueError, match="labels"):
        model(input_ids=torch.tensor([[40, 5, 2]]), labels=torch.tensor([[40, 2]]))
    untied = tiny_model(
        vocab_size=41,
        decoder_vocab_size=37,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
    )
    assert untied.lm_head.weight is not untied.model.decoder.embed_tokens.weight


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_training_attention_matches_sdpa_kernel_and_is_causal(dtype, monkeypatch):
    """In half precision with gradients on the CPU, "sdpa" computes attention with matmuls (faster backward);
    no target position sees a later one, and logits and gradients are as close to float32 as the kernel's."""
    from vaswani import modeling_vaswani

    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    results, calls = [], []
    original = modeling_vaswani._matmul_attention_for_sdpa_masks
    monkeypatch.setattr(
        modeling_vaswani,
        "_matmul_attention_for_sdpa_masks",
        lambda *a, **k: calls.append(1) or original(*a, **k),
    )
    for use_matmuls in (True, False, None):  # None: float32 reference
        monkeypatch.setattr(modeling_vaswani, "_MATMUL_ATTENTION_MAX_KEYS", 128 if use_matmuls else 0)
        calls.clear()
        model = tiny_model(dropout=0.0).to(torch.float32 if use_matmuls is None else dtype).train()
        embeds = (model.get_input_embeddings()(dec) * model.config.d_model**0.5).detach().requires_grad_()
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_inputs_embeds=embeds
        ).logits
        logits[:, 2].float().sum().backward()
        assert (len(calls) > 0) == bool(use_matmuls)
        assert embeds.grad[:, 3:].abs().sum() == 0 and embeds.grad[:, :3].abs().sum() > 0
        results.append([t.float() for t in (logits.detach(), embeds.grad, model.lm_head.weight.grad)])
    for ours, kernel, exact in zip(*results, strict=True):
        assert (ours - exact).abs().max() <= 1.5 * (kernel - exact).abs().max() + 1e-3


def test_token_ids_outside_the_vocabulary_are_named(model):
    with pytest.raises(ValueError, match="input_ids.*outside the vocabulary"):
        model(input_ids=torch.tensor([[5, 53]]), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="input_ids.*outside the vocabulary"):
        model(input_ids=torch.tensor([[5, -1]]), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="decoder_input_ids.*outside the vocabulary"):
        model(input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="labels.*outside the vocabulary"):
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


def test_static_cache_with_torch_compile_matches_dynamic(model):
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=6, num_beams=1, do_sample=False)
    dynamic = model.generate(input_ids, **kw)
    static = model.generate(input_ids, cache_implementation="static", **kw)
    assert torch.equal(dynamic, static)
    compiled = torch.compile(model.forward, dynamic=False, fullgraph=False)
    model.forward = compiled
    try:
        compiled_out = model.generate(input_ids, cache_implementation="static", **kw)
    finally:
        del model.forward
    assert torch.equal(dynamic, compiled_out)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_keeps_each_element_with_probability_one_minus_p_and_scales_it(dtype):
    p, n = 0.3, 1 << 20
    x = torch.randn(n, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    y = apply_dropout(x, p, training=True)
    kept = y != 0
    # Bernoulli(1 - p) per element: the kept fraction within 5 standard deviations of 1 - p.
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    # Kept elements are x times 1 / (1 - p) rounded to x's dtype: the formula of torch's own dropout.
    scaled_mask = kept.to(dtype) * torch.tensor(1 / (1 - p), dtype=dtype)
    assert y.dtype == dtype and torch.equal(y, x.detach() * scaled_mask)
    out, native_mask = torch.native_dropout(x.detach(), p, True)
    assert torch.equal(out, x.detach() * native_mask.to(dtype) * torch.tensor(1 / (1 - p), dtype=dtype))
    # The gradient goes through the same mask and scale.
    g = torch.randn(n, dtype=dtype)
    y.backward(g)
    assert torch.equal(x.grad, g * scaled_mask)
    # A seed fixes the mask.
    torch.manual_seed(0)
    assert torch.equal(apply_dropout(x.detach(), p, training=True), y.detach())


def test_dropout_is_the_identity_when_off_and_zero_at_p_one():
    x = torch.randn(4, 5)
    assert apply_dropout(x, 0.3, training=False) is x
    assert torch.equal(apply_dropout(x, 0.0, training=True), x)
    assert torch.equal(apply_dropout(x, 1.0, training=True), torch.zeros_like(x))


def test_training_on_the_cpu_draws_every_dropout_mask_with_the_fast_path(monkeypatch):
    """Each dropout site of the model (embeddings, sublayer outputs, attention weights, FFN activations) goes
    through `apply_dropout`'s uniform mask on the CPU, not through `F.dropout`'s slower `bernoulli_`."""
    model = tiny_model(
        dropout=0.2, attention_dropout=0.1, activation_dropout=0.1, attn_implementation="eager"
    )
    model.train()
    input_ids, attention_mask, labels = batch()

    def refuse(*args, **kwargs):
        raise AssertionError("F.dropout was called on the CPU in training")

    monkeypatch.setattr(F, "dropout", refuse)
    torch.manual_seed(1)
    first = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    first.backward()
    torch.manual_seed(1)
    again = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    torch.manual_seed(2)
    other = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert all(
        p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad
    )
