"""Learning curves and attention heatmaps: PNG files are written, and the plotted weights are the model's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, SENTENCES, tool_model
from matplotlib.image import imread

from vaswani.recipe.plotting import (
    attention_maps,
    find_trainer_state,
    learning_curves,
    load_attention_model,
    plot_attention_maps,
    plot_learning_curves,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

LOG_HISTORY = [
    {"loss": 5.1, "grad_norm": 3.0, "learning_rate": 1e-4, "epoch": 0.5, "step": 10},
    {"loss": 4.2, "grad_norm": 2.0, "learning_rate": 2e-4, "epoch": 1.0, "step": 20},
    {"eval_loss": 4.0, "eval_bleu": 3.5, "eval_runtime": 1.0, "epoch": 1.0, "step": 20},
    {"loss": 3.3, "grad_norm": 1.5, "learning_rate": 1.4e-4, "epoch": 1.5, "step": 30},
    {"eval_loss": 3.1, "eval_bleu": 9.25, "eval_runtime": 1.0, "epoch": 2.0, "step": 40},
    {"train_runtime": 9.0, "train_loss": 4.2, "epoch": 2.0, "step": 40},
]


def assert_png(path: Path, min_bytes: int = 10_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes
    height, width, _ = imread(path).shape
    assert height > 200 and width > 200


def write_run(run: Path) -> None:
    for step, entries in ((20, LOG_HISTORY[:3]), (40, LOG_HISTORY)):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        state = {"global_step": step, "log_history": entries}
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state))


def test_learning_curves_series():
    curves = learning_curves(LOG_HISTORY)
    assert curves["loss"] == ([10, 20, 30], [5.1, 4.2, 3.3])  # the final train_loss summary is not a point
    assert curves["eval_loss"] == ([20, 40], [4.0, 3.1])
    assert curves["eval_bleu"] == ([20, 40], [3.5, 9.25])
    assert curves["learning_rate"] == ([10, 20, 30], [1e-4, 2e-4, 1.4e-4])


def test_learning_curves_png_from_run_folder(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    assert (
        find_trainer_state(run) == run / "checkpoint-40" / "trainer_state.json"
    )  # the newest, longest history
    path = plot_learning_curves(run, tmp_path / "curves.png")
    assert_png(path)
    # Without any evaluation the panels still come out, saying "not logged".
    assert_png(plot_learning_curves(LOG_HISTORY[:2], tmp_path / "no_eval.png"))
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        find_trainer_state(tmp_path / "nothing")


@pytest.fixture(scope="module")
def eager_model(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    tool_model(len(tokenizer), encoder_layers=2, decoder_layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model, _, _ = load_attention_model(folder, device="cpu")
    return model, folder


def test_attention_maps_are_the_models(eager_model, tokenizer):
    model, _ = eager_model
    assert model.config._attn_implementation == "eager"
    source, target = SENTENCES[0], SENTENCES[4]
    maps = attention_maps(model, tokenizer, source, target)
    src_ids, tgt_ids = tokenizer(source)["input_ids"], tokenizer(target)["input_ids"]
    ts, tt = len(src_ids), len(tgt_ids)
    assert maps.encoder.shape == (2, 2, ts, ts)
    assert maps.decoder.shape == (2, 2, tt, tt)
    assert maps.cross.shape == (2, 2, tt, ts)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert torch.equal(maps.decoder, maps.decoder.tril())  # masked: no attention to later positions
    assert maps.source_tokens[-1] == "</s>" and maps.target_tokens[0] == "<s>"
    assert len(maps.source_tokens) == ts and len(maps.target_tokens) == tt
    # Labels are the text each token adds, spaces shown as "▁": together they spell the sentences ("ä" is two
    # byte-level tokens: the first is labelled "\ufffd", the second "ä").
    assert "\ufffd" in maps.source_tokens
    assert "".join(maps.source_tokens[:-1]).replace("▁", " ").replace("\ufffd", "").strip() == source
    # Decoder inputs are <s> y_1 ... y_n: the whole target, without </s>.
    assert "".join(maps.target_tokens[1:]).replace("▁", " ").strip() == target
    # The same numbers as the model's own output_attentions.
    out = model(
        input_ids=torch.tensor([src_ids]),
        decoder_input_ids=torch.tensor([[1] + tgt_ids[:-1]]),
        output_attentions=True,
    )
    torch.testing.assert_close(maps.encoder[1], out.encoder_attentions[1][0])
    torch.testing.assert_close(maps.decoder[0], out.decoder_attentions[0][0])
    torch.testing.assert_close(maps.cross[1], out.cross_attentions[1][0])


def test_sdpa_model_is_switched_to_eager_for_attention_maps(tokenizer):
    model = tool_model(len(tokenizer), attn_implementation="sdpa")
    reference = tool_model(len(tokenizer), attn_implementation="eager")
    assert model.config._attn_implementation == "sdpa"
    maps = attention_maps(model, tokenizer, SENTENCES[0], SENTENCES[4])
    assert model.config._attn_implementation == "eager"
    expected = attention_maps(reference, tokenizer, SENTENCES[0], SENTENCES[4])
    torch.testing.assert_close(maps.cross, expected.cross)
    torch.testing.assert_close(maps.encoder, expected.encoder)


def test_attention_pngs(eager_model, tokenizer, tmp_path):
    model, _ = eager_model
    maps = attention_maps(model, tokenizer, SENTENCES[1], SENTENCES[5])
    paths = plot_attention_maps(maps, tmp_path, prefix="pair")
    assert set(paths) == {"encoder", "decoder", "cross"}
    for kind, path in paths.items():
        assert path == tmp_path / f"pair_{kind}.png"
        assert_png(path)
    # A restricted grid is a smaller picture.
    small = plot_attention_maps(maps, tmp_path / "small", layers=[1], heads=[0])
    assert imread(small["cross"]).shape[0] < imread(paths["cross"]).shape[0]


def test_attention_of_the_models_own_translation(eager_model, tokenizer):
    model, _ = eager_model
    maps = attention_maps(model, tokenizer, SENTENCES[2])
    assert maps.cross.shape[-1] == len(tokenizer(SENTENCES[2])["input_ids"])
    assert maps.target_tokens[0] == "<s>"


def test_script(eager_model, tmp_path):
    _, folder = eager_model
    run = tmp_path / "run"
    write_run(run)
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    commands = [
        ["curves", "--run_dir", str(run), "--output", str(tmp_path / "curves.png")],
        [
            "attention",
            "--model_name_or_path",
            str(folder),
            "--source_text",
            SENTENCES[0],
            "--target_text",
            SENTENCES[4],
        ]
        + ["--output_dir", str(tmp_path / "att"), "--device", "cpu"],
    ]
    for command in commands:
        result = subprocess.run(
            [sys.executable, "scripts/plot.py", *command], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
    assert_png(tmp_path / "curves.png")
    assert {p.name for p in (tmp_path / "att").iterdir()} == {
        "attention_encoder.png",
        "attention_decoder.png",
        "attention_cross.png",
    }
