"""Export to CTranslate2 and ONNX: the exports decode as the PyTorch model does.

CTranslate2 reproduces the PyTorch beam search with its own settings (|Y|^alpha, stop at k finished hypotheses); the
ONNX graphs give the PyTorch logits at every step, and this package's search over them its greedy and beam outputs.
"""

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import BIN, ROOT, SENTENCES, SHAPES, tiny_tokenizer, translation_model

from vaswani.commands.export import main
from vaswani.interop import engines
from vaswani.interop.export import CTRANSLATE2_QUANTIZATIONS, export, read_metadata
from vaswani.recipe.tokenization import save_tokenizers
from vaswani.recipe.translation import translate, translate_n_best

MORE = SENTENCES + ["Ein Hund.", "Die Kinder spielen im Park mit zwei Hunden und einem Ball.", "Schnee"]
# What CTranslate2's beam search does, asked of `generate()`.
CTRANSLATE2_SEARCH = dict(length_penalty_form="power", early_stopping=True)


def save_model(folder: Path, tokenizer, target_tokenizer=None, **overrides):
    """A random tiny model (outputs of many lengths) and its tokenizer(s) saved as the recipe saves them."""
    target_tokenizer = target_tokenizer or tokenizer
    if target_tokenizer is not tokenizer:
        overrides.update(
            decoder_vocab_size=len(target_tokenizer) + 20
        )  # the target embedding outgrows its BPE
    model = translation_model(len(tokenizer), **overrides)
    model.save_pretrained(folder)
    save_tokenizers(tokenizer, target_tokenizer, folder)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("model")
    return save_model(folder, tokenizer), folder


@pytest.fixture(scope="module")
def ct2_folder(saved, tmp_path_factory):
    return export(saved[1], tmp_path_factory.mktemp("ct2") / "float32", "ctranslate2")


@pytest.fixture(scope="module")
def onnx_folder(saved, tmp_path_factory):
    return export(saved[1], tmp_path_factory.mktemp("onnx") / "model", "onnx")


def ids_of(outputs):
    """`generate()` rows as the engines return them: tokens after the start token, up to and with the first </s>."""
    rows = []
    for row in outputs.tolist():
        row = row[1:]
        rows.append(row[: row.index(2) + 1] if 2 in row else row)
    return rows


# --------------------------------------------------------------------------------------------------------------------
# CTranslate2
# --------------------------------------------------------------------------------------------------------------------
def test_ctranslate2_export_reproduces_the_pytorch_beam_4_translations(saved, ct2_folder, tokenizer):
    model, _ = saved
    engine, source, target = engines.load_exported(ct2_folder)
    got = engines.translate(MORE, engine, source, target, batch_size=4, length_penalty_form="power")
    expected = translate(MORE, model, tokenizer, batch_size=4, show_progress=False, **CTRANSLATE2_SEARCH)
    assert (
        len(set(expected)) == len(MORE) and got == expected
    )  # eleven different translations, same as PyTorch


@pytest.mark.parametrize(
    "shape",
    [
        "pre-norm",
        "learned-positions-attention-bias",
        "separate-vocabularies",
        "marian-layout",
        "fairseq-positions",
    ],
)
def test_ctranslate2_export_follows_each_departure_from_the_paper(tmp_path, tokenizer, shape):
    overrides = dict(SHAPES.get(shape, {}))
    overrides.pop("decoder_vocab_size", None)
    if (
        shape == "fairseq-positions"
    ):  # fairseq's frequencies from position 2, more decoder heads, another epsilon
        overrides = dict(
            sinusoid_frequencies="fairseq", position_offset=2, decoder_attention_heads=4, layer_norm_eps=1e-6
        )
    target = tiny_tokenizer(SENTENCES[4:]) if shape == "separate-vocabularies" else tokenizer
    model = save_model(tmp_path / "model", tokenizer, target, **overrides)
    engine, source_tok, target_tok = engines.load_exported(
        export(tmp_path / "model", tmp_path / "ct2", "ctranslate2")
    )
    sources = tokenizer(MORE)["input_ids"]
    for beams in (1, 4):
        got = engine.generate(sources, num_beams=beams, max_new_tokens=16, length_penalty_form="power")
        expected = [
            ids_of(
                model.generate(torch.tensor([ids]), num_beams=beams, max_new_tokens=16, **CTRANSLATE2_SEARCH)
            )[0]
            for ids in sources
        ]
        assert [hypotheses[0].ids for hypotheses in got] == expected


def test_int8_and_bfloat16_exports_are_smaller_and_translate(saved, ct2_folder, tmp_path):
    size = {"float32": (ct2_folder / "model.bin").stat().st_size}
    for quantization in ("int8", "bfloat16"):
        folder = export(saved[1], tmp_path / quantization, "ctranslate2", quantization=quantization)
        assert read_metadata(folder)["quantization"] == quantization
        size[quantization] = (folder / "model.bin").stat().st_size
        engine, source, target = engines.load_exported(folder)
        translations = engines.translate(MORE, engine, source, target, max_new_tokens=8, show_progress=False)
        assert len(translations) == len(MORE) and all(isinstance(t, str) for t in translations)
    assert max(size["int8"], size["bfloat16"]) < size["float32"]


def test_ctranslate2_quantizations_are_the_ones_ctranslate2_accepts():
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    assert set(CTRANSLATE2_QUANTIZATIONS) == set(ACCEPTED_MODEL_TYPES)


def test_ctranslate2_n_best_starts_with_the_best(ct2_folder, tokenizer):
    engine = engines.load_engine(ct2_folder)
    sources = tokenizer(MORE[:3])["input_ids"]
    best = engine.generate(sources, num_beams=4, max_new_tokens=12)
    two = engine.generate(sources, num_beams=4, max_new_tokens=12, num_return_sequences=2)
    assert [len(h) for h in two] == [2, 2, 2] and [h[0].ids for h in two] == [h[0].ids for h in best]


@pytest.mark.parametrize("beams, n_best", [(1, 1), (4, 2)], ids=["greedy", "beam-4-2-best"])
def test_ctranslate2_n_best_lists_and_scores_are_the_pytorch_ones(
    saved, ct2_folder, tokenizer, beams, n_best
):
    assert_same_n_best(
        saved[0], engines.load_exported(ct2_folder), tokenizer, beams, n_best, **CTRANSLATE2_SEARCH
    )


def assert_same_n_best(model, exported, tokenizer, beams, n_best, **search):
    """`engines.translate_n_best` gives `translation.translate_n_best`'s texts and scores (an empty line included)."""
    sentences = MORE[:5] + [""]
    options = dict(
        n_best=n_best, num_beams=beams, max_new_tokens=20, batch_size=4, show_progress=False, **search
    )
    engine, source, target = exported
    got = engines.translate_n_best(sentences, engine, source, target, **options)
    expected = translate_n_best(sentences, model, tokenizer, **options)
    assert [[h.text for h in hypotheses] for hypotheses in got] == [[h.text for h in e] for e in expected]
    scores = [[h.score for h in hypotheses] for hypotheses in got]
    assert np.allclose(scores, [[h.score for h in e] for e in expected], atol=1e-4) and min(min(scores)) < 0


def test_ctranslate2_warns_that_it_has_no_paper_length_penalty(ct2_folder, tokenizer, caplog):
    engine = engines.load_engine(ct2_folder)
    with caplog.at_level(logging.WARNING, logger="vaswani.interop.engines"):
        engine.generate(
            tokenizer(MORE[:1])["input_ids"], num_beams=4, max_new_tokens=4, length_penalty_form="gnmt"
        )
    assert "|Y|^alpha" in caplog.text


def test_vaswani_translate_says_once_that_ctranslate2_decodes_without_the_models_length_penalty(
    ct2_folder, saved, tmp_path, capsys
):
    """`vaswani-translate --engine ctranslate2` decoded with |Y|^alpha instead of the model's GNMT form and said
    nothing a user noticed: said once, before the first sentence, naming both forms and the alpha; asked for the GNMT
    form by flag, refused; the export says it too."""
    from vaswani.commands.cli import setup_logging
    from vaswani.commands.translate import main as translate_main

    source = tmp_path / "src.txt"
    source.write_text("\n".join(MORE[:3]) + "\n")
    setup_logging()
    main(
        [
            "--model_name_or_path",
            str(saved[1]),
            "--engine",
            "ctranslate2",
            "--output_dir",
            str(tmp_path / "ct2"),
        ]
    )
    exported = capsys.readouterr().err
    assert "|Y|^0.6, not by the model's gnmt form ((5 + |Y|) / 6)^0.6" in exported
    argv = ["--model_name_or_path", str(ct2_folder), "--engine", "ctranslate2", "--input", str(source)]
    translate_main([*argv, "--output", str(tmp_path / "hyp.txt"), "--batch_size", "1"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "CTranslate2 has only the length penalty |Y|^alpha" in line]
    assert len(said) == 1 and "|Y|^0.6, not by the model's gnmt form ((5 + |Y|) / 6)^0.6" in said[0], err
    assert err.index(said[0]) < err.index("Translating"), "said before the first sentence"
    translate_main([*argv, "--output", str(tmp_path / "hyp.txt"), "--length_penalty_form", "power"])
    assert "CTranslate2 has only" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        translate_main([*argv, "--length_penalty_form", "gnmt"])
    assert exit_info.value.code == 2
    assert (
        "--length_penalty_form gnmt: CTranslate2 divides beam scores by |Y|^alpha" in capsys.readouterr().err
    )


def test_an_export_records_the_models_languages_and_vaswani_translate_checks_them(saved, tmp_path, capsys):
    from vaswani.commands.translate import main as translate_main

    folder = tmp_path / "model"
    shutil.copytree(saved[1], folder)
    (folder / "training_summary.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}))
    out = export(folder, tmp_path / "ct2", "ctranslate2")
    assert read_metadata(out)["languages"]["source_lang"] == "de"
    source = tmp_path / "src.de"
    source.write_text(MORE[0] + "\n")
    with pytest.raises(SystemExit):
        translate_main(
            [
                "--model_name_or_path",
                str(out),
                "--engine",
                "onnx",
                "--input",
                str(source),
                "--target_lang",
                "fr",
            ]
        )
    assert "--target_lang fr: the model" in capsys.readouterr().err


def test_ctranslate2_refuses_what_it_cannot_run(tmp_path, tokenizer, ct2_folder):
    save_model(tmp_path / "tanh", tokenizer, activation_function="tanh")
    with pytest.raises(ValueError, match="activation_function='tanh'"):
        export(tmp_path / "tanh", tmp_path / "out", "ctranslate2")
    engine = engines.load_engine(ct2_folder)
    with pytest.raises(ValueError, match="position table"):
        engine.generate([[5] * 1025], num_beams=1, max_new_tokens=4)


# --------------------------------------------------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------------------------------------------------
def assert_same_logits_at_every_step(model, engine, tokenizer):
    """Encoder output, a first call over three target tokens, then one token per call with the cache: all as the
    PyTorch model computes them for the whole target at once."""
    batch = tokenizer.pad({"input_ids": tokenizer(MORE[:3])["input_ids"]}, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    targets = torch.randint(
        4, model.config.decoder_vocab_size, (3, 7), generator=torch.Generator().manual_seed(0)
    )
    targets[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        memory = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
    got_memory, cross = engine.encode(ids.numpy(), mask.numpy())
    np.testing.assert_allclose(got_memory, memory.numpy(), atol=1e-5)
    past = [c[:, :, :0] for c in cross]  # the self-attention cache before the first target position
    logits, past = engine.decode(targets[:, :3].numpy(), mask.numpy(), past, cross)
    np.testing.assert_allclose(logits, expected[:, :3].numpy(), atol=1e-5)
    for step in range(3, 7):
        logits, past = engine.decode(targets[:, step : step + 1].numpy(), mask.numpy(), past, cross)
        np.testing.assert_allclose(logits[:, 0], expected[:, step].numpy(), atol=1e-5)
    assert past[0].shape[2] == 7  # the cache holds every target position


def test_onnx_export_gives_the_pytorch_logits_at_every_step(saved, onnx_folder, tokenizer):
    assert_same_logits_at_every_step(saved[0], engines.load_engine(onnx_folder), tokenizer)


@pytest.mark.parametrize(
    "search",
    [
        dict(num_beams=1),
        dict(num_beams=4),  # the paper's ((5 + |Y|) / 6)^0.6 and transformers' heuristic stop
        dict(num_beams=4, length_penalty_form="power", early_stopping=True),
        dict(num_beams=3, length_penalty=1.0, early_stopping="never"),
    ],
    ids=["greedy", "beam-4-paper", "beam-4-power-early-stop", "beam-3-never"],
)
def test_onnx_export_gives_the_pytorch_translations(saved, onnx_folder, tokenizer, search):
    model, _ = saved
    engine, source, target = engines.load_exported(onnx_folder)
    limits = dict(batch_size=4, max_new_tokens=30, show_progress=False)
    got = engines.translate(MORE, engine, source, target, **limits, **search)
    expected = translate(MORE, model, tokenizer, **limits, **search)
    assert len(set(expected)) > 5 and got == expected


def test_onnx_n_best_is_the_pytorch_n_best(saved, onnx_folder, tokenizer):
    model, _ = saved
    engine = engines.load_engine(onnx_folder)
    sources = tokenizer(MORE[:4])["input_ids"]
    got = engine.generate(sources, num_beams=4, max_new_tokens=10, num_return_sequences=3)
    for ids, hypotheses in zip(sources, got, strict=True):
        expected = model.generate(torch.tensor([ids]), num_beams=4, max_new_tokens=10, num_return_sequences=3)
        assert [h.ids for h in hypotheses] == ids_of(expected)


@pytest.mark.parametrize("beams, n_best", [(1, 1), (4, 3)], ids=["greedy", "beam-4-3-best"])
def test_onnx_n_best_lists_and_scores_are_the_pytorch_ones(saved, onnx_folder, tokenizer, beams, n_best):
    assert_same_n_best(saved[0], engines.load_exported(onnx_folder), tokenizer, beams, n_best)


def test_onnx_export_of_every_departure_at_once(tmp_path, tokenizer):
    overrides = {**SHAPES["marian-layout"], **SHAPES["pre-norm"], "sinusoid_frequencies": "fairseq"}
    overrides.update(position_offset=2, decoder_attention_heads=4)
    model = save_model(tmp_path / "model", tokenizer, tiny_tokenizer(SENTENCES[4:]), **overrides)
    engine = engines.load_engine(export(tmp_path / "model", tmp_path / "onnx", "onnx"))
    assert_same_logits_at_every_step(model, engine, tokenizer)


# --------------------------------------------------------------------------------------------------------------------
# Command line, metadata, optional extras
# --------------------------------------------------------------------------------------------------------------------
def test_command_line_exports_and_says_what_went_wrong_in_one_line(saved, tmp_path, capsys):
    out = tmp_path / "ct2"
    flags = ["--model_name_or_path", str(saved[1]), "--engine", "ctranslate2"]
    assert main([*flags, "--output_dir", str(out)]) == out
    assert json.loads((out / "vaswani_export.json").read_text())["decoding"]["length_penalty_form"] == "gnmt"
    capsys.readouterr()
    failures = [
        ([*flags, "--output_dir", str(out)], "--overwrite_output_dir"),
        (
            ["--model", str(tmp_path / "nowhere"), "--output", str(tmp_path / "x"), "--engine", "onnx"],
            "nowhere",
        ),
        (
            [*flags[:2], "--engine", "onnx", "--output_dir", str(tmp_path / "y"), "--quantization", "int8"],
            "ONNX",
        ),
        ([*flags, "--output_dir", str(tmp_path / "z"), "--quantization", "int4"], "--quantization"),
    ]
    for argv, named in failures:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        error = [line for line in capsys.readouterr().err.splitlines() if "vaswani-export: error:" in line]
        assert exit_info.value.code in (1, 2) and len(error) == 1 and named in error[0]



def test_the_onnx_export_command_prints_only_what_concerns_its_user(saved, tmp_path):
    """torch's exporter warns of its own deprecated calls and of the torchvision operators it skips; `vaswani-export`
    silences exactly those messages."""
    out = tmp_path / "onnx"
    flags = ["--model_name_or_path", str(saved[1]), "--engine", "onnx", "--output_dir", str(out)]
    done = subprocess.run([BIN / "vaswani-export", *flags], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and (out / "decoder.onnx").is_file(), done.stderr[-3000:]
    assert "Warning" not in done.stderr and "torchvision" not in done.stderr, done.stderr[-3000:]

def test_script_is_the_command_line():
    done = subprocess.run(
        [sys.executable, "scripts/export.py", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert (
        "--engine {ctranslate2,onnx}" in done.stdout
        and "--quantization" in done.stdout
        and "--overwrite_output_dir" in done.stdout
    )


def test_an_engine_names_the_folder_it_cannot_use(ct2_folder, tmp_path):
    with pytest.raises(ValueError, match="holds a ctranslate2 export"):
        engines.load_engine(ct2_folder, "onnx")
    with pytest.raises(ValueError, match="vaswani_export.json not found"):
        engines.load_engine(tmp_path)


def test_the_package_imports_no_engine():
    code = (
        "import sys, vaswani, vaswani.interop.export, vaswani.interop.engines;"
        "print(sorted({'ctranslate2', 'onnx', 'onnxruntime', 'onnxscript'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("engine", ["ctranslate2", "onnx"])
def test_vaswani_translate_runs_an_export_and_records_what_ran(
    engine, saved, ct2_folder, onnx_folder, tmp_path
):
    """`vaswani-translate --engine ctranslate2|onnx` on an exported folder: the translations of the engine's own
    `translate`, scores against references, and a results file that records the engine and the length penalty's
    form that ran; flags of the PyTorch path are refused for an export."""
    from vaswani.commands.translate import main as translate_main

    folder = ct2_folder if engine == "ctranslate2" else onnx_folder
    source = tmp_path / "src.txt"
    source.write_text("\n".join(MORE[:4]) + "\n")
    results = tmp_path / "results.json"
    out = translate_main(
        [
            "--model_name_or_path",
            str(folder),
            "--engine",
            engine,
            "--input",
            str(source),
            "--output",
            str(tmp_path / "hyp.txt"),
            "--references",
            str(source),
            "--results_json",
            str(results),
            "--no_progress",
        ]
    )
    engine_object, src_tok, tgt_tok = engines.load_exported(folder, engine)
    assert out == engines.translate(MORE[:4], engine_object, src_tok, tgt_tok, show_progress=False)
    record = json.loads(results.read_text())
    assert record["engine"] == engine
    assert record["length_penalty_form"] == ("power" if engine == "ctranslate2" else "gnmt")
    with pytest.raises(SystemExit):
        translate_main(
            ["--model_name_or_path", str(folder), "--engine", engine, "--bf16", "--input", str(source)]
        )


def test_a_folder_that_is_not_a_complete_export_is_named_as_such(tmp_path):
    from vaswani.interop.engines import load_exported

    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)  # a tokenizer, but no export
    with pytest.raises(ValueError, match="is not a complete folder written by vaswani-export"):
        load_exported(tmp_path)
