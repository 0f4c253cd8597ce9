"""Decoding throughput and one-sentence latency of vaswani, Marian and nn.Transformer at equal sizes.

Greedy and beam decoding of `--batch-size` sentences of `--src-len` source tokens into exactly `--new-tokens` tokens
each, with the KV cache: `generate()` for `vaswani` and `marian` with one shared `GenerationConfig`; `torch_generate`
for `torch` (`nn.Transformer` has no KV cache). Throughput counts the new tokens of the returned sentences (not of
every beam); latency is one sentence alone. Memory: the rise of a fresh process's resident peak (`VmHWM`) over one
batch decode; with `--gpu` (bf16 weights, the static cache), of `torch.cuda.max_memory_allocated`.

    python -m bench generate --preset base --repeats 5 --fixed-length no-eos --json bench/results/generate_base_cpu.json
"""

import argparse
import json
import statistics

import torch

from bench import common, train


def parse_args(argv):
    parser = common.parser("generate", __doc__)
    common.model_flags(parser, common.IMPLEMENTATIONS, ["base"])
    common.decoding_flags(parser, batch_size=32)
    parser.add_argument(
        "--dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16"], help="weights' dtype"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--gpu", action="store_true", help="GPU mode: bf16, the static cache; needs CUDA")
    parser.add_argument(
        "--attention",
        default=common.FAST_ATTENTION,
        help="vaswani's attn_implementation (vaswani_sdpa: as the recipe)",
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)  # one configuration in a subprocess
    quick = {"preset": ["small"], "batch_size": 2, "src_len": 5, "new_tokens": 4, "vocab": 1000, "repeats": 1}
    return common.parse(parser, argv, **quick)


def build(name: str, preset: str, dtype: str, args, device: str):
    config = common.vaswani_config(preset, args.vocab, attn_implementation=args.attention)
    model = common.build_model(name, config).eval().to(device)
    return model.to(torch.bfloat16) if dtype == "bf16" else model


def make_job(name: str, model, beams: int, batch_size: int, args, device: str):
    """A closure decoding one batch; checks that exactly `--new-tokens` tokens came out."""
    source = common.random_batch(batch_size, args.src_len, 1, args.vocab, seed=beams, device=device)
    suppress_eos = args.fixed_length == "min-new-tokens"
    config = common.fixed_length_generation_config(
        beams, args.new_tokens, suppress_eos, static_cache=args.gpu
    )

    @torch.inference_mode()
    def job() -> torch.Tensor:
        if name == "torch":
            out = common.torch_generate(
                model, source["input_ids"], source["attention_mask"], beams, args.new_tokens
            )
        else:
            out = model.generate(
                **{k: source[k] for k in ("input_ids", "attention_mask")}, generation_config=config
            )
        if out.shape != (batch_size, 1 + args.new_tokens):
            raise RuntimeError(f"{name} produced shape {tuple(out.shape)}")
        return out

    return job


def memory_child(args) -> None:
    """Subprocess: the peak resident memory of one batch decode, as a JSON line."""
    name, preset, dtype, beams = args.memory_child.split(",")
    job = make_job(name, build(name, preset, dtype, args, "cpu"), int(beams), args.batch_size, args, "cpu")
    print(json.dumps(common.peak_rss_during(job)))


def measure(args, preset: str, dtype: str, device: str) -> list[dict]:
    """One row per implementation and beam setting, all jobs interleaved."""
    jobs = {}
    for name in args.impl:
        model = build(name, preset, dtype, args, device)
        for beams in args.beams:
            jobs[name, beams, "batch"] = make_job(name, model, beams, args.batch_size, args, device)
            jobs[name, beams, "latency"] = make_job(name, model, beams, 1, args, device)
    times = common.interleaved_times(jobs, args.repeats, args.warmup, device)
    rows = []
    for name in args.impl:
        for beams in args.beams:
            seconds = times[name, beams, "batch"]
            row = {"preset": preset, "dtype": dtype, "impl": name, "beams": beams}
            row |= {"decoding": "greedy" if beams == 1 else f"beam-{beams}", "batch_s_all": seconds}
            row["tokens_per_s"] = args.batch_size * args.new_tokens / statistics.median(seconds)
            row["latency_s"] = statistics.median(times[name, beams, "latency"])
            if args.gpu:  # how far allocated memory rises over the weights and the data
                row["mem_rise_mib"] = common.cuda_memory_rise_mib(jobs[name, beams, "batch"])
            elif not args.no_memory:
                spec = f"{name},{preset},{dtype},{beams}"
                memory = common.run_child("generate", [*args.argv, "--memory-child", spec])
                row["peak_rss_mib"], row["mem_rise_mib"] = memory["peak_rss_mib"], memory["rise_mib"]
            rows.append(row)
    return rows


def main(argv) -> dict:
    args = parse_args(argv)
    if args.memory_child:
        return memory_child(args)
    if args.gpu:
        if skipped := common.cuda_or_skip(args):
            return skipped
        args.dtype, args.no_memory = ["bf16"], True
    device = "cuda" if args.gpu else "cpu"
    rows = [
        row for preset in args.preset for dtype in args.dtype for row in measure(args, preset, dtype, device)
    ]
    train.add_ratios(rows, ("preset", "dtype", "beams"), ("marian", "torch"))
    columns = [
        ("preset", "preset", ""),
        ("dtype", "dtype", ""),
        ("impl", "impl", ""),
        ("decoding", "decoding", ""),
    ]
    columns += [("tokens_per_s", "tok/s", ".0f"), ("latency_s", "latency s", ".3f")]
    columns += [
        ("mem_rise_mib", "mem rise MiB", ".0f"),
        ("vs_marian", "x marian", ".2f"),
        ("vs_torch", "x torch", ".2f"),
    ]
    title = (
        f"decoding: batch {args.batch_size}, source {args.src_len}, {args.new_tokens} new tokens, median of "
        f"{args.repeats}, length fixed by {args.fixed_length}; latency: one sentence"
    )
    return common.report(args, title, rows, columns)
