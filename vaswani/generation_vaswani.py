"""The paper's decoding (§6.1) as the model's own `generate`: beam search whose length penalty is the one the paper cites.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [38]. [...] We set the maximum output
length during inference to input length + 50, but terminate early when possible." (§6.1)

transformers' beam search divides a finished hypothesis' log-probability by |Y|^alpha; [38] (Wu et al., 2016, eq. 14)
divides by ((5 + |Y|) / 6)^alpha. `generate` below decodes a model with the form its generation config names
(`length_penalty_form`, "gnmt" unless it says "power"), through transformers' public seams only:

- it hands every call to `GenerationMixin.generate`, which prepares the inputs, the encoder output, the cache, the
  logits processors and the stopping criteria as for any model;
- for beam search it passes `custom_generate=beam_search`, transformers' documented hook for a decoding loop of
  one's own: `beam_search` runs the beams on the model's public forward and the cache's public `reorder_cache`,
  exactly as transformers' beam search does except for lp(Y) (with `length_penalty_form="power"` it gives
  transformers' beams and scores), over a target vocabulary of any size on every supported release, each process
  on its own (transformers hands a `custom_generate` loop no `synced_gpus`);
- when neither the call nor the generation config sets a maximum length, the maximum is the paper's: the longest
  source of the batch + 50 new tokens (transformers' default would cut every sentence at 20 tokens).

Saved model folders carry this file twice: beside `modeling_vaswani.py`, whose `generate` calls it, and as
`custom_generate/generate.py`, which `from_pretrained(folder, trust_remote_code=True)` installs as the model's
`generate` (`GenerationMixin.load_custom_generate`). So it imports only torch and transformers, and
`vaswani.interop.engines` (the CTranslate2 and ONNX Runtime exports) takes its length penalty from `length_penalty_factor`
here: one statement of the penalty.
"""

import copy
import math
import numbers

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.generation import GenerateBeamEncoderDecoderOutput, GenerationMode

# §6.1, written into a model's GenerationConfig by `paper_decoding`.
PAPER_NUM_BEAMS = 4
PAPER_LENGTH_PENALTY = 0.6
PAPER_LENGTH_PENALTY_FORM = "gnmt"  # ((5 + |Y|) / 6) ** alpha, the form of [38]
PAPER_DECODING = {
    "num_beams": PAPER_NUM_BEAMS,
    "length_penalty": PAPER_LENGTH_PENALTY,
    "length_penalty_form": PAPER_LENGTH_PENALTY_FORM,
}
EXTRA_OUTPUT_TOKENS = 50  # "maximum output length [...] input length + 50"
LENGTH_PENALTY_FORMS = (PAPER_LENGTH_PENALTY_FORM, "power")

# transformers 5.24 renamed the cache argument and output field `past_key_values` -> `cache`; the model speaks the
# installed version's name in its outputs and accepts both names as input (`utils_vaswani.cache_argument`).
CACHE_NAME = (
    "cache" if "cache" in GenerateBeamEncoderDecoderOutput.__dataclass_fields__ else "past_key_values"
)


def paper_decoding(generation_config):
    """Write §6.1's decoding (`PAPER_DECODING`) into a model's `GenerationConfig`, saved as generation_config.json,
    where transformers keeps a checkpoint's decoding (as Marian's and BART's folders do)."""
    generation_config.update(**PAPER_DECODING, allow_custom_entries=True)
    # A generation config marked as made from the model config drops the settings transformers does not know
    # (`length_penalty_form`) when it is loaded again; this one holds the model's own settings.
    generation_config._from_model_config = False


def length_penalty_factor(length, alpha, form=PAPER_LENGTH_PENALTY_FORM):
    """lp(Y), by which beam search divides a hypothesis' summed log-probability so that lengths compare fairly.

    `"gnmt"`: ((5 + |Y|) / 6) ** alpha, Wu et al. (2016) eq. 14, cited by §6.1 (also tensor2tensor's).
    `"power"`: |Y| ** alpha, transformers' and fairseq's `--lenpen`, which favours long hypotheses more.
    |Y| counts the generated tokens, end-of-sentence included; an int or a tensor of lengths.
    """
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "power":
        return (length * 1.0) ** alpha
    raise ValueError(f"`length_penalty_form` must be one of {LENGTH_PENALTY_FORMS}, not {form!r}.")


def generate(*args, model, **kwargs):
    """`model.generate(...)` with the paper's decoding rules (see the module docstring); every argument of
    transformers' `generate` works as there. One more: `length_penalty_form` ("gnmt" or "power"; default: the
    generation config's, else "gnmt")."""
    source = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    check_token_ids(source, model.config.vocab_size, "input_ids")
    check_token_ids(kwargs.get("decoder_input_ids"), model.config.decoder_vocab_size, "decoder_input_ids")
    if kwargs.get("custom_generate") is not None:  # the caller's own decoding
        return GenerationMixin.generate(model, *args, **kwargs)
    drop_trainer_defaults(model.generation_config)
    config = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
    config.update(**kwargs)  # sets only the generation settings among them
    form = (
        kwargs.pop("length_penalty_form", None)
        or getattr(config, "length_penalty_form", None)
        or PAPER_LENGTH_PENALTY_FORM
    )
    length_penalty_factor(1, 1.0, form)  # a bad form is named before any work
    _check_settings(config)
    if config.max_length is None and config.max_new_tokens is None:  # the call's settings are in `config`
        kwargs["max_new_tokens"] = _source_length(source, kwargs) + EXTRA_OUTPUT_TOKENS
    if config.get_generation_mode(kwargs.get("assistant_model")) == GenerationMode.BEAM_SEARCH:
        kwargs.update(custom_generate=beam_search, length_penalty_form=form)
    return GenerationMixin.generate(model, *args, **kwargs)


def check_token_ids(ids, vocab_size, name):
    """A clear error for token ids outside the vocabulary where data enters `generate` (and the tools, which call it),
    instead of an index error inside torch. It reads the smallest and largest id (a host-device sync, once per call);
    the model's forward reads no token value."""
    if not torch.is_tensor(ids) or ids.numel() == 0 or ids.is_floating_point():
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`{name}` holds token ids outside the vocabulary [0, {vocab_size}): min {low}, max {high}. "
            "Check that the tokenizer matches the model (`-100` belongs in `labels` only)."
        )


def _check_settings(config):
    """Name a decoding setting that cannot work before any work. transformers checks the lengths itself; a beam count
    below 1 failed deep in the decoding (`ZeroDivisionError`, "upper bound and lower bound inconsistent with step
    sign"), a number of returned sequences below 1 returned another number of rows, and a length penalty that is
    not a number failed inside `math`."""
    for name in ("num_beams", "num_return_sequences"):
        value = getattr(config, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        ):
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    alpha = config.length_penalty
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha)
    ):
        raise ValueError(f"`length_penalty` must be a finite number, got {alpha!r}.")


def drop_trainer_defaults(generation_config):
    """Take back the `max_length` of 20 that transformers' `Seq2SeqTrainer.prediction_step` writes into a model's
    generation config: after its first generated batch it fills every unset setting with transformers' defaults
    (`update(**GenerationConfig._get_default_generation_params(), defaults_only=True)`), so that each later
    `generate(max_new_tokens=...)` warned that `max_length` (=20) was set too, one without a length stopped at 20
    tokens instead of the paper's input length + 50, and `save_pretrained` saved it. A config holding every one of
    those defaults got them from there: its `max_length` of 20 is dropped, the rest are the defaults anyway. Called
    by the model's `generate` and `save_pretrained`."""
    if generation_config is None:
        return
    defaults = type(generation_config)._get_default_generation_params()
    if generation_config.max_length == defaults["max_length"] and all(
        getattr(generation_config, key, None) is not None
        for key, value in defaults.items()
        if value is not None
    ):
        generation_config.max_length = None


def _source_length(source, kwargs):
    """Tokens in the longest source of the batch (padding excluded), for the paper's `input length + 50`."""
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return int(mask.sum(dim=-1).max()) if mask.numel() else 0
    if source is None:
        source = kwargs.get("inputs_embeds")
    if source is None and kwargs.get("encoder_outputs") is not None:
        source = kwargs["encoder_outputs"][0]
    return int(source.shape[1]) if source is not None and source.dim() >= 2 else 0


# --------------------------------------------------------------------------------------------------------------------
# Beam search with the length penalty of `length_penalty_form`: one loop for transformers' `custom_generate` and for
# `vaswani.interop.engines` (ONNX Runtime)
# --------------------------------------------------------------------------------------------------------------------
class BeamSearch:
    """The hypotheses of beam search over `num_beams` beams per source, as transformers keeps them: the top
    `keep` (2 x num_beams) continuations per step, the best num_beams of those that did not stop go on, and those that
    stopped among the first num_beams join a sorted set of num_beams finished hypotheses, scored by their summed
    log-probability divided by `length_penalty_factor(|Y|, alpha, form)`; transformers' early-stopping rules.

    `input_ids` (batch x num_beams, prompt) are the decoder's start. A decoding loop calls `step` with each step's
    log-probabilities and its stopping rule (the candidates' sequences -> which of them stop); `step` returns the row
    each beam that goes on extends (to reorder a cache), `done` whether every source is finished, `best` the result.
    Used by `beam_search` (transformers' `custom_generate`) and by `vaswani.interop.engines` (ONNX Runtime).
    """

    def __init__(self, input_ids, config, form):
        """`config`: a generation config's num_beams, max_length, eos_token_id, pad_token_id, length_penalty and
        early_stopping (True, False (None) or "never", read as transformers does)."""
        rows, self.cur_len = input_ids.shape
        k, max_length, device = config.num_beams, config.max_length, input_ids.device
        batch = rows // k
        self.max_length, self.prompt_len = max_length, self.cur_len
        self.alpha = 1.0 if config.length_penalty is None else config.length_penalty
        self.form, self.early_stopping = form, config.early_stopping
        # The end-of-sentence ids, and the id that fills the positions after a hypothesis ends, as transformers' beam
        # search chooses it: the pad id unless it is 0 or missing, else the first end-of-sentence id.
        eos = [] if config.eos_token_id is None else torch.as_tensor(config.eos_token_id).view(-1).tolist()
        fill = int(config.pad_token_id or eos[0]) if eos else -1
        self.keep = max(2, 1 + len(eos)) * k  # continuations kept per step
        # A hypothesis is a row of its `max_length` tokens, then, per generated position, the row of the batch
        # (source x num_beams + beam) it came from (-1 before it is generated).
        self.running = torch.full(
            (batch, k, 2 * max_length - self.cur_len), -1, dtype=torch.long, device=device
        )
        self.running[:, :, :max_length] = fill
        self.running[:, :, : self.cur_len] = input_ids.view(batch, k, self.cur_len)
        self.finished = self.running.clone()
        self.running_scores = torch.zeros(batch, k, device=device)
        self.finished_scores = torch.full_like(self.running_scores, -1e9)
        self.running_scores[:, 1:] = -1e9  # only the first beam's continuations count at the first step
        self.is_finished = torch.zeros_like(self.running_scores, dtype=torch.bool)
        self.can_improve = torch.ones_like(self.is_finished[:, :1])

    def sequences(self):  # (batch x num_beams, cur_len)
        return self.running[:, :, : self.cur_len].flatten(0, 1)

    def step(self, log_probs, stop):
        """Take a step. The best `keep` continuations of all the beams of each source, by log-probability + beam
        score over the num_beams x vocabulary continuations, are among the best `keep` of each beam (a beam adds one
        score to all its continuations), so those are found first, each beam's row on its own. `stop` tells which of
        them stop (their sequences, (batch x keep, cur_len + 1) -> bool); the best num_beams that did not stop go on,
        those that stopped among the first num_beams join the finished hypotheses. Returns the row
        (batch x num_beams) each running beam extends."""
        (batch, k), generated = self.running_scores.shape, self.cur_len + 1 - self.prompt_len
        per_beam = min(self.keep, log_probs.shape[-1])
        beam_best, beam_tokens = torch.topk(log_probs, per_beam)  # (batch x num_beams, per_beam)
        totals = (beam_best.view(batch, k, per_beam) + self.running_scores[:, :, None]).view(batch, -1)
        top_scores, picked = torch.topk(totals, self.keep)
        from_beam = picked // per_beam
        candidates = _take(self.running, from_beam)
        candidates[:, :, self.cur_len] = beam_tokens.view(batch, -1).gather(1, picked)
        origin = self.max_length + generated - 1  # where the candidates' origins go
        candidates[:, :, origin] = from_beam + torch.arange(batch, device=from_beam.device)[:, None] * k
        self.stops = stops = stop(candidates[:, :, : self.cur_len + 1].flatten(0, 1)).view(batch, -1)
        live_scores = top_scores + stops.float() * -1e9
        chosen = torch.topk(live_scores, k).indices
        self.running = _take(candidates, chosen)
        self.running_scores = live_scores.gather(1, chosen)
        penalised = top_scores / length_penalty_factor(generated, self.alpha, self.form)
        full = self.is_finished.all(dim=-1, keepdim=True) & (self.early_stopping is True)
        just_finished = stops & (torch.arange(self.keep, device=stops.device) < k)
        for excluded in (full, ~self.can_improve, ~just_finished):  # added one by one, as transformers does
            penalised = penalised + excluded.float() * -1e9
        merged_scores = torch.cat([self.finished_scores, penalised], dim=1)
        best = torch.topk(merged_scores, k).indices
        self.finished = _take(torch.cat([self.finished, candidates], dim=1), best)
        self.finished_scores = merged_scores.gather(1, best)
        self.is_finished = torch.cat([self.is_finished, just_finished], dim=1).gather(1, best)
        self.cur_len += 1
        self.can_improve &= self.may_improve()
        return self.running[:, :, origin].flatten()

    def may_improve(self):
        """Per source, whether its best running beam may still beat its worst finished hypothesis, as transformers
        bounds it: at the current length, or at the maximum length with early_stopping="never" and alpha > 0."""
        never = self.early_stopping == "never" and self.alpha > 0.0
        length = (self.max_length if never else self.cur_len) - self.prompt_len
        best_running = self.running_scores[:, :1] / length_penalty_factor(length, self.alpha, self.form)
        worst_finished = torch.where(
            self.is_finished, self.finished_scores.min(dim=1, keepdim=True).values, -1.0e9
        )
        return (best_running > worst_finished).any(dim=-1, keepdim=True)

    def done(self):
        """Whether no source can change any more (a host-device sync: once per step)."""
        full = self.is_finished.all() & (self.early_stopping is True)
        return not bool(self.can_improve.any() & ~full & ~self.stops.all())

    def best(self, count):
        """The best `count` finished hypotheses per source, cut to the longest: sequences, scores, origins."""
        hypotheses = self.finished[:, :count].flatten(0, 1)
        origins = hypotheses[:, self.max_length :]
        generated = int((origins + 1).bool().sum(dim=1).max())  # the origin of an ungenerated position is -1
        return (
            hypotheses[:, : self.prompt_len + generated],
            self.finished_scores[:, :count].flatten(),
            origins[:, :generated].int(),
        )


def beam_search(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    length_penalty_form=PAPER_LENGTH_PENALTY_FORM,
    **model_kwargs,
):
    """Beam search (`BeamSearch`) on the model's public forward and the cache's public `reorder_cache`, as
    transformers runs it, with finished hypotheses scored by `length_penalty_factor(|Y|, alpha, length_penalty_form)`.
    Called by `GenerationMixin.generate(..., custom_generate=beam_search)` once it has prepared everything: `input_ids`
    (batch x num_beams, prompt) the decoder's start, `model_kwargs` the encoder output, masks and cache per beam
    (`generate` hands a `custom_generate` function no `synced_gpus`: each process decodes on its own)."""
    beams = BeamSearch(input_ids, generation_config, length_penalty_form)
    config = generation_config
    asked = config.return_dict_in_generate
    collect = {name: () for name, flag in _COLLECTED.items() if asked and getattr(config, flag)}
    use_cache = model_kwargs.pop("use_cache", True)
    # not for the forward calls of decoding (`labels` come with Seq2SeqTrainer's inputs)
    for key in ("output_attentions", "output_hidden_states", "return_dict", "labels"):
        model_kwargs.pop(key, None)
    cache = model_kwargs.get(CACHE_NAME)
    past_length = cache.get_seq_length() if cache is not None else 0
    while True:
        sequences = beams.sequences()
        outputs = model(
            decoder_input_ids=sequences[:, past_length:] if use_cache else sequences,
            use_cache=use_cache,
            output_attentions=bool(config.output_attentions),
            output_hidden_states=bool(config.output_hidden_states),
            return_dict=True,
            **model_kwargs,
        )
        if use_cache:
            model_kwargs[CACHE_NAME], past_length = getattr(outputs, CACHE_NAME), beams.cur_len
        mask = model_kwargs.get("decoder_attention_mask")
        if mask is not None:  # one more target position
            model_kwargs["decoder_attention_mask"] = torch.cat(
                [mask, mask.new_ones(mask.shape[0], 1)], dim=-1
            )
        # float32 logits as they are (log_softmax writes a new tensor; the collected logits are a copy), others
        # converted
        logits = outputs.logits[:, -1, :].float()
        log_probs = logits_processor(sequences, nn.functional.log_softmax(logits, dim=-1))
        step = {**outputs, "scores": log_probs, "logits": logits.clone() if "logits" in collect else None}
        collect = {name: (*so_far, step[name]) for name, so_far in collect.items()}
        del outputs, logits, step
        scores = collect.get("scores")
        beam_idx = beams.step(
            log_probs, lambda candidates, scores=scores: stopping_criteria(candidates, scores)
        )
        if use_cache:
            # Each beam's decoder self-attention keys and values follow it. The encoder-decoder attention's stay:
            # a beam moves within its own source, whose beams all hold the same ones.
            model_kwargs[CACHE_NAME].self_attention_cache.reorder_cache(beam_idx)
        if beams.done():
            return _beam_search_output(beams, config, collect, model_kwargs)


def _take(tensor, index):
    """The rows `index` (batch, n) picks from each source's rows of `tensor` (batch, rows, length): (batch, n, length)."""
    return tensor.gather(1, index[:, :, None].expand(-1, -1, tensor.shape[2]))


# What `return_dict_in_generate` has a decoding loop collect at each step: output field -> the generation config's flag
# asking for it.
_COLLECTED = {
    "scores": "output_scores",
    "logits": "output_logits",
    "decoder_attentions": "output_attentions",
    "cross_attentions": "output_attentions",
    "decoder_hidden_states": "output_hidden_states",
}


def _beam_search_output(beams, generation_config, collect, model_kwargs):
    """The best `num_return_sequences` hypotheses per source, cut to the longest one, as transformers returns them."""
    sequences, scores, origins = beams.best(generation_config.num_return_sequences or 1)
    if not generation_config.return_dict_in_generate:
        return sequences
    encoder_outputs = model_kwargs["encoder_outputs"]
    return GenerateBeamEncoderDecoderOutput(
        sequences=sequences,
        sequences_scores=scores if generation_config.output_scores else None,
        beam_indices=origins,
        encoder_attentions=encoder_outputs.get("attentions"),
        encoder_hidden_states=encoder_outputs.get("hidden_states"),
        **collect,
        **{CACHE_NAME: model_kwargs.get(CACHE_NAME)},
    )
