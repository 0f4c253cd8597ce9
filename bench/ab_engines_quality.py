"""Translation quality of the exported models and of int8 PyTorch against the PyTorch model on a test set: the BLEU
change of int8 weights (CTranslate2's, and transformers' torchao quantization run by `vaswani.use_cpu_kernels`, as
`vaswani-translate --quantization int8` loads it), and how many sentences each translates exactly as PyTorch does.

Every system decodes with beam 4 and length penalty 0.6 as CTranslate2 can (|Y|^alpha, a sentence stops at 4 finished
hypotheses: `length_penalty_form="power"`, `early_stopping=True` on the PyTorch side); `pytorch` is the model itself
with those settings, the reference of the "same as pytorch" column; `pytorch-int8` the same folder loaded in int8
(`load_translation_model(folder, int8=True)`; skipped without torchao or with --no_pytorch_int8); `pytorch-paper` is
its own decoding (§6.1's ((5 + |Y|) / 6)^alpha and transformers' heuristic stop), for scale. Every system runs on
the CPU with torch's or the engine's default threads. Exports are written to `--workdir` (default: a
temporary folder).

    python -m bench.ab_engines_quality --model runs/multi30k-de-en/averaged \
        --source ../shared/data/multi30k/test_2016_flickr.de.gz \
        --references ../shared/data/multi30k/test_2016_flickr.en.gz --moses_lang en \
        --json bench/results/engines_quality_test2016.json
"""

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from bench import common
from vaswani.interop import engines
from vaswani.interop.export import export
from vaswani.recipe.tokenization import lowercases
from vaswani.recipe.translation import load_translation_model, read_sentences, score_translations, translate

EXPORTS = ("float32", "int8", "bfloat16", "onnx")
CTRANSLATE2_SEARCH = dict(num_beams=4, length_penalty=0.6, length_penalty_form="power", early_stopping=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a vaswani model folder (trained by the recipe)")
    parser.add_argument("--source", required=True, help="source sentences, one a line (.gz allowed)")
    parser.add_argument("--references", required=True, help="reference translations, line-aligned")
    parser.add_argument(
        "--moses_lang", default=None, help="also BLEU on lowercased Moses-tokenized text of this language"
    )
    parser.add_argument(
        "--exports",
        nargs="+",
        default=["float32", "int8"],
        choices=EXPORTS,
        help="CTranslate2 weight types, or onnx",
    )
    parser.add_argument(
        "--no_pytorch_int8", action="store_true", help="leave out the PyTorch model loaded in int8 (torchao)"
    )
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument(
        "--workdir", default=None, help="where the exports are written (default: a temporary folder)"
    )
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    sources = read_sentences(args.source)[: args.limit]
    references = read_sentences(args.references)[: args.limit]
    model, source_tokenizer, target_tokenizer = load_translation_model(args.model, device="cpu")
    systems = {
        "pytorch": lambda: translate(
            sources, model, source_tokenizer, target_tokenizer, args.batch_size, **CTRANSLATE2_SEARCH
        ),
        "pytorch-paper": lambda: translate(
            sources, model, source_tokenizer, target_tokenizer, args.batch_size
        ),
    }
    if not args.no_pytorch_int8 and importlib.util.find_spec("torchao") is not None:
        int8_model = load_translation_model(args.model, device="cpu", int8=True)[0]
        systems["pytorch-int8"] = lambda: translate(
            sources, int8_model, source_tokenizer, target_tokenizer, args.batch_size, **CTRANSLATE2_SEARCH
        )
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.workdir or temporary)
        for name in args.exports:
            engine_name, quantization = ("onnx", None) if name == "onnx" else ("ctranslate2", name)
            folder = export(args.model, workdir / name, engine_name, quantization=quantization, force=True)
            engine, source, target = engines.load_exported(folder)
            systems[f"{engine_name}-{name}" if quantization else name] = (
                lambda engine=engine, source=source, target=target: engines.translate(
                    sources, engine, source, target, batch_size=args.batch_size, **CTRANSLATE2_SEARCH
                )
            )
        rows, outputs = [], {}
        for name, run in systems.items():
            start = time.perf_counter()
            outputs[name] = run()
            seconds = time.perf_counter() - start
            scores = score_lines(outputs[name], references, args, target_tokenizer)
            same = sum(a == b for a, b in zip(outputs[name], outputs["pytorch"], strict=True)) / len(sources)
            rows.append({"system": name, **scores, "same_as_pytorch": same, "seconds": seconds})
    for row in rows:
        row["bleu_change"] = row["bleu"] - rows[0]["bleu"]
    columns = [
        ("system", "system", ""),
        ("bleu", "BLEU", ".2f"),
        ("bleu_change", "change", "+.2f"),
        ("bleu_lowercase_moses_tokenized", "BLEU lc Moses", ".2f"),
        ("chrf", "chrF", ".2f"),
        ("same_as_pytorch", "same as pytorch", ".1%"),
        ("seconds", "seconds", ".1f"),
    ]
    print(
        f"\n{len(sources)} sentences of {args.source}; beam 4, alpha 0.6, |Y|^alpha, stop at 4 finished hypotheses"
    )
    print(common.table(rows, columns))
    result = {"machine": common.machine(), "settings": vars(args), "results": rows}
    common.write_json(args.json, result)
    return result


def score_lines(translations: list[str], references: list[str], args, target_tokenizer) -> dict:
    """BLEU and chrF against the reference lines (`translation.score_translations` reads references from files)."""
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt") as file:
        file.write("".join(line + "\n" for line in references))
        file.flush()
        scores = score_translations(
            translations, [file.name], moses_lang=args.moses_lang, lowercase=lowercases(target_tokenizer)
        )
    return {key: value for key, value in scores.items() if not key.endswith("signature")}


if __name__ == "__main__":
    main(sys.argv[1:])
