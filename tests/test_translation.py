"""Batched translation: same output as one-by-one `generate`, input order kept, empty lines, stdin/stdout."""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import (
    BIN,
    ROOT,
    SENTENCES,
    assert_one_line_error,
    invoke,
    tiny_model,
    tiny_tokenizer,
    translation_model,
)

from vaswani.commands import translate as translate_command
from vaswani.publishing.model_card import EvalResults
from vaswani.recipe.metrics import reported_scores
from vaswani.recipe.tokenization import save_tokenizers
from vaswani.recipe.translation import (
    length_penalty_form_of,
    length_penalty_of,
    load_translation_model,
    make_batches,
    read_sentences,
    score_translations,
    translate,
    write_sentences,
)

MORE = SENTENCES + ["Ein Hund.", "Die Kinder spielen im Park mit zwei Hunden und einem Ball.", "Schnee"]


@pytest.fixture(scope="module")
def model(tokenizer):
    return translation_model(len(tokenizer))


def one_by_one(sentences, model, src_tok, tgt_tok, max_new_tokens):
    """The reference: `model.generate` per sentence, unbatched, with §6.1's beam 4 and length penalty 0.6."""
    outputs = []
    for sentence in sentences:
        ids = model.generate(
            **src_tok([sentence], return_tensors="pt"),
            num_beams=4,
            length_penalty=0.6,
            max_new_tokens=max_new_tokens,
        )
        outputs.append(tgt_tok.decode(ids[0], skip_special_tokens=True))
    return outputs


def test_make_batches_sorts_by_length_and_caps_tokens():
    lengths = [3, 9, 1, 9, 5, 2]
    assert make_batches(lengths, batch_size=2) == [[1, 3], [4, 0], [5, 2]]
    # max_tokens=18: two 9-token sentences fit, a third sentence would make 3 x 5 = 15 < 18 but 3 x 9 > 18.
    assert make_batches(lengths, batch_size=10, max_tokens=18) == [[1, 3], [4, 0, 5], [2]]
    assert make_batches([30, 2], batch_size=10, max_tokens=8) == [[0], [1]]  # too long: alone
    with pytest.raises(ValueError, match="batch_size"):
        make_batches(lengths, batch_size=0)


@pytest.fixture(scope="module")
def expected(model, tokenizer):
    return one_by_one(MORE, model, tokenizer, tokenizer, max_new_tokens=12)


@pytest.mark.parametrize("batch_size, max_tokens", [(4, None), (64, None), (64, 40)])
def test_batched_equals_one_by_one_in_input_order(model, tokenizer, expected, batch_size, max_tokens):
    assert len(set(expected)) > 3, "the test needs different outputs to check the order"
    assert len({len(tokenizer(t)["input_ids"]) for t in expected}) > 1, "and outputs of different lengths"
    got = translate(
        MORE,
        model,
        tokenizer,
        batch_size=batch_size,
        max_tokens=max_tokens,
        max_new_tokens=12,
        show_progress=False,
    )
    assert got == expected


def test_default_limit_is_longest_source_of_the_batch_plus_50(model, tokenizer, monkeypatch):
    calls = []

    def spy(**kwargs):
        calls.append((kwargs["attention_mask"].sum(-1).max().item(), kwargs))
        rows = kwargs["input_ids"].shape[0]
        return torch.tensor([[1, 7 + rows, 2]]).repeat(rows, 1)  # <s> (a token saying the batch size) </s>

    monkeypatch.setattr(model, "generate", spy)
    got = translate(MORE, model, tokenizer, batch_size=3, show_progress=False)
    assert len(calls) == 4
    for longest, kwargs in calls:
        assert kwargs["max_new_tokens"] == longest + 50
        assert kwargs["num_beams"] == 4 and kwargs["length_penalty"] == 0.6
        assert "length_penalty_form" not in kwargs  # the model's generation config decides
    calls.clear()
    translate(MORE[:1], model, tokenizer, length_penalty_form="power", show_progress=False)
    assert calls[0][1]["length_penalty_form"] == "power"
    # Longest first: the limits never grow from one batch to the next.
    limits = [kwargs["max_new_tokens"] for _, kwargs in calls]
    assert limits == sorted(limits, reverse=True)
    # 11 sentences in batches of 3: the two shortest came in the last batch, of 2.
    lengths = [len(tokenizer(s)["input_ids"]) for s in MORE]
    shortest = sorted(range(len(MORE)), key=lambda i: -lengths[i])[-2:]
    assert [i for i, text in enumerate(got) if text == tokenizer.decode([9])] == sorted(shortest)


def test_empty_lines_give_empty_lines(model, tokenizer):
    sentences = ["", SENTENCES[0], "   ", SENTENCES[1], ""]
    got = translate(sentences, model, tokenizer, max_new_tokens=8, show_progress=False)
    expected = one_by_one([SENTENCES[0], SENTENCES[1]], model, tokenizer, tokenizer, max_new_tokens=8)
    assert got == ["", expected[0], "", expected[1], ""]
    assert translate(["", ""], model, tokenizer, show_progress=False) == ["", ""]


def test_separate_source_and_target_tokenizers(tmp_path):
    source = tiny_tokenizer(SENTENCES[:4])
    target = tiny_tokenizer(SENTENCES[4:])
    model = translation_model(len(source), decoder_vocab_size=len(target))
    model.save_pretrained(tmp_path)
    save_tokenizers(source, target, tmp_path)
    loaded, src_tok, tgt_tok = load_translation_model(tmp_path, device="cpu")
    assert src_tok is not tgt_tok and len(tgt_tok) == len(target)
    got = translate(SENTENCES[:4], loaded, src_tok, tgt_tok, max_new_tokens=10, show_progress=False)
    assert got == one_by_one(SENTENCES[:4], model, source, target, max_new_tokens=10)


def test_bf16(tmp_path, model, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, src_tok, _ = load_translation_model(tmp_path, device="cpu", bf16=True)
    assert loaded.dtype == torch.bfloat16 and not loaded.training
    assert len(translate(SENTENCES[:2], loaded, src_tok, max_new_tokens=4, show_progress=False)) == 2


def test_script_stdin_to_stdout_with_references(tmp_path, model, tokenizer):
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    sentences = [SENTENCES[0], "", SENTENCES[2], SENTENCES[1]]
    references = tmp_path / "ref.txt"
    references.write_text("\n".join(["A man rides a bike.", "", "A book.", "Two dogs."]) + "\n")
    result = subprocess.run(
        [sys.executable, "scripts/translate.py", "--model_name_or_path", str(folder), "--max_new_tokens", "8"]
        + ["--batch_size", "2", "--device", "cpu", "--references", str(references)],
        input="\n".join(sentences) + "\n",
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    assert result.returncode == 0, result.stderr
    expected = translate(sentences, model, tokenizer, max_new_tokens=8, show_progress=False)
    assert result.stdout.split("\n") == expected + [""]
    assert "BLEU = " in result.stderr and "chrF = " in result.stderr
    assert "Translating" in result.stderr  # the progress bar goes to stderr, never into the translations


def test_files_keep_one_sentence_a_line(tmp_path):
    path = tmp_path / "out" / "hyp.txt"
    write_sentences(["a\nb", "", "c\r\nd ü\u2028e"], path)
    assert path.read_bytes() == "a b\n\nc  d ü\u2028e\n".encode()
    assert read_sentences(path) == ["a b", "", "c  d ü\u2028e"]


def test_score_translations_checks_line_counts(tmp_path):
    references = tmp_path / "ref.txt"
    references.write_text("A man rides a bike.\nTwo dogs play.\n")
    scores = score_translations(["A man rides a bike.", "Two dogs play."], [references])
    assert scores["bleu"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="ref.txt has 2 lines"):
        score_translations(["only one"], [references])


def test_score_translations_with_moses_lang_gives_the_reported_record(tmp_path):
    references = tmp_path / "ref.txt"
    references.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen.\n")
    hypotheses = ["ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Park."]
    scores = score_translations(hypotheses, [references], moses_lang="de")
    assert scores == reported_scores(hypotheses, ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen."], "de")
    # lowercased and Moses-tokenized, the first hypothesis matches its reference; on raw text it does not
    assert scores["bleu_lowercase_moses_tokenized"] > scores["bleu"]
    assert "tok:none" in scores["bleu_lowercase_moses_tokenized_signature"]
    caseless = score_translations(hypotheses, [references], moses_lang="de", lowercase=True)
    assert "case:lc" in caseless["bleu_signature"] and caseless["bleu"] > scores["bleu"]
    with pytest.raises(TypeError, match="tokenize"):  # the reported record has no other settings
        score_translations(hypotheses, [references], moses_lang="de", tokenize="intl")


def test_script_writes_results_that_the_model_card_reads(tmp_path, model, tokenizer):
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # A length penalty the model's generation config holds (vaswani-train --length_penalty chooses one on val).
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "length_penalty": 1.3}))
    source, references, results = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "results.json"
    source.write_text("\n".join(SENTENCES[:3]) + "\n")
    references.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde.\nEin Buch.\n")
    command = [
        sys.executable,
        "scripts/translate.py",
        "--model_name_or_path",
        str(folder),
        "--input",
        str(source),
    ]
    command += [
        "--output",
        str(tmp_path / "hyp.txt"),
        "--max_new_tokens",
        "6",
        "--device",
        "cpu",
        "--no_progress",
    ]
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    refused = subprocess.run(
        command + ["--results_json", str(results)], cwd=ROOT, env=env, capture_output=True
    )
    assert refused.returncode != 0 and b"need --references" in refused.stderr and not results.exists()

    command += ["--references", str(references), "--moses_lang", "de", "--results_json", str(results)]
    command += ["--dataset_name", "multi30k", "--split", "test_2016_flickr", "--num_beams", "2"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8")
    assert result.returncode == 0, result.stderr
    assert "BLEU (lowercased, Moses-tokenized, de) = " in result.stderr
    hypotheses = read_sentences(tmp_path / "hyp.txt")
    expected = reported_scores(hypotheses, read_sentences(references), "de")
    card = EvalResults.from_json(results)
    assert card.bleu == expected["bleu"] and card.chrf == expected["chrf"]
    assert card.bleu_lowercase_moses_tokenized == expected["bleu_lowercase_moses_tokenized"]
    assert card.bleu_signature == expected["bleu_signature"]
    assert (card.dataset, card.split, card.num_beams, card.length_penalty) == (
        "multi30k",
        "test_2016_flickr",
        2,
        1.3,
    )
    # the model's own length penalty and form, which the script did not override
    assert card.length_penalty_form == "gnmt"
    command += ["--output", str(tmp_path / "hyp-0.6.txt"), "--length_penalty", "0.6"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8")
    assert result.returncode == 0, result.stderr
    assert EvalResults.from_json(results).length_penalty == 0.6


def test_the_recorded_length_penalty_form_is_the_one_that_ran():
    model = tiny_model()  # a generation config without the setting: generate() uses the paper's form
    assert length_penalty_form_of(model) == "gnmt"
    # alpha as generate() takes it: the generation config's (transformers' 1.0 in one the recipe has not written)
    assert length_penalty_of(model) == 1.0 and length_penalty_of(model, 2.0) == 2.0
    model.generation_config.length_penalty = 1.5
    assert length_penalty_of(model) == 1.5
    assert length_penalty_form_of(model, "power") == "power"
    model.generation_config.length_penalty_form = "power"
    assert length_penalty_form_of(model) == "power"
    del model.generation_config.length_penalty_form
    model.config.model_type = "marian"  # any other model runs transformers' own form
    assert length_penalty_form_of(model) == "power"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_is_the_default_device_and_bf16_runs_there(tmp_path, model, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, src_tok, _ = load_translation_model(tmp_path, bf16=True)
    assert loaded.device.type == "cuda" and loaded.dtype == torch.bfloat16
    assert len(translate(MORE, loaded, src_tok, max_new_tokens=6, show_progress=False)) == len(MORE)


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
    """`vaswani-translate` without --input, on a terminal, says that it reads standard input."""
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
