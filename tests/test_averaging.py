"""Checkpoint averaging (§6.1): the mean of the last N Trainer checkpoints, written as a normal model folder."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, assert_one_line_error, invoke, tiny_tokenizer, tool_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vaswani import VaswaniForConditionalGeneration
from vaswani.commands import average_checkpoints as average_command
from vaswani.recipe.averaging import (
    average_checkpoints,
    average_state_dicts,
    find_checkpoints,
    last_checkpoints,
)

VOCAB = 280


def write_checkpoint(run_dir: Path, step: int, seed: int, tokenizer=None, **overrides) -> Path:
    """A Trainer-like checkpoint folder: weights, config, generation config, tokenizer, training state."""
    folder = run_dir / f"checkpoint-{step}"
    model = tool_model(VOCAB, seed=seed, **overrides)
    model.generation_config.max_new_tokens = step  # marks which checkpoint the generation config came from
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    torch.save({"state": {}}, folder / "optimizer.pt")
    return folder


def average_run(run_dir: Path, out: Path, num_checkpoints: int) -> Path:
    """`vaswani-average-checkpoints --run_dir RUN --num_checkpoints N --output_dir OUT`, as a user types it."""
    argv = ["--run_dir", str(run_dir), "--num_checkpoints", str(num_checkpoints), "--output_dir", str(out)]
    return average_command.main(argv)


def refused_run(run_dir: Path, out: Path, capsys) -> str:
    """The one-line error of `vaswani-average-checkpoints` on the last 2 checkpoints of `run_dir`; nothing written."""
    argv = ["--run_dir", run_dir, "--num_checkpoints", 2, "--output_dir", out]
    code, _, err = invoke(average_command.main, argv, capsys)
    assert_one_line_error(code, err)
    assert not out.exists()
    return err


@pytest.fixture
def run_dir(tmp_path, tokenizer):
    """Steps chosen so that sorting names as strings would pick the wrong ones (checkpoint-9 > checkpoint-1000)."""
    run = tmp_path / "run"
    for seed, step in enumerate([9, 10, 100, 1000]):
        write_checkpoint(run, step, seed, tokenizer)
    (run / "checkpoint-best").mkdir()  # not a checkpoint-<step> folder: ignored
    (run / "runs").mkdir()
    return run


def test_checkpoints_sorted_by_step_number(run_dir):
    assert [p.name for p in find_checkpoints(run_dir)] == [
        "checkpoint-9",
        "checkpoint-10",
        "checkpoint-100",
        "checkpoint-1000",
    ]
    assert [p.name for p in last_checkpoints(run_dir, 3)] == [
        "checkpoint-10",
        "checkpoint-100",
        "checkpoint-1000",
    ]


def test_average_of_three_equals_hand_computed_mean(run_dir, tmp_path, tokenizer):
    out = average_run(run_dir, tmp_path / "avg", 3)
    models = [
        VaswaniForConditionalGeneration.from_pretrained(run_dir / f"checkpoint-{s}") for s in (10, 100, 1000)
    ]
    averaged = VaswaniForConditionalGeneration.from_pretrained(out)
    params = dict(averaged.named_parameters())
    for name, _ in models[0].named_parameters():
        expected = sum(dict(m.named_parameters())[name].double() for m in models) / 3
        torch.testing.assert_close(params[name].double(), expected, rtol=0, atol=1e-7)
        assert params[name].dtype == torch.float32
    # checkpoint-9 took no part: the mean of the last three differs from that of all four.
    first = VaswaniForConditionalGeneration.from_pretrained(run_dir / "checkpoint-9")
    all_four = (sum(m.model.shared.weight for m in models) + first.model.shared.weight) / 4
    assert not torch.allclose(averaged.model.shared.weight, all_four)


def test_average_state_dicts_accumulates_in_float64(tmp_path):
    """A float32 running sum would lose the 1.0 next to 1e8 (and give 0); the float64 sum keeps it."""
    values = [1e8, 1.0, -1e8]
    paths = []
    for i, value in enumerate(values):
        folder = tmp_path / f"checkpoint-{i}"
        folder.mkdir()
        save_file({"w": torch.full((3,), value, dtype=torch.float32)}, str(folder / "model.safetensors"))
        paths.append(folder)
    mean = average_state_dicts(paths, show_progress=False)["w"]
    assert mean.dtype == torch.float32
    assert torch.equal(mean, torch.full((3,), 1 / 3, dtype=torch.float32))


def test_output_folder_keeps_ties_and_companion_files(run_dir, tmp_path, tokenizer):
    out = average_checkpoints([run_dir / "checkpoint-100", run_dir / "checkpoint-1000"], tmp_path / "avg")
    with safe_open(out / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
    assert "model.shared.weight" in keys
    assert not keys & {
        "lm_head.weight",
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
    }
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert type(model) is VaswaniForConditionalGeneration
    assert model.lm_head.weight is model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is model.model.shared.weight
    # Tokenizer and generation config of the newest checkpoint; no training state.
    assert AutoTokenizer.from_pretrained(out)("Ein Hund.")["input_ids"] == tokenizer("Ein Hund.")["input_ids"]
    assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == 1000
    files = {p.name for p in out.iterdir()}
    assert not files & {"optimizer.pt", "trainer_state.json"}
    assert {"config.json", "modeling_vaswani.py", "configuration_vaswani.py"} <= files


def test_separate_tokenizers_and_extra_code_are_copied(tmp_path, tokenizer):
    run = tmp_path / "run"
    for seed, step in enumerate([1, 2]):
        folder = write_checkpoint(run, step, seed)
        tokenizer.save_pretrained(folder / "source")
        tokenizer.save_pretrained(folder / "target")
        (folder / "custom_module.py").write_text("# code the config refers to\n")
    out = average_run(run, tmp_path / "avg", 2)
    assert (out / "source" / "tokenizer.json").is_file() and (out / "target" / "tokenizer.json").is_file()
    assert (out / "custom_module.py").read_text() == "# code the config refers to\n"


def test_sharded_checkpoints(tmp_path):
    run = tmp_path / "run"
    for seed, step in enumerate([1, 2]):
        tool_model(VOCAB, seed=seed).save_pretrained(run / f"checkpoint-{step}", max_shard_size="20KB")
    assert (run / "checkpoint-1" / "model.safetensors.index.json").is_file()
    out = average_run(run, tmp_path / "avg", 2)
    a, b = (tool_model(VOCAB, seed=seed) for seed in (0, 1))
    averaged = VaswaniForConditionalGeneration.from_pretrained(out)
    torch.testing.assert_close(
        averaged.model.shared.weight, (a.model.shared.weight + b.model.shared.weight) / 2
    )


def test_mismatched_shapes_name_the_folder(tmp_path, capsys):
    run = tmp_path / "run"
    write_checkpoint(run, 1, 0)
    write_checkpoint(run, 2, 1, encoder_ffn_dim=24)
    assert re.search(r"checkpoint-2.*fc1.*shape", refused_run(run, tmp_path / "avg", capsys))


def test_missing_key_names_the_folder(tmp_path, capsys):
    run = tmp_path / "run"
    write_checkpoint(run, 1, 0)
    folder = write_checkpoint(run, 2, 1)
    state = load_file(folder / "model.safetensors")
    del state["model.encoder.layers.0.fc1.bias"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert re.search(r"checkpoint-2.*missing.*fc1\.bias", refused_run(run, tmp_path / "avg", capsys))


def test_truncated_safetensors_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    write_checkpoint(run, 1, 0)
    weights = write_checkpoint(run, 2, 1) / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert re.search(r"checkpoint-2/model\.safetensors", refused_run(run, tmp_path / "avg", capsys))


def test_too_few_or_no_checkpoints(tmp_path, run_dir):
    with pytest.raises(ValueError, match=r"last 5 .* has 4"):
        last_checkpoints(run_dir, 5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has 0"):
        last_checkpoints(tmp_path / "empty", 1)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        average_checkpoints([run_dir / "checkpoint-best"], tmp_path / "avg", show_progress=False)


def test_script(run_dir, tmp_path):
    out = tmp_path / "avg"
    result = subprocess.run(
        [
            sys.executable,
            "scripts/average_checkpoints.py",
            "--run_dir",
            str(run_dir),
            "--num_checkpoints",
            "2",
        ]
        + ["--output_dir", str(out)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "checkpoint-1000" in result.stderr
    VaswaniForConditionalGeneration.from_pretrained(out)


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


def test_averaging_refuses_an_index_that_points_outside_its_checkpoint(tmp_path):
    """A safetensors index naming `../elsewhere/model.safetensors` would average weights from another folder."""
    tokenizer = tiny_tokenizer()
    elsewhere = tmp_path / "elsewhere"
    tool_model(len(tokenizer)).save_pretrained(elsewhere)
    checkpoints = []
    for step in (1, 2):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        tool_model(len(tokenizer), seed=step).save_pretrained(folder)
        checkpoints.append(folder)
    (checkpoints[1] / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "../../elsewhere/model.safetensors"}}
    (checkpoints[1] / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names weight files outside its folder: \['../../elsewhere"):
        average_checkpoints(checkpoints, tmp_path / "averaged", show_progress=False)
    assert not (tmp_path / "averaged").exists()


def test_vaswani_average_checkpoints_folder_is_readable_by_others(tmp_path):
    tokenizer = tiny_tokenizer()
    checkpoints = []
    for step in (1, 2):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        tool_model(len(tokenizer), seed=step).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        checkpoints.append(str(folder))
    out = tmp_path / "averaged"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vaswani.commands.average_checkpoints",
            "--checkpoints",
            *checkpoints,
            "--output_dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        preexec_fn=lambda: os.umask(0o022),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044 for p in out.rglob("*") if p.is_file())
