"""`vaswani-train`'s run as a user meets it: its flags mean what they mean in transformers' examples and
fairseq, a run folder belongs to one run and holds nothing else of the user's, resuming keeps what a run wrote,
a run that cannot be what was asked is refused with a one-line error before any file is written, and no secret
is written."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from helpers import BIN, ROOT, TOKEN, assert_one_line_error, invoke, run_args
from packaging import version
from safetensors.torch import load_file

from vaswani.commands import train as train_command
from vaswani.common.errors import UsageError
from vaswani.recipe.checkpoints import checkpoints, resolve_resume_checkpoint, verify_checkpoint
from vaswani.recipe.schedule import resolve_peak_learning_rate, warmup_factor


# ---------------------------------------------------------------------------------------------------------------------
# One run per folder, refused runs, resuming, secrets
# ---------------------------------------------------------------------------------------------------------------------
def test_a_run_folder_belongs_to_one_run(finished_run, corpus, tmp_path, capsys):
    """Re-running into an existing run folder is refused; --overwrite_output_dir replaces the run, so that neither
    a checkpoint nor the scores of the earlier run end up beside the new model."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    code, _, err = invoke(train_command.main, run_args(corpus, out, "--max_steps", "4"), capsys)
    assert_one_line_error(
        code, err, "already holds a run", "--resume_from_checkpoint", "--overwrite_output_dir"
    )
    assert [p.name for p in checkpoints(out)] == ["checkpoint-4", "checkpoint-8"]  # untouched

    code, _, err = invoke(
        train_command.main,
        run_args(corpus, out, "--max_steps", "6", "--save_steps", "3", "--average_last", "3", "--seed", "4")
        + ["--overwrite_output_dir"],
        capsys,
    )
    assert code == 0, err[-3000:]
    assert [p.name for p in checkpoints(out)] == ["checkpoint-3", "checkpoint-6"]
    assert not (out / "test_results.json").exists()  # this run scored nothing
    assert "Averaging 2 checkpoints: checkpoint-3, checkpoint-6" in err
    averaged = load_file(out / "averaged" / "model.safetensors")
    c3, c6 = (load_file(out / f"checkpoint-{s}" / "model.safetensors") for s in (3, 6))
    key = "model.encoder.layers.0.fc1.weight"
    torch.testing.assert_close(averaged[key], (c3[key] + c6[key]) / 2)


def test_resuming_a_finished_run_trains_nothing_and_keeps_its_results(finished_run, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    final = (out / "model.safetensors").read_bytes()
    averaged = load_file(out / "averaged" / "model.safetensors")
    args = run_args(corpus, out, "--max_steps", "8", "--save_steps", "4", "--average_last", "2")
    code, _, err = invoke(train_command.main, args + ["--resume_from_checkpoint", "last"], capsys)
    assert code == 0, err[-3000:]
    assert "already reached --max_steps 8" in err
    assert [p.name for p in checkpoints(out)] == ["checkpoint-4", "checkpoint-8"]
    assert (out / "model.safetensors").read_bytes() == final
    assert "Averaging 2 checkpoints: checkpoint-4, checkpoint-8" in err
    for key, tensor in load_file(out / "averaged" / "model.safetensors").items():
        assert torch.equal(tensor, averaged[key]), key
    # killed after its last checkpoint but before the final model was written: the model comes from the checkpoint
    (out / "model.safetensors").unlink()
    code, _, err = invoke(train_command.main, args + ["--resume_from_checkpoint", "last"], capsys)
    assert code == 0, err[-3000:]
    assert (out / "model.safetensors").read_bytes() == (
        out / "checkpoint-8" / "model.safetensors"
    ).read_bytes()


def test_a_checkpoint_with_a_truncated_config_is_skipped_on_resume(finished_run, tmp_path):
    run = tmp_path / "run"
    for step in (4, 8):
        shutil.copytree(finished_run / f"checkpoint-{step}", run / f"checkpoint-{step}")
    config = run / "checkpoint-8" / "config.json"
    config.write_text(config.read_text()[:40])
    with pytest.raises(ValueError, match=r"checkpoint-8/config\.json is corrupt or truncated"):
        verify_checkpoint(run / "checkpoint-8")
    assert resolve_resume_checkpoint("last", run) == str(run / "checkpoint-4")


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--max_steps", "-5"], "--max_steps"),
        (["--max_steps", "0"], "--max_steps"),
        (["--num_train_epochs", "0"], "--num_train_epochs"),
        (["--max_steps", "10", "--max_train_minutes", "0"], "--max_train_minutes"),
        (["--max_steps", "10", "--lr_cooldown_fraction", "1"], "--lr_cooldown_fraction"),
    ],
)
def test_runs_of_no_length_are_refused(corpus, tmp_path, capsys, flags, named):
    code, _, err = invoke(train_command.main, run_args(corpus, tmp_path / "run", *flags), capsys)
    assert_one_line_error(code, err, named)
    assert not (tmp_path / "run").exists()


def test_fp16_without_a_gpu_is_refused(corpus, tmp_path, capsys, monkeypatch):
    """`--fp16` on a CPU trained in float32 (Accelerate runs no fp16 mixed precision there) while the training summary
    said "fp16 autocast"."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)  # this machine's GPU, if any, aside
    code, _, err = invoke(train_command.main, run_args(corpus, tmp_path / "run", "--max_steps", "2", "--fp16"), capsys)
    assert_one_line_error(code, err, "--fp16 needs a GPU", "--bf16")
    assert not (tmp_path / "run").exists()


def test_bad_data_files_are_named(corpus, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train.de").write_text("")
    (empty / "train.en").write_text("")
    code, _, err = invoke(train_command.main, run_args(empty, tmp_path / "r1", "--max_steps", "2"), capsys)
    assert_one_line_error(code, err, "train.de", "train.en", "empty")

    latin1 = tmp_path / "latin1"
    shutil.copytree(corpus, latin1)
    lines = (latin1 / "train.de").read_bytes().split(b"\n")
    lines[41] = "Ein Mädchen läuft .".encode("latin-1")
    (latin1 / "train.de").write_bytes(b"\n".join(lines))
    code, _, err = invoke(train_command.main, run_args(latin1, tmp_path / "r2", "--max_steps", "2"), capsys)
    assert_one_line_error(code, err, "train.de, line 42: not UTF-8")


def test_model_config_and_language_errors_come_before_any_data_is_read(corpus, tmp_path, capsys, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data was read before the flags were checked")

    monkeypatch.setattr("vaswani.recipe.run.load_split", no_data)
    cases = [
        (["--d_model", "15"], "d_model"),  # not divisible by the 2 heads
        (["--encoder_attention_heads", "7"], "d_model"),
        (["--dropout", "1.5"], "dropout"),
        (["--preset", "huge"], "--preset"),
        (["--source_lang", "en"], "--source_lang and --target_lang"),
        (["--model_name_or_path", tmp_path / "nowhere"], "--model_name_or_path"),
        (["--do_train", "false"], "--do_train"),
        (["--dataset_name", "./missing-folder"], "--dataset_name"),
        (["--train_file", tmp_path / "missing"], "--train_file"),
    ]
    for extra, named in cases:
        args = run_args(corpus, tmp_path / "run", "--max_steps", "2", *extra)
        code, _, err = invoke(train_command.main, args, capsys)
        assert_one_line_error(code, err, named)


@pytest.mark.parametrize("flag", ["--tokenizer_name", "--model_name_or_path"])
def test_a_vocab_size_the_tokenizer_given_contradicts_is_refused(flag, model_dir, corpus, tmp_path, capsys):
    """`--vocab_size 2000 --tokenizer_name` of an 8000-token BPE trained with 8000 tokens without a word: the flag
    sizes a BPE trained for the run, and no BPE trained with it has more tokens."""
    argv = ["--dataset_name", corpus, "--source_lang", "de", "--target_lang", "en", "--max_steps", "1"]
    argv += [flag, model_dir, "--vocab_size", "200", "--output_dir", tmp_path / "run"]
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, f"--vocab_size 200, but {flag} {model_dir} brings a vocabulary of 300 tokens")
    assert not (tmp_path / "run").exists()


def test_default_logs_are_quiet(corpus, tmp_path, capfd):
    capfd.readouterr()
    train_command.main(run_args(corpus, tmp_path / "run", "--max_steps", "4", "--save_steps", "2"))
    _, err = capfd.readouterr()
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert "VaswaniConfig {" not in err and "Model config" not in err  # the configuration is never dumped
    assert len([line for line in lines if " INFO " in line or " WARNING " in line]) < 20, err
    assert "Writing model shards" not in err and "Loading weights" not in err


def test_do_predict_translates_the_test_split_and_do_eval_evaluates_at_the_end(
    finished_run, corpus, tmp_path
):
    out = tmp_path / "run"
    train_command.main(
        run_args(corpus, out, "--max_steps", "2", "--save_steps", "2", "--do_eval", "--do_predict")
        + ["--test_file", str(Path(corpus) / "val")]
    )
    assert json.loads((out / "test_results.json").read_text())["split"] == "val"
    assert "eval_bleu" in json.loads((out / "eval_results.json").read_text())


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_trains_the_model_as_one_process_does(corpus, tmp_path):
    """torchrun, 2 CPU processes on gloo, `--fsdp` (torch's FSDP2 through Accelerate's plugin): the saved model
    equals one process accumulating the same 2 micro-batches per step (measured: 3e-6; tolerance 2e-5)."""
    common = run_args(corpus, "OUT", "--max_steps", "6", "--save_steps", "3", "--dropout", "0.0")
    common.remove("--output_dir")
    common.remove("OUT")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    from vaswani.recipe.data import read_lines
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    lines = [*read_lines(corpus / "train.de"), *read_lines(corpus / "train.en")]
    tokenizer = train_bpe_tokenizer(iter(lines), vocab_size=300, show_progress=False)
    save_tokenizers(tokenizer, tokenizer, tmp_path / "tokenizer")
    common += ["--tokenizer_name", str(tmp_path / "tokenizer")]
    torchrun = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", "29547", "-m"]
    fsdp = subprocess.run(
        [*torchrun, "vaswani.commands.train", *map(str, common), "--output_dir", str(tmp_path / "fsdp"), "--fsdp", "full_shard"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if version.parse(transformers.__version__) < version.parse("5.8"):  # its --fsdp is FSDP1: refused, no folder
        assert fsdp.returncode != 0 and "--fsdp on CPU processes needs transformers >= 5.8" in fsdp.stderr
        assert not (tmp_path / "fsdp").exists()
        return
    assert fsdp.returncode == 0, fsdp.stderr[-4000:]
    assert "FSDP2 on 2 CPU processes" in fsdp.stderr
    single = subprocess.run(
        [str(BIN / "vaswani-train"), *map(str, common), "--output_dir", str(tmp_path / "single")]
        + ["--gradient_accumulation_steps", "2"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-4000:]
    sharded, one = (load_file(tmp_path / name / "model.safetensors") for name in ("fsdp", "single"))
    assert sharded.keys() == one.keys()  # the tied matrix saved once, as without FSDP
    for key in one:
        torch.testing.assert_close(sharded[key], one[key], atol=2e-5, rtol=1e-4)
    # its checkpoints resume-check and carry the model's code, not torch's FSDP module
    verify_checkpoint(tmp_path / "fsdp" / "checkpoint-6")
    config = json.loads((tmp_path / "fsdp" / "checkpoint-6" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"
    assert not list((tmp_path / "fsdp").rglob("_fsdp_*.py"))


class _RunsCode:
    """Unpickling this creates a file: proof that a pickle was loaded with `weights_only=False`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_checking_a_checkpoint_runs_no_code_from_it(finished_run, tmp_path):
    checkpoint = tmp_path / "checkpoint-8"
    shutil.copytree(finished_run / "checkpoint-8", checkpoint)
    marker = tmp_path / "code-ran"
    torch.save(
        {"state": _RunsCode(marker)}, checkpoint / "optimizer.pt"
    )  # a file transformers loads on resume
    torch.save(_RunsCode(marker), checkpoint / "dropped.pt")  # a file nothing should open
    torch.save(_RunsCode(marker), checkpoint / "extra.pth")
    verify_checkpoint(checkpoint)  # the archives are intact: the check passes...
    assert not marker.exists()  # ...without unpickling anything
    assert resolve_resume_checkpoint("last", tmp_path) == str(checkpoint)
    assert not marker.exists()


def test_the_hub_token_is_never_written_to_disk(finished_run):
    offenders = [p for p in finished_run.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert offenders == []
    assert (
        finished_run / "training_args.bin"
    ).is_file()  # the Trainer's own file is still written, without it


# ---------------------------------------------------------------------------------------------------------------------
# vaswani-train with the habits of transformers' examples and fairseq
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    """A finished run of 8 steps (checkpoints at 4 and 8) that translated its val split: (folder, trainer, what it
    printed)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        trainer = train_command.main(
            run_args(corpus, out, "--max_steps", "8", "--save_steps", "4", "--test_split", "val")
        )
    return out, trainer, printed.getvalue()


def _copy(run, tmp_path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _logged_rates(trainer) -> dict[int, float]:
    return {e["step"]: e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e}


def test_fine_tuning_as_run_translation_does_gets_its_learning_rate_and_batch_size(
    finished, corpus, tmp_path, capsys
):
    """`--per_device_train_batch_size 16 --learning_rate 5e-5` means what it means in run_translation.py: batches of
    16 sentences, and 5e-5 as the peak of the schedule; a run that ends inside the warm-up says so."""
    model, _, _ = finished
    argv = [
        "--model_name_or_path", model, "--do_train", "--per_device_train_batch_size", "16", "--learning_rate", "5e-5",
        "--max_steps", "10", "--dataset_name", corpus, "--validation_split", "val", "--source_lang", "de",
        "--target_lang", "en", "--eval_strategy", "no", "--logging_steps", "2", "--plots", "false",
        "--output_dir", tmp_path / "tuned",
    ]  # fmt: skip
    trainer = train_command.main(list(map(str, argv)))
    err = capsys.readouterr().err
    assert "Batches: batches of 16 sentences per device (--per_device_train_batch_size)" in err
    assert "Token-budget" not in err
    rates = _logged_rates(trainer)
    assert rates == pytest.approx({step: 5e-5 * warmup_factor(step, 4000) for step in (2, 4, 6, 8, 10)})
    assert (
        "--max_steps 10 ends the run inside the 4000 warm-up steps" in err and "not to the peak 5e-05" in err
    )
    # 120 pairs: 7 batches of 16 and one of 8 an epoch; 10 steps saw 120 + 2 * 16 sentences, and say so
    final = trainer.state.log_history[-1]
    assert final["train_samples"] == 152
    assert final["train_samples_per_second"] == pytest.approx(152 / final["train_runtime"], rel=1e-3)


def test_token_budget_batches_report_what_they_trained_on(finished):
    """`train_samples_per_second` counted 8 sentences (the unused --per_device_train_batch_size) per token-budget
    batch; it counts the sentences of the batches, and `train_tokens_per_second` their target tokens."""
    _, trainer, _ = finished
    batches = list(trainer.token_sampler())[:8]  # epoch 0: the 8 steps of the run
    labels = trainer.train_dataset["labels"]
    final = trainer.state.log_history[-1]
    assert final["train_samples"] == sum(len(b) for b in batches) != 8 * 8
    assert final["train_tokens"] == sum(len(labels[i]) for b in batches for i in b)
    assert final["train_tokens_per_second"] == pytest.approx(
        final["train_tokens"] / final["train_runtime"], rel=1e-3
    )


def test_batches_follow_the_flags_given(tmp_path, corpus, capsys):
    from vaswani.recipe.arguments import PaperTrainingArguments

    def args(**given):
        return PaperTrainingArguments(output_dir=str(tmp_path), **given)

    paper, sentences, both = (
        args(),
        args(per_device_train_batch_size=16),
        args(per_device_train_batch_size=3, max_tokens=96),
    )
    assert (paper.max_tokens, paper.max_sentences) == (4096, None)
    assert (sentences.max_tokens, sentences.per_device_train_batch_size) == (None, 16)
    assert (both.max_tokens, both.max_sentences) == (96, 3)
    trainer = train_command.main(
        run_args(
            corpus,
            tmp_path / "run",
            "--max_steps",
            "6",
            "--save_steps",
            "6",
            "--per_device_train_batch_size",
            "3",
        )
    )
    assert "token-budget batches of at most 96 tokens and 3 sentences per device" in capsys.readouterr().err
    assert all(len(batch) <= 3 for batch in trainer.token_sampler())
    assert trainer.state.log_history[-1]["train_samples"] <= 6 * 3


def test_the_learning_rate_flags_of_transformers_tensor2tensor_and_fairseq(tmp_path, corpus, capsys):
    """--learning_rate is the peak (transformers), --learning_rate_constant the multiplier of Eq. 3 (tensor2tensor, and
    this tool's --learning_rate before), --lr fairseq's name of the peak; a prefix is never another flag."""
    from vaswani.commands.cli import parse_args
    from vaswani.recipe.arguments import PaperTrainingArguments

    def parsed(*argv):
        return parse_args(PaperTrainingArguments, ["--output_dir", str(tmp_path), *argv], description="")[0]

    assert parsed("--lr", "3e-4").learning_rate == 3e-4
    constant = parsed("--learning_rate_constant", "0.5")
    assert resolve_peak_learning_rate(constant, 256) == pytest.approx(0.5 * 256**-0.5 * 4000**-0.5)
    with pytest.raises(UsageError, match="unrecognized arguments: --learning_rat"):
        parsed("--learning_rat", "3e-4")
    assert parsed("--paper_lr_schedule", "false").learning_rate == 5e-5  # transformers' default there
    for argv, named in (
        (
            ["--learning_rate", "1e-3", "--learning_rate_constant", "2"],
            "--learning_rate 0.001 and --learning_rate_constant 2.0",
        ),
        (["--learning_rate", "-1"], "--learning_rate must be a positive number"),
        (["--label_smoothing_factor", "1.5"], "--label_smoothing_factor"),
        (["--save_steps", "0"], "--save_steps must be positive"),
        (["--max_tokens", "0"], "--max_tokens must be positive, got 0"),  # the sampler's token budget
        (["--max_tokens", "40", "--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be positive"),
        (["--lr_scheduler_type", "cosine"], "add --paper_lr_schedule false to use it"),  # not ignored
    ):
        code, _, err = invoke(
            train_command.main, run_args(corpus, tmp_path / "run", "--max_steps", "2", *argv), capsys
        )
        assert_one_line_error(code, err, named)
    assert not (tmp_path / "run").exists()


def test_an_invalid_hub_model_id_is_refused_before_any_data_is_read(tmp_path, corpus, capsys, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data was read before the flags were checked")

    monkeypatch.setattr("vaswani.recipe.run.load_split", no_data)
    argv = ["--max_steps", "2", "--push_to_hub", "--hub_model_id", "me/not a valid id"]
    code, _, err = invoke(train_command.main, run_args(corpus, tmp_path / "run", *argv), capsys)
    assert_one_line_error(code, err, "--hub_model_id", "not a valid id")


def test_an_undertrained_run_says_its_translations_are_empty_and_where_they_are(finished):
    out, _, printed = finished
    hypotheses = out / "val.hyp.en"
    empty = sum(1 for line in hypotheses.read_text().splitlines() if not line.strip())
    assert empty > 4  # 8 steps: most translations are empty
    assert f"translations: {hypotheses}" in printed
    assert (
        f"warning: {empty} of the 8 test translations are empty: the model is undertrained (8 training steps)"
        in printed
    )
    assert json.loads((out / "test_results.json").read_text())["empty_translations"] == empty


def test_a_barely_trained_run_says_up_front_what_follows_and_names_its_repeated_output(
    corpus, tmp_path, capsys
):
    """A short run times what follows training (validation, the beam-4 test translation) before training starts, names
    the flags that cap or skip the test pass, and warns by name of output that repeats one token to the length
    limit."""
    out = tmp_path / "run"
    argv = run_args(
        corpus,
        out,
        "--max_steps",
        "1",
        "--save_steps",
        "1",
        "--test_split",
        "val",
        "--max_train_minutes",
        "0.001",
    )
    code, printed, err = invoke(
        train_command.main, argv + ["--eval_strategy", "steps", "--eval_steps", "1"], capsys
    )
    assert code == 0, err[-3000:]
    (plan,) = [
        line for line in err.splitlines() if "in all (decoder steps timed on the untrained model" in line
    ]
    assert (
        "a final evaluation of 8 pairs, greedy" in plan and "the test translation of 8 pairs, beam 4" in plan
    )
    assert err.index(plan) < err.index("Evaluating: decoding")  # before training
    assert "more than the 0.001-minute training budget" in err
    assert "--max_predict_samples N translates the first N test pairs only, --do_predict false none" in err
    results = json.loads((out / "test_results.json").read_text())
    assert results["repeated_translations"] == 8 and results["empty_translations"] == 0
    assert 'warning: 8 of the 8 test translations repeat one token over and over (the first: "' in printed
    assert "the model is undertrained (1 training step)" in printed

    code, printed, err = invoke(
        train_command.main, argv + ["--overwrite_output_dir", "--max_predict_samples", "3"], capsys
    )
    assert code == 0, err[-3000:]
    results = json.loads((out / "test_results.json").read_text())
    assert (results["split"], results["sentences"]) == ("val[:3]", 3)  # not the val split's figure
    assert len((out / "val.hyp.en").read_text().splitlines()) == 3
    assert "\nval[:3]: BLEU" in printed

    code, printed, err = invoke(
        train_command.main, argv + ["--overwrite_output_dir", "--do_predict", "false"], capsys
    )
    assert code == 0, err[-3000:]
    assert "--do_predict false: --test_split val is not translated after training" in err
    assert not (out / "test_results.json").exists() and "BLEU" not in printed


# ---------------------------------------------------------------------------------------------------------------------
# A run's folder: what --overwrite_output_dir deletes, one run at a time, resuming
# ---------------------------------------------------------------------------------------------------------------------
USERS_FILES = {
    "source/main.c": "int main(void) { return 0; }\n",
    "runs/exp1/log.txt": "step 1 loss 9.1\n",
    "paper_results.json": '{"bleu": 27.3}\n',
    "config.json": '{"model_type": "bert", "hidden_size": 768}\n',
}


def _write(folder: Path, files: dict) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_overwrite_output_dir_refuses_a_folder_of_the_users_own_work(corpus, tmp_path, capsys):
    """`--overwrite_output_dir` replaces only a run's own files: a folder of the user's own work is refused and kept."""
    work = tmp_path / "work"
    _write(work, USERS_FILES)
    code, _, err = invoke(
        train_command.main, run_args(corpus, work, "--max_steps", "2", "--overwrite_output_dir"), capsys
    )
    assert_one_line_error(
        code, err, f"--output_dir {work} holds files that are not a vaswani run", "config.json"
    )
    assert {p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()} == set(USERS_FILES)
    assert all((work / name).read_text() == text for name, text in USERS_FILES.items())


def test_overwrite_output_dir_removes_only_what_a_run_wrote(finished, corpus, tmp_path, capsys):
    """A run's folder (here of a run from before the marker) that also holds the user's files: the earlier run's
    files go, the user's stay, and the tool names what it kept. A user's file inside a folder that runs replace
    whole (a checkpoint) is named and nothing is removed."""
    out = _copy(finished[0], tmp_path)
    (out / ".vaswani-run.json").unlink()
    mine = {
        name: text for name, text in USERS_FILES.items() if name != "config.json"
    }  # the run's own is there
    _write(out, {**mine, "checkpoint-8/notes.txt": "the best one\n"})
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))  # the earlier run's lock file too
    argv = ["--max_steps", "2", "--save_steps", "2", "--overwrite_output_dir"]
    code, _, err = invoke(train_command.main, run_args(corpus, out, *argv), capsys)
    assert_one_line_error(code, err, "checkpoint-8/notes.txt", "move them out", "nothing was removed")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    (out / "checkpoint-8" / "notes.txt").rename(tmp_path / "notes.txt")
    code, _, err = invoke(train_command.main, run_args(corpus, out, *argv), capsys)
    assert code == 0, err[-3000:]
    assert all((out / name).read_text() == text for name, text in mine.items())
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (out / "test_results.json").exists() and not (out / "val.hyp.en").exists()
    assert "Left in" in err and "paper_results.json" in err and "runs/exp1/log.txt" in err


def test_a_second_run_into_a_folder_in_use_is_refused_at_once(corpus, tmp_path, capsys):
    """A run holds its folder's lock: a second run into it is refused at once (here the lock is held by a process
    that took the tool's lock and is then killed with SIGKILL, which releases it)."""
    out = tmp_path / "run"
    script = (
        "import sys, time\nfrom vaswani.recipe.run_folder import lock_output_dir\n"
        "lock_output_dir(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        code, _, err = invoke(train_command.main, run_args(corpus, out, "--max_steps", "2"), capsys)
        assert_one_line_error(code, err, f"--output_dir {out} is in use by another run (process {holder.pid}")
        assert [p.name for p in out.iterdir()] == [".vaswani-run.lock"]
    finally:
        holder.kill()
        holder.wait()
    code, _, err = invoke(
        train_command.main, run_args(corpus, out, "--max_steps", "2", "--save_steps", "2"), capsys
    )
    assert code == 0, err[-3000:]


def _contents(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder` (relative path: a file's bytes, None for a folder), hidden ones included."""
    return {
        p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")
    }


def test_a_refused_command_changes_nothing_in_the_run_folder(finished, corpus, tmp_path, capsys):
    """A refused command changes nothing in the run folder: a rerun refused with "already holds a run" writes nothing
    into the lock file, and a checkpoint that cannot be resumed from is refused before the folder is claimed or
    created."""
    out = _copy(finished[0], tmp_path)
    (out / ".vaswani-run.lock").write_text(
        '{"pid": 1, "host": "elsewhere", "since": "2020-01-01 00:00:00"}\n'
    )
    before = _contents(out)
    code, _, err = invoke(train_command.main, run_args(corpus, out, "--max_steps", "2"), capsys)
    assert_one_line_error(code, err, "already holds a run")
    assert _contents(out) == before
    for checkpoint in (out / "checkpoint-9", out / "checkpoint-4" / "trainer_state.json"):
        code, _, err = invoke(
            train_command.main,
            run_args(corpus, out, "--max_steps", "12", "--resume_from_checkpoint", checkpoint),
            capsys,
        )
        assert_one_line_error(code, err, "--resume_from_checkpoint")
        assert _contents(out) == before
    new = tmp_path / "new" / "run"
    argv = run_args(corpus, new, "--max_steps", "2", "--resume_from_checkpoint", out / "checkpoint-9")
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, "--resume_from_checkpoint")
    assert not (tmp_path / "new").exists()


def test_a_time_budget_alone_bounds_the_run_and_a_run_inside_its_warmup_says_so(corpus, tmp_path, capfd):
    """`--max_train_minutes` without --max_steps bounds the run by time alone (not by the Trainer's default of 3
    epochs: here an epoch is one batch, so 3 epochs would be 3 steps), its progress counts steps, and a run that ends
    inside its warm-up says so."""
    argv = [str(a) for a in run_args(corpus, tmp_path / "timed", "--max_train_minutes", "0.05")]
    argv[argv.index("--max_tokens") + 1], argv[argv.index("--warmup_steps") + 1] = "4096", "4000"
    capfd.readouterr()
    trainer = train_command.main(argv)
    err = capfd.readouterr().err
    # how many steps fit in 3 seconds depends on the machine's load; what must hold is that the plan is not 3 epochs
    # (3 steps) and that the time budget ended the run
    assert trainer.state.max_steps > 3 and "Time budget of 0.05 minutes reached" in err
    assert "Training (0.05 min)" in err and " s [" not in err and "or 3 steps" not in err
    assert "After the 0.05-minute budget:" in err
    assert "--max_train_minutes 0.05 (about " in err and "ends the run inside the 4000 warm-up steps" in err
    argv[argv.index("--max_train_minutes") : argv.index("--max_train_minutes") + 2] = ["--num_train_epochs", "2"]
    argv[argv.index("--output_dir") + 1] = str(tmp_path / "epochs")
    trainer = train_command.main(argv)
    assert trainer.state.global_step == 2
    assert "--num_train_epochs 2 (2 steps) ends the run inside the 4000 warm-up steps" in capfd.readouterr().err


def test_a_run_with_separate_vocabularies_encodes_its_sources_with_the_source_tokenizer(corpus, tmp_path, capsys):
    """The model folders of a `--separate_vocabularies` run also hold the Trainer's copy of the target tokenizer as
    tokenizer.json, which was loaded as a joint one: the sources (the run's own test split too) were encoded with
    the target vocabulary, without a word."""
    from vaswani.recipe.tokenization import load_tokenizers
    from vaswani.recipe.translation import load_translation_model

    out = tmp_path / "run"
    argv = run_args(corpus, out, "--max_steps", "2", "--save_steps", "2", "--average_last", "1", "--separate_vocabularies")
    code, _, err = invoke(train_command.main, argv, capsys)
    assert code == 0, err[-3000:]
    source, target = load_tokenizers(out / "tokenizer")
    assert source.tokenize("Ein Mann") != target.tokenize("Ein Mann")
    for folder in (out, out / "averaged", out / "checkpoint-2"):
        tokenizer = out / "tokenizer" if folder.name.startswith("checkpoint") else None
        _, loaded_source, loaded_target = load_translation_model(folder, tokenizer, device="cpu")
        assert loaded_source.tokenize("Ein Mann") == source.tokenize("Ein Mann"), folder
        assert loaded_target.tokenize("A man") == target.tokenize("A man"), folder
    # Publishing took that tokenizer.json for the model's only one; a published model has one shared tokenizer.
    from vaswani.commands import push_to_hub as push_command

    argv = ["--model_name_or_path", out / "averaged", "--dry_run", "--output_dir", tmp_path / "hub"]
    code, _, err = invoke(push_command.main, argv, capsys)
    assert_one_line_error(code, err, "holds separate source and target tokenizers")
    argv = run_args(corpus, tmp_path / "pushed", "--max_steps", "2", "--separate_vocabularies", "--push_to_hub")
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, "--push_to_hub publishes a model with one shared tokenizer")
    assert not (tmp_path / "hub").exists() and not (tmp_path / "pushed").exists()


def test_the_saved_model_decodes_as_the_run_translated_its_test_split(corpus, tmp_path, capsys):
    """What a run decoded its test split with is what it saves: with --lenpen 1.0 the averaged folder's
    generation_config.json holds the same length penalty and form, so vaswani-translate (and an export) decode the
    saved model as the run did."""
    from vaswani.commands import translate as translate_command

    out = tmp_path / "run"
    argv = run_args(corpus, out, "--max_steps", "4", "--save_steps", "2", "--average_last", "2", "--test_split", "val")
    code, _, err = invoke(train_command.main, argv + ["--lenpen", "1.0", "--beam", "3"], capsys)
    assert code == 0, err[-3000:]
    results = json.loads((out / "test_results.json").read_text())
    saved = json.loads((out / "averaged" / "generation_config.json").read_text())
    decoding = ("num_beams", "length_penalty", "length_penalty_form")
    assert {key: saved[key] for key in decoding} == {key: results[key] for key in decoding}
    assert results["length_penalty_form"] == "power" and results["num_beams"] == 3
    argv = ["--model_name_or_path", out / "averaged", "--input", corpus / "val.de", "--output", tmp_path / "hyp.en"]
    assert invoke(translate_command.main, argv, capsys)[0] == 0
    assert (tmp_path / "hyp.en").read_text() == Path(results["hypotheses"]).read_text()


def test_a_command_refused_for_its_data_creates_and_writes_nothing(finished, corpus, tmp_path, capsys):
    """A command refused for its data (`--source_lang ge`) creates and writes nothing: the data is read before the
    folder is taken, and a model to fine-tune whose weights do not match its config is refused before that."""

    def in_ge(out, *extra):  # the run's arguments with --source_lang ge, a language the corpus does not have
        return ["ge" if arg == "de" else arg for arg in run_args(corpus, out, *extra)]

    code, _, err = invoke(train_command.main, in_ge(tmp_path / "new" / "run", "--max_steps", "2"), capsys)
    assert_one_line_error(code, err, "No 'ge' text for split")
    assert not (tmp_path / "new").exists()
    out = _copy(finished[0], tmp_path)
    (out / ".vaswani-run.lock").write_text('{"pid": 1, "host": "elsewhere"}\n')
    before = _contents(out)
    resume = ["--max_steps", "12", "--resume_from_checkpoint", "last"]
    code, _, err = invoke(train_command.main, in_ge(out, *resume), capsys)
    assert_one_line_error(code, err, "No 'ge' text for split")
    assert _contents(out) == before
    wider = tmp_path / "wider"
    shutil.copytree(out / "checkpoint-8", wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "encoder_ffn_dim": 48}))
    argv = ["--dataset_name", corpus, "--source_lang", "de", "--target_lang", "en", "--max_steps", "1"]
    argv += ["--model_name_or_path", wider, "--output_dir", tmp_path / "tuned"]
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, "--model_name_or_path", "do not match its config.json")
    assert not (tmp_path / "tuned").exists()


def test_a_run_that_failed_before_training_does_not_block_its_rerun(corpus, tmp_path, capsys, monkeypatch):
    """Every named input is read before any work (a corrupt test file is named before the BPE is trained or the
    model built), and a run that trained no step does not block the same command's rerun."""
    from vaswani.recipe import run

    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    good = (data / "val.de").read_bytes()
    lines = good.split(b"\n")
    lines[2] = "Ein Mädchen läuft .".encode("latin-1")
    (data / "val.de").write_bytes(b"\n".join(lines))
    out = tmp_path / "run"
    argv = run_args(corpus, out, "--max_steps", "2", "--save_steps", "2", "--test_file", data / "val")
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, "val.de, line 3: not UTF-8")
    assert "Training the BPE" not in err and not (out / "tokenizer").exists()
    (data / "val.de").write_bytes(good)
    code, _, err = invoke(train_command.main, argv, capsys)
    assert code == 0, err[-3000:]
    assert json.loads((out / "test_results.json").read_text())["sentences"] == 8

    # Failed after the tokenizer was trained: every training pair dropped by a --max_source_length too small.
    out = tmp_path / "run2"
    argv = run_args(corpus, out, "--max_steps", "2", "--save_steps", "2")
    code, _, err = invoke(train_command.main, argv + ["--max_source_length", "1"], capsys)
    assert_one_line_error(code, err, "training pairs were dropped")
    assert (out / "tokenizer").is_dir()
    code, _, err = invoke(train_command.main, argv, capsys)
    assert code == 0, err[-3000:]
    assert (
        "Replacing a run that saved nothing of its training" in err and "Training the BPE" in err
    )  # the earlier attempt's tokenizer replaced
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]

    # A torn --tokenizer_name is named before any data is read.
    (tmp_path / "torn").mkdir()
    shutil.copy(out / "tokenizer" / "tokenizer.json", tmp_path / "torn" / "tokenizer.json")
    text = (tmp_path / "torn" / "tokenizer.json").read_bytes()
    (tmp_path / "torn" / "tokenizer.json").write_bytes(text[: len(text) // 2])

    def no_data(*args, **kwargs):
        raise AssertionError("data was read before the tokenizer was checked")

    monkeypatch.setattr(run, "load_split", no_data)
    argv = run_args(corpus, tmp_path / "run3", "--max_steps", "2", "--tokenizer_name", tmp_path / "torn")
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, "--tokenizer_name", "corrupt or truncated")


@pytest.mark.parametrize("damage", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "nan"])
def test_a_damaged_checkpoint_is_refused_by_name_and_skipped_when_resuming_from_last(
    finished, corpus, tmp_path, capsys, damage
):
    """A checkpoint without optimizer.pt, scheduler.pt or rng_state.pth, or with NaN weights, is refused by name
    (resuming would restart Adam or the schedule, or change the weights), and skipped when resuming from the last."""
    from safetensors.torch import load_file, save_file

    out = _copy(finished[0], tmp_path)
    checkpoint = out / "checkpoint-8"
    if damage == "nan":
        weights = load_file(checkpoint / "model.safetensors")
        weights["model.encoder.layers.0.fc1.weight"][0, 0] = float("nan")
        save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
        reason = "holds NaN or infinite weights (model.encoder.layers.0.fc1.weight)"
    else:
        (checkpoint / damage).unlink()
        reason = f"it has no {damage}"
    argv = ["--max_steps", "10", "--save_steps", "4", "--test_split", "val"]
    code, _, err = invoke(
        train_command.main, run_args(corpus, out, *argv, "--resume_from_checkpoint", checkpoint), capsys
    )
    assert_one_line_error(code, err, "--resume_from_checkpoint", "checkpoint-8", reason)
    if damage != "optimizer.pt":
        return  # resuming from "last" skips each the same way: once is enough
    code, _, err = invoke(
        train_command.main, run_args(corpus, out, *argv, "--resume_from_checkpoint", "last"), capsys
    )
    assert code == 0, err[-3000:]
    assert f"Skipping checkpoint {checkpoint}: " in err and reason in err
    assert json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["global_step"] == 8
    assert (out / "checkpoint-8" / "optimizer.pt").is_file()  # trained again from checkpoint-4


def test_resuming_with_another_tokenizer_is_refused(finished, corpus, tmp_path, capsys):
    """Resuming with a different tokenizer, even one of the same size, is refused: its ids would train the other
    vocabulary's embeddings."""
    from vaswani.recipe.tokenization import load_tokenizers, save_tokenizers, train_bpe_tokenizer

    out = _copy(finished[0], tmp_path)
    own, _ = load_tokenizers(out / "tokenizer")
    lines = (corpus / "train.en").read_text().splitlines() + (corpus / "train.de").read_text().splitlines()
    other = train_bpe_tokenizer(
        iter([line[::-1] for line in lines]), vocab_size=len(own), show_progress=False
    )
    assert len(other) == len(own)  # the same size: nothing else tells them apart
    save_tokenizers(other, other, tmp_path / "other")
    argv = ["--max_steps", "10", "--tokenizer_name", tmp_path / "other"]
    for resume in (out / "checkpoint-8", "last"):
        code, _, err = invoke(
            train_command.main, run_args(corpus, out, *argv, "--resume_from_checkpoint", resume), capsys
        )
        # the error itself gives the reason, from "last" too, where every checkpoint is refused for it
        assert_one_line_error(
            code, err, "--resume_from_checkpoint", "trained with another tokenizer than this run's"
        )
    assert "(checkpoint-4, checkpoint-8), all for the same reason: " in err
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]


@pytest.mark.parametrize(
    "where, field",
    [("TrainingClock", "seconds_elapsed"), ("TimedCheckpoints", "interval"), (None, "best_bleu")],
)
def test_a_training_state_with_an_unknown_field_is_refused_by_file_and_field(
    finished, corpus, tmp_path, capsys, where, field
):
    """A trainer_state.json with a field the run cannot take (written by another version, or edited) is refused
    naming the file and the field."""
    out = _copy(finished[0], tmp_path)
    for checkpoint in ("checkpoint-4", "checkpoint-8"):
        path = out / checkpoint / "trainer_state.json"
        state = json.loads(path.read_text())
        if where is None:
            state[field] = 1.0
        else:
            state["stateful_callbacks"].setdefault(where, {"args": {}, "attributes": {}})["args"][field] = 1.0
        path.write_text(json.dumps(state))
    argv = ["--max_steps", "10", "--save_steps", "4"]
    for resume in (out / "checkpoint-8", "last"):
        code, _, err = invoke(
            train_command.main, run_args(corpus, out, *argv, "--resume_from_checkpoint", resume), capsys
        )
        assert_one_line_error(
            code,
            err,
            "--resume_from_checkpoint",
            "checkpoint-8/trainer_state.json",
            f"unknown field '{field}'",
        )
    assert json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["global_step"] == 8


def test_a_finished_run_killed_before_its_tokenizer_was_written_gets_it_back(
    finished, corpus, tmp_path, capsys
):
    """A finished run killed (SIGKILL) after its final model but before its final tokenizer.json was renamed into
    place gets the tokenizer back when resumed."""
    out = _copy(finished[0], tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "training_summary.json"):
        (out / name).unlink()
    argv = ["--max_steps", "8", "--save_steps", "4", "--resume_from_checkpoint", "last"]
    code, _, err = invoke(train_command.main, run_args(corpus, out, *argv), capsys)
    assert code == 0, err[-3000:]
    assert "already reached --max_steps 8" in err
    assert (out / "tokenizer.json").read_bytes() == (out / "tokenizer" / "tokenizer.json").read_bytes()
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 8


def _validation_loss(model_dir, corpus) -> float:
    """The plain cross-entropy of a model folder on the corpus' val pairs."""
    import torch

    from vaswani.recipe.translation import load_translation_model

    model, source, target = load_translation_model(model_dir, device="cpu")
    sources, references = ((corpus / f"val.{lang}").read_text().splitlines() for lang in ("de", "en"))
    inputs = source(sources, return_tensors="pt", padding=True)
    labels = target(text_target=references, return_tensors="pt", padding=True)["input_ids"]
    labels[labels == target.pad_token_id] = -100
    with torch.no_grad():
        return model(**inputs, labels=labels).loss.item()


def test_the_readme_fine_tuning_example_lowers_the_validation_loss(finished, corpus, tmp_path, capsys):
    """The README's fine-tuning command, with transformers' flags, on the tiny trained model and data (its paths and
    its length made small: 16 steps, 4 of warm-up): the peak --learning_rate is reached and the loss goes down."""
    import re
    import shlex

    readme = re.sub(r"\\\n\s*", " ", (Path(ROOT) / "README.md").read_text())
    (line,) = [line for line in readme.splitlines() if line.startswith("vaswani-train --model_name_or_path")]
    argv = shlex.split(line.removeprefix("vaswani-train"))
    for flag, value in (
        ("--model_name_or_path", finished[0]),
        ("--dataset_name", corpus),
        ("--output_dir", tmp_path / "tuned"),
        ("--max_steps", 16),
        ("--warmup_steps", 4),
    ):
        argv[argv.index(flag) + 1] = str(value)
    assert {"--per_device_train_batch_size", "--learning_rate"} <= set(argv)
    trainer = train_command.main(argv)
    err = capsys.readouterr().err
    assert "batches of 16 sentences per device" in err and "rising to its peak 5e-05 at step 4" in err
    assert trainer.args.learning_rate == 5e-5
    assert _validation_loss(tmp_path / "tuned", corpus) < _validation_loss(finished[0], corpus)
