"""Corpus BLEU and chrF with sacreBLEU, as an `evaluate` metric that loads by path, offline.

`evaluate.load("sacrebleu")` fetches its script from the Hub; this file is loaded by path instead
(`evaluate.load("vaswani/recipe/metrics/sacrebleu_chrf")` or `vaswani.recipe.metrics.load_translation_metric()`).
It imports only `datasets`, `evaluate` and its sibling `scoring.py` (which `evaluate` copies beside it when it copies
it out of the package), where `vaswani.recipe.metrics.compute_bleu` computes the same numbers without `evaluate`.
"""

import datasets
import evaluate

from .scoring import corpus_scores

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
    url = "https://www.aclweb.org/anthology/W18-6319",
}
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
    url = "https://aclanthology.org/W15-3049",
}
"""

_DESCRIPTION = """\
Corpus-level BLEU and chrF computed by sacreBLEU on detokenized text, returned with sacreBLEU's signatures so
that scores can be reported reproducibly (Post, 2018). The paper (Vaswani et al., 2017, Table 2) reports BLEU
on WMT newstest2014.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one detokenized hypothesis per segment.
    references (`list[str]` or `list[list[str]]`): one reference per segment, or a list of references per
        segment (the same number for every segment).
    tokenize (`str`): sacreBLEU's BLEU tokenizer, "13a" (default), "intl", "zh", "ja-mecab", "char" or "none"
        for text that is already tokenized.
    lowercase (`bool`): lowercase hypotheses and references before scoring (BLEU and chrF).
    chrf_word_order (`int`): 0 for chrF (default), 2 for chrF++.
Returns:
    bleu (`float`): corpus BLEU, 0-100.
    chrf (`float`): corpus chrF (or chrF++), 0-100.
    bleu_signature, chrf_signature (`str`): sacreBLEU's signatures, e.g.
        "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0".
    counts, totals (`list[int]`), precisions (`list[float]`), bp (`float`), sys_len, ref_len (`int`): the
        n-gram statistics behind BLEU.
Examples:
    >>> metric = evaluate.load("vaswani/recipe/metrics/sacrebleu_chrf")
    >>> metric.compute(predictions=["Ein Hund rennt."], references=["Ein Hund rennt."])["bleu"]
    100.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuChrf(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
                ),
            ],
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://www.aclweb.org/anthology/W18-6319", "https://aclanthology.org/W15-3049"],
        )

    def _compute(self, predictions, references, tokenize="13a", lowercase=False, chrf_word_order=0):
        return corpus_scores(predictions, references, tokenize, lowercase, chrf_word_order)
