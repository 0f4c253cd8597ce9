"""`generate()`: the paper's decoding (§6.1) and its length penalty, caches, beams and samples, and what happens on a
transformers version without the beam-search helpers the length penalty needs."""

import logging

import pytest
import torch
import transformers
from conftest import batch, tiny_model
from packaging.version import Version
from transformers import GenerationConfig, GenerationMixin

from vaswani import generation_vaswani
from vaswani.generation_vaswani import (
    EXTRA_OUTPUT_TOKENS,
    PAPER_LENGTH_PENALTY,
    PAPER_NUM_BEAMS,
    length_penalty_factor,
    paper_decoding,
)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_cached_equals_uncached(model, num_beams):
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=12, num_beams=num_beams, do_sample=False)
    assert torch.equal(
        model.generate(input_ids, use_cache=True, **kw), model.generate(input_ids, use_cache=False, **kw)
    )


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
    kw = dict(attention_mask=attention_mask, do_sample=True, top_k=10, num_beams=1, max_new_tokens=8)
    torch.manual_seed(1)
    sampled = model.generate(input_ids, **kw)
    torch.manual_seed(1)
    assert torch.equal(sampled, model.generate(input_ids, **kw))
    assert ((sampled >= 0) & (sampled < 53)).all()


def test_a_model_decodes_greedily_until_its_generation_config_holds_the_papers_decoding(model):
    """Decoding settings live in the generation config (generation_config.json), as in every transformers model; the
    recipe writes the paper's into each model it trains."""
    assert model.generation_config.num_beams in (None, 1)  # transformers' default: greedy
    paper_decoding(model.generation_config)
    assert (PAPER_NUM_BEAMS, PAPER_LENGTH_PENALTY, EXTRA_OUTPUT_TOKENS) == (4, 0.6, 50)
    assert model.generation_config.num_beams == 4
    assert model.generation_config.length_penalty == 0.6
    assert model.generation_config.length_penalty_form == "gnmt"
    input_ids, attention_mask, _ = batch()
    beams = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, num_return_sequences=4)
    assert beams.shape[0] == 4 * input_ids.shape[0]


def test_the_papers_decoding_survives_save_and_load(model, tmp_path):
    paper_decoding(model.generation_config)
    model.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert (loaded.num_beams, loaded.length_penalty, loaded.length_penalty_form) == (4, 0.6, "gnmt")


def test_length_penalty_is_wu_et_al_by_default_and_transformers_power_on_request():
    # Wu et al. (2016) eq. 14, which §6.1 cites: ((5 + |Y|) / 6) ** alpha
    assert length_penalty_factor(1, 0.6) == 1.0
    assert length_penalty_factor(13, 0.6) == pytest.approx(3.0**0.6)
    assert length_penalty_factor(13, 0.6, "power") == pytest.approx(13**0.6)
    assert length_penalty_factor(13, 0.0) == 1.0
    with pytest.raises(ValueError, match="length_penalty_form.*'linear'"):
        length_penalty_factor(13, 0.6, "linear")


def _beam_scores(model, **kw):
    input_ids, attention_mask, _ = batch()
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
    return out.sequences_scores, summed, lengths


@pytest.mark.parametrize("form", [None, "gnmt", "power"])
def test_beam_search_scores_finished_hypotheses_with_the_length_penalty_form(model, form):
    """A returned hypothesis' score is its summed log-probability divided by lp(|Y|) of the chosen form."""
    scores, summed, lengths = _beam_scores(model, **({} if form is None else {"length_penalty_form": form}))
    divisors = torch.tensor([length_penalty_factor(int(n), 0.6, form or "gnmt") for n in lengths])
    torch.testing.assert_close(scores, summed / divisors)
    other = "power" if form != "power" else "gnmt"
    other_divisors = torch.tensor([length_penalty_factor(int(n), 0.6, other) for n in lengths])
    assert not torch.allclose(scores, summed / other_divisors)
    assert "_update_finished_beams" not in vars(model)  # the wrappers lived for the one call only


def test_the_length_penalty_form_can_come_from_the_generation_config(model):
    model.generation_config.length_penalty_form = "power"
    scores, summed, lengths = _beam_scores(model)
    torch.testing.assert_close(scores, summed / torch.tensor([int(n) ** 0.6 for n in lengths]))


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
        with generation_vaswani.paper_length_penalty(model, form, 0.6, uses_beams=True):
            decisions[form] = bool(model._check_early_stop_heuristic(**kw))
    assert decisions == {"power": True, "gnmt": False}


def test_an_unknown_length_penalty_form_is_named_before_any_work(model):
    input_ids, attention_mask, _ = batch()
    with pytest.raises(ValueError, match="length_penalty_form.*'average'"):
        model.generate(input_ids, attention_mask=attention_mask, num_beams=2, length_penalty_form="average")


def test_without_the_beam_search_helpers_generate_warns_and_uses_transformers_penalty(
    model, monkeypatch, caplog
):
    """On a transformers version whose beam search has no `_update_finished_beams` (private, may change),
    `generate()` still works: it warns that the paper's length penalty is unavailable and divides by |Y| ** alpha."""
    monkeypatch.delattr(GenerationMixin, "_update_finished_beams")
    assert not generation_vaswani.length_penalty_hooks_available()
    logging.getLogger("vaswani").propagate = True
    with caplog.at_level(logging.WARNING):
        generation_vaswani.logger.warning_once.cache_clear()
        context = generation_vaswani.paper_length_penalty(model, "gnmt", 0.6, uses_beams=True)
    assert "uses transformers' |Y| ** alpha instead" in caplog.text
    with context:
        assert "_update_finished_beams" not in vars(model)
    monkeypatch.undo()
    # a signature that changed is treated the same way
    monkeypatch.setattr(GenerationMixin, "_check_early_stop_heuristic", lambda self, scores: scores)
    assert not generation_vaswani.length_penalty_hooks_available()
    monkeypatch.undo()
    scores, summed, lengths = _beam_scores(
        model, length_penalty_form="power"
    )  # transformers' own penalty works
    torch.testing.assert_close(scores, summed / torch.tensor([int(n) ** 0.6 for n in lengths]))


def test_generate_works_on_a_transformers_without_the_helpers(model, monkeypatch):
    """The whole call, not only the context: missing helpers give a working `generate()` with |Y| ** alpha."""
    reference = _beam_scores(model, length_penalty_form="power")[0]
    monkeypatch.setattr(generation_vaswani, "length_penalty_hooks_available", lambda: False)
    torch.testing.assert_close(_beam_scores(model, length_penalty_form="gnmt")[0], reference)


@pytest.mark.parametrize(
    "options",
    [
        dict(num_beams=4, num_return_sequences=2, length_penalty=0.6),
        dict(do_sample=True, num_beams=1, num_return_sequences=3),
    ],
    ids=["beam", "sampling"],
)
def test_share_encoder_outputs_keeps_one_copy_per_source_and_changes_no_result(model, options):
    """Opt-in: the beams and samples of a source share its encoder output and encoder-decoder attention keys and
    values (held once per source in the returned cache); sequences and scores equal the default layout's, whose
    cache holds them once per returned row as transformers' caches do."""
    input_ids, attention_mask, _ = batch()
    kw = dict(
        attention_mask=attention_mask, max_new_tokens=10, output_scores=True, return_dict_in_generate=True
    )
    kw.update(options)
    expanded = 3 * max(options["num_beams"], options.get("num_return_sequences", 1))
    results = {}
    for share in (False, True):
        torch.manual_seed(0)
        results[share] = model.generate(input_ids, share_encoder_outputs=share, **kw)
        cache = getattr(results[share], "cache", None) or results[share].past_key_values
        assert cache.cross_attention_cache.layers[0].keys.shape[0] == (3 if share else expanded)
        assert cache.self_attention_cache.layers[0].keys.shape[0] == expanded
    assert torch.equal(results[True].sequences, results[False].sequences)
    for shared, copied in zip(results[True].scores, results[False].scores, strict=True):
        torch.testing.assert_close(shared, copied)


def test_decoder_rows_in_groups_per_source_equal_copied_encoder_rows(model):
    """A decoder batch that is a multiple g of the encoder batch (g consecutive rows per source) gives the logits and
    attention maps of the same call with the encoder output and mask copied g times."""
    input_ids, attention_mask, _ = batch()
    group = 4
    encoder_outputs = model.get_encoder()(input_ids, attention_mask=attention_mask)
    copied = type(encoder_outputs)(
        last_hidden_state=encoder_outputs.last_hidden_state.repeat_interleave(group, 0)
    )
    decoder_input_ids = torch.randint(4, 53, (3 * group, 5), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("eager")
    kw = dict(decoder_input_ids=decoder_input_ids, output_attentions=True)
    shared = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask, **kw)
    reference = model(encoder_outputs=copied, attention_mask=attention_mask.repeat_interleave(group, 0), **kw)
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


def test_beam_search_reorders_only_the_self_attention_cache(model):
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

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


def test_static_cache_with_torch_compile_matches_dynamic(model):
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=6, num_beams=1, do_sample=False)
    dynamic = model.generate(input_ids, **kw)
    assert torch.equal(dynamic, model.generate(input_ids, cache_implementation="static", **kw))
    model.forward = torch.compile(model.forward, dynamic=False, fullgraph=True)
    try:
        compiled = model.generate(input_ids, cache_implementation="static", **kw)
    finally:
        del model.forward
    assert torch.equal(dynamic, compiled)


def test_continuing_generation_from_a_returned_cache_equals_one_call(model):
    """transformers' contract: `generate(..., max_new_tokens=3)` then one more token from its returned cache gives
    the tokens, scores and cache of `generate(..., max_new_tokens=4)`."""
    input_ids, attention_mask, _ = batch()
    kw = dict(
        attention_mask=attention_mask,
        num_beams=1,
        do_sample=False,
        suppress_tokens=[2],  # never ends
        return_dict_in_generate=True,
        output_scores=True,
    )
    whole = model.generate(input_ids, max_new_tokens=4, **kw)
    part = model.generate(input_ids, max_new_tokens=3, **kw)
    cache_name = "cache" if hasattr(part, "cache") else "past_key_values"
    rest = model.generate(  # the whole target so far, with its mask (transformers slices off what the cache holds)
        input_ids,
        decoder_input_ids=part.sequences,
        decoder_attention_mask=torch.ones_like(part.sequences),
        max_new_tokens=1,
        **{cache_name: getattr(part, cache_name)},
        **kw,
    )
    assert torch.equal(rest.sequences, whole.sequences)
    torch.testing.assert_close(rest.scores[0], whole.scores[-1])
    for name in ("self_attention_cache", "cross_attention_cache"):
        for ours, theirs in zip(
            getattr(getattr(rest, cache_name), name).layers,
            getattr(getattr(whole, cache_name), name).layers,
            strict=True,
        ):
            torch.testing.assert_close(ours.keys, theirs.keys)


def test_share_encoder_outputs_steps_aside_for_a_static_cache(model):
    """A static cache holds one row per beam: sharing is off there (a warning), and results are unchanged."""
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=6, num_beams=3, cache_implementation="static")
    assert torch.equal(
        model.generate(input_ids, share_encoder_outputs=True, **kw), model.generate(input_ids, **kw)
    )


def test_beam_search_over_separate_vocabularies_is_named_where_transformers_cannot(monkeypatch):
    separate = tiny_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=61)
    input_ids, attention_mask, _ = batch()
    monkeypatch.setattr(generation_vaswani.transformers, "__version__", "5.14.0")
    with pytest.raises(ValueError, match=r"needs transformers >= 5.18.0 \(found 5.14.0\)"):
        separate.generate(input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=3)
    separate.generate(input_ids, attention_mask=attention_mask, max_new_tokens=3)  # greedy works there
    monkeypatch.undo()
    if Version(transformers.__version__) >= Version(generation_vaswani.BEAM_SEARCH_OVER_ANY_VOCABULARY):
        beams = separate.generate(input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=3)
        assert beams.shape[0] == 3
