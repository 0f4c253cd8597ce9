"""Faults a user of the tools meets (bad input, kills, reruns, secrets), each rerun: the tools give the right result or a one-line error
that names the file, line or flag (no traceback unless --debug)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import transformers
from helpers import SENTENCES, TOKEN, assert_one_line_error, invoke, run_args, tiny_tokenizer
from packaging import version
from safetensors.torch import load_file

from vaswani.commands import average_checkpoints as average_command
from vaswani.commands import evaluate as evaluate_command
from vaswani.commands import push_to_hub as push_command
from vaswani.commands import train as train_command
from vaswani.commands import translate as translate_command
from vaswani.recipe import translation
from vaswani.recipe.checkpoints import checkpoints, resolve_resume_checkpoint, verify_checkpoint

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# ---------------------------------------------------------------------------------------------------------------------
# Wrong results and data loss
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


def test_the_tools_say_what_they_did(finished_run, corpus, tmp_path, capsys):
    """`vaswani-average-checkpoints` and `vaswani-push-to-hub --dry_run` printed nothing on success, and a resumed run
    did not say which checkpoint it went on from."""
    argv = ["--run_dir", finished_run, "--num_checkpoints", "2", "--output_dir", tmp_path / "avg"]
    code, out, err = invoke(average_command.main, argv, capsys)
    assert code == 0 and out == f"Wrote the average of 2 checkpoints to {tmp_path / 'avg'}\n", err[-3000:]
    argv = ["--model_name_or_path", tmp_path / "avg", "--dry_run", "--output_dir", tmp_path / "hub"]
    code, out, err = invoke(push_command.main, argv, capsys)
    assert code == 0 and out == f"Dry run: wrote the folder to publish to {tmp_path / 'hub'}; nothing was pushed\n"
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    args = run_args(corpus, run, "--max_steps", "10", "--save_steps", "4", "--resume_from_checkpoint", "last")
    code, _, err = invoke(train_command.main, args, capsys)
    assert code == 0 and f"Resuming from {run / 'checkpoint-8'} (step 8)" in err, err[-3000:]


def test_averaging_into_an_existing_folder_is_all_or_nothing(finished_run, tmp_path, monkeypatch, capsys):
    """Killed (here: failing) before the new folder is complete, the output folder is still the earlier average:
    its config and weights belong together."""
    out = tmp_path / "averaged"
    shutil.copytree(finished_run / "averaged", out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def killed(folder):
        raise KeyboardInterrupt  # as a kill would stop the process here, after the weights were written

    monkeypatch.setattr(
        "vaswani.recipe.averaging._copy_companion_files", lambda newest, folder: killed(folder)
    )
    with pytest.raises(SystemExit):
        average_command.main(["--checkpoints", str(finished_run / "checkpoint-4"), "--output_dir", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["averaged"]  # nothing half-built left beside it
    capsys.readouterr()


def test_written_files_are_whole_or_absent(tmp_path):
    """A translation file (and any JSON result) is the earlier complete file until the new one is complete, and two
    processes writing one path leave one of their complete files, never a mix."""
    from vaswani.common.fileio import write_json
    from vaswani.recipe.translation import write_sentences

    path = tmp_path / "hyp.txt"
    write_sentences(["complete", "earlier", "output"], path)

    def killed_after_two():
        yield "new 1"
        yield "new 2"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_sentences(killed_after_two(), path)
    assert path.read_text() == "complete\nearlier\noutput\n"
    results = tmp_path / "test_results.json"
    write_json(results, {"bleu": 30.0})
    with pytest.raises(TypeError):
        write_json(results, {"bleu": object()})  # fails while writing
    assert json.loads(results.read_text()) == {"bleu": 30.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.txt", "test_results.json"]

    # two processes at once, each writing 100000 lines through the one writer all tools use (loaded alone: fast)
    writer = tmp_path / "writer.py"
    writer.write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('fileio', {str(ROOT / 'vaswani' / 'common' / 'fileio.py')!r})\n"
        "fileio = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(fileio)\n"
        "with fileio.atomic_write(sys.argv[2]) as f:\n"
        "    for _ in range(100000):\n"
        "        f.write(sys.argv[1] * 20 + '\\n')\n"
    )
    procs = [subprocess.Popen([sys.executable, str(writer), tag, str(path)]) for tag in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lines = path.read_text().splitlines()
    assert len(lines) == 100000 and len(set(lines)) == 1 and lines[0] in ("a" * 20, "b" * 20)


def test_a_torn_tokenizer_is_never_written_and_a_bad_one_is_named(tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from vaswani.recipe.tokenization import load_tokenizers, save_tokenizers

    tokenizer = tiny_tokenizer()
    save_tokenizers(tokenizer, tokenizer, tmp_path / "tokenizer")
    good = (tmp_path / "tokenizer" / "tokenizer.json").read_bytes()
    original = PreTrainedTokenizerFast.save_pretrained

    def killed_while_writing(self, directory, *args, **kwargs):
        original(self, directory, *args, **kwargs)
        written = Path(directory) / "tokenizer.json"
        written.write_bytes(written.read_bytes()[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        save_tokenizers(tokenizer, tokenizer, tmp_path / "tokenizer")
    assert (tmp_path / "tokenizer" / "tokenizer.json").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]
    monkeypatch.undo()

    (tmp_path / "tokenizer" / "tokenizer.json").write_bytes(
        good[: len(good) // 2]
    )  # torn by an older version
    with pytest.raises(ValueError, match=r"tokenizer/tokenizer\.json is corrupt or truncated"):
        load_tokenizers(tmp_path / "tokenizer")


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


# ---------------------------------------------------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------------------------------------------------
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
# Errors that name the problem
# ---------------------------------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize(
    "case",
    [
        "num_beams_0",
        "missing_model",
        "corrupt_weights",
        "moses_xx",
        "non_utf8_input",
        "n_best_over_beams",
        "length_penalty_inf",
        "unknown_flag",
    ],
)
def test_translate_errors_name_the_flag_or_file(case, model_dir, tmp_path, capsys):
    source = tmp_path / "src.txt"
    source.write_text("Ein Mann .\n")
    argv = [
        "--model_name_or_path",
        model_dir,
        "--input",
        source,
        "--output",
        tmp_path / "hyp.txt",
        "--no_progress",
    ]
    expected: tuple
    if case == "num_beams_0":
        argv += ["--num_beams", "0"]
        expected = ("--num_beams",)
    elif case == "missing_model":
        argv[1] = tmp_path / "no-such-model"
        expected = ("No model folder at", "no-such-model")
    elif case == "corrupt_weights":
        broken = tmp_path / "broken"
        shutil.copytree(model_dir, broken)
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-64])
        argv[1] = broken
        expected = ("broken/model.safetensors", "corrupt or truncated")
    elif case == "moses_xx":
        argv += ["--references", source, "--moses_lang", "xx"]
        expected = ("--moses_lang", "'xx'")
    elif case == "non_utf8_input":
        source.write_bytes("Ein Mann .\nEin Mädchen .\n".encode("latin-1"))
        expected = ("src.txt, line 2: not UTF-8",)
    elif case == "n_best_over_beams":
        argv += ["--n_best", "5", "--num_beams", "4"]
        expected = ("--n_best",)
    elif case == "length_penalty_inf":  # was blamed on --num_beams
        argv += ["--length_penalty", "inf"]
        expected = ("--length_penalty: length_penalty must be a finite number, got inf",)
    else:  # a flag of another tool
        argv += ["--preset", "small"]
        expected = ("--preset",)
    code, _, err = invoke(translate_command.main, argv, capsys)
    assert_one_line_error(code, err, *expected)
    assert not (tmp_path / "hyp.txt").exists()


def test_debug_shows_the_traceback(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="No model folder"):
        translate_command.main(["--model_name_or_path", str(tmp_path / "nowhere"), "--debug"])


@pytest.mark.parametrize(
    "name, offline, named",
    [
        ("runs/nope", True, ("No model folder at runs/nope", "not in the local cache", "HF_HUB_OFFLINE")),
        ("runs/nope", False, ("No model folder at runs/nope", "the Hub could not be reached")),
        ("runs/de-en/nope", False, ("No model folder at runs/de-en/nope", "not a Hub model id")),
        ("./nope", False, ("No model folder at ./nope", "not a Hub model id")),
        ("../nope", False, ("No model folder at ../nope", "not a Hub model id")),
        ("nope model", False, ("No model folder at nope model", "not a Hub model id")),
    ],
)
def test_a_model_name_that_is_no_folder_and_no_reachable_hub_model_is_named_at_once(
    name, offline, named, tmp_path, capsys, monkeypatch
):
    """`vaswani-translate --model_name_or_path runs/nope` waited about a minute for the Hub (transformers' retries)
    before saying it could not connect. A name that can only be a path, or a Hub model that is not in the cache when
    offline, is named at once as both; an unreachable Hub (here: a closed local port) after one request."""
    import huggingface_hub.constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    (tmp_path / "t5.de").write_text("Ein Mann .\n")
    from vaswani.commands import convert as convert_command
    from vaswani.commands import export as export_command
    from vaswani.commands import plot as plot_command

    runs = [  # vaswani-translate, and the other tools that take a model by name
        (translate_command.main, ["--input", "t5.de", "--no_progress"]),
        (export_command.main, ["--engine", "onnx", "--output_dir", "onnx"]),
        (convert_command.main, ["--output_dir", "converted"]),
        (plot_command.main, ["--source_text", "Ein Mann .", "--output_dir", "plots"]),
    ]
    for main, extra in runs:
        argv = (["attention"] if main is plot_command.main else []) + ["--model_name_or_path", name, *extra]
        started = time.monotonic()
        code, _, err = invoke(main, argv, capsys)
        assert_one_line_error(code, err, *named)
        assert time.monotonic() - started < 10, "the error came after retries"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t5.de"]


def test_a_hub_model_translates_with_its_own_tokenizer(model_dir, tmp_path):
    """`vaswani-translate --model_name_or_path namespace/name` loaded the model from the Hub, then looked for its
    tokenizer in a local folder named namespace/name. Here the Hub is a cache filled as a download fills it, offline."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub-cache" / "models--someone--tiny-de-en"
    shutil.copytree(model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    source = tmp_path / "src.de"
    source.write_text(SENTENCES[0] + "\n")
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    argv = ["--input", source, "--output", tmp_path / "hyp.en", "--max_new_tokens", "6", "--no_progress"]
    done = subprocess.run(
        [BIN / "vaswani-translate", "--model_name_or_path", "someone/tiny-de-en", *argv],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from vaswani.recipe.translation import load_translation_model, translate

    model, tokenizer, _ = load_translation_model(model_dir, device="cpu")
    expected = translate(SENTENCES[:1], model, tokenizer, max_new_tokens=6, show_progress=False)
    assert (tmp_path / "hyp.en").read_text().splitlines() == expected


def test_a_missing_input_or_reference_is_named_before_the_model_loads(
    model_dir, tmp_path, capsys, monkeypatch
):
    """`vaswani-translate --input nope.de` loaded the model, then printed a raw `[Errno 2]`; a missing --references
    file came after the whole translation."""

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the files were checked")

    monkeypatch.setattr(translation, "load_translation_model", no_loading)  # imported from here when it runs
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    model = ["--model_name_or_path", model_dir, "--no_progress"]
    cases = [
        (["--input", tmp_path / "nope.de"], ("--input", "nope.de", "no such file")),
        (["--input", tmp_path], ("--input", "is a folder")),
        (
            ["--input", source, "--references", tmp_path / "nope.en"],
            ("--references", "nope.en", "no such file"),
        ),
        (["--input", source, "--tokenizer_name", tmp_path / "nope"], ("--tokenizer_name", "no such folder")),
        (["--input", source, "--output", tmp_path], ("--output", "is a folder")),
    ]
    for extra, named in cases:
        code, _, err = invoke(translate_command.main, model + extra, capsys)
        assert_one_line_error(code, err, *named)
    code, _, err = invoke(
        evaluate_command.main, ["--hypotheses", tmp_path / "nope.en", "--references", source], capsys
    )
    assert_one_line_error(code, err, "--hypotheses", "nope.en", "no such file")
    from vaswani.commands import plot as plot_command

    argv = ["--model_name_or_path", tmp_path / "nope", "--engine", "onnx", "--input", source]
    code, _, err = invoke(translate_command.main, argv, capsys)
    assert_one_line_error(code, err, "No export folder at", "nope")
    code, _, err = invoke(
        plot_command.main, ["curves", "--run_dir", "nope", "--output", tmp_path / "c.png"], capsys
    )
    assert_one_line_error(code, err, "No run folder at nope")


def test_a_corrupt_config_is_named_by_every_tool_that_reads_it(model_dir, tmp_path, capsys):
    """`vaswani-export` on a folder whose config.json is not JSON said only "Expecting property name enclosed in
    double quotes: line 10 column 2", without the file."""
    from vaswani.commands import convert as convert_command
    from vaswani.commands import export as export_command
    from vaswani.commands import plot as plot_command

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    config = broken / "config.json"
    config.write_text(config.read_text().replace('"d_model"', "d_model", 1))
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    runs = [
        (export_command.main, ["--engine", "onnx", "--output_dir", tmp_path / "onnx"]),
        (translate_command.main, ["--input", source, "--output", tmp_path / "hyp.en"]),
        (convert_command.main, ["--output_dir", tmp_path / "converted"]),
        (push_command.main, ["--dry_run", "--output_dir", tmp_path / "hub"]),
        (plot_command.main, ["--source_text", "Ein Mann .", "--output_dir", tmp_path / "plots"]),
    ]
    for main, extra in runs:
        argv = (["attention"] if main is plot_command.main else []) + ["--model_name_or_path", broken, *extra]
        code, _, err = invoke(main, argv, capsys)
        assert_one_line_error(code, err, f"{config} is not valid JSON", "line ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "src.de"]


def test_a_folder_whose_weights_do_not_match_its_config_is_refused_by_every_tool(
    model_dir, corpus, tmp_path, capsys
):
    """`vaswani-translate` on a copy of a model whose config.json had "decoder_layers" mistyped translated garbage with
    exit 0: the config fell back to 6 layers, transformers made up the weights of 4. Every tool that loads a model
    names the weights missing (or left over, or of another shape) and the config key the model does not know."""
    from vaswani.commands import export as export_command
    from vaswani.commands import plot as plot_command

    def edited(name, edit) -> Path:
        folder = tmp_path / name
        shutil.copytree(model_dir, folder)
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    typo = edited("typo", lambda c: c.update(decoder_layer=c.pop("decoder_layers")))
    fewer = edited("fewer", lambda c: c.update(decoder_layers=1))
    wider = edited("wider", lambda c: c.update(encoder_ffn_dim=48))
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    runs = [
        (translate_command.main, ["--input", source, "--output", tmp_path / "hyp.en"]),
        (export_command.main, ["--engine", "onnx", "--output_dir", tmp_path / "onnx"]),
        (export_command.main, ["--engine", "ctranslate2", "--output_dir", tmp_path / "ct2"]),
        (push_command.main, ["--dry_run", "--output_dir", tmp_path / "hub"]),
        (plot_command.main, ["--source_text", "Ein Mann .", "--output_dir", tmp_path / "plots"]),
        (train_command.main, ["--dataset_name", corpus, "--source_lang", "de", "--target_lang", "en",
                              "--max_steps", "1", "--output_dir", tmp_path / "tuned"]),
    ]  # fmt: skip
    for folder, named in (
        (typo, "missing model.decoder.layers.2."),
        (fewer, "unexpected model.decoder.layers.1."),
        (wider, "of another shape model.encoder.layers.0.fc1.bias"),
    ):
        for main, extra in runs:
            argv = (["attention"] if main is plot_command.main else []) + ["--model_name_or_path", folder, *extra]
            code, _, err = invoke(main, argv, capsys)
            assert_one_line_error(code, err, f"The weights of {folder} do not match its config.json: {named}")
            assert ("keys the model does not know, which it ignores: decoder_layer" in err) == (folder == typo)
        code, _, err = invoke(
            average_command.main, ["--checkpoints", model_dir, folder, "--output_dir", tmp_path / "avg"], capsys
        )
        assert_one_line_error(code, err, f"The weights of {folder} do not match its config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_tokenizer_other_than_the_models_own_is_refused_by_every_tool(model_dir, corpus, tmp_path, capsys):
    """`vaswani-translate --tokenizer_name` with another run's (smaller) BPE translated garbage with exit 0: only ids
    beyond the vocabulary were caught. Every tool that takes a tokenizer beside a model folder holding its own
    compares the two vocabularies; a copy of the model's own is taken."""
    from vaswani.commands import export as export_command
    from vaswani.commands import plot as plot_command

    tiny_tokenizer(SENTENCES[:4]).save_pretrained(tmp_path / "other")
    shutil.copytree(model_dir, tmp_path / "own", ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    model = ["--model_name_or_path", model_dir, "--tokenizer_name"]
    before = sorted(p.name for p in tmp_path.iterdir())
    runs = [
        (translate_command.main, ["--input", source, "--output", tmp_path / "hyp.en"]),
        (export_command.main, ["--engine", "ctranslate2", "--output_dir", tmp_path / "ct2"]),
        (push_command.main, ["--dry_run", "--output_dir", tmp_path / "hub"]),
        (plot_command.main, ["--source_text", "Ein Mann .", "--output_dir", tmp_path / "plots"]),
        (train_command.main, ["--dataset_name", corpus, "--source_lang", "de", "--target_lang", "en",
                              "--max_steps", "1", "--output_dir", tmp_path / "tuned"]),
    ]  # fmt: skip
    for main, extra in runs:
        argv = (["attention"] if main is plot_command.main else []) + [*model, tmp_path / "other", *extra]
        code, _, err = invoke(main, argv, capsys)
        assert_one_line_error(
            code, err, f"The tokenizer {tmp_path / 'other'} is not the one the model {model_dir} was trained with"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    code, _, err = invoke(translate_command.main, [*model, tmp_path / "own", *runs[0][1]], capsys)
    assert code == 0, err[-3000:]


@pytest.mark.parametrize("flag", ["--tokenizer_name", "--model_name_or_path"])
def test_a_vocab_size_the_tokenizer_given_contradicts_is_refused(flag, model_dir, corpus, tmp_path, capsys):
    """`--vocab_size 2000 --tokenizer_name` of an 8000-token BPE trained with 8000 tokens without a word: the flag
    sizes a BPE trained for the run, and no BPE trained with it has more tokens."""
    argv = ["--dataset_name", corpus, "--source_lang", "de", "--target_lang", "en", "--max_steps", "1"]
    argv += [flag, model_dir, "--vocab_size", "200", "--output_dir", tmp_path / "run"]
    code, _, err = invoke(train_command.main, argv, capsys)
    assert_one_line_error(code, err, f"--vocab_size 200, but {flag} {model_dir} brings a vocabulary of 300 tokens")
    assert not (tmp_path / "run").exists()


def test_every_folder_the_tools_write_or_wrote_loads_through_every_tool(finished_run, tmp_path, capsys):
    """What refuses a folder whose weights do not match its config (above) refuses none the project writes or wrote:
    a checkpoint, an averaged model, a folder saved quantized to int8, and a folder of an earlier release
    (`tests/fixtures`), through every tool that loads a model, without a warning about its config."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from vaswani.commands import export as export_command
    from vaswani.commands import plot as plot_command

    earlier = tmp_path / "earlier"
    shutil.copytree(ROOT / "tests" / "fixtures" / "folder_saved_before_the_layers", earlier)
    words = Tokenizer(WordLevel({"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "Ein": 4, "Mann": 5, ".": 6}, "<unk>"))
    words.pre_tokenizer = Whitespace()
    words.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    special = dict(pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    PreTrainedTokenizerFast(tokenizer_object=words, **special).save_pretrained(earlier)  # its 40 ids hold 7
    int8 = tmp_path / "int8"
    model, _, _ = translation.load_translation_model(finished_run / "averaged", int8=True)
    model.save_pretrained(int8)
    AutoTokenizer.from_pretrained(finished_run / "averaged").save_pretrained(int8)
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    for folder in (finished_run / "checkpoint-8", finished_run / "averaged", earlier, int8):
        model = ["--model_name_or_path", folder]
        runs = [
            (translate_command.main, [*model, "--input", source, "--output", tmp_path / f"{folder.name}.en"]),
            (plot_command.main, ["attention", *model, "--source_text", "Ein Mann .", "--output_dir", tmp_path / folder.name]),
        ]  # fmt: skip
        if folder != int8:  # torchao's int8 tensors: no export, no re-saving, no averaging (each raises)
            runs += [
                (export_command.main, [*model, "--engine", "ctranslate2", "--output_dir", tmp_path / f"{folder.name}-ct2"]),
                (push_command.main, [*model, "--dry_run", "--output_dir", tmp_path / f"{folder.name}-hub"]),
                (average_command.main, ["--checkpoints", folder, "--output_dir", tmp_path / f"{folder.name}-avg"]),
            ]  # fmt: skip
        for main, argv in runs:
            code, _, err = invoke(main, argv, capsys)
            assert code == 0, (folder, main.__module__, err[-3000:])
            assert "does not know" not in err and "do not match" not in err, err


@pytest.mark.parametrize(
    "record, flags, named",
    [
        ("summary", ["--source_lang", "de", "--target_lang", "xx"], "--target_lang xx: the model"),
        ("summary", ["--source_lang", "en", "--target_lang", "de"], "--source_lang en: the model"),
        ("run", ["--target_lang", "fr"], "translates de into en"),
        ("marian", ["--source_lang", "fr"], "translates de into en"),
        ("fsmt", ["--target_lang", "fr"], "translates de into en"),
        ("card", ["--source_lang", "de", "--target_lang", "xx"], "README.md"),
        ("card", ["--source_lang", "en", "--target_lang", "de"], "translates de into en"),
    ],
)
def test_a_language_the_model_does_not_know_is_refused(record, flags, named, model_dir, tmp_path, capsys):
    """`vaswani-translate --source_lang de --target_lang xx` translated with exit 0. The languages a folder records
    (its configs, tokenizer config, the run's training_summary.json, its model card) are checked before it loads."""
    folder = tmp_path / "run" / "averaged" if record == "run" else tmp_path / "model"
    shutil.copytree(model_dir, folder)
    summary = json.dumps({"source_lang": "de", "target_lang": "en"})
    if record == "summary":
        (folder / "training_summary.json").write_text(summary)
    elif record == "run":  # vaswani-train's layout: the summary in the run folder, the model in averaged/
        (folder.parent / "training_summary.json").write_text(summary)
    elif record in ("marian", "fsmt"):  # a converted model: its tokenizer's config says
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        if record == "marian":
            tokenizer_config.update(source_lang="de", target_lang="en")
        else:
            tokenizer_config.update(langs=["de", "en"])
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    else:  # a published folder: this package's card lists [source, target]
        (folder / "README.md").write_text("---\nlanguage:\n- de\n- en\ntags:\n- vaswani\n---\n# A model\n")
    source = tmp_path / "src.txt"
    source.write_text("Ein Mann .\n")
    argv = [
        "--model_name_or_path",
        folder,
        "--input",
        source,
        "--output",
        tmp_path / "hyp.txt",
        "--no_progress",
    ]
    code, _, err = invoke(translate_command.main, argv + flags, capsys)
    assert_one_line_error(code, err, named)
    assert not (tmp_path / "hyp.txt").exists()
    code, _, err = invoke(
        translate_command.main, argv + ["--source_lang", "de", "--target_lang", "en"], capsys
    )
    assert code == 0, err


def test_languages_are_not_checked_where_nothing_records_them_and_it_is_said(model_dir, tmp_path, capsys):
    source = tmp_path / "src.txt"
    source.write_text("Ein Mann .\n")
    argv = ["--input", source, "--output", tmp_path / "hyp.txt", "--no_progress"]
    code, _, err = invoke(
        translate_command.main,
        ["--model_name_or_path", model_dir, *argv, "--source_lang", "de", "--target_lang", "xx"],
        capsys,
    )
    assert code == 0 and "records no languages" in err, err
    # a group of languages (Marian's opus-mt-en-ROMANCE records "ROMANCE") is no language to check against
    group = tmp_path / "group"
    shutil.copytree(model_dir, group)
    tokenizer_config = json.loads((group / "tokenizer_config.json").read_text())
    tokenizer_config.update(source_lang="en", target_lang="ROMANCE")
    (group / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    flags = ["--source_lang", "en", "--target_lang", "fr"]
    code, _, err = invoke(translate_command.main, ["--model_name_or_path", group, *argv, *flags], capsys)
    assert code == 0, err
    code, _, err = invoke(
        translate_command.main, ["--model_name_or_path", group, *argv, "--source_lang", "de"], capsys
    )
    assert_one_line_error(code, err, "--source_lang de: the model", "translates en into ROMANCE")


def test_evaluate_errors_name_the_file_or_flag(tmp_path, capsys):
    empty, reference = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    empty.write_text("")
    reference.write_text("")
    code, _, err = invoke(evaluate_command.main, ["--hypotheses", empty, "--references", reference], capsys)
    assert_one_line_error(code, err, "hyp.txt is empty")
    empty.write_text("a b c\n")
    reference.write_text("a b c\n")
    code, _, err = invoke(
        evaluate_command.main,
        ["--hypotheses", empty, "--references", reference, "--tokenize", "bogus"],
        capsys,
    )
    assert_one_line_error(code, err, "--tokenize", "bogus")
    code, _, err = invoke(
        evaluate_command.main,
        ["--hypotheses", empty, "--references", reference, "--moses_lang", "xx"],
        capsys,
    )
    assert_one_line_error(code, err, "--moses_lang")


@pytest.mark.parametrize("bleu", ['"high"', "NaN", "250.0"])
def test_results_that_a_card_cannot_state_are_refused(bleu, model_dir, tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text('{"bleu": ' + bleu + ', "bleu_signature": "BLEU|nrefs:1"}')
    argv = ["--model_name_or_path", model_dir, "--dry_run", "--output_dir", tmp_path / "hub"]
    code, _, err = invoke(push_command.main, argv + ["--results_json", results], capsys)
    assert_one_line_error(code, err, "results.json", "'bleu'")
    assert not (tmp_path / "hub").exists()


def test_the_pipeline_translates_an_empty_text_to_an_empty_text(model_dir):
    from transformers import PreTrainedTokenizerFast

    from vaswani import VaswaniForConditionalGeneration
    from vaswani.pipeline_vaswani import VaswaniTranslationPipeline
    from vaswani.recipe.translation import translate

    model = VaswaniForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    pipe = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer, device="cpu")
    assert translate(["", "  "], model, tokenizer, show_progress=False) == ["", ""]
    assert pipe("") == [{"translation_text": ""}]
    mixed = pipe(["", SENTENCES[0], " "], max_new_tokens=5)
    assert mixed[0] == mixed[2] == {"translation_text": ""}
    assert mixed[1] == pipe(SENTENCES[0], max_new_tokens=5)[0] and mixed[1]["translation_text"]
    assert pipe([""], num_return_sequences=2, num_beams=2) == [[{"translation_text": ""}] * 2]


# ---------------------------------------------------------------------------------------------------------------------
# Habits of the field
# ---------------------------------------------------------------------------------------------------------------------
def test_n_best_lists_with_scores(model_dir, tmp_path, capsys):
    from vaswani.recipe.translation import load_translation_model, translate

    source = tmp_path / "src.txt"
    source.write_text("\n".join([SENTENCES[0], "", SENTENCES[1]]) + "\n")
    out = tmp_path / "nbest.tsv"
    argv = ["--model_name_or_path", model_dir, "--input", source, "--output", out, "--no_progress"]
    code, _, err = invoke(translate_command.main, argv + ["--n_best", "3", "--max_new_tokens", "8"], capsys)
    assert code == 0, err
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    model, tokenizer, _ = load_translation_model(model_dir, device="cpu")
    best = translate(
        [SENTENCES[0], "", SENTENCES[1]], model, tokenizer, max_new_tokens=8, show_progress=False
    )
    assert [rows[0][2], rows[3][2], rows[6][2]] == best
    for i in (0, 6):
        scores = [float(rows[i + k][1]) for k in range(3)]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    # the beam's score: transformers' own for the same search
    inputs = tokenizer([SENTENCES[0]], return_tensors="pt")
    generated = model.generate(
        **inputs, num_beams=4, num_return_sequences=3, max_new_tokens=8, output_scores=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    assert [float(r[1]) for r in rows[:3]] == pytest.approx(generated.sequences_scores.tolist(), abs=1e-4)


def test_interactive_translation_answers_each_line_before_the_next(model_dir):
    """fairseq-interactive: a line in, its translation out, while standard input stays open."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [str(BIN / "vaswani-translate"), "--model_name_or_path", str(model_dir), "--interactive"]
    process = subprocess.Popen(
        command + ["--max_new_tokens", "6"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        encoding="utf-8",
    )
    reader = ThreadPoolExecutor(max_workers=1)
    try:
        answers = []
        for sentence in SENTENCES[:2]:
            process.stdin.write(sentence + "\n")
            process.stdin.flush()
            # the answer comes while standard input is still open (a batch tool would wait for its end)
            answers.append(reader.submit(process.stdout.readline).result(timeout=120))
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        reader.shutdown(wait=False)
    from vaswani.recipe.translation import load_translation_model, translate

    model, tokenizer, _ = load_translation_model(model_dir, device="cpu")
    expected = translate(SENTENCES[:2], model, tokenizer, max_new_tokens=6, show_progress=False)
    assert [a.rstrip("\n") for a in answers] == expected


def test_plain_translate_on_a_terminal_says_it_reads_standard_input(model_dir):
    """Issue: `vaswani-translate` without --input waited on a terminal without a word."""
    import pty

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    terminal, its_end = pty.openpty()
    command = [
        str(BIN / "vaswani-translate"),
        "--model_name_or_path",
        str(model_dir),
        "--max_new_tokens",
        "6",
    ]
    process = subprocess.Popen(
        command, stdin=its_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    os.close(its_end)
    reader = ThreadPoolExecutor(max_workers=1)
    try:

        def notice():
            for line in process.stderr:
                if "vaswani-translate: reading sentences from standard input" in line:
                    return line

        assert "Ctrl-D ends them" in reader.submit(notice).result(timeout=120)
        os.write(terminal, SENTENCES[0].encode() + b"\n\x04")  # a sentence, then Ctrl-D
        assert process.wait(timeout=120) == 0
        output = process.stdout.read()
    finally:
        process.kill()
        reader.shutdown(wait=False)
        os.close(terminal)
    from vaswani.recipe.translation import load_translation_model, translate

    model, tokenizer, _ = load_translation_model(model_dir, device="cpu")
    assert (
        output == translate(SENTENCES[:1], model, tokenizer, max_new_tokens=6, show_progress=False)[0] + "\n"
    )


def test_the_progress_bar_ends_where_the_run_ends():
    from transformers import TrainerControl, TrainerState

    from vaswani.recipe.callbacks import RunProgress

    state, control = TrainerState(), TrainerControl()
    state.max_steps, state.global_step = 100000, 0
    bar = RunProgress(minutes=0.001)  # 60 ms of a run whose --max_steps would take 40 hours
    bar.on_train_begin(None, state, control)
    assert bar.training_bar.total == 1000  # per mille of the run
    time.sleep(0.1)
    state.global_step = 3
    bar.on_step_end(None, state, control)
    assert bar.training_bar.n == bar.training_bar.total  # the time budget is spent: the bar is full
    bar.on_train_end(None, state, control)
    by_steps = RunProgress()
    by_steps.on_train_begin(None, state, control)
    assert by_steps.training_bar.total == 100000
    by_steps.on_train_end(None, state, control)


def test_a_tool_prints_nothing_of_what_its_libraries_say_to_their_developers(model_dir, tmp_path):
    """Every tool printed torchao's failure to load extensions built for Python 3.10 and CUDA sm_90a, torch's
    deprecation of torchao's `register_constant` calls, and (int8) torchao's missing Triton: each is silenced by its
    exact text (`cli.NOISE`), and the tool logs only its own lines."""
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    for extra in ([], ["--quantization", "int8"]):
        done = subprocess.run(
            [BIN / "vaswani-translate", "--model_name_or_path", model_dir, "--input", source, "--no_progress", *extra],
            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        for noise in ("Failed to load", "register_constant", "Detected no triton"):
            assert noise not in done.stderr, done.stderr
        assert [line for line in done.stderr.splitlines() if " INFO vaswani." not in line] == [], done.stderr


def test_default_logs_are_quiet(corpus, tmp_path, capfd):
    capfd.readouterr()
    train_command.main(run_args(corpus, tmp_path / "run", "--max_steps", "4", "--save_steps", "2"))
    _, err = capfd.readouterr()
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert "VaswaniConfig {" not in err and "Model config" not in err  # the configuration is never dumped
    assert len([line for line in lines if " INFO " in line or " WARNING " in line]) < 20, err
    assert "Writing model shards" not in err and "Loading weights" not in err


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


def test_the_readme_pipeline_works_on_every_folder_the_tools_write(finished_run, tmp_path):
    """The `pipeline("translation", ...)` example of docs/recipe.md, run as written in an interpreter where `vaswani` cannot
    be imported, on a checkpoint, the final model and the averaged model of a run."""
    readme = (ROOT / "docs" / "recipe.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "pipeline(" in b]
    assert 'model="runs/de-en/averaged"' in block
    folders = [finished_run / "checkpoint-8", finished_run, finished_run / "averaged"]
    script = "import sys\nsys.modules['vaswani'] = None\n"
    for folder in folders:
        script += block.replace('"runs/de-en/averaged"', repr(str(folder)))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [eval(line) for line in done.stdout.strip().splitlines()]  # noqa: S307 (our own child's output)
    from vaswani.recipe.translation import load_translation_model, translate

    assert len(printed) == len(folders)
    for folder, result in zip(folders, printed, strict=True):
        model, tokenizer, _ = load_translation_model(folder, device="cpu")
        expected = translate(["Ein Mann fährt Fahrrad.", ""], model, tokenizer, show_progress=False)
        assert result == [{"translation_text": text} for text in expected], folder
