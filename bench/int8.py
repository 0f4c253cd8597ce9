"""int8 decoding in PyTorch on the CPU, through transformers' own door, beside float32 and CTranslate2 int8.

One saved model folder (`VaswaniConfig` preset, random weights, seed 0), loaded five ways:

- `fp32`: `AutoModelForSeq2SeqLM.from_pretrained(folder)`, plain torch as loaded;
- `fp32-kernels`: the same after `vaswani.use_cpu_kernels(model)`;
- `int8`: `from_pretrained(folder, quantization_config=TorchAoConfig(Int8DynamicActivationInt8WeightConfig()),
  device_map="cpu")`, torchao's int8 linear layers (transformers keeps the tied output projection in float32);
- `int8-kernels`: the same after `vaswani.use_cpu_kernels(model)` (`vaswani.kernels.Int8Linear`);
- `ct2-int8`: the folder exported by `vaswani-export --engine ctranslate2 --quantization int8`, `translate_batch`.

Decoding, threads, rounds and child processes as `python -m bench engines`. Ratios are against `fp32` and
`ct2-int8`; the agreement columns compare each greedy output with `fp32`'s: the share of sentences identical, and of
tokens identical before a sentence's first difference (after it, a greedy decoder continues another prefix).

    python -m bench int8 --preset base --batch-size 16 --repeats 5 --fixed-length no-eos --json bench/results/int8_base_cpu.json
"""

import json
import tempfile
from pathlib import Path

import torch

from bench import common, engines, train

IMPLEMENTATIONS = ("fp32", "fp32-kernels", "int8", "int8-kernels", "ct2-int8")


def load(name: str, args, workdir: Path):
    """A decoding function of one implementation: (source id lists, beams) -> per sentence, the generated ids."""
    if name == "ct2-int8":
        decode = engines.load("vaswani-ct2-int8", args, workdir)
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
    return lambda sources, beams: engines.generate_pytorch(model, sources, beams, args)


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """The share of sentences identical to the reference's, and of tokens identical before each first difference."""
    same_sentences = sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)
    prefix = sum(
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(b))
        for a, b in zip(outputs, reference, strict=True)
    )
    return same_sentences, prefix / sum(len(b) for b in reference)


def main(argv) -> dict:
    from transformers.utils import logging as transformers_logging

    args = common.parse(
        engines.parser("int8", __doc__, IMPLEMENTATIONS, batch_size=16), argv, **engines.QUICK
    )
    transformers_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    if args.engine_child:
        return engines.engine_child(args, load(args.engine_child, args, Path(args.workdir)))
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.workdir or temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        engines.prepare(args, workdir, ["vaswani-ct2-int8"] if "ct2-int8" in args.impl else [])
        times, outputs = engines.rounds_of_times("int8", args, workdir, load)
    rows = engines.rows_of(args, times)
    for row in rows:
        if ("fp32", row["beams"]) in outputs:
            reference = outputs["fp32", row["beams"]]
            agreed = agreement(outputs[row["impl"], row["beams"]], reference)
            row["same_sentences_as_fp32"], row["same_tokens_as_fp32"] = agreed
    train.add_ratios(rows, ("beams",), ("fp32", "ct2-int8"))
    columns = [("decoding", "decoding", ""), ("impl", "impl", ""), ("tokens_per_s", "tok/s", ".0f")]
    columns += [("vs_fp32", "x fp32", ".2f"), ("vs_ct2_int8", "x ct2-int8", ".2f")]
    columns += [
        ("same_sentences_as_fp32", "sentences = fp32", ".2f"),
        ("same_tokens_as_fp32", "tokens = fp32", ".2f"),
    ]
    title = (
        f"int8 decoding, preset {args.preset}: batch {args.batch_size}, source {args.src_len}, exactly "
        f"{args.new_tokens} new tokens, {args.threads} threads each, median of {args.repeats}"
    )
    packages = engines.versions("ctranslate2", "torchao")
    return common.report(args, title, rows, columns, versions=packages)
