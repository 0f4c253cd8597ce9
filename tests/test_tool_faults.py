"""Faults every tool meets alike (a folder that is not what it says, a missing file, a kill while writing):
each tool gives the right result or a one-line error that names the file, line or flag (no traceback unless
--debug). A fault of one tool is tested beside that tool's other tests."""

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, SENTENCES, assert_one_line_error, invoke, run_args, tiny_tokenizer

from vaswani.commands import average_checkpoints as average_command
from vaswani.commands import evaluate as evaluate_command
from vaswani.commands import push_to_hub as push_command
from vaswani.commands import train as train_command
from vaswani.commands import translate as translate_command
from vaswani.common.fileio import atomic_folder, write_json
from vaswani.recipe import translation


# ---------------------------------------------------------------------------------------------------------------------
# Outputs whole, and said
# ---------------------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------------------
# Errors that name the problem
# ---------------------------------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_folders_and_files_written_whole_follow_the_umask(tmp_path, umask):
    """Built beside their destination and renamed into place, outputs get the permissions of any new file: under
    umask 022 others on a shared machine can read the models."""
    previous = os.umask(umask)
    try:
        with atomic_folder(tmp_path / "model") as building:
            (building / "weights.bin").write_bytes(b"0")
        write_json(tmp_path / "model" / "scores.json", {})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((tmp_path / "model" / "scores.json").stat().st_mode) == 0o666 & ~umask
