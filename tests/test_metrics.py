"""BLEU and chrF: the offline `evaluate` metric, the direct functions, the Moses convention and the script."""

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from helpers import assert_one_line_error, invoke

from vaswani.commands import evaluate as evaluate_command
from vaswani.recipe.metrics import (
    METRIC_PATH,
    compute_bleu,
    compute_moses_bleu,
    moses_lowercase_tokenize,
    reported_scores,
    score_files,
)

REPO = Path(__file__).resolve().parents[1]

PREDICTIONS = [
    "Ein Mann fährt mit dem Fahrrad über die Straße.",
    "Zwei Hunde spielen im Schnee.",
    "Das Mädchen isst ein Brötchen, oder?",
    "Drei Männer sitzen vor einem großen Gebäude.",
    "Eine Frau läuft über eine grüne Wiese!",
]
REFERENCES = [
    "Ein Mann fährt Fahrrad über die Straße.",
    "Zwei Hunde spielen draußen im Schnee.",
    "Das Mädchen isst ein Brötchen.",
    "Drei Männer sitzen vor einem großen, alten Gebäude.",
    "Eine Frau rennt über die grüne Wiese!",
]
SECOND_REFERENCES = [
    "Ein Mann radelt über die Straße.",
    "Zwei Hunde spielen im Schnee.",
    "Ein Mädchen isst ein Brötchen, nicht wahr?",
    "Drei Männer sitzen vor einem Gebäude.",
    "Eine Frau läuft über eine Wiese.",
]


@pytest.mark.parametrize(("tokenize", "lowercase"), [("13a", False), ("intl", True), ("char", False)])
def test_compute_bleu_equals_sacrebleu(tokenize, lowercase):
    scores = compute_bleu(PREDICTIONS, REFERENCES, tokenize=tokenize, lowercase=lowercase)
    bleu = sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES], tokenize=tokenize, lowercase=lowercase)
    chrf = sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES])
    assert 0 < scores["bleu"] < 100
    assert scores["bleu"] == bleu.score and scores["counts"] == bleu.counts and scores["bp"] == bleu.bp
    if not lowercase:
        assert scores["chrf"] == chrf.score
    case = "lc" if lowercase else "mixed"
    assert (
        scores["bleu_signature"]
        == f"BLEU|nrefs:1|case:{case}|eff:no|tok:{tokenize}|smooth:exp|version:{sacrebleu.__version__}"
    )
    assert scores["chrf_signature"].startswith(f"chrF2|nrefs:1|case:{case}|")


def test_several_references_per_segment():
    per_segment = [[a, b] for a, b in zip(REFERENCES, SECOND_REFERENCES, strict=True)]
    scores = compute_bleu(PREDICTIONS, per_segment)
    assert scores["bleu"] == sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES, SECOND_REFERENCES]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES, SECOND_REFERENCES]).score
    assert "nrefs:2" in scores["bleu_signature"]
    with pytest.raises(ValueError, match="5 predictions but 4 references"):
        compute_bleu(PREDICTIONS, REFERENCES[:4])


_OFFLINE_LOAD = """
import json, sys
import evaluate
from vaswani.recipe.metrics import METRIC_PATH, load_translation_metric
predictions, references, second = json.loads(sys.stdin.read())
by_function = load_translation_metric().compute(predictions=predictions, references=references)
by_file = evaluate.load(str(METRIC_PATH / "sacrebleu_chrf.py")).compute(
    predictions=predictions, references=[[a, b] for a, b in zip(references, second)], tokenize="intl", lowercase=True
)
print(json.dumps([by_function, by_file]))
"""


@pytest.mark.slow
def test_metric_loads_offline_by_path_and_matches_sacrebleu(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),  # a fresh cache: nothing was downloaded before
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
    }
    result = subprocess.run(
        [sys.executable, "-c", _OFFLINE_LOAD],
        input=json.dumps([PREDICTIONS, REFERENCES, SECOND_REFERENCES]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    by_function, by_file = json.loads(result.stdout.strip().splitlines()[-1])
    assert by_function == compute_bleu(PREDICTIONS, REFERENCES)
    assert by_function["bleu"] == sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score
    assert by_function["chrf"] == sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES]).score
    expected = sacrebleu.corpus_bleu(
        PREDICTIONS, [REFERENCES, SECOND_REFERENCES], tokenize="intl", lowercase=True
    )
    assert by_file["bleu"] == expected.score
    assert "nrefs:2|case:lc|eff:no|tok:intl" in by_file["bleu_signature"]
    assert (METRIC_PATH / "sacrebleu_chrf.py").is_file()


def test_moses_tokenization_reproduces_multi30k_tok_files():
    # Line 3 of Multi30k's val.en and of data/task1/tok/val.lc.norm.tok.en.
    raw = "A boy wearing headphones sits on a woman's shoulders."
    assert moses_lowercase_tokenize([raw], "en") == [
        "a boy wearing headphones sits on a woman &apos;s shoulders ."
    ]
    assert moses_lowercase_tokenize(["Ein Mann fährt über die Straße, oder?"], "de") == [
        "ein mann fährt über die straße , oder ?"
    ]


def test_moses_bleu_is_sacrebleu_on_lowercased_tokenized_text():
    shouted = ["".join(c if c == "ß" else c.upper() for c in p) for p in PREDICTIONS]  # "ß".upper() is "SS"
    scores = compute_moses_bleu(shouted, REFERENCES, lang="de")
    hypotheses = moses_lowercase_tokenize(PREDICTIONS, "de")
    references = moses_lowercase_tokenize(REFERENCES, "de")
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none").score
    assert compute_bleu(shouted, REFERENCES)["bleu"] < 5 < scores["bleu"]  # case-insensitive only here
    assert (
        "|case:lc|" in scores["bleu_signature"] and "|tok:none|" in scores["bleu_signature"]
    )  # lowercased: said so


def test_a_lowercase_model_is_scored_case_insensitively_by_every_metric():
    """A model that writes lowercase (`--lowercase`) gets the scores of its words, not of their case, from every
    metric `test_results.json` and the model card report: the same as the cased output's, each signature `case:lc`.
    Scored case-sensitively, the paper's tokenized BLEU of a lowercase en->de model fell from about 40 to 8."""
    lowered = [p.lower() for p in PREDICTIONS]
    scores = reported_scores(lowered, REFERENCES, "de", lowercase=True)
    cased = reported_scores(PREDICTIONS, REFERENCES, "de", lowercase=True)
    for key in ("bleu", "chrf", "bleu_lowercase_moses_tokenized", "bleu_tokenized"):
        assert scores[key] == pytest.approx(cased[key]) and scores[key] > 20, key
        assert "|case:lc|" in scores[f"{key}_signature"], key
    assert reported_scores(lowered, REFERENCES, "de")["bleu_tokenized"] < scores["bleu_tokenized"] / 2


def _write(path: Path, lines: list[str]) -> Path:
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_score_files_checks_line_counts(tmp_path):
    hypotheses = _write(tmp_path / "hyp.de", PREDICTIONS)
    short = _write(tmp_path / "ref.de.gz", REFERENCES[:3])
    with pytest.raises(ValueError, match=r"hyp\.de has 5 lines but .*ref\.de\.gz has 3"):
        score_files(hypotheses, [short])


@pytest.mark.slow
def test_evaluate_script(tmp_path):
    hypotheses = _write(tmp_path / "hyp.de", PREDICTIONS)
    references = _write(tmp_path / "ref.de.gz", REFERENCES)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, str(REPO / "scripts" / "evaluate.py"), "--hypotheses", str(hypotheses)]
    command += ["--references", str(references), "--moses_lang", "de"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    bleu = sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES])
    chrf = sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES])
    moses = compute_moses_bleu(PREDICTIONS, REFERENCES, "de")
    lines = result.stdout.splitlines()
    assert (
        lines[0]
        == f"BLEU = {bleu.score:.2f}\tBLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    )
    assert re.fullmatch(rf"chrF = {chrf.score:.2f}\tchrF2\|nrefs:1\|case:mixed\|.*", lines[1])
    assert lines[2].startswith(f"BLEU (lowercased, Moses-tokenized, de) = {moses['bleu']:.2f}\t")


def test_tokenized_bleu_is_multi_bleu_on_moses_tokens_with_compounds_split():
    """tensor2tensor's get_ende_bleu.sh, worked by hand: Moses tokenization, then "rot-weißes" becomes
    "rot ##AT##-##AT## weißes" on both sides, and multi-bleu.perl's BLEU over 9 tokens: 8/9 unigrams, 6/8 bigrams,
    5/7 trigrams and 4/6 four-grams match, lengths equal."""
    from vaswani.recipe.metrics import compute_tokenized_bleu, moses_compound_tokenize, split_compounds

    assert moses_compound_tokenize(["Der Mann fährt ein rot-weißes Fahrrad."], "de") == [
        "Der Mann fährt ein rot ##AT##-##AT## weißes Fahrrad ."
    ]
    assert (
        split_compounds("a-b-c - x") == "a ##AT##-##AT## b-c - x"
    )  # one non-overlapping pass, as perl's s///g
    scores = compute_tokenized_bleu(
        ["Der Mann fährt ein rot-weißes Rad."], ["Der Mann fährt ein rot-weißes Fahrrad."], "de"
    )
    assert scores["counts"] == [8, 6, 5, 4] and scores["totals"] == [9, 8, 7, 6]
    assert scores["bleu"] == pytest.approx(100 * (8 / 9 * 6 / 8 * 5 / 7 * 4 / 6) ** 0.25)  # 75.06
    assert "|case:mixed|" in scores["bleu_signature"] and "smooth:none" in scores["bleu_signature"]
    assert "compounds split" in scores["bleu_signature"]
    # multi-bleu.perl gives 0 when an n-gram order has no match (no smoothing); case counts
    assert compute_tokenized_bleu(["Ein Hund schläft."], ["Zwei Katzen schlafen."], "de")["bleu"] == 0.0
    assert compute_tokenized_bleu(["der mann ."], ["Der Mann ."], "de")["bleu"] < 100


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
