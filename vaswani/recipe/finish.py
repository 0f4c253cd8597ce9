"""After training (§6.1), on the main process: average the last checkpoints (or the average that translates the
validation split best), choose the length penalty on the validation split when asked, translate the test split with
beam search and score it, draw the learning curves and attention maps, and publish the final model (`--push_to_hub`).
"""

import logging
import re
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

from ..common.fileio import read_json, write_json
from ..modeling_vaswani import VaswaniForConditionalGeneration
from ..publishing.hub import publish
from .averaging import average_checkpoints
from .checkpoints import checkpoints
from .evaluation import describe_decoding, describe_seconds
from .metrics import reported_scores
from .model_folders import load_model
from .run import load_split, load_test_split, test_split_name
from .tokenization import lowercases
from .translation import load_translation_model, translate, write_sentences

logger = logging.getLogger(__name__)


def finish(trainer, data_args, finish_args):
    """§6.1 after training, on the main process: average the last checkpoints, translate the test split with beam
    search, score it (sacreBLEU, chrF, BLEU lowercased and Moses-tokenized as published Multi30k figures are, and the
    paper's tokenized BLEU), draw the pictures, and publish if `--push_to_hub`. Returns the test scores (or None
    without a test split)."""
    if not trainer.is_world_process_zero():
        return None
    args, output_dir, steps = trainer.args, Path(trainer.args.output_dir), trainer.state.global_step
    own = [c for c in checkpoints(output_dir) if int(c.name.split("-")[1]) <= steps]
    final_dir, averaged, last = output_dir, None, finish_args.average_last[0]
    if last > 0 and not own:
        logger.warning("No checkpoints in %s to average: the final model is the result", output_dir)
    elif last > 0:
        final_dir, averaged = output_dir / "averaged", own[-last:]
        if finish_args.chooses_average:
            averaged = choose_average_on_validation(own, output_dir, data_args, finish_args)
        elif len(averaged) < last:
            logger.warning("Only %d checkpoints to average (asked for %d)", len(averaged), last)
        average_checkpoints(averaged, final_dir, tokenizer_dir=output_dir)
    alpha = finish_args.length_penalty[0]
    if finish_args.chooses_length_penalty:
        alpha = choose_length_penalty_on_validation(final_dir, output_dir, data_args, finish_args)
    save_decoding(final_dir, finish_args, alpha)
    if finish_args.plots:
        from .plotting import plot_learning_curves  # matplotlib, only when drawing

        plot_learning_curves(trainer.state.log_history, output_dir / "learning_curves.png")
    scores, results = None, output_dir / "test_results.json"
    if data_args.test_split or data_args.test_file:
        scores = evaluate_test_split(final_dir, data_args, finish_args, alpha)
        if averaged is not None:
            scores["averaged_checkpoints"] = [c.name for c in averaged]
        scores["steps"] = steps
        if warning := degenerate_translations_warning(scores):
            logger.warning("%s", warning)
        write_json(results, scores)
        logger.info("Test scores written to %s", results)
    if args.push_to_hub:
        published = publish(
            final_dir,
            model=load_model(final_dir, VaswaniForConditionalGeneration),  # mismatched weights: refused
            repo_id=args.hub_model_id or output_dir.name,
            results=results if scores else None,
            summary=output_dir / "training_summary.json",
            private=args.hub_private_repo,
            token=args.hub_token,
            revision=args.hub_revision,
        )
        logger.info("Published: %s", published)
    return scores


# A line that ends in one piece of text (a word, a subword, a letter) written over and over: "geworfen geworfen
# geworfen ...", "unununun...": what a barely trained model writes until the length limit stops it.
_REPEATED = re.compile(r"(\S.{0,24}?)(?:\s*\1){3,}\s*$", re.S)
_BLANKS = re.compile(r"\s{4,}")


def repeats_one_token(text):
    """Whether `text` is mostly one token repeated: it ends in a run of at least four copies of one piece of text
    (up to 25 characters), or holds a run of four or more blanks (a space token repeated), and that run is at least
    half of it. A line of blanks only is empty, not repeated."""
    if not text.strip():
        return False  # empty, counted as such
    if 2 * max(map(len, _BLANKS.findall(text)), default=0) >= len(text):
        return True
    match = _REPEATED.search(text.strip())
    return match is not None and 2 * len(match[0]) >= len(text.strip())


def degenerate_translations_warning(scores):
    """What to say when most test translations are empty (a model after a few steps writes the end of sentence
    first), repeat one token to the length limit (the model before that), or either: their BLEU of about 0 measures
    the training so far, not the recipe. None otherwise."""
    empty, repeated, total = (
        scores["empty_translations"],
        scores["repeated_translations"],
        scores["sentences"],
    )
    repeat, steps = "repeat one token over and over", scores["steps"]
    if (empty + repeated) * 2 <= total:
        return None
    if empty * 2 > total:
        what = f"{empty} of the {total} test translations are empty"
    else:  # so some are repeated
        what = f"{repeated} of the {total} test translations {repeat}"
        if repeated * 2 <= total:
            what = f"{empty} of the {total} test translations are empty and {repeated} {repeat}"
        what += f" (the first: {scores['repeated_example']})"
    return (
        f"{what}: the model is undertrained ({steps} training step{'s' if steps != 1 else ''}), so its scores say "
        "nothing yet about the recipe; train longer (--max_steps, --max_train_minutes)"
    )


def _example(text):
    """A repeated line as the warning shows it: '"geworfen geworfen geworfen geworfen ..."', or '"w" and 75
    blanks' for a line of blanks."""
    body = text.strip()
    if 2 * len(body) < len(text):
        return f'"{body[:40]}" and {len(text) - len(body)} blanks'
    short = " ".join(body.split()[:4])[:40]
    return f'"{short}{" ..." if len(short) < len(body) else ""}"'


def choose_average_on_validation(own, output_dir, data_args, finish_args):
    """The checkpoints whose average translates the validation split best: for each N of `--average_last` (several
    numbers), the last N of `own` (oldest first) are averaged in a temporary folder, one at a time, and the
    validation split is translated with the test's beam search and scored. The highest BLEU wins, the fewest
    checkpoints among equals (`finish` averages them into `output_dir/averaged`). The scores of every candidate are
    written to `average_on_validation.json` in `output_dir`."""
    validation, most, alpha = (
        load_split(data_args, "validation"),
        max(finish_args.average_last),
        finish_args.length_penalty[0],
    )
    if len(own) < most:
        logger.warning("Only %d checkpoints to average (asked for up to %d)", len(own), most)
    sizes, candidates = sorted({min(n, len(own)) for n in finish_args.average_last}), []
    for size in tqdm(sizes, desc="Averages on validation", disable=len(sizes) < 2):
        with tempfile.TemporaryDirectory(dir=output_dir, prefix=".average-") as scratch:
            folder = average_checkpoints(
                own[-size:], Path(scratch, f"last-{size}"), show_progress=False, tokenizer_dir=output_dir
            )
            _, scores = _translate_and_score(folder, validation, data_args, finish_args, alpha)
        candidates.append({"checkpoints": [c.name for c in own[-size:]], **scores})
        logger.info("Average of the last %d checkpoints: validation BLEU %.2f", size, scores["bleu"])
    # sizes ascend, so the first of equals has the fewest checkpoints
    best = _choose(
        output_dir / "average_on_validation.json",
        candidates,
        "checkpoints",
        data_args,
        finish_args,
        length_penalty=alpha,
    )
    size = len(best["checkpoints"])
    logger.info(
        "Chosen on validation: the average of the last %d checkpoints (BLEU %.2f)", size, best["bleu"]
    )
    return own[-size:]


def choose_length_penalty_on_validation(model_dir, output_dir, data_args, finish_args):
    """The length penalty alpha, among `--length_penalty`'s values, with which `model_dir` translates the validation
    split best (the test's beam size and form): the highest BLEU wins, the first given among equals. The scores of
    every value are written to `length_penalty_on_validation.json` in `output_dir`."""
    validation, candidates = load_split(data_args, "validation"), []
    for alpha in tqdm(list(dict.fromkeys(finish_args.length_penalty)), desc="Length penalties on validation"):
        _, scores = _translate_and_score(model_dir, validation, data_args, finish_args, alpha)
        candidates.append({"length_penalty": alpha, **scores})
        logger.info("Length penalty %g: validation BLEU %.2f", alpha, scores["bleu"])
    path = output_dir / "length_penalty_on_validation.json"
    best = _choose(path, candidates, "length_penalty", data_args, finish_args, model=str(model_dir))
    logger.info("Chosen on validation: length penalty %g (BLEU %.2f)", best["length_penalty"], best["bleu"])
    return best["length_penalty"]


def _choose(path, candidates, key, data_args, finish_args, **record):
    """The candidate with the highest BLEU, the first among equals. Written down at `path`: the criterion, the
    split, the decoding, `record`, the choice (the winner's `key`) and every candidate with its scores."""
    best = max(candidates, key=lambda candidate: candidate["bleu"])
    write_json(
        path,
        {
            "criterion": "bleu",
            "split": data_args.validation_file or data_args.validation_split,
            "num_beams": finish_args.num_beams,
            "length_penalty_form": finish_args.length_penalty_form,
            **record,
            "chosen": best[key],
            "candidates": candidates,
        },
    )
    return best


def save_decoding(model_dir, finish_args, alpha):
    """Write the test's decoding (`--num_beams`, the length penalty `alpha` and `--length_penalty_form`) into the model
    folder's generation config, so that `generate()`, the translation pipeline, `vaswani-translate` and an export
    decode the saved model as its test score was made."""
    path = Path(model_dir, "generation_config.json")
    decoding = dict(
        num_beams=finish_args.num_beams,
        length_penalty=alpha,
        length_penalty_form=finish_args.length_penalty_form,
    )
    if path.exists() and (config := read_json(path)) != (updated := config | decoding):
        write_json(path, updated)


def _translate_and_score(model_dir, pairs, data_args, finish_args, length_penalty):
    """The sources of `pairs` translated by the model folder with the test's decoding, and the translations' scores
    against the pairs' targets (`metrics.reported_scores`)."""
    model, source_tok, target_tok = load_translation_model(model_dir)
    hypotheses = translate(
        pairs[data_args.source_lang],
        model,
        source_tok,
        target_tok,
        batch_size=finish_args.translate_batch_size,
        num_beams=finish_args.num_beams,
        length_penalty=length_penalty,
        length_penalty_form=finish_args.length_penalty_form,
    )
    target = data_args.target_lang
    return hypotheses, reported_scores(hypotheses, pairs[target], target, lowercase=lowercases(target_tok))


def evaluate_test_split(model_dir, data_args, finish_args, alpha):
    """Beam-search translation of the test split (§6.1) with the length penalty `alpha`, and its scores; with
    `--plots`, the attention maps of the first test pair (source and its translation) as
    `attention_{encoder,decoder,cross}.png`."""
    test = load_test_split(data_args)
    split, sources = test_split_name(data_args, len(test)), test[data_args.source_lang]
    what = describe_decoding(len(test), finish_args.num_beams, finish_args.translate_batch_size)
    logger.info("Translating the test split %s: %s", split, what)
    started = time.monotonic()
    hypotheses, scores = _translate_and_score(model_dir, test, data_args, finish_args, alpha)
    logger.info("Translated %d test pairs in %s", len(test), describe_seconds(time.monotonic() - started))
    repeated = [h for h in hypotheses if repeats_one_token(h)]
    hypotheses_file = Path(model_dir, f"{test_split_name(data_args)}.hyp.{data_args.target_lang}")
    write_sentences(hypotheses, hypotheses_file)
    logger.info("Test translations written to %s", hypotheses_file)
    if finish_args.plots:
        from .plotting import attention_maps, load_attention_model, plot_attention_maps  # matplotlib

        eager, src_tok, tgt_tok = load_attention_model(model_dir)
        maps = attention_maps(eager, src_tok, sources[0], hypotheses[0], tgt_tok)
        plot_attention_maps(maps, model_dir)  # attention_{encoder,decoder,cross}.png
    return {
        **scores,
        "dataset": data_args.source,
        "split": split,
        "num_beams": finish_args.num_beams,
        "length_penalty": alpha,
        "length_penalty_form": finish_args.length_penalty_form,
        "model": str(model_dir),
        "hypotheses": str(hypotheses_file),
        "sentences": len(sources),
        # translations left empty although their source is not: an untrained model's, whose BLEU means nothing
        "empty_translations": sum(
            1 for s, h in zip(sources, hypotheses, strict=True) if s.strip() and not h.strip()
        ),
        # translations that repeat one token to the length limit: a barely trained model's
        "repeated_translations": len(repeated),
        **({"repeated_example": _example(repeated[0])} if repeated else {}),
    }
