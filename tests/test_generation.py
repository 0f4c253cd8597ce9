"""`generate()`: the paper's decoding (§6.1) and its length penalty through transformers' public `custom_generate`
seam, caches, beams and samples."""

import itertools
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import batch, tiny_model
from transformers import GenerationConfig, GenerationMixin

import vaswani
from vaswani import generation_vaswani
from vaswani.generation_vaswani import (
    EXTRA_OUTPUT_TOKENS,
    LENGTH_PENALTY_FORMS,
    PAPER_LENGTH_PENALTY,
    PAPER_NUM_BEAMS,
    beam_search,
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


def test_the_length_penalty_form_can_come_from_the_generation_config(model):
    model.generation_config.length_penalty_form = "power"
    scores, summed, lengths = _beam_scores(model)
    torch.testing.assert_close(scores, summed / torch.tensor([int(n) ** 0.6 for n in lengths]))


def test_the_early_stop_bound_uses_the_length_penalty_form():
    """transformers stops extending a sentence's beams once its best running hypothesis, length-penalised, cannot
    beat the worst finished one. Here the best running log-probability is -2.0 after 9 generated tokens and the worst
    finished score is -0.55: dividing by 9 ** 0.6 = 3.74 gives -0.53 (keep searching), by (14 / 6) ** 0.6 = 1.66
    gives -1.20 (stop)."""
    decisions = {}
    for form in ("power", "gnmt"):
        search = dict(
            num_beams=2, max_length=30, eos_token_id=2, pad_token_id=0, length_penalty=0.6, early_stopping=False
        )
        beams = generation_vaswani.BeamSearch(torch.ones(2, 1, dtype=torch.long), SimpleNamespace(**search), form)
        beams.running_scores = torch.tensor([[-2.0, -3.0]])
        beams.finished_scores = torch.tensor([[-0.5, -0.55]])
        beams.is_finished = torch.tensor([[True, True]])
        beams.cur_len = 10
        decisions[form] = bool(beams.may_improve())
    assert decisions == {"power": True, "gnmt": False}


def reference_beam_search(model, input_ids, attention_mask, k, alpha, max_new_tokens, eos, form="gnmt"):
    """Beam search written plainly, one source at a time, the decoder rerun over the whole prefix at every step (no
    cache): at each step the best continuations of the live beams (2k, or (1 + the number of end ids) x k); those among
    the first k that end with an id of `eos` or reach the length limit join the finished hypotheses, scored
    sum(log p) / lp(|Y|) (the best k kept); the best k others live on. A source stops when it holds k finished hypotheses that its best live beam cannot beat even at
    the length limit (early_stopping="never"). Returns (sequences, scores) best first per source."""
    start = model.config.decoder_start_token_id
    lp = lambda n: length_penalty_factor(n, alpha, form)  # noqa: E731
    results = []
    for row in range(input_ids.shape[0]):
        length = int(attention_mask[row].sum())
        source = input_ids[row : row + 1, :length]
        live, finished = [([start], 0.0)], []
        for step in range(max_new_tokens):
            candidates = []
            for tokens, score in live:
                logits = model(input_ids=source, decoder_input_ids=torch.tensor([tokens])).logits[0, -1]
                log_probs = torch.log_softmax(logits.float(), dim=-1).tolist()
                candidates += [(tokens + [t], score + lp_t) for t, lp_t in enumerate(log_probs)]
            candidates = sorted(candidates, key=lambda c: -c[1])[: max(2, 1 + len(eos)) * k]
            live = []
            for rank, (tokens, score) in enumerate(candidates):
                if tokens[-1] in eos or step == max_new_tokens - 1:
                    if rank < k:
                        finished.append((tokens, score / lp(len(tokens) - 1)))
                elif len(live) < k:
                    live.append((tokens, score))
            finished = sorted(finished, key=lambda f: -f[1])[:k]
            if not live or (len(finished) == k and live[0][1] / lp(max_new_tokens) <= finished[-1][1]):
                break
        results.append(finished)
    return results


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_gnmt_beam_search_equals_a_plain_reference_implementation(model, alpha):
    """The beams and scores of `generate()` in the paper's form equal those of `reference_beam_search`."""
    input_ids, attention_mask, _ = batch()
    k, max_new, eos = 3, 9, list(range(2, 12))  # a random model then ends hypotheses at many lengths
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        num_beams=k,
        num_return_sequences=k,
        length_penalty=alpha,
        early_stopping="never",
        max_new_tokens=max_new,
        eos_token_id=eos,
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        expected = reference_beam_search(model, input_ids, attention_mask, k, alpha, max_new, eos=set(eos))
    lengths = set()
    for row, hypotheses in enumerate(expected):
        for j, (tokens, score) in enumerate(hypotheses):
            got = out.sequences[row * k + j].tolist()
            assert got[: len(tokens)] == tokens and set(got[len(tokens) :]) <= {0, *eos}  # then filled
            assert out.sequences_scores[row * k + j].item() == pytest.approx(score, abs=1e-5)
            lengths.add(len(tokens))
    assert len(lengths) > 2  # hypotheses of several lengths were compared


def test_our_beam_loop_in_transformers_form_gives_transformers_beams_and_outputs(model):
    """`beam_search` run with |Y| ** alpha (`length_penalty_form="power"`) returns what transformers' own beam search
    returns: sequences, scores, per-step scores and beam indices, for every early-stopping rule, with and without the
    cache, for several beams and returned sequences."""
    input_ids, attention_mask, _ = batch()
    for beams, returned, stopping, alpha, cache in itertools.product(
        [2, 4], [1, 2], [False, True, "never"], [0.6, -0.5], [True, False]
    ):
        kw = dict(
            attention_mask=attention_mask,
            num_beams=beams,
            num_return_sequences=returned,
            early_stopping=stopping,
            length_penalty=alpha,
            max_new_tokens=9,
            eos_token_id=list(range(2, 12)),  # hypotheses end at many lengths
            use_cache=cache,
            output_scores=True,
            return_dict_in_generate=True,
        )
        assert_our_beams_are_transformers(model, input_ids, **kw)


def assert_our_beams_are_transformers(model, input_ids, **kw):
    """`beam_search` in transformers' length-penalty form returns transformers' own beam search outputs."""
    theirs = GenerationMixin.generate(model, input_ids, **kw)
    ours = GenerationMixin.generate(
        model, input_ids, custom_generate=beam_search, length_penalty_form="power", **kw
    )
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.beam_indices, theirs.beam_indices)
    torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores)
    assert len(ours.scores) == len(theirs.scores)
    for a, b in zip(ours.scores, theirs.scores, strict=True):
        torch.testing.assert_close(a, b)


def test_our_beam_loop_gives_transformers_beams_over_fewer_tokens_than_it_keeps_per_beam():
    """`beam_search` takes each beam's best continuations before the best of all the beams; where the vocabulary
    (6 tokens) is smaller than the continuations kept per step (2 x 4 beams), a beam offers all its tokens, and the
    beams are still transformers' own."""
    model = tiny_model(vocab_size=6)
    input_ids, attention_mask, _ = batch(vocab_size=6)
    assert_our_beams_are_transformers(
        model,
        input_ids,
        attention_mask=attention_mask,
        num_beams=4,
        max_new_tokens=5,
        eos_token_id=2,
        output_scores=True,
        return_dict_in_generate=True,
    )


def test_no_private_generation_mixin_name_appears_in_the_package():
    """The paper's decoding runs on transformers' public API: `GenerationMixin.generate` and its `custom_generate`
    hook, the model's forward and the cache's `reorder_cache`; no private `GenerationMixin` method is wrapped,
    overridden or called (they change between the releases a saved folder runs on)."""
    private = {name for name in dir(GenerationMixin) if name.startswith("_") and not name.startswith("__")}
    assert "_update_finished_beams" in private or "_beam_search" in private  # the check looks at real names
    found = []
    for path in Path(vaswani.__file__).parent.rglob("*.py"):
        for name in private:
            if re.search(rf"\b{re.escape(name)}\b", path.read_text(encoding="utf-8")):
                found.append(f"{path.name}: {name}")
    assert found == []


def test_a_folder_decodes_with_its_custom_generate_file(model, tmp_path):
    """Every saved folder carries the paper's decoding as `custom_generate/generate.py`, the same code as the
    model's `generate`; `generate(custom_generate=folder, trust_remote_code=True)` runs it."""
    paper_decoding(model.generation_config)
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "custom_generate" / "generate.py").read_text(encoding="utf-8")
    assert saved == Path(generation_vaswani.__file__).read_text(encoding="utf-8")
    input_ids, attention_mask, _ = batch()
    kw = dict(
        attention_mask=attention_mask, max_new_tokens=7, output_scores=True, return_dict_in_generate=True
    )
    ours = model.generate(input_ids, **kw)
    through_the_folder = GenerationMixin.generate(
        model, input_ids, custom_generate=str(tmp_path), trust_remote_code=True, **kw
    )
    assert torch.equal(ours.sequences, through_the_folder.sequences)
    torch.testing.assert_close(ours.sequences_scores, through_the_folder.sequences_scores)


def test_without_a_length_generate_stops_at_the_source_length_plus_50(model):
    """§6.1's maximum output length, input length + 50, where neither the call nor the generation config sets one
    (transformers' default would cut every translation at 20 tokens): the longest source of the batch counts, its
    padding not."""
    input_ids, attention_mask, _ = batch()  # sources of 7, 6 and 5 tokens, padded to 7
    padded = torch.cat([input_ids, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([attention_mask, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    for num_beams in (1, 3):
        out = model.generate(padded, attention_mask=mask, num_beams=num_beams, suppress_tokens=[2])
        assert out.shape[1] == 1 + 7 + EXTRA_OUTPUT_TOKENS
    assert model.generate(padded, attention_mask=mask, max_new_tokens=4, suppress_tokens=[2]).shape[1] == 5
    model.generation_config.max_length = 9
    assert model.generate(padded, attention_mask=mask, suppress_tokens=[2]).shape[1] == 9


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), "0.6"])
def test_a_length_penalty_that_is_not_finite_is_refused_by_name(model, alpha):
    input_ids, attention_mask, _ = batch()
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number"):
        model.generate(input_ids, attention_mask=attention_mask, num_beams=2, length_penalty=alpha)


@pytest.mark.parametrize(
    "setting",
    [
        {"num_beams": 0},
        {"num_beams": -2},
        {"num_beams": -2, "length_penalty_form": "power"},
        {"num_beams": 2.5},
        {"num_return_sequences": 0, "num_beams": 4},
        {"num_return_sequences": -1, "num_beams": 4},
        {"num_return_sequences": -1, "num_beams": 4, "length_penalty_form": "power"},
    ],
)
def test_a_beam_count_or_number_of_sequences_below_one_is_refused_by_name(model, setting):
    """num_beams=0 ended in ZeroDivisionError, a negative one in "upper bound and lower bound inconsistent with step
    sign"; num_return_sequences=-1 returned 3 sequences per source instead of an error."""
    input_ids, attention_mask, _ = batch()
    name = "num_return_sequences" if "num_return_sequences" in setting else "num_beams"
    with pytest.raises(ValueError, match=rf"`{name}` must be a positive integer, got {setting[name]!r}"):
        model.generate(input_ids, attention_mask=attention_mask, **setting)


def test_evaluating_with_seq2seq_trainer_leaves_no_max_length_of_20_behind(model, tmp_path):
    """transformers' Seq2SeqTrainer writes its default `max_length` of 20 into the model's generation config after
    the first generated batch: each later batch of `evaluate(max_new_tokens=40)` warned "Both `max_new_tokens` (=40)
    and `max_length`(=20) seem to have been set", and `generate()` without a length stopped at 20 tokens."""
    import json

    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    input_ids, attention_mask, labels = batch()
    data = [
        {"input_ids": i, "attention_mask": m, "labels": y}
        for i, m, y in zip(input_ids, attention_mask, labels, strict=True)
    ]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        predict_with_generate=True,
        per_device_eval_batch_size=1,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model, args=args, eval_dataset=data[:2], compute_metrics=lambda p: {"n": 1.0}
    )
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("transformers").addHandler(handler)
    try:
        trainer.evaluate(max_new_tokens=25, num_beams=2)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    logged = "\n".join(record.getMessage() for record in records)
    assert "seem to have been set" not in logged, logged
    # a random model never ends a sentence: it runs to the paper's input length + 50, not to 20 tokens
    out = model.generate(input_ids, attention_mask=attention_mask, suppress_tokens=[2])
    assert out.shape[1] == 1 + 7 + EXTRA_OUTPUT_TOKENS
    model.save_pretrained(tmp_path / "saved")
    assert "max_length" not in json.loads((tmp_path / "saved" / "generation_config.json").read_text())


def test_an_unknown_length_penalty_form_is_named_before_any_work(model):
    input_ids, attention_mask, _ = batch()
    with pytest.raises(ValueError, match="length_penalty_form.*'average'"):
        model.generate(input_ids, attention_mask=attention_mask, num_beams=2, length_penalty_form="average")


def test_beam_search_reorders_only_the_self_attention_cache(model, monkeypatch):
    """The beams of a source hold the same encoder-decoder attention keys and values: reordering them at every step
    (as `EncoderDecoderCache.reorder_cache` does) would copy equal values."""
    from transformers.cache_utils import DynamicCache

    reordered = []
    original = DynamicCache.reorder_cache

    def record(cache, beam_idx):
        reordered.append(cache)
        return original(cache, beam_idx)

    monkeypatch.setattr(DynamicCache, "reorder_cache", record)
    input_ids, attention_mask, _ = batch()
    out = model.generate(
        input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=5, return_dict_in_generate=True
    )
    cache = getattr(out, "cache", None) or out.past_key_values
    assert reordered and all(c is cache.self_attention_cache for c in reordered)


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


def test_beam_search_over_separate_vocabularies_works_on_every_release_in_either_form():
    """transformers' own beam search before 5.18 sized its beams by the source vocabulary; the model's own loop
    (`beam_search`, sized by the logits) runs beam search in either length-penalty form on every release."""
    separate = tiny_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=61)
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, num_beams=2, max_new_tokens=3, output_scores=True)
    for form in LENGTH_PENALTY_FORMS:
        out = separate.generate(input_ids, length_penalty_form=form, return_dict_in_generate=True, **kw)
        assert out.sequences.shape[0] == 3 and out.scores[0].shape == (6, 61)
