"""`vaswani-train`'s run as a user meets it: a run folder belongs to one run, resuming keeps what a run wrote, a run
that cannot be what was asked is refused with a one-line error before any file is written, and no secret is written."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import transformers
from helpers import BIN, TOKEN, assert_one_line_error, invoke, run_args
from packaging import version
from safetensors.torch import load_file

from vaswani.commands import train as train_command
from vaswani.recipe.checkpoints import checkpoints, resolve_resume_checkpoint, verify_checkpoint


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
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(
        [corpus / "train.de", corpus / "train.en"], vocab_size=300, show_progress=False
    )
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
