"""The paper's WMT 2014 experiment: the argument files in recipes/, checkpoints every N minutes (--save_minutes),
WMT's two BLEU scores in the tools, and evaluation that says what it decodes and how long it takes."""

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from helpers import ROOT, tiny_tokenizer
from transformers import EvalPrediction, GenerationConfig, TrainerControl, TrainerState
from transformers.trainer_utils import IntervalStrategy

from bench.synthetic_corpus import write_corpus
from vaswani.commands.cli import parse_args, read_arguments_file
from vaswani.recipe.arguments import (
    DataArguments,
    FinishArguments,
    ModelArguments,
    ModelConfigArguments,
    PaperTrainingArguments,
    config_overrides,
)
from vaswani.recipe.callbacks import TimeBudget, TimedCheckpoints
from vaswani.recipe.checkpoints import checkpoints
from vaswani.recipe.evaluation import (
    EvaluationClock,
    describe_decoding,
    log_after_training,
    sort_by_source_length,
)
from vaswani.recipe.metrics import bleu_metric_fn, compute_bleu, compute_tokenized_bleu

RECIPES = {path.stem: path for path in sorted((ROOT / "recipes").glob("*.yaml"))}


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- --save_minutes ---------------------------------------------------------------------------------------------
def _step(callback, state, control=None):
    control = control or TrainerControl()
    state.global_step += 1
    callback.on_step_end(None, state, control)
    return control.should_save


def test_save_minutes_writes_a_checkpoint_every_interval_and_a_resumed_run_continues_it():
    clock = FakeClock()
    timed = TimedCheckpoints(minutes=10, clock=clock)
    state = TrainerState(max_steps=1000, stateful_callbacks=[timed])
    timed.on_train_begin(None, state, TrainerControl())
    saved = []
    for _ in range(25):  # a step a minute
        clock.now += 60
        if _step(timed, state):
            saved.append(state.global_step)
    assert saved == [10, 20]
    # Any checkpoint restarts the interval: one by --save_steps at step 27 moves the next timed one to step 37.
    for _ in range(2):
        clock.now += 60
        _step(timed, state)
    clock.now += 60
    by_steps = TrainerControl(should_save=True)
    _step(timed, state, by_steps)
    # What a checkpoint written now keeps in its trainer_state.json (the Trainer calls state() while saving).
    clock.now += 30
    kept = {"TimedCheckpoints": timed.state()}
    assert kept["TimedCheckpoints"]["args"] == {"minutes": 10.0, "seconds_since_save": 30.0}
    # Resumed in another process, with another clock: 9.5 minutes after the checkpoint, the interval is over.
    other = FakeClock(now=5.0)
    resumed = TimedCheckpoints(minutes=10, clock=other)
    state = TrainerState(max_steps=1000, global_step=28, stateful_callbacks=kept)
    resumed.on_train_begin(None, state, TrainerControl())
    steps = []
    for _ in range(12):
        other.now += 60
        steps.append(_step(resumed, state))
    assert steps.index(True) == 9  # 30 s before the kill + 9 minutes + 60 s: 10.5 minutes, step 38
    # The last step is always saved; a checkpoint written without the callback resumes from zero.
    last = TrainerState(max_steps=3, global_step=2, stateful_callbacks={})
    fresh = TimedCheckpoints(minutes=10, clock=FakeClock())
    fresh.on_train_begin(None, last, TrainerControl())
    assert (
        "TimedCheckpoints" in last.stateful_callbacks
    )  # so that the Trainer can store it at the next checkpoint
    assert _step(fresh, last)


@pytest.mark.parametrize("minutes", [0, -10, float("nan")])
def test_save_minutes_must_be_positive(tmp_path, minutes):
    with pytest.raises(ValueError, match="--save_minutes must be a positive number of minutes"):
        PaperTrainingArguments(output_dir=str(tmp_path), save_minutes=minutes)


def test_a_run_stopped_by_its_time_budget_evaluates_its_last_step_as_at_max_steps(tmp_path):
    args = PaperTrainingArguments(output_dir=str(tmp_path), eval_strategy="steps", eval_steps=500)
    assert args.eval_strategy == IntervalStrategy.STEPS
    budget, state, control = TimeBudget(minutes=0.0), TrainerState(global_step=7), TrainerControl()
    budget.on_train_begin(args, state, control)
    budget.on_step_end(args, state, control)
    assert control.should_training_stop and control.should_save and control.should_evaluate


# ---- the recipes ---------------------------------------------------------------------------------------------
PAPER = {  # Vaswani et al. (2017): §5.1-5.4, Table 3, §6.1
    "wmt14_en_de_base": dict(target="de", config="de-en", vocab=37000, preset="base", dropout=0.1, steps=100_000, avg=5),
    "wmt14_en_de_big": dict(target="de", config="de-en", vocab=37000, preset="big", dropout=0.3, steps=300_000, avg=20),
    "wmt14_en_fr_base": dict(target="fr", config="fr-en", vocab=32000, preset="base", dropout=0.1, steps=100_000, avg=5),
    "wmt14_en_fr_big": dict(target="fr", config="fr-en", vocab=32000, preset="big", dropout=0.1, steps=300_000, avg=20),
}  # fmt: skip


def test_the_recipes_hold_the_papers_values():
    assert set(RECIPES) == set(PAPER)
    for name, paper in PAPER.items():
        values = read_arguments_file(RECIPES[name])
        expected = {
            "dataset_name": "wmt/wmt14",  # the Hub's wmt14
            "dataset_config_name": paper["config"],
            "source_lang": "en",
            "target_lang": paper["target"],
            "train_split": "train",
            "validation_split": "validation",  # newstest2013
            "test_split": "test",  # newstest2014
            "vocab_size": paper["vocab"],
            "preset": paper["preset"],
            "dropout": paper["dropout"],
            "batch_tokens": 25000,
            "max_steps": paper["steps"],
            "paper_lr_schedule": True,
            "learning_rate_constant": 1.0,  # the peak is then the paper's, d_model^-0.5 * warmup^-0.5
            "warmup_steps": 4000,
            "adam_beta1": 0.9,
            "adam_beta2": 0.98,
            "adam_epsilon": 1e-9,
            "weight_decay": 0.0,
            "max_grad_norm": 0.0,
            "label_smoothing_factor": 0.1,
            "bf16": True,
            "save_minutes": 10,
            "save_strategy": "no",
            "average_last": paper["avg"],
            "num_beams": 4,
            "length_penalty": 0.6,
            "length_penalty_form": "gnmt",
        }
        assert {key: values.get(key) for key in expected} == expected, name
        assert values["save_total_limit"] > paper["avg"], name  # the checkpoints to average are kept
        # vaswani-train reads every entry as the flag it names (bf16 off: this machine may have no GPU).
        model, config, data, finish, training = parse_args(
            [ModelArguments, ModelConfigArguments, DataArguments, FinishArguments, PaperTrainingArguments],
            [str(RECIPES[name]), "--bf16", "false"],
            description="",
        )
        assert (model.preset, config_overrides(config), data.vocab_size) == (
            paper["preset"],
            {"dropout": paper["dropout"]},
            paper["vocab"],
        )
        assert (training.save_strategy, training.save_minutes, training.adam_epsilon) == ("no", 10, 1e-9)
        assert training.learning_rate is None and "learning_rate" not in values  # the peak is not overridden
        assert (
            training.gradient_accumulation_steps == 7
        )  # 25,000 tokens in micro-batches of 3584 on one process
        assert (finish.average_last, finish.num_beams, finish.length_penalty) == ([paper["avg"]], 4, [0.6])


def _tiny(corpus: Path, output_dir: Path) -> list[str]:
    """The recipe's sizes and data replaced by tiny ones: the synthetic corpus, a 300-token BPE, d_model 16 with
    one layer, three steps of 512 tokens, a checkpoint every step (by time), the last 2 averaged."""
    return [
        "--dataset_name", str(corpus), "--validation_split", "val", "--preprocessing_num_workers", "1",
        "--vocab_size", "300", "--d_model", "16", "--encoder_layers", "1", "--decoder_layers", "1",
        "--encoder_attention_heads", "2", "--decoder_attention_heads", "2", "--encoder_ffn_dim", "32",
        "--decoder_ffn_dim", "32", "--max_tokens", "512", "--batch_tokens", "512", "--warmup_steps", "2",
        "--max_steps", "3", "--save_minutes", "0.00001", "--save_total_limit", "3", "--average_last", "2",
        "--bf16", "false", "--logging_steps", "1", "--plots", "false", "--output_dir", str(output_dir),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """WMT14-shaped synthetic corpora standing in for the Hub's wmt14: train, val and test splits."""
    folder = tmp_path_factory.mktemp("wmt14")
    return {
        target: write_corpus(
            folder / target, pairs=300, src="en", tgt=target, validation=20, test=20, vocab=200
        )
        for target in ("de", "fr")
    }


@pytest.fixture
def one_thread():
    """Tiny models run thousands of tiny kernels: on a busy machine, torch's threads waiting for each other at every
    one of them cost more than the work (10x here), so these runs take one thread, as the subprocess runs do."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_each_recipe_runs_end_to_end_at_tiny_sizes(name, corpora, tmp_path, caplog, capsys, one_thread):
    from vaswani.commands import train as train_command

    paper, out = PAPER[name], tmp_path / "run"
    caplog.set_level(logging.INFO, logger="vaswani")
    train_command.main([str(RECIPES[name]), *_tiny(corpora[paper["target"]], out)])
    # Checkpoints by time (every step here), the last 2 averaged, the test split translated with beam 4 and scored.
    assert [c.name for c in checkpoints(out)] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert "TimedCheckpoints" in state["stateful_callbacks"]
    assert any(
        "eval_bleu" in entry for entry in state["log_history"]
    )  # the final evaluation of the last step
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["dropout"]) == (16, paper["dropout"])
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 3 and summary["label_smoothing"] == 0.1
    results = json.loads((out / "test_results.json").read_text())
    assert results["averaged_checkpoints"] == ["checkpoint-2", "checkpoint-3"]
    assert (results["split"], results["num_beams"], results["length_penalty"]) == ("test", 4, 0.6)
    assert "tok:13a" in results["bleu_signature"] and "compounds split" in results["bleu_tokenized_signature"]
    hypotheses = (out / "averaged" / f"test.hyp.{paper['target']}").read_text().splitlines()
    assert len(hypotheses) == 20
    printed = capsys.readouterr().out
    assert "test: BLEU" in printed and "(sacreBLEU, detokenized)" in printed
    # Scores of a WMT-shaped synthetic corpus are compared with nothing published (Multi30k's, the paper's Table 2).
    assert "Multi30k" not in printed and "newstest2014 figures" not in printed
    assert f"tokenized BLEU, compounds split (the paper's measure, comparable only with the same measure on test of " \
        f"{corpora[paper['target']]}; never with sacreBLEU)" in printed  # fmt: skip
    log = caplog.text
    assert "After training (step 3): a final evaluation of 20 pairs, greedy, 64 a batch (1 batch)" in log
    assert "the average of the last 2 checkpoints; the test translation of 20 pairs, beam 4" in log
    assert (
        "Evaluating: decoding 20 pairs, greedy, 64 a batch (1 batch), at most source length + 50 new" in log
    )
    assert "Evaluation of 20 pairs took" in log


def test_the_summary_compares_each_figure_only_with_figures_of_its_own_data():
    from vaswani.commands.train import comparable_to

    moses, paper = comparable_to({"dataset": "../shared/data/multi30k", "split": "test_2016_flickr"})
    assert moses == "the convention of published Multi30k figures, comparable with them on test_2016_flickr"
    assert paper == (
        "the paper's measure, comparable only with the same measure on test_2016_flickr of ../shared/data/multi30k; "
        "never with sacreBLEU"
    )
    moses, paper = comparable_to({"dataset": "wmt14", "split": "test"})
    assert moses == "comparable only with the same measure on test of wmt14"
    assert paper == "the paper's measure, comparable with its newstest2014 figures; never with sacreBLEU"
    # --max_predict_samples, or another split: not the published figure
    for split in ("test[:100]", "validation"):
        moses, paper = comparable_to({"dataset": "wmt14", "split": split})
        assert "newstest2014" not in paper
    moses, _ = comparable_to({"dataset": "bentrevett/multi30k", "split": "test[:100]"})
    assert "Multi30k" not in moses


# ---- WMT's metrics in the tools ------------------------------------------------------------------------------
# Worked by hand. sacreBLEU's 13a keeps "rot-weißes" whole: 7 tokens a side, 6/7 unigrams, 4/6 bigrams, 3/5 trigrams
# and 2/4 four-grams match. The paper's BLEU (get_ende_bleu.sh) splits it, "rot ##AT##-##AT## weißes": 9 tokens,
# 8/9, 6/8, 5/7, 4/6. Lengths are equal: no brevity penalty.
HYPOTHESIS, REFERENCE = "Der Mann fährt ein rot-weißes Rad.", "Der Mann fährt ein rot-weißes Fahrrad."
SACREBLEU = 100 * (6 / 7 * 4 / 6 * 3 / 5 * 2 / 4) ** 0.25  # 64.34
TOKENIZED = 100 * (8 / 9 * 6 / 8 * 5 / 7 * 4 / 6) ** 0.25  # 75.06


def test_the_worked_example():
    assert compute_bleu([HYPOTHESIS], [REFERENCE])["bleu"] == pytest.approx(SACREBLEU)
    assert compute_tokenized_bleu([HYPOTHESIS], [REFERENCE], "de")["bleu"] == pytest.approx(TOKENIZED)


def _wmt_lines(text: str) -> dict:
    lines = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    return {name: (float(value.split("\t")[0]), value.split("\t")[1]) for name, value in lines.items()}


def test_evaluate_reports_sacrebleu_and_the_papers_tokenized_bleu(tmp_path, capsys):
    from vaswani.commands.evaluate import main as evaluate_main

    hypotheses, references = tmp_path / "hyp.de", tmp_path / "ref.de"
    hypotheses.write_text(HYPOTHESIS + "\n")
    references.write_text(REFERENCE + "\n")
    evaluate_main(["--hypotheses", str(hypotheses), "--references", str(references), "--moses_lang", "de"])
    lines = _wmt_lines(capsys.readouterr().out)
    bleu, signature = lines["BLEU"]
    assert bleu == pytest.approx(SACREBLEU, abs=0.005) and "|tok:13a|" in signature
    tokenized, signature = lines["BLEU (tokenized, compounds split, de: the paper's WMT BLEU)"]
    assert tokenized == pytest.approx(TOKENIZED, abs=0.005)
    assert (
        "|case:mixed|" in signature and "|tok:none|smooth:none|" in signature and "##AT##-##AT##" in signature
    )


def test_translate_with_references_reports_both_bleus(tmp_path, capsys, monkeypatch):
    """`vaswani-translate --references --moses_lang de` scores what it translated: here a model folder stands in,
    and the translation is the worked example's hypothesis."""
    from helpers import tiny_model

    from vaswani.commands import translate as translate_command
    from vaswani.recipe import translation
    from vaswani.recipe.translation import Hypothesis

    folder = tmp_path / "model"
    tokenizer = tiny_tokenizer()
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    monkeypatch.setattr(
        translation,  # vaswani-translate imports it from here when it runs
        "translate_n_best",
        lambda sentences, *args, **kwargs: [[Hypothesis(HYPOTHESIS, 0.0)] for _ in sentences],
    )
    source, references, results = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "results.json"
    source.write_text("The man rides a red-and-white bike.\n")
    references.write_text(REFERENCE + "\n")
    translate_command.main(
        ["--model_name_or_path", str(folder), "--input", str(source), "--output", str(tmp_path / "hyp.de")]
        + ["--references", str(references), "--moses_lang", "de", "--results_json", str(results)]
    )
    lines = _wmt_lines(capsys.readouterr().err)
    assert lines["BLEU"][0] == pytest.approx(SACREBLEU, abs=0.005)
    assert lines["BLEU (tokenized, compounds split, de: the paper's WMT BLEU)"][0] == pytest.approx(
        TOKENIZED, abs=0.005
    )
    record = json.loads(results.read_text())
    assert record["bleu_tokenized"] == pytest.approx(TOKENIZED) and record["bleu"] == pytest.approx(SACREBLEU)


# ---- bounded evaluation -----------------------------------------------------------------------------------------
def test_the_validation_split_sorted_by_source_length_keeps_its_bleu():
    tokenizer = tiny_tokenizer()
    sources = ["Ein Mann.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.", "Kinder."]
    targets = ["A man.", "Two dogs play in the snow.", "A woman reads a book in the park.", "Children."]
    hypotheses = ["A man.", "Two dogs play in snow.", "A woman reads in the park.", "Kids."]
    raw = Dataset.from_dict({"de": sources, "en": targets, "hyp": hypotheses})
    tokenized = raw.map(lambda row: {"input_ids": tokenizer(row["de"])["input_ids"]})
    sorted_tokenized, sorted_raw = sort_by_source_length(tokenized, raw)
    lengths = [len(ids) for ids in sorted_tokenized["input_ids"]]
    assert lengths == sorted(lengths, reverse=True) and sorted_raw["de"][0] == sources[2]
    assert sorted_tokenized["de"] == sorted_raw["de"]  # the references follow their sources

    def scores(split):  # the Trainer's predictions come in the order of the split
        ids = tokenizer(list(split["hyp"]), padding=True, return_tensors="np")["input_ids"]
        return bleu_metric_fn(tokenizer, list(split["en"]))(EvalPrediction(predictions=ids, label_ids=ids))

    assert scores(sorted_raw) == scores(raw)
    assert 0 < scores(raw)["bleu"] < 100
    with pytest.raises(ValueError, match="must align"):
        sort_by_source_length(tokenized, raw.select(range(3)))


def test_each_evaluation_says_what_it_decodes_and_how_long_it_should_take(caplog):
    caplog.set_level(logging.INFO, logger="vaswani")
    clock = FakeClock()
    timer = EvaluationClock(clock=clock)
    what = describe_decoding(3000, 1, 64, processes=2)
    assert what == "3000 pairs, greedy, 64 a batch on each of 2 processes (24 batches each), at most source " \
        "length + 50 new tokens"  # fmt: skip
    with timer.timing(3000, what):
        clock.now += 60
    with timer.timing(3000, what):
        clock.now += 30
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        f"Evaluating: decoding {what}; its time is logged when it ends",
        "Evaluation of 3000 pairs took 60 s (50.0 pairs/s)",
        f"Evaluating: decoding {what}; about 60 s at the last evaluation's 50.0 pairs/s",
        "Evaluation of 3000 pairs took 30 s (100.0 pairs/s)",
    ]


def test_what_runs_after_the_time_budget_is_said_up_front_and_timed_once_measured(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vaswani")
    clock = FakeClock()
    args = PaperTrainingArguments(
        output_dir=str(tmp_path), max_train_minutes=2, max_steps=100000, eval_strategy="steps", eval_steps=1000
    )
    trainer = SimpleNamespace(  # a process other than the main one, which times nothing before training
        args=args,
        eval_dataset=Dataset.from_dict({"input_ids": [[5, 6, 2]] * 3000}),
        model=SimpleNamespace(generation_config=GenerationConfig()),
        evaluation_clock=EvaluationClock(clock=clock),
        is_world_process_zero=lambda: False,
    )
    log_after_training(trainer, FinishArguments(average_last=5), None, ["Ein Hund ."] * 3003, tiny_tokenizer())
    assert caplog.records[-1].getMessage() == (
        "After the 2-minute budget (or step 100000, if sooner): a final evaluation of 3000 pairs, greedy, 64 a batch "
        "(47 batches), at most source length + 50 new tokens; the average of the last 5 checkpoints; the test "
        "translation of 3003 pairs, beam 4, 64 a batch (47 batches), at most source length + 50 new tokens. How "
        "long these take is logged once an evaluation has measured the decoding rate"
    )
    timer = trainer.evaluation_clock
    with timer.timing(3000, "3000 pairs"):
        clock.now += 100  # 30 pairs/s greedy: beam 4 estimated at a third, 10 pairs/s
    assert caplog.records[-1].getMessage() == (
        "After the 2-minute budget (or step 100000, if sooner): a final evaluation of 3000 pairs, greedy, 64 a batch "
        "(47 batches), at most source length + 50 new tokens (~100 s); the average of the last 5 checkpoints; the "
        "test translation of 3003 pairs, beam 4, 64 a batch (47 batches), at most source length + 50 new tokens "
        "(~5.0 min); about 6.7 min in all (beam search estimated at 3x the measured greedy time per pair, on one "
        "process)"
    )


def test_evaluation_decodes_64_pairs_a_batch_by_default(tmp_path):
    assert (
        PaperTrainingArguments(output_dir=str(tmp_path)).per_device_eval_batch_size == 64
    )  # transformers': 8
