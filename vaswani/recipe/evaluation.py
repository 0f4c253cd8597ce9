"""Evaluation that stays bounded on a large validation set (WMT's newstest2013: 3000 pairs).

- `sort_by_source_length`: the validation split decoded longest source first, so that each `generate()` batch holds
  sources of similar length (little padding, and a batch stops as soon as its similar outputs end); the raw split,
  whose target column is the BLEU references, is reordered the same way, so predictions and references stay aligned.
- `EvaluationClock`: before each evaluation (during and after training), a log line saying what is decoded (pairs,
  greedy or beam, batch size, output limit) and how long it should take, from the previous evaluation's measured
  rate; after it, how long it took.
- `log_after_training`: what runs once training ends (a final evaluation, the averaging, the choices on validation, the
  test translation), logged by `vaswani-train` before training with the most time each part may take (the decoder
  steps of outputs that all run to their length limit, as an untrained model's do, each step timed on the model:
  `seconds_to_decode`) and, with `--max_train_minutes`, timed again after each evaluation from the measured rate, so
  that nobody is surprised by the time a run takes after its budget.
"""

import contextlib
import logging
import math
import time
from functools import partial

import torch

from ..generation_vaswani import EXTRA_OUTPUT_TOKENS

logger = logging.getLogger(__name__)

# Decoder steps timed before training, for the bound on the work after it (`seconds_to_decode`).
PROBE_STEPS = 16

# Beam search of 4 decodes about a third as many tokens per second as greedy decoding (BENCHMARKS.md: 335 / 851 on the
# CPU, 3892 / 12193 on the H200, base preset): the factor that turns a measured greedy rate into a beam-4 estimate.
BEAM_SLOWDOWN = 3.0


def sort_by_source_length(tokenized, raw):
    """`tokenized` (with `input_ids`) and `raw` (its text, row for row) reordered longest source first, ties in their
    original order. Corpus BLEU does not depend on the order of the segments, only on their pairing, which stays."""
    lengths = [len(ids) for ids in tokenized["input_ids"]]
    if len(lengths) != len(raw):
        raise ValueError(
            f"{len(lengths)} tokenized validation pairs but {len(raw)} raw ones: they must align"
        )
    order = sorted(
        range(len(lengths)), key=lengths.__getitem__, reverse=True
    )  # stable: ties keep their order
    return tokenized.select(order), raw.select(order)


def describe_seconds(seconds):
    """3.2 s, 41 s, 6.5 min, 2.1 h."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def describe_decoding(pairs, num_beams, batch_size, processes=1, max_new_tokens=None):
    """'3000 pairs, greedy, 64 a batch (47 batches), at most source length + 50 new tokens'."""
    decoding = "greedy" if num_beams == 1 else f"beam {num_beams}"
    batches = math.ceil(pairs / (batch_size * processes))
    per = f"{batch_size} a batch" + (f" on each of {processes} processes" if processes > 1 else "")
    per += f" ({batches} {'batch' if batches == 1 else 'batches'}{' each' if processes > 1 else ''})"
    limit = max_new_tokens or f"source length + {EXTRA_OUTPUT_TOKENS}"
    return f"{pairs} pairs, {decoding}, {per}, at most {limit} new tokens"


def seconds_to_decode(
    model,
    source_ids,
    num_beams,
    batch_size,
    processes=1,
    max_new_tokens=None,
    bf16_autocast=False,
):
    """About the most seconds `model` should take to decode `source_ids` (one or more; `num_beams` beams each; the
    decoding's settings in the order of `describe_decoding`): the decoder steps if every output runs to its limit, as
    an untrained model's do (over batches of `batch_size` sources of similar length, the longest source +
    `EXTRA_OUTPUT_TOKENS` each, or `max_new_tokens`; the batches shared among `processes`), times one step of
    `generate()` timed over `PROBE_STEPS` steps on a batch of the longest batch's shape (its longest source repeated,
    with an attention mask as a padded batch has), under bf16 autocast when the decoding it stands for runs under it
    (evaluation in a `--bf16` run). The model is left in evaluation mode, the run's random state untouched."""
    longest_first = sorted(source_ids, key=len, reverse=True)  # as `translation.make_batches` batches them
    steps = sum(max_new_tokens or len(ids) + EXTRA_OUTPUT_TOKENS for ids in longest_first[::batch_size])
    device = model.device
    input_ids = torch.tensor([longest_first[0]] * len(longest_first[:batch_size]), device=device)
    model.eval()  # the Trainer's `training_step` puts it back in training mode
    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        torch.inference_mode(),
        torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast),
    ):
        started = time.perf_counter()
        model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            num_beams=num_beams,
            max_new_tokens=PROBE_STEPS,
            min_new_tokens=PROBE_STEPS,
            do_sample=False,
            use_cache=True,
        )
        step = (time.perf_counter() - started) / PROBE_STEPS
    return math.ceil(steps / processes) * step


class EvaluationClock:
    """Logs what each evaluation decodes and how long it should take, and measures how long it took: the rate of the
    last evaluation (pairs per second over every process) predicts the next one, and `describe_after_training` the
    work after training."""

    rate = None  # validation pairs per second, the last evaluation's
    after_training = None  # with a time budget: `describe_after_training` given the last rate

    def __init__(self, clock=time.monotonic):
        self.clock = clock

    @contextlib.contextmanager
    def timing(self, pairs, description):
        """Around one evaluation of `pairs` validation pairs that decodes as `description` says."""
        expected = "its time is logged when it ends"
        if self.rate:
            expected = f"about {describe_seconds(pairs / self.rate)} at the last evaluation's {self.rate:.1f} pairs/s"
        logger.info("Evaluating: decoding %s; %s", description, expected)
        started = self.clock()
        yield
        seconds = max(self.clock() - started, 1e-9)
        self.rate = pairs / seconds
        logger.info(
            "Evaluation of %d pairs took %s (%.1f pairs/s)", pairs, describe_seconds(seconds), self.rate
        )
        if self.after_training:  # with a time budget
            logger.info(self.after_training(self.rate))


def generation_settings(trainer, gen_kwargs):
    """The beams and the fixed output limit (None: source length + 50) of the trainer's evaluation, as
    `Seq2SeqTrainer.evaluate` and `VaswaniTrainer.prediction_step` will choose them."""
    beams = (
        gen_kwargs.get("num_beams")
        or trainer.args.generation_num_beams
        or trainer.model.generation_config.num_beams
        or 1
    )
    limit = gen_kwargs.get("max_new_tokens") or gen_kwargs.get("max_length")
    return int(beams), limit or trainer.args.generation_max_length


def describe_after_training(when, parts, rate=None):
    """One line saying what `vaswani-train` does once training ends (`when`: at `--max_steps`, or the
    `--max_train_minutes` budget), on the main process but for the final evaluation: `parts`, each (what it does,
    what it costs in validation pairs decoded greedily over every process, the most seconds it should take as timed
    before training), None where a part is not timed. The time of each part comes from `rate`, the last evaluation's
    validation pairs per second (greedy, every process; beam search estimated at `BEAM_SLOWDOWN` times greedy's time
    per pair), else from the bound timed before training."""
    if not parts:
        return f"After {when}: nothing more than saving the final model"
    texts, total, timed = [], 0.0, False
    for text, pairs, bound in parts:
        seconds = (pairs and pairs / rate) if rate else bound
        if seconds is not None:
            total, timed = total + seconds, True
            text += f" ({'' if rate else 'up to '}~{describe_seconds(seconds)})"
        texts.append(text)
    text = f"After {when}: " + "; ".join(texts)
    if rate:
        return text + (
            f"; about {describe_seconds(total)} in all (beam search estimated at {BEAM_SLOWDOWN:g}x the measured "
            "greedy time per pair, on one process)"
        )
    if timed:
        return text + (
            f"; up to about {describe_seconds(total)} in all (decoder steps timed on the untrained model, "
            "which writes every output to its length limit; a trained model stops sooner)"
        )
    return text + ". How long these take is logged once an evaluation has measured the decoding rate"


def log_after_training(trainer, finish_args, choice_sources, test_sources, source_tok):
    """Log before training what runs once it ends (`describe_after_training`: the final evaluation, the averaging,
    the translations of the validation split's `choice_sources` that choose an average or a length penalty, the test
    translation of `test_sources`), each part's time bounded now on this model by the main process; warn, naming the
    flags that shorten it, when that may outlast --max_train_minutes, whose evaluations then time it again."""
    args, validation = trainer.args, trainer.eval_dataset
    budget = args.max_train_minutes
    test_decoding = finish_args.num_beams, finish_args.translate_batch_size

    def bound(ids, *decoding, **autocast):  # timed on the main process only
        if trainer.is_world_process_zero():
            return seconds_to_decode(trainer.model, ids, *decoding, **autocast)
        return None

    # with the test's decoding (the bound counts empty sources, which are not decoded)
    def beam_bound(sources):
        return bound(source_tok(sources)["input_ids"], *test_decoding)

    parts, evaluation = [], None
    if validation and (args.eval_strategy == "steps" or (args.do_eval and args.eval_strategy == "no")):
        beams, limit = generation_settings(trainer, {})
        decoding = beams, args.per_device_eval_batch_size, args.world_size, limit
        evaluation = bound(validation["input_ids"], *decoding, bf16_autocast=args.bf16)
        what = describe_decoding(len(validation), *decoding)
        parts.append((f"a final evaluation of {what}", len(validation), evaluation))
    if max(finish_args.average_last) > 0:
        sizes = "/".join(map(str, finish_args.average_last))
        parts.append((f"the average of the last {sizes} checkpoints", None, None))
    per_pair = args.world_size * BEAM_SLOWDOWN  # greedy pairs over every process: beam search on the main one
    if choice_sources:
        choices = finish_args.chooses_average * len(set(finish_args.average_last))
        choices += finish_args.chooses_length_penalty * len(set(finish_args.length_penalty))
        each = beam_bound(choice_sources)
        text = f"{choices} beam-search translations of the {len(choice_sources)} validation pairs to choose among"
        pairs = choices * len(choice_sources) * per_pair
        parts.append((f"{text} averages or length penalties", pairs, each and choices * each))
    if test_sources:
        what = describe_decoding(len(test_sources), *test_decoding)
        parts.append(
            (f"the test translation of {what}", len(test_sources) * per_pair, beam_bound(test_sources))
        )
    end = f"step {args.max_steps}" if args.max_steps > 0 else "the last epoch"
    when = f"training ({end})"
    if budget:
        when = f"the {budget:g}-minute budget" + ("" if args.timed_only else f" (or {end}, if sooner)")
        trainer.evaluation_clock.after_training = partial(describe_after_training, when, parts)  # timed again
    logger.info(describe_after_training(when, parts))
    most = sum(seconds or 0 for *_, seconds in parts)
    if budget and most > budget * 60:
        fewer = ", --max_eval_samples N evaluates on fewer validation pairs" if evaluation else ""
        logger.warning(
            "The work after training may take up to %s, more than the %g-minute training budget "
            "(--max_train_minutes bounds training only): --max_predict_samples N translates the first N test pairs "
            "only, --do_predict false none%s",
            describe_seconds(most),
            budget,
            fewer,
        )
