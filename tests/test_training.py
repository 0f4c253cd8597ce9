"""The training recipe: token-budget batches, the §5.3 schedule, Adam defaults, checkpoints, resume, DDP."""

import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import BIN, ROOT
from safetensors.torch import load_file
from transformers import TrainerCallback

from vaswani import VaswaniConfig
from vaswani.configuration_vaswani import (
    ACTIVATIONS,
    POSITION_EMBEDDING_TYPES,
    SINUSOID_FREQUENCIES,
    SINUSOID_LAYOUTS,
)
from vaswani.recipe.arguments import PaperTrainingArguments
from vaswani.recipe.batching import TokenBudgetBatchSampler
from vaswani.recipe.callbacks import TimeBudget
from vaswani.recipe.checkpoints import checkpoints, resolve_resume_checkpoint, verify_checkpoint
from vaswani.recipe.schedule import (
    cooldown_factor,
    paper_peak_learning_rate,
    paper_schedule,
    resolve_peak_learning_rate,
)

RUNNER = ROOT / "tests" / "helpers" / "train_runner.py"


# ---- batches ----------------------------------------------------------------------------------------------------
def test_token_budget_batches_cover_every_example_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(500)]
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=200, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(500))
        for b in batches:
            assert len(b) * max(lengths[i] for i in b) <= 200
        # Similar lengths together: the spread inside a batch is small compared to the data's.
        spreads = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
        assert sum(spreads) / len(spreads) < 3
    sampler.set_epoch(1)
    first = list(sampler)
    assert list(sampler) == first  # a pure function of the epoch: a resumed run sees the same batches
    sampler.set_epoch(2)
    assert list(sampler) != first
    assert list(TokenBudgetBatchSampler(lengths, max_tokens=200, seed=4)) != list(
        TokenBudgetBatchSampler(lengths, max_tokens=200, seed=3)
    )


def test_token_budget_rejects_examples_over_budget():
    with pytest.raises(ValueError, match="Example 1 has 50 tokens.*max_tokens"):
        TokenBudgetBatchSampler([3, 50, 4], max_tokens=40)


class PerExampleSampler:
    """The sampler as it was before it moved to numpy: a Python loop over every example (kept to check that the
    vectorised one gives exactly its batches, so that runs resume identically across the change)."""

    def __init__(self, lengths, max_tokens, seed=0, max_sentences=None):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.max_tokens, self.max_sentences, self.seed = max_tokens, max_sentences, seed
        self.epoch = 0

    def _group(self, order):
        batches, batch, longest = [], [], 0
        for index in order.tolist():
            length = int(self.lengths[index])
            grown = max(longest, length)
            full = self.max_sentences is not None and len(batch) >= self.max_sentences
            if batch and (grown * (len(batch) + 1) > self.max_tokens or full):
                batches.append(batch)
                batch, grown = [], length
            batch.append(index)
            longest = grown
        batches.append(batch)
        return batches

    def batches(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        shuffled = rng.permutation(len(self.lengths))
        order = shuffled[np.argsort(self.lengths[shuffled], kind="stable")]
        batches = self._group(order)
        return [batches[i] for i in rng.permutation(len(batches))]


def test_token_budget_batches_are_exactly_those_of_the_per_example_loop():
    rng = np.random.default_rng(0)
    cases = [
        (rng.integers(1, 41, 700), 200, None),
        (rng.integers(0, 9, 300), 8, None),
    ]  # lengths 0 and == budget
    cases += [(rng.integers(1, 41, 700), 200, 3), (np.full(50, 7), 70, None), ([5], 5, None), ([1, 1], 1, 1)]
    wmt_like = np.clip(np.round(rng.lognormal(np.log(30), 0.55, 60_000)), 1, 256).astype(np.int32)
    cases += [(wmt_like, 4096, None), (wmt_like, 1024, 64)]
    for lengths, max_tokens, max_sentences in cases:
        for seed in (0, 5):  # every epoch is shuffled (the sampler has no unshuffled order)
            new = TokenBudgetBatchSampler(lengths, max_tokens, seed, max_sentences)
            old = PerExampleSampler(lengths, max_tokens, seed, max_sentences)
            for epoch in (0, 1, 7):
                new.set_epoch(epoch)
                old.epoch = epoch
                expected = old.batches()
                assert list(new) == expected, (len(lengths), max_tokens, max_sentences, seed, epoch)
                assert len(new) == len(expected)


def test_the_sampler_keeps_arrays_not_lists():
    lengths = np.clip(np.round(np.random.default_rng(1).lognormal(np.log(30), 0.55, 100_000)), 1, 256)
    sampler = TokenBudgetBatchSampler(lengths.astype(np.int64), max_tokens=4096, seed=2)
    assert sampler.lengths.dtype == np.uint16  # the smallest type that holds the lengths
    order, batch_order = sampler.epoch_order()
    assert order.dtype == np.int32 and len(order) == 100_000 and len(batch_order) == len(sampler)
    first = next(iter(sampler))
    assert isinstance(first, list) and isinstance(first[0], int)  # a Python list only when a batch is yielded


def test_example_lengths_are_read_from_arrow():
    from datasets import Dataset

    from vaswani.recipe.batching import example_lengths

    rows = {"input_ids": [[5, 2], [5, 6, 7, 2], [2]], "labels": [[9, 9, 9, 2], [2], [4, 2]]}
    with_length = Dataset.from_dict({**rows, "length": [40, 41, 42]})
    assert example_lengths(with_length).tolist() == [40, 41, 42]  # the column tokenize_dataset writes
    assert example_lengths(with_length).dtype == np.int32
    assert example_lengths(with_length.select([2, 0])).tolist() == [42, 40]  # an indices mapping is followed
    with pytest.raises(ValueError, match="need a 'length' column.*data.tokenize_dataset.*'input_ids', 'labels'"):
        example_lengths(Dataset.from_dict(rows))


# ---- schedule and optimizer defaults -----------------------------------------------------------------------------
def paper_learning_rate(step, d_model, warmup_steps):
    """§5.3, Eq. 3: lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5), step_num from 1."""
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def test_paper_learning_rate_formula_and_schedule():
    d_model, warmup = 512, 4000
    peak = paper_learning_rate(warmup, d_model, warmup)
    assert peak == pytest.approx((d_model * warmup) ** -0.5)
    assert (
        paper_learning_rate(warmup - 1, d_model, warmup)
        < peak
        > paper_learning_rate(warmup + 1, d_model, warmup)
    )
    # The optimizer's learning rate is the peak (as in transformers); the paper's peak makes the schedule Eq. 3.
    assert paper_peak_learning_rate(d_model, warmup) == pytest.approx(7.0e-4, rel=2e-3)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=paper_peak_learning_rate(d_model, warmup))
    schedule = paper_schedule(optimizer, warmup)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert seen == pytest.approx([paper_learning_rate(s, d_model, warmup) for s in range(1, 6)])


def _learning_rates(optimizer, schedule, steps):
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return seen


def test_cooldown_falls_to_zero_where_the_run_ends():
    assert [cooldown_factor(p, 0.2) for p in (0.0, 0.8, 0.9, 1.0, 1.5)] == pytest.approx([1, 1, 0.5, 0, 0])
    assert cooldown_factor(0.99, 0.0) == 1.0  # 0: the paper's schedule
    d_model, warmup = 64, 4

    def adam():
        return torch.optim.Adam(
            [torch.nn.Parameter(torch.zeros(1))], lr=paper_peak_learning_rate(d_model, warmup)
        )

    # Bound by steps: 10 steps, the last half cooling; the rate of update k is lrate(k) * factor((k - 1) / 10).
    optimizer = adam()
    seen = _learning_rates(
        optimizer, paper_schedule(optimizer, warmup, cooldown_fraction=0.5, max_steps=10), 10
    )
    expected = [
        paper_learning_rate(k, d_model, warmup) * min(1, (1 - (k - 1) / 10) / 0.5) for k in range(1, 11)
    ]
    assert seen == pytest.approx(expected)
    assert seen[:6] == pytest.approx([paper_learning_rate(k, d_model, warmup) for k in range(1, 7)])
    # Bound by time: with 90% of the budget spent, a 20% cool-down is half-way down, whatever the step count says.
    budget = TimeBudget(minutes=10.0)
    budget.started = time.monotonic() - 0.9 * budget.seconds
    optimizer = adam()
    seen = _learning_rates(optimizer, paper_schedule(optimizer, warmup, 0.2, 100000, budget), 3)
    assert seen[1:] == pytest.approx(
        [paper_learning_rate(k, d_model, warmup) * 0.5 for k in (2, 3)], rel=1e-3
    )


@pytest.mark.parametrize("fraction", [-0.1, 1.0, float("nan")])
def test_cooldown_fraction_is_checked(tmp_path, fraction):
    with pytest.raises(ValueError, match="--lr_cooldown_fraction"):
        PaperTrainingArguments(output_dir=str(tmp_path), lr_cooldown_fraction=fraction)
    with pytest.raises(ValueError, match="--lr_cooldown_fraction acts on the §5.3 schedule"):
        PaperTrainingArguments(output_dir=str(tmp_path), lr_cooldown_fraction=0.2, paper_lr_schedule=False)


def test_training_arguments_default_to_the_paper(tmp_path):
    args = PaperTrainingArguments(output_dir=str(tmp_path))
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert args.warmup_steps == 4000 and args.label_smoothing_factor == 0.1 and args.weight_decay == 0.0
    # --learning_rate is the peak, as in transformers; not given, the paper's peak for the model's d_model
    assert args.paper_lr_schedule and args.learning_rate is None and args.learning_rate_constant is None
    assert resolve_peak_learning_rate(args, 512) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert args.max_tokens == 4096 and args.max_sentences is None  # the paper's token-budget batches
    assert args.max_grad_norm == 0.0  # the paper clips no gradients; transformers' Trainer would clip at 1.0
    args = PaperTrainingArguments(output_dir=str(tmp_path), max_tokens=4096, batch_tokens=25000)
    assert args.gradient_accumulation_steps == 7  # ceil(25000 / 4096) on one process


def test_the_optimizer_is_transformers_default_adam_and_a_given_one_is_kept(tmp_path):
    from helpers import tiny_model
    from transformers import Seq2SeqTrainingArguments

    from vaswani.recipe.trainer import VaswaniTrainer

    expected = Seq2SeqTrainingArguments(output_dir=str(tmp_path)).optim  # the fused kernel from torch 2.8 on
    assert PaperTrainingArguments(output_dir=str(tmp_path)).optim == expected
    model = tiny_model()
    for optim, fused in ((None, expected == "adamw_torch_fused"), ("adamw_torch", False)):
        kwargs = {} if optim is None else {"optim": optim}
        args = PaperTrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", eval_strategy="no", **kwargs
        )
        trainer = VaswaniTrainer(model=model, args=args)
        optimizer = trainer.create_optimizer()
        assert isinstance(optimizer, torch.optim.AdamW) and bool(optimizer.defaults.get("fused")) is fused
        assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9


def test_lowercase_flag_trains_a_lowercasing_tokenizer_and_refuses_a_mismatched_one(tmp_path):
    from datasets import Dataset

    from vaswani.recipe.arguments import DataArguments
    from vaswani.recipe.run import prepare_tokenizers
    from vaswani.recipe.tokenization import lowercases

    pairs = {"de": ["Ein Mann läuft.", "Zwei Hunde spielen.", "Die Frau liest."] * 20}
    pairs["en"] = ["A man runs.", "Two dogs play.", "The woman reads."] * 20
    raw = {"train": Dataset.from_dict(pairs)}
    args = DataArguments(
        dataset_name="unused", source_lang="de", target_lang="en", vocab_size=300, lowercase=True
    )
    run = PaperTrainingArguments(output_dir=str(tmp_path / "run"))
    source, target = prepare_tokenizers(args, raw, run)
    assert source is target and lowercases(source)
    assert lowercases(prepare_tokenizers(args, raw, run)[0])  # a resumed run reloads it
    cased = DataArguments(
        dataset_name="unused", tokenizer_name=str(tmp_path / "run" / "tokenizer"), lowercase=False
    )
    with pytest.raises(ValueError, match="--lowercase is False but the tokenizer in .* lowercases"):
        prepare_tokenizers(cased, raw, PaperTrainingArguments(output_dir=str(tmp_path / "other")))


def test_validation_bleu_of_a_lowercasing_model_is_case_insensitive():
    from transformers import EvalPrediction

    from vaswani.recipe.metrics import bleu_metric_fn
    from vaswani.recipe.tokenization import train_bpe_tokenizer

    sentences = ["Ein Mann läuft über die Straße.", "Zwei Hunde spielen im Schnee."] * 10
    references = sentences[:2]
    for lowercase, expected in ((True, 100.0), (False, None)):
        tok = train_bpe_tokenizer(iter(sentences), vocab_size=300, show_progress=False, lowercase=lowercase)
        ids = tok([s.lower() for s in references], padding=True, return_tensors="np")["input_ids"]
        scores = bleu_metric_fn(tok, references)(EvalPrediction(predictions=ids, label_ids=ids))
        if expected is not None:
            assert scores["bleu"] == pytest.approx(expected)
        else:  # a cased model that writes lowercase is scored case-sensitively, and loses for it
            assert scores["bleu"] < 50


def test_config_fields_on_the_command_line():
    from vaswani.commands.cli import parse_args
    from vaswani.common.errors import UsageError
    from vaswani.recipe.arguments import ModelConfigArguments, config_overrides

    def overrides(argv):
        (config_args,) = parse_args(ModelConfigArguments, argv, description="")
        return config_overrides(config_args)

    assert overrides(["--d_model", "64", "--dropout", "0.3", "--normalize_before", "true"]) == {
        "d_model": 64,
        "dropout": 0.3,
        "normalize_before": True,
    }
    # the `=` form, and a bare boolean flag
    assert overrides(["--d_model=64", "--normalize_before"]) == {"d_model": 64, "normalize_before": True}
    with pytest.raises(UsageError, match="--no_such_flag"):
        overrides(["--no_such_flag", "1"])
    with pytest.raises(UsageError, match="--activation_function.*invalid choice"):
        overrides(["--activation_function", "bogus"])
    # config_overrides: only what was given, and it builds the configuration over the preset
    given = config_overrides(ModelConfigArguments(d_model=64, normalize_before=False, init_std=None))
    assert given == {"d_model": 64, "normalize_before": False}
    config = VaswaniConfig.from_preset("small", vocab_size=100, **given)
    assert (config.d_model, config.normalize_before, config.encoder_layers) == (64, False, 3)
    assert config_overrides(ModelConfigArguments()) == {}


def test_every_config_parameter_is_a_flag_or_named_as_not_one():
    """`ModelConfigArguments` is built from `VaswaniConfig`: each of its parameters is a flag (with the parameter's
    type, optional, default None, and the parameter's text in the config's docstring as its help) or is named in
    `CONFIG_FIELDS_NOT_FLAGS`."""
    import dataclasses
    import inspect
    import typing

    from vaswani.recipe.arguments import CONFIG_FIELDS_NOT_FLAGS, ModelConfigArguments

    # the dataclass's own fields, not those of transformers' base class
    own = set(VaswaniConfig.__annotations__)
    parameters = {
        name: p
        for name, p in inspect.signature(VaswaniConfig.__init__).parameters.items()
        if name in own and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    fields = {f.name: f for f in dataclasses.fields(ModelConfigArguments)}
    missing = sorted(set(parameters) - set(fields) - CONFIG_FIELDS_NOT_FLAGS)
    assert not missing, (
        f"VaswaniConfig parameters that are neither flags nor in CONFIG_FIELDS_NOT_FLAGS: {missing}"
    )
    assert not set(fields) & CONFIG_FIELDS_NOT_FLAGS
    assert not set(fields) - set(parameters), "flags that are no VaswaniConfig parameter"
    hints = typing.get_type_hints(ModelConfigArguments)
    for name, item in fields.items():
        kind = VaswaniConfig.__annotations__[name]
        base = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
        assert hints[name] == base | None and item.default is None, name
        assert item.metadata["help"].strip() and "\n" not in item.metadata["help"], name
        if base is bool:
            assert (item.metadata.get("nargs"), item.metadata.get("const")) == ("?", True), name
    choices = {
        "activation_function": ACTIVATIONS,
        "position_embedding_type": POSITION_EMBEDDING_TYPES,
        "sinusoid_layout": SINUSOID_LAYOUTS,
        "sinusoid_frequencies": SINUSOID_FREQUENCIES,
    }
    for name, values in choices.items():
        assert fields[name].metadata["choices"] == list(values), name
    # --help shows each field's docstring text, written once, in VaswaniConfig
    from vaswani.commands.cli import build_parser

    help_text = " ".join(build_parser(ModelConfigArguments, description="").format_help().split())
    assert "--qkv_init_gain QKV_INIT_GAIN The gain of the Xavier-uniform initialisation" in help_text
    assert "fairseq uses 1/sqrt(2)" in help_text and "`" not in help_text
    assert "--normalize_before [NORMALIZE_BEFORE] False is the paper's post-norm residual block" in help_text


# ---- the size of an update (§5.1: ~25,000 source and target tokens, whatever the hardware) ------------------------
class UpdateRecorder(TrainerCallback):
    """Each update's gradients (before the optimizer step) and learning rate, and each micro-batch's target tokens."""

    def __init__(self):
        self.gradients, self.learning_rates, self.target_tokens = [], [], []

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        self.gradients.append(grads)
        self.learning_rates.append(optimizer.param_groups[0]["lr"])

    def collator(self, collate):
        def counting(features):
            batch = collate(features)
            self.target_tokens.append(int((batch["labels"] != -100).sum()))
            return batch

        return counting


def _pairs(lengths: list[tuple[int, int]], vocab_size: int, seed: int = 0):
    """A tokenized dataset of random ids with these (source, target) lengths, `</s>` last, as tokenize_dataset
    writes it."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)

    def ids(n):
        return [*rng.integers(4, vocab_size, n - 1).tolist(), 2]

    rows = [(ids(s), ids(t)) for s, t in lengths]
    return Dataset.from_dict(
        {
            "input_ids": [s for s, _ in rows],
            "labels": [t for _, t in rows],
            "length": [max(s, t) for s, t in lengths],
        }
    )


def _train(tmp_path, name, dataset, tokenizer, **flags):
    from helpers import tool_model
    from transformers import DataCollatorForSeq2Seq
    from transformers.utils import logging as hf_logging

    from vaswani.recipe.trainer import VaswaniTrainer

    hf_logging.set_verbosity_error()
    model = tool_model(len(tokenizer))  # the same initial weights for every run, no dropout
    model.train()
    settings = dict(
        output_dir=str(tmp_path / name), warmup_steps=4, save_strategy="no", eval_strategy="no", seed=0,
        logging_steps=1, use_cpu=True, dataloader_pin_memory=False, disable_tqdm=True, report_to="none",
    )  # fmt: skip
    settings.update(flags)
    recorder = UpdateRecorder()
    trainer = VaswaniTrainer(
        model=model,
        args=PaperTrainingArguments(**settings),
        train_dataset=dataset,
        data_collator=recorder.collator(
            DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
        ),
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    trainer.train()
    return trainer, recorder


def test_two_accumulated_half_batches_give_the_gradient_of_the_whole_batch(tmp_path):
    """§5.1's update of ~25,000 target tokens made of 2 micro-batches (gradient accumulation, or 2 GPUs) has the
    gradient of the single batch holding both: the label-smoothed loss is summed over every target token of the
    update and divided by their number (`num_items_in_batch`), not averaged per micro-batch. The micro-batches
    differ in target tokens (12,500 and about 9,000) and in padding, which a per-micro-batch mean would show."""
    from helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    rng = np.random.default_rng(1)
    short = [(int(rng.integers(15, 26)), 25) for _ in range(500)]  # 500 x 25 = 12,500 tokens: one budget
    long = [(50, int(rng.integers(20, 51))) for _ in range(250)]  # 250 x 50 = 12,500 padded tokens
    dataset = _pairs(short + long, len(tokenizer))
    _, halves = _train(
        tmp_path, "halves", dataset, tokenizer, max_tokens=12_500, batch_tokens=25_000, max_steps=1
    )
    _, whole = _train(tmp_path, "whole", dataset, tokenizer, max_tokens=37_500, max_steps=1)
    assert sorted(halves.target_tokens) == [sum(t for _, t in long), 12_500]  # two micro-batches, one update
    assert whole.target_tokens == [sum(halves.target_tokens)]  # one batch of both, ~21,500 target tokens
    assert len(halves.gradients) == len(whole.gradients) == 1
    # Summed in another order, float32 gradients differ by up to ~3e-4 of a tensor's largest entry on some CPUs (seen
    # on an Intel Xeon); a mean per micro-batch would be off by ~15% (12,500 against ~9,000 target tokens).
    for key, expected in whole.gradients[0].items():
        scale = float(expected.abs().max())
        torch.testing.assert_close(halves.gradients[0][key], expected, rtol=1e-3, atol=2e-3 * scale, msg=key)


def test_batch_tokens_counts_updates_not_micro_batches(tmp_path):
    """With --batch_tokens the run's length (--max_steps, or the updates of an epoch), the logged steps and the §5.3
    schedule count optimizer updates: an epoch of 9 micro-batches accumulated 2 at a time is 5 updates (the last
    of one micro-batch), at the learning rates of steps 1..5."""
    from helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    dataset = _pairs([(10, 10)] * 27, len(tokenizer))  # 9 micro-batches of 3 pairs at 30 tokens
    trainer, record = _train(
        tmp_path,
        "epoch",
        dataset,
        tokenizer,
        max_tokens=30,
        batch_tokens=60,
        max_steps=-1,
        num_train_epochs=1,
    )
    assert trainer.args.gradient_accumulation_steps == 2 and len(trainer.get_train_dataloader()) == 9
    assert trainer.state.global_step == 5 and len(record.gradients) == 5
    assert record.target_tokens == [30] * 9
    assert record.learning_rates == pytest.approx([paper_learning_rate(k, 16, 4) for k in range(1, 6)])
    logged = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
    assert logged == pytest.approx(record.learning_rates)
    trainer, record = _train(
        tmp_path, "steps", dataset, tokenizer, max_tokens=30, batch_tokens=60, max_steps=3
    )
    assert trainer.state.global_step == 3 and record.target_tokens[:6] == [30] * 6
    assert record.learning_rates == pytest.approx([paper_learning_rate(k, 16, 4) for k in range(1, 4)])


# ---- end to end --------------------------------------------------------------------------------------------------
DE = "ein eine mann frau kind hund läuft über die straße grünen wiese spielt ball im park schöne große rote".split()
EN = "a an man woman child dog runs across the street green meadow plays ball in park beautiful big red".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for split, n in (("train", 160), ("val", 12)):
        src, tgt = [], []
        for _ in range(n):
            idx = [rng.randrange(len(DE)) for _ in range(rng.randint(3, 8))]
            src.append(" ".join(DE[i] for i in idx).capitalize() + " .")
            tgt.append(" ".join(EN[i] for i in idx).capitalize() + " .")
        (folder / f"{split}.de").write_text("\n".join(src) + "\n")
        (folder / f"{split}.en").write_text("\n".join(tgt) + "\n")
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    """One tokenizer for the runs that are compared with each other."""
    from vaswani.recipe.data import iter_text, load_parallel_dataset
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    train = load_parallel_dataset(corpus, "de", "en", splits=["train"])["train"]
    tok = train_bpe_tokenizer(iter_text(train, ["de", "en"]), vocab_size=300)
    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizers(tok, tok, folder)
    return folder


def tiny_run_args(corpus, output_dir, max_steps=12, extra=()):
    return [
        "--dataset_name", str(corpus), "--validation_split", "val", "--source_lang", "de", "--target_lang", "en",
        "--preset", "small", "--vocab_size", "300", "--d_model", "16", "--encoder_layers", "1",
        "--decoder_layers", "2", "--encoder_attention_heads", "2", "--decoder_attention_heads", "2",
        "--encoder_ffn_dim", "24", "--decoder_ffn_dim", "24", "--max_tokens", "96", "--warmup_steps", "4",
        "--max_steps", str(max_steps), "--save_steps", "4", "--logging_steps", "2", "--eval_strategy", "no",
        "--output_dir", str(output_dir), "--seed", "7", "--dataloader_pin_memory", "false",
        *extra,
    ]  # fmt: skip


def _with_tokenizer(folder):
    def args(corpus, output_dir, max_steps=12, extra=()):
        return tiny_run_args(corpus, output_dir, max_steps, [*extra, "--tokenizer_name", str(folder)])

    return args


def run(cmd, env_extra=None, check=True, cwd=None):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env_extra or {}),
    }
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def final_weights(folder):
    return load_file(str(Path(folder) / "model.safetensors"))


@pytest.mark.slow
def test_train_script_end_to_end_with_bleu_evaluation(corpus, tmp_path):
    out = tmp_path / "run"
    args = tiny_run_args(
        corpus,
        out,
        max_steps=8,
        extra=["--eval_strategy", "steps", "--eval_steps", "8", "--average_last", "2", "--test_split", "val"],
    )
    result = run([str(BIN / "vaswani-train"), *args])
    assert "val: BLEU" in result.stdout and "BLEU|nrefs:1" in result.stdout
    assert [p.name for p in checkpoints(out)] == ["checkpoint-4", "checkpoint-8"]
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    evals = [e for e in state["log_history"] if "eval_bleu" in e]
    assert evals and "eval_chrf" in evals[0]
    lrs = [e["learning_rate"] for e in state["log_history"] if "learning_rate" in e]
    assert lrs[0] == pytest.approx(paper_learning_rate(2, 16, 4))  # logged after step 2
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 8 and summary["parameters"] > 0 and summary["source_lang"] == "de"
    assert summary["precision"] == "fp32" and summary["max_grad_norm"] == 0.0
    config = json.loads((out / "config.json").read_text())
    assert config["d_model"] == 16 and config["dropout"] == 0.1 and "label_smoothing" not in config
    assert summary["label_smoothing"] == 0.1  # the recipe's setting
    assert config["use_cache"] is True
    assert json.loads((out / "averaged" / "config.json").read_text())["use_cache"] is True
    # Evaluation ran before checkpoint-8 was saved; the saved generation config is still the model's own, without
    # the defaults Seq2SeqTrainer fills in (its max_length=20 made every generate(max_new_tokens=...) warn).
    for folder in ("checkpoint-8", "averaged"):
        generation = json.loads((out / folder / "generation_config.json").read_text())
        assert "max_length" not in generation and generation["num_beams"] == 4, folder
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out / "tokenizer").pad_token_id == 0
    # §6.1 after training: the average of the last 2 checkpoints, beam search on the "test" split, scores.
    from vaswani.recipe.averaging import load_safetensors_state_dict

    averaged = load_file(str(out / "averaged" / "model.safetensors"))
    c4, c8 = (load_safetensors_state_dict(out / f"checkpoint-{s}") for s in (4, 8))
    key = "model.encoder.layers.0.fc1.weight"
    torch.testing.assert_close(averaged[key], (c4[key] + c8[key]) / 2)
    scores = json.loads((out / "test_results.json").read_text())
    assert scores["split"] == "val" and scores["num_beams"] == 4 and scores["length_penalty"] == 0.6
    assert scores["length_penalty_form"] == "gnmt"
    assert 0 <= scores["bleu"] <= 100 and "chrf" in scores and "bleu_lowercase_moses_tokenized" in scores
    hyps = (out / "averaged" / "val.hyp.en").read_text().splitlines()
    assert len(hyps) == 12
    assert (out / "learning_curves.png").stat().st_size > 5000
    for kind in ("encoder", "decoder", "cross"):
        assert (out / "averaged" / f"attention_{kind}.png").stat().st_size > 5000


@pytest.mark.parametrize("fused", [True, False], ids=["fused-output-loss", "logits-then-loss"])
def test_bf16_training_runs_the_loss_under_autocast_and_evaluates_under_it(
    corpus, tokenizer_dir, tmp_path, monkeypatch, fused
):
    """Under `--bf16` the trainer runs autocast itself (`VaswaniTrainer.take_over_autocast`). Each training step
    computes the output projection and the label-smoothed loss in one kernel under that autocast (the default), or,
    with `--fused_output_loss False`, hands the loss the logits in bf16 (not Accelerate's float32 copy of them).
    Generation in evaluation runs under the same autocast, and the run trains and saves as in float32."""
    from vaswani import kernels
    from vaswani.commands import train as train_command
    from vaswani.recipe import losses

    seen = {"fused": [], "logits": []}
    projection_and_loss = kernels.linear_label_smoothed_cross_entropy
    loss_of_logits = kernels.label_smoothed_cross_entropy

    def fused_spy(hidden, weight, bias, labels, epsilon=0.0, chunk_elements=None):
        seen["fused"].append((epsilon, torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))
        return projection_and_loss(hidden, weight, bias, labels, epsilon, chunk_elements)

    def logits_spy(logits, labels, epsilon=0.0, chunk_elements=None):
        seen["logits"].append(
            (logits.dtype, epsilon, torch.is_autocast_enabled("cpu"), torch.is_grad_enabled())
        )
        return loss_of_logits(logits, labels, epsilon, chunk_elements)

    # where the recipe's losses (`vaswani.recipe.losses`) call the kernels
    monkeypatch.setattr(losses, "linear_label_smoothed_cross_entropy", fused_spy)
    monkeypatch.setattr(losses, "label_smoothed_cross_entropy", logits_spy)
    generating = []
    from vaswani.modeling_vaswani import VaswaniForConditionalGeneration

    generate = VaswaniForConditionalGeneration.generate

    def generate_spy(self, *args, **kwargs):
        generating.append(torch.is_autocast_enabled("cpu"))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(VaswaniForConditionalGeneration, "generate", generate_spy)
    out = tmp_path / "run"
    extra = ["--bf16", "--use_cpu", "--eval_strategy", "steps", "--eval_steps", "4"]
    args = _with_tokenizer(tokenizer_dir)(
        corpus, out, max_steps=4, extra=extra + ["--fused_output_loss", str(fused)]
    )
    train_command.main(args)
    training = [call for call in seen["logits"] if call[-1]]  # with autograd on: a training step's loss
    if fused:
        assert seen["fused"] == [(0.1, True, True)] * 4 and training == []
    else:
        assert seen["fused"] == []
        assert training == [(torch.bfloat16, 0.1, True, True)] * 4
    assert generating and all(generating)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 4 and summary["precision"] == "bf16 autocast"
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert any("eval_bleu" in entry for entry in state["log_history"])
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert losses and all(math.isfinite(loss) for loss in losses)
    step_times = [entry.get("seconds_per_step") for entry in state["log_history"] if "loss" in entry]
    assert all(isinstance(t, float) and 0 < t < 60 for t in step_times)  # every training log: the step time
    assert final_weights(out)["model.shared.weight"].dtype == torch.float32


def _batch_shapes(monkeypatch) -> list:
    """The (input_ids, labels) shapes of every training step of the trainer, recorded as they are trained on."""
    from vaswani.recipe.trainer import VaswaniTrainer

    shapes = []
    step = VaswaniTrainer.training_step

    def spy(self, model, inputs, num_items_in_batch=None):
        shapes.append((tuple(inputs["input_ids"].shape), tuple(inputs["labels"].shape)))
        return step(self, model, inputs, num_items_in_batch)

    monkeypatch.setattr(VaswaniTrainer, "training_step", spy)
    return shapes


def test_pad_to_multiple_of_pads_batches_to_a_few_lengths_within_the_budget(
    corpus, tokenizer_dir, tmp_path, monkeypatch
):
    """`--pad_to_multiple_of 8`: every training batch's source and target are padded to a multiple of 8 tokens, and
    the token budget counts the padded lengths, so that no batch holds more than `--max_tokens` padded tokens."""
    from vaswani.commands import train as train_command

    shapes = _batch_shapes(monkeypatch)
    extra = ["--pad_to_multiple_of", "8", "--save_strategy", "no"]
    train_command.main(_with_tokenizer(tokenizer_dir)(corpus, tmp_path / "run", max_steps=8, extra=extra))
    assert len(shapes) == 8
    for (sentences, source), (same, target) in shapes:
        assert sentences == same and source % 8 == 0 and target % 8 == 0
        assert sentences * max(source, target) <= 96  # --max_tokens of tiny_run_args


def test_pad_to_multiple_of_is_checked(tmp_path):
    from vaswani.common.errors import UsageError

    with pytest.raises(UsageError, match="--pad_to_multiple_of must be a positive number of tokens, got 0"):
        PaperTrainingArguments(output_dir=str(tmp_path), pad_to_multiple_of=0)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-output-loss", "logits-then-loss"])
def test_the_training_forward_and_loss_compile_as_one_graph(fused):
    """`torch.compile` captures a training step's forward pass and label-smoothed loss whole, as the recipe runs them
    on the CPU (the model's CPU kernels swapped in, bf16 autocast, padded source and target): no graph break, which
    would leave part of the step in eager mode and split it at every break (`torch._dynamo.explain`)."""
    from helpers import batch as padded_batch

    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, kernels
    from vaswani.recipe import losses

    config = VaswaniConfig.from_preset(
        "tiny",
        vocab_size=60,
        d_model=16,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        attn_implementation="vaswani_sdpa",
    )
    model = kernels.use_cpu_kernels(VaswaniForConditionalGeneration(config), attention=False).train()
    input_ids, attention_mask, labels = padded_batch(60)
    labels[1:, -2:] = -100  # padded targets
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def step():
        if fused:
            return losses.fused_output_loss(model, dict(batch), 0.1)
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return losses.label_smoothed_loss(
            model(**inputs, decoder_input_ids=decoder_input_ids), batch["labels"]
        )

    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(step)()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_compiled_training_compiles_once_for_every_batch_shape_and_matches_eager(
    corpus, tokenizer_dir, tmp_path, monkeypatch, caplog
):
    """`--torch_compile true` on token-budget batches of varying shapes: the first compilation serves every shape
    (the batch's sentences and tokens are dynamic dimensions), the log counts the graphs compiled, and the losses
    are those of the same run in eager mode, to rounding (no dropout, so both draw nothing at random). The
    `aot_eager` backend traces and differentiates as inductor does without generating code, which takes minutes
    on a small CPU."""
    import logging

    from vaswani.commands import train as train_command

    shapes = _batch_shapes(monkeypatch)
    extra = ["--dropout", "0", "--save_strategy", "no", "--logging_steps", "1"]
    runs = {}
    for name, flags in (
        ("eager", []),
        ("compiled", ["--torch_compile", "true", "--torch_compile_backend", "aot_eager"]),
    ):
        caplog.clear()
        shapes.clear()
        with caplog.at_level(logging.INFO, logger="vaswani"):
            trainer = train_command.main(
                _with_tokenizer(tokenizer_dir)(corpus, tmp_path / name, max_steps=6, extra=extra + flags)
            )
        runs[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert len({shape for pair in shapes for shape in pair}) > 2  # batches of several shapes
    counted = [r.getMessage() for r in caplog.records if "graphs compiled in 6 steps" in r.getMessage()]
    assert counted and 1 <= int(counted[-1].split()[1]) <= 2, counted
    assert len(runs["eager"]) == 6
    assert runs["compiled"] == pytest.approx(runs["eager"], rel=1e-4)


@pytest.mark.slow
def test_average_chosen_on_validation(corpus, tokenizer_dir, tmp_path, monkeypatch, caplog):
    """--average_last with several numbers: each average of the last N checkpoints translates the validation split
    with the test's beam search, the highest BLEU is kept (the fewest checkpoints among equals), and every
    candidate's scores are written down."""
    from vaswani.recipe import finish
    from vaswani.recipe.arguments import DataArguments, FinishArguments
    from vaswani.recipe.averaging import average_state_dicts

    out = tmp_path / "run"
    args = _with_tokenizer(tokenizer_dir)(
        corpus,
        out,
        max_steps=12,
        extra=["--average_last", "3", "1", "5", "2", "--lr_cooldown_fraction", "0.5"]
        + ["--length_penalty", "0.6", "2.0", "0.0"],
    )
    run([str(BIN / "vaswani-train"), *args, "--test_split", "val"])
    # The length penalty, chosen on val with the chosen average, is the saved model's and the test's.
    chosen = json.loads((out / "length_penalty_on_validation.json").read_text())
    alphas = [c["length_penalty"] for c in chosen["candidates"]]
    assert alphas == [0.6, 2.0, 0.0] and chosen["model"] == str(out / "averaged")
    bleus = [c["bleu"] for c in chosen["candidates"]]
    assert chosen["chosen"] == alphas[bleus.index(max(bleus))]  # the first of the best
    generation = json.loads((out / "averaged" / "generation_config.json").read_text())
    assert generation["length_penalty"] == chosen["chosen"]
    assert json.loads((out / "test_results.json").read_text())["length_penalty"] == chosen["chosen"]
    # Over the last half of the 12 steps the learning rate fell linearly towards 0: the rate of update k (logged
    # after updates 2, 4, ... 12) is lrate(k) * factor((k - 1) / 12), the last one a sixth of lrate(12).
    state = json.loads((out / "checkpoint-12" / "trainer_state.json").read_text())
    lrs = [e["learning_rate"] for e in state["log_history"] if "learning_rate" in e]
    assert lrs == pytest.approx(
        [paper_learning_rate(k, 16, 4) * cooldown_factor((k - 1) / 12, 0.5) for k in range(2, 13, 2)]
    )
    assert lrs[-1] == pytest.approx(paper_learning_rate(12, 16, 4) / 6)
    assert "last 50% of the run" in json.loads((out / "training_summary.json").read_text())["schedule"]
    record = json.loads((out / "average_on_validation.json").read_text())
    assert record["criterion"] == "bleu" and record["split"] == "val" and record["num_beams"] == 4
    assert record["length_penalty"] == 0.6  # averages are compared with the first length penalty
    sizes = [len(c["checkpoints"]) for c in record["candidates"]]
    assert sizes == [1, 2, 3]  # 5 asks for more checkpoints than the run has: all 3
    assert record["candidates"][2]["checkpoints"] == ["checkpoint-4", "checkpoint-8", "checkpoint-12"]
    bleus = [c["bleu"] for c in record["candidates"]]
    assert all(0 <= b <= 100 for b in bleus) and all("chrf" in c for c in record["candidates"])
    best = record["candidates"][bleus.index(max(bleus))]["checkpoints"]
    assert record["chosen"] == best
    expected = average_state_dicts([out / name for name in best], show_progress=False)
    averaged = load_file(str(out / "averaged" / "model.safetensors"))
    key = "model.encoder.layers.0.fc1.weight"
    torch.testing.assert_close(averaged[key], expected[key])
    assert json.loads((out / "test_results.json").read_text())["averaged_checkpoints"] == best
    assert not list(out.glob(".average-*"))  # the candidates' folders are gone

    # The choice itself: a candidate that translates the validation split perfectly wins.
    data_args = DataArguments(
        dataset_name=str(corpus), validation_split="val", source_lang="de", target_lang="en"
    )
    finish_args = FinishArguments(average_last=[1, 2, 3])
    references = (corpus / "val.en").read_text().splitlines()

    def translate(sources, model, *tokenizers, **decoding):
        assert len(sources) == len(references)
        perfect = Path(model.name_or_path).name == "last-2"
        return references if perfect else ["ein"] * len(sources)

    monkeypatch.setattr(finish, "translate", translate)
    own = checkpoints(out)
    assert finish.choose_average_on_validation(own, out, data_args, finish_args) == own[-2:]
    assert json.loads((out / "average_on_validation.json").read_text())["chosen"] == [
        "checkpoint-8",
        "checkpoint-12",
    ]

    # And of the length penalty: the value that translates val perfectly wins; among equals, the first given.
    def translate_by_alpha(perfect_alpha):
        def translate(sources, model, *tokenizers, length_penalty, **decoding):
            return references if length_penalty == perfect_alpha else ["ein"] * len(sources)

        return translate

    finish_args = FinishArguments(length_penalty=[0.6, 1.0, 1.5])
    monkeypatch.setattr(finish, "translate", translate_by_alpha(1.0))
    assert finish.choose_length_penalty_on_validation(out / "averaged", out, data_args, finish_args) == 1.0
    monkeypatch.setattr(finish, "translate", translate_by_alpha(None))
    assert finish.choose_length_penalty_on_validation(out / "averaged", out, data_args, finish_args) == 0.6
    finish.save_decoding(out / "averaged", FinishArguments(num_beams=5, length_penalty_form="power"), 1.5)
    from transformers import GenerationConfig

    saved = GenerationConfig.from_pretrained(out / "averaged")
    assert saved.length_penalty == 1.5 and saved.length_penalty_form == "power" and saved.num_beams == 5


def test_average_choices_are_checked(tmp_path):
    from vaswani.common.errors import UsageError
    from vaswani.recipe.arguments import DataArguments, FinishArguments
    from vaswani.recipe.checks import _check_data_sources

    assert FinishArguments(average_last=5).average_last == [5]
    assert not FinishArguments(average_last=[5, 5]).chooses_average
    with pytest.raises(UsageError, match="0 \\(no averaging\\) cannot be one of several"):
        FinishArguments(average_last=[0, 5])
    with pytest.raises(UsageError, match="--average_last must be 0"):
        FinishArguments(average_last=[-1])
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"translation": {"de": "Ein Hund .", "en": "A dog ."}}) + "\n")
    data_args = DataArguments(train_file=str(train), source_lang="de", target_lang="en")
    training_args = PaperTrainingArguments(output_dir="unused", eval_strategy="no")
    with pytest.raises(
        UsageError, match="--average_last with several numbers chooses among them on validation"
    ):
        _check_data_sources(data_args, training_args, FinishArguments(average_last=[5, 10]))
    # --length_penalty: one value or several, finite, several only with validation data to choose on.
    assert FinishArguments(length_penalty=1.0).length_penalty == [1.0]
    assert not FinishArguments(length_penalty=[2.0, 2.0]).chooses_length_penalty
    with pytest.raises(UsageError, match="--length_penalty must be finite numbers"):
        FinishArguments(length_penalty=[0.6, float("inf")])
    with pytest.raises(
        UsageError, match="--length_penalty with several numbers chooses among them on validation"
    ):
        _check_data_sources(data_args, training_args, FinishArguments(length_penalty=[0.6, 1.0]))


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(corpus, tokenizer_dir, tmp_path):
    """SIGKILL after the checkpoint of step 8, resume from it: the final weights equal an uninterrupted run's
    (dropout on, so the restored random state matters too)."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    tiny_run_args = _with_tokenizer(tokenizer_dir)
    run([sys.executable, str(RUNNER), *tiny_run_args(corpus, straight, max_steps=14)])
    result = run(
        [sys.executable, str(RUNNER), *tiny_run_args(corpus, killed, max_steps=14)],
        env_extra={"VASWANI_KILL_AT_STEP": "8"},
        check=False,
    )
    assert result.returncode == -9, result.stderr[-2000:]
    assert [p.name for p in checkpoints(killed)] == ["checkpoint-4", "checkpoint-8"]
    assert not (killed / "model.safetensors").exists()
    # A checkpoint cut short while being written is skipped when resuming from "last".
    partial = killed / "checkpoint-12"
    shutil.copytree(killed / "checkpoint-8", partial)
    weights = partial / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    run(
        [
            sys.executable,
            str(RUNNER),
            *tiny_run_args(corpus, killed, max_steps=14),
            "--resume_from_checkpoint",
            "last",
        ]
    )
    # The training time counts both processes: the resumed one started from checkpoint-8's clock.
    state = json.loads((killed / "checkpoint-8" / "trainer_state.json").read_text())
    before = state["stateful_callbacks"]["TrainingClock"]["args"]["seconds_before"]
    summary = json.loads((killed / "training_summary.json").read_text())
    assert before > 0 and summary["train_runtime"] > before
    a, b = final_weights(straight), final_weights(killed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5)
    # (the resumed run overwrote the bad checkpoint-12 with a good one when it reached step 12)
    verify_checkpoint(killed / "checkpoint-12")


def test_corrupt_checkpoints_are_named(tmp_path):
    from helpers import tiny_model

    folder = tmp_path / "checkpoint-5"
    model = tiny_model()
    model.save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": {}}, folder / name)
    verify_checkpoint(folder)
    assert resolve_resume_checkpoint("last", tmp_path) == str(folder)
    assert resolve_resume_checkpoint(None, tmp_path) is None

    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-100])
    with pytest.raises(ValueError, match=r"model\.safetensors is corrupt or truncated"):
        verify_checkpoint(folder)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        resolve_resume_checkpoint(str(folder), tmp_path)
    # the only checkpoint is bad: refused, not started afresh among the old run's files
    with pytest.raises(
        ValueError, match=r"no checkpoint .* can be resumed from \(checkpoint-5.*--overwrite_output_dir"
    ):
        resolve_resume_checkpoint("last", tmp_path)
    weights.write_bytes(good)

    optimizer = folder / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:50])
    with pytest.raises(ValueError, match=r"optimizer\.pt is corrupt or truncated"):
        verify_checkpoint(folder)
    optimizer.unlink()
    (folder / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match=r"trainer_state\.json is missing"):
        verify_checkpoint(folder)
    with pytest.raises(FileNotFoundError, match="checkpoint-9"):
        verify_checkpoint(tmp_path / "checkpoint-9")


@pytest.fixture(scope="module")
def wmt_corpus(tmp_path_factory):
    """2,000 WMT-shaped pairs (`bench.synthetic_corpus`: news-like lengths, 26 words a side on average) and a joint BPE
    vocabulary of 1,000 tokens learned from them."""
    from bench.synthetic_corpus import write_corpus
    from vaswani.recipe.data import iter_text, load_parallel_dataset
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    folder = write_corpus(
        tmp_path_factory.mktemp("wmt"), 2000, "en", "de", validation=20, test=20, vocab=3000
    )
    train = load_parallel_dataset(folder, "en", "de", ["train"], cache_dir=folder / "raw-cache")["train"]
    tokenizer = train_bpe_tokenizer(iter_text(train, ["en", "de"]), vocab_size=1000, show_progress=False)
    save_tokenizers(tokenizer, tokenizer, folder / "tokenizer")
    return folder


@pytest.mark.slow
def test_two_process_ddp_on_gloo_matches_one_process(wmt_corpus, tmp_path):
    """torchrun with 2 CPU processes (gloo) on a WMT-shaped corpus with the base preset shrunk (d_model 32, 2 + 2
    layers): rank 0 reads and tokenizes the corpus once and rank 1 maps the same cache; the ranks train on different
    micro-batches, take the same number of updates and end with identical weights, equal to one process that
    accumulates 2 micro-batches per update: the same micro-batches, the same update."""
    args = [
        "--dataset_name", str(wmt_corpus), "--source_lang", "en", "--target_lang", "de", "--eval_strategy", "no",
        "--tokenizer_name", str(wmt_corpus / "tokenizer"), "--cache_dir", str(tmp_path / "cache"),
        "--preset", "base", "--d_model", "32", "--encoder_layers", "2", "--decoder_layers", "2",
        "--encoder_attention_heads", "4", "--decoder_attention_heads", "4", "--encoder_ffn_dim", "64",
        "--decoder_ffn_dim", "64", "--dropout", "0.0", "--max_tokens", "2048", "--warmup_steps", "4",
        "--max_steps", "4", "--save_strategy", "no", "--logging_steps", "2", "--seed", "7",
        "--dataloader_pin_memory", "false",
    ]  # fmt: skip
    ddp_dump, single_dump = tmp_path / "ddp", tmp_path / "single"
    launch = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", "29533", str(RUNNER)]
    run(
        [*launch, *args, "--output_dir", str(tmp_path / "ddp_run")],
        env_extra={"VASWANI_DUMP_WEIGHTS": str(ddp_dump)},
    )
    single_args = [*args, "--output_dir", str(tmp_path / "single_run"), "--gradient_accumulation_steps", "2"]
    run([sys.executable, str(RUNNER), *single_args], env_extra={"VASWANI_DUMP_WEIGHTS": str(single_dump)})
    records = [json.loads((ddp_dump / f"rank{r}.json").read_text()) for r in (0, 1)]
    single = json.loads((single_dump / "rank0.json").read_text())
    # The corpus was read and tokenized once, by rank 0; rank 1 (and the later run) mapped its cache file.
    assert (
        records[0]["tokenized_batches"] > 0
        and records[1]["tokenized_batches"] == single["tokenized_batches"] == 0
    )
    assert records[0]["cache_files"] == records[1]["cache_files"] == single["cache_files"]
    assert len(records[0]["cache_files"]) == 1 and str(tmp_path / "cache") in records[0]["cache_files"][0]
    # Different micro-batches on the two ranks, the same number of updates, one micro-batch per rank and update.
    ranks = [r["micro_batches"] for r in records]
    assert records[0]["updates"] == records[1]["updates"] == single["updates"] == 4
    assert len(ranks[0]) == len(ranks[1]) == 4 and len(single["micro_batches"]) == 8
    assert not {tuple(b) for b in ranks[0]} & {tuple(b) for b in ranks[1]}
    # The one process accumulates, update by update, the micro-batches of rank 0 and rank 1.
    assert single["micro_batches"] == [batch for pair in zip(*ranks, strict=True) for batch in pair]
    rank0, rank1 = torch.load(ddp_dump / "rank0.pt"), torch.load(ddp_dump / "rank1.pt")
    one, initial = torch.load(single_dump / "rank0.pt"), torch.load(ddp_dump / "initial0.pt")
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
        torch.testing.assert_close(rank0[key], one[key], atol=2e-5, rtol=1e-4)
    assert all(torch.equal(initial[k], torch.load(single_dump / "initial0.pt")[k]) for k in initial)
    assert any(not torch.allclose(initial[k], one[k], atol=1e-3) for k in initial)  # and training moved them


def test_time_budget_stops_training_with_a_checkpoint():
    from transformers import TrainerControl, TrainerState

    budget = TimeBudget(minutes=0.0)
    state, control = TrainerState(), TrainerControl()
    budget.on_train_begin(None, state, control)
    budget.on_step_end(None, state, control)
    assert control.should_training_stop and control.should_save
    patient, control = TimeBudget(minutes=60.0), TrainerControl()
    patient.on_train_begin(None, state, control)
    patient.on_step_end(None, state, control)
    assert not control.should_training_stop


def test_the_progress_bar_ends_where_the_run_ends(tmp_path):
    from helpers import tiny_model
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_callback import ProgressCallback

    from vaswani.recipe.callbacks import RunProgress
    from vaswani.recipe.trainer import VaswaniTrainer

    state, control = TrainerState(), TrainerControl()
    state.max_steps, state.global_step = 100000, 0
    budget = TimeBudget(minutes=0.001)  # 60 ms of a run whose --max_steps would take 40 hours
    bar = RunProgress(budget)
    budget.on_train_begin(None, state, control)  # before the bar, as the trainer adds them
    bar.on_train_begin(None, state, control)
    assert bar.training_bar.total == 1000  # per mille of the run
    time.sleep(0.1)
    state.global_step = 3
    bar.on_step_end(None, state, control)
    assert bar.training_bar.n == bar.training_bar.total  # the time budget is spent: the bar is full
    bar.on_train_end(None, state, control)
    # Without a time budget the trainer keeps transformers' bar, which counts the steps.
    settings = dict(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", eval_strategy="no", disable_tqdm=False
    )
    trainer = VaswaniTrainer(model=tiny_model(), args=PaperTrainingArguments(**settings))
    (by_steps,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)]
    assert type(by_steps) is ProgressCallback
    by_steps.on_train_begin(None, state, control)
    assert by_steps.training_bar.total == 100000
    by_steps.on_train_end(None, state, control)


def test_launch_mistakes_are_refused(monkeypatch, tmp_path):
    from vaswani.recipe.arguments import PaperTrainingArguments

    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # `accelerate launch --cpu --num_processes 2` sets these
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="starts ONE process.*--multi_gpu --num_processes N.*torchrun"):
        PaperTrainingArguments(output_dir=str(tmp_path))
    monkeypatch.delenv("MASTER_ADDR")
    PaperTrainingArguments(output_dir=str(tmp_path))  # one process asked for: fine
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--deepspeed needs a GPU.*--fsdp"):
            PaperTrainingArguments(output_dir=str(tmp_path), deepspeed=str(tmp_path / "ds.json"))
