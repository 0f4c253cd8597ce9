"""Corpus BLEU and chrF with sacreBLEU: the scoring that both `sacrebleu_chrf.py` (the `evaluate` metric, which
`evaluate` copies out of the package with this file beside it) and `vaswani.recipe.metrics` use. It imports only
`sacrebleu`."""

from sacrebleu.metrics import BLEU, CHRF


def reference_streams(references):
    """sacreBLEU's layout (one list per reference set) from one reference or a list of them per segment."""
    if references and isinstance(references[0], str):
        return [list(references)]
    if any(len(refs) != len(references[0]) for refs in references):
        raise ValueError("Every prediction needs the same number of references")
    return [list(stream) for stream in zip(*references, strict=True)]


def corpus_scores(
    predictions, references, tokenize="13a", lowercase=False, chrf_word_order=0, smooth_method="exp"
):
    """BLEU and chrF of `predictions` against `references` (one or a list per segment), with their signatures and
    BLEU's n-gram statistics."""
    streams = reference_streams(references)
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none", smooth_method=smooth_method)
    chrf = CHRF(word_order=chrf_word_order, lowercase=lowercase)
    bleu_score = bleu.corpus_score(list(predictions), streams)
    chrf_score = chrf.corpus_score(list(predictions), streams)
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": f"{bleu_score.name}|{bleu.get_signature()}",
        "chrf_signature": f"{chrf_score.name}|{chrf.get_signature()}",
        **{
            name: getattr(bleu_score, name)
            for name in ("counts", "totals", "precisions", "bp", "sys_len", "ref_len")
        },
    }
