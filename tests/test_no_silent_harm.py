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


@pytest.fixture(scope="module")
def converted_marian(tmp_path_factory):
    """A small Marian model (sentencepiece vocabulary, no beginning-of-sentence id, a generation config without a
    length penalty), taught to copy, and its `vaswani-convert` folder."""
    import test_convert

    from vaswani.convert import convert

    root = tmp_path_factory.mktemp("marian")
    name = next(name for name, case in test_convert.CASES.items() if case[0] == "marian")
    test_convert.source_model(name, root / "marian", steps=40)
    convert(root / "marian", root / "converted")
    return root / "marian", root / "converted"


@pytest.mark.parametrize("engine", ["ctranslate2", "onnx"])
def test_a_converted_marian_model_exports_and_translates_as_pytorch_does(converted_marian, tmp_path, engine):
    """CTranslate2 needs a beginning-of-sentence token the Marian config lacks (the decoder start serves), and a
    generation config without a length penalty decodes with transformers' default, 1.0."""
    from vaswani.engines import load_exported
    from vaswani.engines import translate as translate_exported
    from vaswani.export import export
    from vaswani.translation import load_translation_model, translate

    _, converted = converted_marian
    export(converted, tmp_path / engine, engine)
    model, source, target = load_translation_model(converted)
    sentences = ["▁a b c d", "c d e", "b a"]
    expected = translate(sentences, model, source, target, show_progress=False)
    loaded, source, target = load_exported(tmp_path / engine)
    assert translate_exported(sentences, loaded, source, target, show_progress=False) == expected


def test_exporting_an_unconverted_marian_folder_names_the_fix(converted_marian, tmp_path):
    from vaswani.export import export

    marian, _ = converted_marian
    with pytest.raises(ValueError, match=r"holds a 'marian' model, not a vaswani one: convert it first"):
        export(marian, tmp_path / "out", "ctranslate2")
    assert not (tmp_path / "out").exists()


def test_a_failed_export_leaves_the_earlier_export_whole_and_no_folder_behind(
    converted_marian, tmp_path, monkeypatch
):
    """Built beside its destination: a failure (here the exporter raises half-way) leaves the earlier export as it
    was, and a first export that fails leaves nothing, so a retry is not refused."""
    from vaswani.export import export, to_onnx

    _, converted = converted_marian
    out = tmp_path / "onnx"
    export(converted, out, "onnx")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def broken(model, output_dir):
        (output_dir / to_onnx.ENCODER_FILE).write_bytes(b"half")
        raise RuntimeError("killed half-way")

    monkeypatch.setattr(to_onnx, "export_graphs", broken)
    with pytest.raises(RuntimeError, match="half-way"):
        export(converted, out, "onnx", force=True)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(RuntimeError, match="half-way"):
        export(converted, tmp_path / "first", "onnx")
    assert not (tmp_path / "first").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["onnx"]  # no temporary folder left


def test_a_folder_that_is_not_a_complete_export_is_named_as_such(tmp_path):
    from vaswani.engines import load_exported

    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)  # a tokenizer, but no export
    with pytest.raises(ValueError, match="is not a complete folder written by vaswani-export"):
        load_exported(tmp_path)


def test_separate_tokenizers_of_two_trainings_are_not_loaded_as_one_pair(tmp_path):
    """`vaswani-train-tokenizer --separate_vocabularies` killed between the renames of source/ and target/ would
    leave one side of the new training beside one of the old: that folder is refused, naming both sides."""
    from vaswani.tokenization import load_tokenizers, save_tokenizers, train_separate_tokenizers

    sentences = ["ein mann fährt rad", "zwei hunde spielen", "a man rides a bike", "two dogs play"]
    old = train_separate_tokenizers(
        iter(sentences[:2]), iter(sentences[2:]), vocab_size=300, min_frequency=1, show_progress=False
    )
    new = train_separate_tokenizers(
        iter(sentences), iter(sentences), vocab_size=320, min_frequency=1, show_progress=False
    )
    save_tokenizers(*old, tmp_path / "tok")
    save_tokenizers(*new, tmp_path / "new")
    load_tokenizers(tmp_path / "tok")  # a whole pair loads
    for name in (
        "tokenizer.json",
        "vaswani_tokenizer_pair.json",
    ):  # the source side of the new one arrived first
        (tmp_path / "tok" / "source" / name).write_bytes((tmp_path / "new" / "source" / name).read_bytes())
    with pytest.raises(ValueError, match=r"are not one pair of tokenizers"):
        load_tokenizers(tmp_path / "tok")


def test_the_tokenizer_of_a_model_folder_loads_silently(tmp_path):
    """The tokenizer is a plain fast tokenizer: after `import vaswani`, `AutoTokenizer` loads it without a question
    or a warning; where the package is missing, `PreTrainedTokenizerFast` does (AutoTokenizer reads the model's
    config.json first, which is custom code there, so it asks for `trust_remote_code=True` as for any such model)."""
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    expected = tokenizer("Ein Mann fährt Fahrrad.")["input_ids"]
    env = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ROOT,
    }
    for code in (
        "import vaswani; from transformers import AutoTokenizer as T",
        "import sys; sys.modules['vaswani'] = None; from transformers import PreTrainedTokenizerFast as T",
        "import sys; sys.modules['vaswani'] = None; from functools import partial; "
        "from transformers import AutoTokenizer; T = type('T', (), {'from_pretrained': staticmethod("
        "partial(AutoTokenizer.from_pretrained, trust_remote_code=True))})",
    ):
        script = (
            f"{code}\nprint(T.from_pretrained({str(tmp_path)!r})('Ein Mann fährt Fahrrad.')['input_ids'])"
        )
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == str(expected)
        assert "Do you wish" not in result.stdout + result.stderr and "model of type" not in result.stderr
