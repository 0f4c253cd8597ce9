"""The paper's decoding (§6.1) on top of transformers' `generate()`: one statement of each setting, and the length
penalty of Wu et al. (2016) that the paper cites.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [38]. [...] We set the maximum output
length during inference to input length + 50, but terminate early when possible." (§6.1)

transformers' beam search divides a finished hypothesis' log-probability by |Y|^alpha; [38] (Wu et al., 2016, eq. 14)
divides by ((5 + |Y|) / 6)^alpha. No public extension point of `generate()` changes that division, so
`paper_length_penalty` wraps the two beam-search helpers that apply it, for one `generate()` call, on the model
instance. Where the installed transformers lacks those helpers (they are private and may change), it warns and
decoding runs with transformers' own penalty: a working `generate()`, never an `AttributeError`.

The same holds for `share_encoder_outputs`, an opt-in speed-up: the beams of one source read one copy of its
encoder output instead of one copy each.

This file is copied next to `modeling_vaswani.py` into saved model folders, so it imports only torch and
transformers.
"""

import contextlib
import inspect

import torch
import transformers
from packaging.version import Version
from transformers import GenerationMixin
from transformers.utils import logging

logger = logging.get_logger(__name__)

# §6.1
PAPER_NUM_BEAMS = 4
PAPER_LENGTH_PENALTY = 0.6
EXTRA_OUTPUT_TOKENS = 50  # "maximum output length [...] input length + 50"
PAPER_LENGTH_PENALTY_FORM = "gnmt"  # ((5 + |Y|) / 6) ** alpha, the form of [38]
LENGTH_PENALTY_FORMS = (PAPER_LENGTH_PENALTY_FORM, "power")


def paper_decoding(generation_config) -> None:
    """Write the paper's decoding settings into a model's `GenerationConfig` (saved as generation_config.json, where
    transformers keeps a checkpoint's decoding, as Marian's and BART's folders do). The recipe does this for every
    model it trains."""
    generation_config.num_beams = PAPER_NUM_BEAMS
    generation_config.length_penalty = PAPER_LENGTH_PENALTY
    generation_config.length_penalty_form = PAPER_LENGTH_PENALTY_FORM
    # A generation config marked as made from the model config drops the settings transformers does not know
    # (`length_penalty_form`) when it is loaded again; this one holds the model's own settings.
    generation_config._from_model_config = False


def length_penalty_factor(length: int, alpha: float, form: str = PAPER_LENGTH_PENALTY_FORM) -> float:
    """lp(Y), by which beam search divides a hypothesis' summed log-probability so that lengths compare fairly.

    `"gnmt"`: ((5 + |Y|) / 6) ** alpha, Wu et al. (2016) eq. 14, cited by §6.1 (also tensor2tensor's).
    `"power"`: |Y| ** alpha, transformers' and fairseq's `--lenpen`, which favours long hypotheses more.
    |Y| counts the generated tokens, end-of-sentence included.
    """
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "power":
        return float(length) ** alpha
    raise ValueError(f"`length_penalty_form` must be one of {LENGTH_PENALTY_FORMS}, not {form!r}.")


def _accepts(method_name: str, *names: str) -> bool:
    """Whether transformers' `GenerationMixin` has this helper and it takes these keyword arguments."""
    method = getattr(GenerationMixin, method_name, None)
    if method is None:
        return False
    parameters = inspect.signature(method).parameters
    return all(name in parameters for name in names)


def length_penalty_hooks_available() -> bool:
    """Whether this transformers' beam search applies its length penalty in the helpers `paper_length_penalty`
    wraps."""
    return _accepts(
        "_update_finished_beams", "topk_log_probs", "cur_len", "decoder_prompt_len", "length_penalty"
    ) and _accepts(
        "_check_early_stop_heuristic",
        "running_beam_scores",
        "cur_len",
        "max_length",
        "decoder_prompt_len",
        "early_stopping",
        "length_penalty",
    )


# Before 5.18, transformers' beam search sized its beams by `config.vocab_size` (the source vocabulary), not by the
# logits: beam search over a target vocabulary of another size failed inside transformers with a reshape error.
BEAM_SEARCH_OVER_ANY_VOCABULARY = "5.18.0"


def check_beam_search_vocabulary(config, uses_beams: bool) -> None:
    """A clear error where this transformers' beam search cannot handle separate vocabularies of different sizes."""
    if (
        uses_beams
        and config.decoder_vocab_size != config.vocab_size
        and Version(transformers.__version__) < Version(BEAM_SEARCH_OVER_ANY_VOCABULARY)
    ):
        raise ValueError(
            f"Beam search over a target vocabulary ({config.decoder_vocab_size} tokens) of another size than the "
            f"source's ({config.vocab_size}) needs transformers >= {BEAM_SEARCH_OVER_ANY_VOCABULARY} (found "
            f"{transformers.__version__}); upgrade transformers, or decode greedily or by sampling."
        )


def _rescale(scores: torch.Tensor, length: int, alpha: float, form: str) -> torch.Tensor:
    """`scores` such that transformers' division by `length ** alpha` divides them by lp(Y) of `form` instead."""
    if form == "power" or alpha == 0:
        return scores
    return scores * (length**alpha / length_penalty_factor(length, alpha, form))


@contextlib.contextmanager
def _instance_wrappers(model, wrappers: dict):
    """Install `wrappers` (name -> function of the original bound method) on this model instance only."""
    for name, wrap in wrappers.items():
        setattr(model, name, wrap(getattr(model, name)))
    try:
        yield
    finally:
        for name in wrappers:
            delattr(model, name)


def paper_length_penalty(model, form: str, alpha: float, uses_beams: bool):
    """A context for one `generate()` call whose beam search divides by lp(Y) of `form` (see module docstring)."""
    length_penalty_factor(1, 1.0, form)  # a bad form is named before any work
    if not uses_beams or form == "power" or alpha == 0:
        return contextlib.nullcontext()
    if not length_penalty_hooks_available():
        logger.warning_once(
            f"length_penalty_form={form!r} (the paper's length penalty) needs transformers' beam-search helpers "
            "`_update_finished_beams` and `_check_early_stop_heuristic`, which this transformers version does not "
            "have in the expected form: beam search uses transformers' |Y| ** alpha instead."
        )
        return contextlib.nullcontext()

    def update_finished_beams(original):
        def wrapped(*, topk_log_probs, cur_len, decoder_prompt_len, length_penalty, **kwargs):
            length = cur_len + 1 - decoder_prompt_len  # transformers divides by this ** alpha
            return original(
                topk_log_probs=_rescale(topk_log_probs, length, length_penalty, form),
                cur_len=cur_len,
                decoder_prompt_len=decoder_prompt_len,
                length_penalty=length_penalty,
                **kwargs,
            )

        return wrapped

    def check_early_stop_heuristic(original):
        def wrapped(
            *,
            running_beam_scores,
            cur_len,
            max_length,
            decoder_prompt_len,
            early_stopping,
            length_penalty,
            **kwargs,
        ):
            # the length at which transformers bounds the best running hypothesis' final score
            if early_stopping == "never" and length_penalty > 0.0:
                length = max_length - decoder_prompt_len
            else:
                length = cur_len - decoder_prompt_len
            return original(
                running_beam_scores=_rescale(running_beam_scores, length, length_penalty, form),
                cur_len=cur_len,
                max_length=max_length,
                decoder_prompt_len=decoder_prompt_len,
                early_stopping=early_stopping,
                length_penalty=length_penalty,
                **kwargs,
            )

        return wrapped

    return _instance_wrappers(
        model,
        {
            "_update_finished_beams": update_finished_beams,
            "_check_early_stop_heuristic": check_early_stop_heuristic,
        },
    )


def shared_encoder_outputs(model, enabled: bool, static_cache: bool = False):
    """A context for one `generate()` call in which the beams (or samples) of a source share its encoder output.

    transformers repeats the encoder output and its mask once per beam, so each beam computes, caches and reads its
    own copy of the encoder-decoder attention keys and values. Here only the decoder inputs are repeated; the decoder
    takes a batch that is a multiple of the encoder's (`VaswaniDecoder`). Same results. The returned cache then
    holds the encoder-decoder attention keys once per source, not once per returned row as transformers' caches do,
    which is why this is not the default.
    """
    if not enabled:
        return contextlib.nullcontext()
    if static_cache:
        logger.warning_once(
            "share_encoder_outputs=True does not apply with a static cache, which is sized with one row per beam: "
            "the encoder output is copied once per beam."
        )
        return contextlib.nullcontext()
    if not _accepts("_expand_inputs_for_generation", "expand_size", "is_encoder_decoder", "input_ids"):
        logger.warning_once(
            "share_encoder_outputs=True needs transformers' `_expand_inputs_for_generation`, which this version "
            "does not have in the expected form: the encoder output is copied once per beam."
        )
        return contextlib.nullcontext()

    def expand_inputs(original):
        def wrapped(expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
            if expand_size == 1 or not is_encoder_decoder or model_kwargs.get("encoder_outputs") is None:
                return original(
                    expand_size=expand_size,
                    is_encoder_decoder=is_encoder_decoder,
                    input_ids=input_ids,
                    **model_kwargs,
                )
            kept = {
                key: model_kwargs.pop(key)
                for key in ("encoder_outputs", "attention_mask")
                if key in model_kwargs
            }
            input_ids, model_kwargs = original(
                expand_size=expand_size, is_encoder_decoder=False, input_ids=input_ids, **model_kwargs
            )
            model_kwargs.update(kept)
            return input_ids, model_kwargs

        return wrapped

    return _instance_wrappers(model, {"_expand_inputs_for_generation": expand_inputs})


__all__ = [
    "EXTRA_OUTPUT_TOKENS",
    "LENGTH_PENALTY_FORMS",
    "PAPER_LENGTH_PENALTY",
    "PAPER_LENGTH_PENALTY_FORM",
    "PAPER_NUM_BEAMS",
    "length_penalty_factor",
    "paper_decoding",
    "paper_length_penalty",
    "shared_encoder_outputs",
]
