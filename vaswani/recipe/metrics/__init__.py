"""Translation metrics: corpus BLEU and chrF with sacreBLEU, offline.

- `load_translation_metric()`: the `evaluate` metric in `sacrebleu_chrf/`, loaded by path (no network).
- `compute_bleu(...)`: the same numbers straight from `sacrebleu`, without `evaluate`.
- `compute_moses_bleu(...)`: BLEU on lowercased, Moses-tokenized text, the convention of most published
  Multi30k results; not comparable with `compute_bleu` on raw text.
- `compute_tokenized_bleu(...)`: the paper's WMT BLEU, case-sensitive on Moses-tokenized text with hyphenated
  compounds split (tensor2tensor's `get_ende_bleu.sh`, then `multi-bleu.perl`); not comparable with either.
- `reported_scores(...)`: all of them as the flat record a run reports (`test_results.json`, the model card's results).
- `score_files(...)`: that record for a hypothesis file and reference files (`vaswani-evaluate`).
- `score_lines(...)`: that record as the tools print it, each line naming its BLEU.
- `bleu_metric_fn(...)`: BLEU and chrF during training, as the Trainer's `compute_metrics`.

Both `compute_bleu` and the `evaluate` metric score with `sacrebleu_chrf/scoring.py`, which imports only sacreBLEU:
`evaluate` copies the metric and that file out of the package before importing them.
"""

import logging
import re
from functools import cache
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU

from .sacrebleu_chrf.scoring import corpus_scores, reference_streams

logger = logging.getLogger(__name__)

METRIC_PATH = Path(__file__).parent / "sacrebleu_chrf"
BLEU_TOKENIZERS = tuple(BLEU.TOKENIZERS)  # sacreBLEU's `tokenize` values: 13a, intl, char, none, ...


@cache
def moses_languages():
    """The language codes for which sacremoses has Moses' rules (nonbreaking prefixes)."""
    try:
        from sacremoses.corpus import NonbreakingPrefixes
    except ImportError as error:
        raise ImportError(
            "Moses-tokenized BLEU needs sacremoses: pip install sacremoses (or this package's [test] extra)"
        ) from error
    return tuple(sorted(set(NonbreakingPrefixes().available_langs.values())))


def check_moses_lang(lang):
    """Raise `ValueError` unless Moses has rules for `lang` (sacremoses would silently tokenize anything else
    without them, giving BLEU that no published figure was computed with)."""
    if lang not in moses_languages():
        raise ValueError(
            f"Moses has no rules for the language {lang!r}; choose one of {', '.join(moses_languages())}"
        )


def load_translation_metric(**kwargs):
    """`evaluate.load` of the local sacreBLEU BLEU + chrF metric; works with `HF_HUB_OFFLINE=1`.

    `kwargs` go to `evaluate.load` (e.g. `experiment_id`, `num_process`, `process_id`).
    """
    # Imported here: run as `python scripts/evaluate.py`, the script itself would shadow the package.
    import evaluate

    return evaluate.load(str(METRIC_PATH), **kwargs)


def compute_bleu(
    predictions, references, tokenize="13a", lowercase=False, chrf_word_order=0, smooth_method="exp"
):
    """Corpus BLEU and chrF of detokenized `predictions` against `references`, with sacreBLEU signatures.

    Args:
        predictions: one hypothesis per segment.
        references: one reference per segment, or a list of references per segment (same count each).
        tokenize: sacreBLEU's BLEU tokenizer: "13a" (its default, WMT's mteval), "intl", "char", "none", ...
        lowercase: case-insensitive BLEU and chrF.
        chrf_word_order: 0 for chrF, 2 for chrF++.
        smooth_method: sacreBLEU's BLEU smoothing: "exp" (its default), "none" (`multi-bleu.perl`), ...

    Returns:
        `{"bleu", "chrf", "bleu_signature", "chrf_signature", "counts", "totals", "precisions", "bp",
        "sys_len", "ref_len"}`, the same keys and values as `load_translation_metric().compute(...)`.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("No predictions to score")
    if tokenize not in BLEU_TOKENIZERS:
        raise ValueError(
            f"sacreBLEU has no tokenizer {tokenize!r}; choose one of {', '.join(BLEU_TOKENIZERS)}"
        )
    return corpus_scores(predictions, references, tokenize, lowercase, chrf_word_order, smooth_method)


def moses_lowercase_tokenize(texts, lang):
    """Lowercase, normalize punctuation and Moses-tokenize, as Multi30k's `scripts/task1-tokenize.sh` does.

    That script runs `lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG` to make
    the repository's `data/task1/tok/*.lc.norm.tok.LANG` files; this is the same pipeline with `sacremoses`
    (Python ports of those scripts), escaping included ("woman's" becomes "woman &apos;s").
    """
    # Imported here: sacremoses is only needed for this convention (it is a test extra of the project).
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(normalizer.normalize(text.lower()), return_str=True, escape=True) for text in texts
    ]


def compute_moses_bleu(predictions, references, lang):
    """BLEU "comparable to published Multi30k numbers": lowercased, Moses-tokenized, no further tokenization.

    Exactly: hypotheses and references (plain detokenized text) both go through `moses_lowercase_tokenize`
    (lowercase, then Moses punctuation normalization, then the Moses tokenizer for `lang`, the target
    language), and sacreBLEU scores the result with `tokenize="none"`, splitting on spaces only. That is what
    `multi-bleu.perl` computes on the repository's `*.lc.norm.tok.*` files (equal whenever no n-gram precision is
    zero; sacreBLEU's default "exp" smoothing only acts then), and what the signature records as
    `case:lc|tok:none`. chrF is computed on the same
    tokenized text. Scores of `compute_bleu` on raw text are a different measurement: never compare the two.
    """
    # The text is lowercased already; `lowercase=True` changes no score and makes the signature say so (case:lc).
    return _bleu_of_moses_tokens(moses_lowercase_tokenize, predictions, references, lang, lowercase=True)


# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, as re.sub)
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text):
    """ "rich-text format" -> "rich ##AT##-##AT## text format", as the Stanford NMT and GNMT papers scored WMT en-de
    and tensor2tensor's `get_ende_bleu.sh` does it (one pass of non-overlapping matches: "a-b-c" keeps its second
    hyphen)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def moses_compound_tokenize(texts, lang):
    """`tokenizer.perl -l LANG` (escaping on, no aggressive hyphen splitting), then `split_compounds`: the text
    `multi-bleu.perl` scores in `get_ende_bleu.sh`. Case is kept."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [split_compounds(tokenizer.tokenize(text, return_str=True, escape=True)) for text in texts]


def compute_tokenized_bleu(predictions, references, lang, lowercase=False):
    """The BLEU the paper reports on WMT 2014 (27.3 base, 28.4 big on en-de): `multi-bleu.perl` on Moses-tokenized
    text with hyphenated compounds split, which tensor2tensor's `get_ende_bleu.sh` computes from detokenized output
    and references.

    Exactly: both sides go through `moses_compound_tokenize` (`lang`, the target language), and sacreBLEU scores the
    result case-sensitively with `tokenize="none"` and no smoothing, as `multi-bleu.perl` does (0 when an n-gram
    order has no match). The signature says so (`tok:none|smooth:none`, and that compounds were split). It runs higher
    than sacreBLEU on detokenized text (`compute_bleu`), the figure WMT reports: give both, never compare across.
    `lowercase` scores it case-insensitively (`case:lc`), for a model that writes lowercase only.
    """
    scores = _bleu_of_moses_tokens(
        moses_compound_tokenize, predictions, references, lang, lowercase=lowercase, smooth_method="none"
    )
    scores["bleu_signature"] += " (Moses-tokenized, compounds split as ##AT##-##AT##)"
    return scores


def _bleu_of_moses_tokens(tokenize, predictions, references, lang, **options):
    """`compute_bleu` of the texts as `tokenize(texts, lang)` writes them, split on spaces only."""
    check_moses_lang(lang)
    streams = [tokenize(stream, lang) for stream in reference_streams(references)]
    return compute_bleu(tokenize(predictions, lang), list(zip(*streams, strict=True)), "none", **options)


def score_files(
    hypotheses_path, reference_paths, tokenize="13a", lowercase=False, chrf_word_order=0, moses_lang=None
):
    """`reported_scores` of a hypothesis file against one or more reference files (one segment a line, `.gz`
    allowed). Raises `ValueError` naming the files if their line counts differ. `moses_lang` is one Moses has rules
    for (`check_moses_lang`, which `vaswani-evaluate` runs on its flag)."""
    from ..data import read_lines  # here: scoring text files needs neither datasets nor torch

    hypotheses = list(read_lines(hypotheses_path))
    if not hypotheses:
        raise ValueError(f"{hypotheses_path} is empty: nothing to score")
    references = [list(read_lines(path)) for path in reference_paths]
    for path, stream in zip(reference_paths, references, strict=True):
        if len(stream) != len(hypotheses):
            raise ValueError(f"{hypotheses_path} has {len(hypotheses)} lines but {path} has {len(stream)}")
    per_segment = list(zip(*references, strict=True))
    return reported_scores(hypotheses, per_segment, moses_lang, lowercase, tokenize, chrf_word_order)


def reported_scores(predictions, references, lang=None, lowercase=False, tokenize="13a", chrf_word_order=0):
    """BLEU and chrF on the raw text (`compute_bleu` with `tokenize` and `chrf_word_order`), and for the target
    language `lang` BLEU on lowercased Moses-tokenized text (published Multi30k figures, `compute_moses_bleu`) and the
    paper's tokenized BLEU with compounds split (WMT, `compute_tokenized_bleu`), with their signatures, under the keys
    a run's `test_results.json` uses and `vaswani.publishing.model_card.EvalResults` reads. `lowercase` makes the
    raw-text BLEU, chrF and the tokenized BLEU case-insensitive (signature `case:lc`), for a model that writes
    lowercase only: scored case-sensitively, its output loses every capitalised word.

    For a language Moses has no rules for, the record has no Moses-tokenized BLEU (a warning says so)."""
    raw = compute_bleu(predictions, references, tokenize, lowercase, chrf_word_order)
    record = {key: raw[key] for key in ("bleu", "bleu_signature", "chrf", "chrf_signature")}
    if lang is None:
        return record
    if lang not in moses_languages():
        logger.warning("No Moses rules for %r: the scores leave out lowercased Moses-tokenized BLEU", lang)
        return record
    for name, scores in (
        ("bleu_lowercase_moses_tokenized", compute_moses_bleu(predictions, references, lang)),
        ("bleu_tokenized", compute_tokenized_bleu(predictions, references, lang, lowercase)),
    ):
        record[name], record[f"{name}_signature"] = scores["bleu"], scores["bleu_signature"]
    return record


def score_lines(record, lang=None):
    """What `vaswani-evaluate` and `vaswani-translate --references` print for a record with `reported_scores`' keys:
    lines "NAME = score<TAB>signature", each saying which score it is. "BLEU" is sacreBLEU on the detokenized text
    (WMT's own figure, comparable across papers through its signature); "BLEU (tokenized, compounds split, ...)" is
    the paper's WMT BLEU (`compute_tokenized_bleu`: 27.3 base, 28.4 big on newstest2014 en-de), higher than
    sacreBLEU's on the same output and never to be compared with it."""
    names = {
        "bleu": "BLEU",
        "chrf": "chrF",
        "bleu_lowercase_moses_tokenized": f"BLEU (lowercased, Moses-tokenized, {lang})",
        "bleu_tokenized": f"BLEU (tokenized, compounds split, {lang}: the paper's WMT BLEU)",
    }
    return [
        f"{name} = {record[key]:.2f}\t{record[f'{key}_signature']}"
        for key, name in names.items()
        if key in record
    ]


def bleu_metric_fn(tokenizer, references):
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: sacreBLEU and chrF of the decoded
    predictions against the raw reference text, case-insensitive if the tokenizer lowercases (its model writes
    lowercase only). Under DDP the gathered predictions can carry padded duplicates at the end; only the first
    `len(references)` rows, which are the dataset's rows in order, are scored."""
    from ..tokenization import lowercases

    def compute(eval_prediction):
        # the generated ids (predict_with_generate), -100 as padding
        ids = np.where(eval_prediction.predictions < 0, tokenizer.pad_token_id, eval_prediction.predictions)
        texts = [t.strip() for t in tokenizer.batch_decode(ids[: len(references)], skip_special_tokens=True)]
        scores = compute_bleu(texts, list(references), lowercase=lowercases(tokenizer))
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute
