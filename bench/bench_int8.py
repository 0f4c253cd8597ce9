"""int8 decoding in PyTorch on the CPU, through transformers' own door, next to float32 and CTranslate2 int8.

One saved model folder (`VaswaniConfig` preset, random weights, seed 0; `common.build_model`), loaded five ways:

- `fp32`: `AutoModelForSeq2SeqLM.from_pretrained(folder)`, plain torch as loaded;
- `fp32-kernels`: the same after `vaswani.use_cpu_kernels(model)`;
- `int8`: `from_pretrained(folder, quantization_config=TorchAoConfig(Int8DynamicActivationInt8WeightConfig()),
  device_map="cpu")`, torchao's int8 linear layers (transformers keeps the tied output projection in float32);
- `int8-kernels`: the same after `vaswani.use_cpu_kernels(model)` (`vaswani.kernels.Int8Linear`);
- `ct2-int8`: the folder exported by `vaswani-export --engine ctranslate2 --quantization int8`, `translate_batch`.

Each decodes `--batch-size` random sources of `--src-len` tokens into exactly `--new-tokens` tokens (PyTorch: the end
token held back until then, or with `--fixed-length no-eos` no end token at all; CTranslate2 holds it back), greedy
and beam 4, length penalty 1, `--threads` threads for every engine, medians of `--repeats` rounds. A round times
each PyTorch job once in this process, interleaved round-robin, then the CTranslate2 export once in a fresh child
process after a warm-up (`bench_engines.in_child`: where CTranslate2 has translated, torch's GEMMs run about 1.8x
slower). Ratios are against `fp32` and against `ct2-int8` (same weights, same run). The agreement columns compare each
implementation's greedy output with `fp32`'s: the share of sentences identical, and of tokens identical before a
sentence's first difference.

    python -m bench.bench_int8 --preset base --batch-size 16 --repeats 5 --json bench/results/int8_base_cpu.json
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from bench import bench_engines, common

IMPLEMENTATIONS = ("fp32", "fp32-kernels", "int8", "int8-kernels", "ct2-int8")


def parse_args(argv=None) -> argparse.Namespace:
    parser = common.decoding_parser(__doc__, IMPLEMENTATIONS, batch_size=16)
    parser.add_argument(
        "--workdir", help="where the model is saved and exported (default: a temporary folder)"
    )
    parser.add_argument(
        "--engine-child", help=argparse.SUPPRESS
    )  # internal: one engine timed in a subprocess
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.batch_size, args.src_len, args.new_tokens = "small", 2, 5, 4
        args.vocab, args.repeats, args.warmup = 1000, 1, 1
    return args


def load(name: str, args, workdir: Path):
    """A decoding function of one implementation: source id lists, beams -> per sentence, the generated ids."""
    if name == "ct2-int8":
        decode = bench_engines.load("vaswani-ct2-int8", args, workdir)
        vocabulary = json.loads((workdir / "vaswani-ct2-int8" / "shared_vocabulary.json").read_text("utf-8"))
        ids = {token: i for i, token in enumerate(vocabulary)}
        return lambda sources, beams: [[ids[token] for token in out] for out in decode(sources, beams)]
    from transformers import AutoModelForSeq2SeqLM

    import vaswani

    kwargs = {}
    if name.startswith("int8"):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig
        from transformers import TorchAoConfig

        kwargs = {
            "quantization_config": TorchAoConfig(Int8DynamicActivationInt8WeightConfig()),
            "device_map": "cpu",
        }
    model = AutoModelForSeq2SeqLM.from_pretrained(workdir / "vaswani", **kwargs).eval()
    if name.endswith("-kernels"):
        vaswani.use_cpu_kernels(model)
    return lambda sources, beams: bench_engines.generate_pytorch(model, sources, beams, args)


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """The share of sentences identical to the reference's, and of tokens identical before each sentence's first
    difference (after it, a greedy decoder continues another prefix)."""
    same_sentences = sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)
    prefix = 0
    for a, b in zip(outputs, reference, strict=True):
        prefix += next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(b))
    return same_sentences, prefix / sum(len(b) for b in reference)


def main(argv=None) -> dict:
    from transformers.utils import logging as transformers_logging

    args = parse_args(argv)
    transformers_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    if args.engine_child:
        bench_engines.timing_child(args, load(args.engine_child, args, Path(args.workdir)))
        return {}
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.workdir or temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        exports = ["vaswani-ct2-int8"] if "ct2-int8" in args.impl else []
        bench_engines.prepare(argparse.Namespace(preset=args.preset, vocab=args.vocab, impl=exports), workdir)
        times, outputs = bench_engines.rounds_of_times("bench.bench_int8", args, workdir, load)
    rows = []
    for (name, beams), seconds in times.items():
        row = {
            "preset": args.preset,
            "impl": name,
            "decoding": "greedy" if beams == 1 else f"beam-{beams}",
            "beams": beams,
            "batch_s": common.median(seconds),
            "batch_s_all": seconds,
            "tokens_per_s": args.batch_size * args.new_tokens / common.median(seconds),
        }
        reference = outputs.get(("fp32", beams))
        if reference is not None:
            row["same_sentences_as_fp32"], row["same_tokens_as_fp32"] = agreement(
                outputs[name, beams], reference
            )
        rows.append(row)
    by_key = {(row["impl"], row["beams"]): row for row in rows}
    for row in rows:
        for column, other in (("vs_fp32", "fp32"), ("vs_ct2_int8", "ct2-int8")):
            peer = by_key.get((other, row["beams"]))
            row[column] = row["tokens_per_s"] / peer["tokens_per_s"] if peer else None
    columns = [
        ("decoding", "decoding", ""),
        ("impl", "impl", ""),
        ("tokens_per_s", "tok/s", ".0f"),
        ("vs_fp32", "x fp32", ".2f"),
        ("vs_ct2_int8", "x ct2-int8", ".2f"),
        ("same_sentences_as_fp32", "sentences = fp32", ".2f"),
        ("same_tokens_as_fp32", "tokens = fp32", ".2f"),
    ]
    print(
        f"\nint8 decoding, preset {args.preset}: batch {args.batch_size}, source {args.src_len}, exactly "
        f"{args.new_tokens} new tokens, vocab {args.vocab}, {args.threads} threads each, median of {args.repeats}"
    )
    print(common.table(rows, columns))
    result = {
        "machine": common.machine(),
        "versions": {**bench_engines.versions(), "torchao": _version("torchao")},
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "workdir", "engine_child")},
        "results": rows,
    }
    common.write_json(args.json, result)
    return result


def _version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    main(sys.argv[1:])
