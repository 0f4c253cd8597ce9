"""Evaluation that stays bounded on a large validation set (WMT's newstest2013: 3000 pairs).

- `sort_by_source_length`: the validation split decoded longest source first, so that each `generate()` batch holds
  sources of similar length (little padding, and a batch stops as soon as its similar outputs end); the raw split,
  whose target column is the BLEU references, is reordered the same way, so predictions and references stay aligned.
- `EvaluationClock`: before each evaluation (during and after training), a log line saying what is decoded (pairs,
  greedy or beam, batch size, output limit) and how long it should take, from the previous evaluation's measured
  rate; after it, how long it took.
- `AfterTraining`: what runs once training ends (a final evaluation, the averaging, the choices on validation, the
  test translation), logged by `vaswani-train` before training with the most time each part may take (`bound`: the
  decoder steps of outputs that all run to their length limit, as an untrained model's do, each step timed on the
  model by `seconds_per_decoder_step`) and, with `--max_train_minutes`, timed again after each evaluation from the
  measured rate, so that nobody is surprised by the time a run takes after its budget.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass

import torch

from ..generation_vaswani import EXTRA_OUTPUT_TOKENS

logger = logging.getLogger(__name__)

# Decoder steps timed before training, for the bound on the work after it (`seconds_per_decoder_step`).
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
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return tokenized.select(order), raw.select(order)


def describe_seconds(seconds: float) -> str:
    """3.2 s, 41 s, 6.5 min, 2.1 h."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def describe_decoding(
    pairs: int, num_beams: int, batch_size: int, processes: int = 1, max_new_tokens: int | None = None
) -> str:
    """'3000 pairs, greedy, 64 a batch (47 batches), at most source length + 50 new tokens'."""
    decoding = "greedy" if num_beams == 1 else f"beam {num_beams}"
    batches = math.ceil(pairs / max(1, batch_size * processes))
    per = f"{batch_size} a batch" + (f" on each of {processes} processes" if processes > 1 else "")
    per += f" ({batches} {'batch' if batches == 1 else 'batches'}{' each' if processes > 1 else ''})"
    limit = (
        f"at most {max_new_tokens} new tokens"
        if max_new_tokens
        else f"at most source length + {EXTRA_OUTPUT_TOKENS} new tokens"
    )
    return f"{pairs} pairs, {decoding}, {per}, {limit}"


def decoder_steps(
    lengths: list[int], batch_size: int, max_new_tokens: int | None = None, processes: int = 1
) -> int:
    """The decoder steps of a decoding whose every output runs to its limit (an untrained model's, which repeats a
    token rather than ending): over the batches of sources of similar length (`translation.make_batches`), the
    longest source + `EXTRA_OUTPUT_TOKENS` each (or `max_new_tokens`), the batches shared among `processes`."""
    from .translation import make_batches

    batches = make_batches(lengths, batch_size) if lengths else []
    limits = [max_new_tokens or max(lengths[i] for i in batch) + EXTRA_OUTPUT_TOKENS for batch in batches]
    return math.ceil(sum(limits) / max(1, processes))


def seconds_per_decoder_step(
    model,
    source_ids: list[list[int]],
    pad_token_id: int,
    num_beams: int,
    steps: int = PROBE_STEPS,
    bf16_autocast: bool = False,
) -> float:
    """The seconds one decoder step of `generate()` takes on `model` for this batch of sources (`num_beams` beams
    each), timed over `steps` steps that the model is made to write (`min_new_tokens`), under bf16 autocast when the
    decoding it stands for runs under it (evaluation in a `--bf16` run). The model is left in the mode it was in."""
    width = max(len(ids) for ids in source_ids)
    input_ids = torch.full((len(source_ids), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(source_ids):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    # Greedy and beam search draw no random numbers; the fork makes sure the run's random state is untouched.
    devices = [device] if device.type == "cuda" else []
    try:
        with (
            torch.random.fork_rng(devices=devices),
            torch.inference_mode(),
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast),
        ):
            started = time.perf_counter()
            model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                num_beams=num_beams,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                use_cache=True,
            )
            seconds = time.perf_counter() - started
    finally:
        model.train(training)
    return seconds / steps


class EvaluationClock:
    """Logs what each evaluation decodes and how long it should take, and measures how long it took: the rate of the
    last evaluation (pairs per second over every process) predicts the next one, and `AfterTraining` the work
    after training."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.rate: float | None = None  # validation pairs per second, the last evaluation's
        self.after_training: AfterTraining | None = None

    def expected_seconds(self, pairs: int) -> float | None:
        return None if not self.rate else pairs / self.rate

    @contextlib.contextmanager
    def timing(self, pairs: int, description: str):
        """Around one evaluation of `pairs` validation pairs that decodes as `description` says."""
        expected = self.expected_seconds(pairs)
        if expected is None:
            logger.info("Evaluating: decoding %s; its time is logged when it ends", description)
        else:
            logger.info(
                "Evaluating: decoding %s; about %s at the last evaluation's %.1f pairs/s",
                description,
                describe_seconds(expected),
                self.rate,
            )
        started = self.clock()
        yield
        seconds = max(self.clock() - started, 1e-9)
        self.rate = pairs / seconds
        logger.info(
            "Evaluation of %d pairs took %s (%.1f pairs/s)", pairs, describe_seconds(seconds), self.rate
        )
        if self.after_training is not None and self.after_training.budget_minutes:
            logger.info(self.after_training.describe(self.rate))


def generation_settings(trainer, gen_kwargs: dict) -> tuple[int, int | None]:
    """The beams and the fixed output limit (None: source length + 50) of the trainer's evaluation, as
    `Seq2SeqTrainer.evaluate` and `VaswaniTrainer.prediction_step` will choose them."""
    args = trainer.args
    beams = gen_kwargs.get("num_beams") or getattr(args, "generation_num_beams", None)
    beams = beams or trainer.model.generation_config.num_beams or 1
    limit = gen_kwargs.get("max_new_tokens") or gen_kwargs.get("max_length")
    return int(beams), limit or getattr(args, "generation_max_length", None)


@dataclass
class AfterTraining:
    """What `vaswani-train` does once training ends (at `--max_steps` or the `--max_train_minutes` budget), on the
    main process but for the final evaluation: `describe` says it, with the time each part should take once an
    evaluation has measured the greedy rate (beam search estimated at `BEAM_SLOWDOWN` times slower per pair)."""

    budget_minutes: float | None
    max_steps: int
    validation_pairs: int | None  # of the final evaluation; None: none
    eval_decoding: str  # describe_decoding(...) of that evaluation
    processes: int
    average_last: tuple[int, ...]
    validation_translations: int  # beam-search passes over validation, choosing an average or alpha
    choice_pairs: int | None  # pairs of those translations
    test_pairs: int | None
    test_decoding: str | None  # describe_decoding(...) of the test translation
    # The bound before training (`bound`): decoder steps of each part if every output runs to its limit
    # (`decoder_steps`), and the seconds of one step (`seconds_per_decoder_step`), greedy and with the test's beams.
    eval_steps: int = 0
    choice_steps: int = 0  # of one translation of the validation split
    test_steps: int = 0
    greedy_step_seconds: float | None = None
    beam_step_seconds: float | None = None
    timed_only: bool = False  # the budget alone ends training (`PaperTrainingArguments.timed_only`)

    def bound(self) -> dict[str, float] | None:
        """About the most seconds each part after training should take, from the decoder steps timed before training: an
        untrained model writes every output to its length limit, a trained one stops sooner. None before timing."""
        if self.greedy_step_seconds is None and self.beam_step_seconds is None:
            return None
        greedy, beam = self.greedy_step_seconds or 0.0, self.beam_step_seconds or 0.0
        parts = {}
        if self.validation_pairs:
            parts["evaluation"] = self.eval_steps * greedy
        if self.validation_translations and self.choice_pairs:
            parts["choices"] = self.validation_translations * self.choice_steps * beam
        if self.test_pairs:
            parts["test"] = self.test_steps * beam
        return parts

    def _from_rate(self, rate: float) -> dict[str, float]:
        """The seconds of each part from `rate`, the last evaluation's validation pairs per second (greedy, every
        process). The work after training runs on the main process alone: one process's share of that rate, with
        beam search at `BEAM_SLOWDOWN` times greedy's time per pair."""
        per_pair = 1 / rate
        beam_per_pair = per_pair * self.processes * BEAM_SLOWDOWN
        seconds = {}
        if self.validation_pairs:
            seconds["evaluation"] = self.validation_pairs * per_pair
        if self.validation_translations and self.choice_pairs:
            seconds["choices"] = self.validation_translations * self.choice_pairs * beam_per_pair
        if self.test_pairs:
            seconds["test"] = self.test_pairs * beam_per_pair
        return seconds

    def describe(self, rate: float | None = None) -> str:
        """One line; `rate`: the last evaluation's validation pairs per second (greedy, every process). Without it,
        the bound timed before training (`bound`) when there is one."""
        bound = None if rate else self.bound()
        # Seconds of each part: the bound, else from the measured rate, else unknown (no entry).
        estimates = bound if bound else self._from_rate(rate) if rate else {}
        parts, total = [], 0.0

        def timed(text: str, part: str) -> str:
            nonlocal total
            seconds = estimates.get(part)
            if seconds is None:
                return text
            total += seconds
            return f"{text} ({'up to ' if bound else ''}~{describe_seconds(seconds)})"

        if self.validation_pairs:
            parts.append(timed(f"a final evaluation of {self.eval_decoding}", "evaluation"))
        if max(self.average_last) > 0:
            sizes = "/".join(str(n) for n in self.average_last)
            parts.append(f"the average of the last {sizes} checkpoints")
        if self.validation_translations and self.choice_pairs:
            parts.append(
                timed(
                    f"{self.validation_translations} beam-search translations of the {self.choice_pairs} validation "
                    "pairs to choose among averages or length penalties",
                    "choices",
                )
            )
        if self.test_pairs:
            parts.append(timed(f"the test translation of {self.test_decoding}", "test"))
        end = f"step {self.max_steps}" if self.max_steps > 0 else "the last epoch"
        when = (
            f"the {self.budget_minutes:g}-minute budget"
            + ("" if self.timed_only else f" (or {end}, if sooner)")
            if self.budget_minutes
            else f"training ({end})"
        )
        if not parts:
            return f"After {when}: nothing more than saving the final model"
        text = f"After {when}: " + "; ".join(parts)
        if bound:
            return text + (
                f"; up to about {describe_seconds(total)} in all (decoder steps timed on the untrained model, "
                "which writes every output to its length limit; a trained model stops sooner)"
            )
        if not rate:
            return text + ". How long these take is logged once an evaluation has measured the decoding rate"
        return (
            text
            + f"; about {describe_seconds(total)} in all (beam search estimated at {BEAM_SLOWDOWN:g}x the "
            "measured greedy time per pair, on one process)"
        )


__all__ = [
    "AfterTraining",
    "BEAM_SLOWDOWN",
    "EvaluationClock",
    "describe_decoding",
    "decoder_steps",
    "describe_seconds",
    "generation_settings",
    "seconds_per_decoder_step",
    "sort_by_source_length",
]
