"""Faults that used to lose, mix or expose files, or to do the wrong thing without a word: each case as a user meets
it, through the command or the call they would type."""

import json
import os
import stat
import subprocess
import sys

import pytest
from tiny_translation_assets import tiny_model, tiny_tokenizer

from vaswani.averaging import average_checkpoints
from vaswani.fileio import atomic_folder, write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_averaging_refuses_an_index_that_points_outside_its_checkpoint(tmp_path):
    """A safetensors index naming `../elsewhere/model.safetensors` would average weights from another folder."""
    tokenizer = tiny_tokenizer()
    elsewhere = tmp_path / "elsewhere"
    tiny_model(len(tokenizer)).save_pretrained(elsewhere)
    checkpoints = []
    for step in (1, 2):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        tiny_model(len(tokenizer), seed=step).save_pretrained(folder)
        checkpoints.append(folder)
    (checkpoints[1] / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "../../elsewhere/model.safetensors"}}
    (checkpoints[1] / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names weight files outside its folder: \['../../elsewhere"):
        average_checkpoints(checkpoints, tmp_path / "averaged", show_progress=False)
    assert not (tmp_path / "averaged").exists()


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_folders_and_files_written_whole_follow_the_umask(tmp_path, umask):
    """Built beside their destination and renamed into place, outputs get the permissions of any new file: under
    umask 022 others on a shared machine can read the models."""
    previous = os.umask(umask)
    try:
        with atomic_folder(tmp_path / "model") as building:
            (building / "weights.bin").write_bytes(b"0")
        write_text(tmp_path / "model" / "scores.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((tmp_path / "model" / "scores.json").stat().st_mode) == 0o666 & ~umask


def test_vaswani_average_checkpoints_folder_is_readable_by_others(tmp_path):
    tokenizer = tiny_tokenizer()
    checkpoints = []
    for step in (1, 2):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        tiny_model(len(tokenizer), seed=step).save_pretrained(folder)
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
