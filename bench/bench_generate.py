"""Generation throughput and single-sentence latency of the three implementations at equal sizes.

Greedy and beam-4 decoding of `--batch-size` sentences of `--src-len` source tokens, exactly `--new-tokens` new
tokens each (by default EOS is suppressed until then with `min_new_tokens`; `--fixed-length no-eos` decodes
without an EOS id instead, leaving out that benchmark-made vocabulary mask), with the KV cache: `generate()` for
`vaswani` and `marian` with one shared `GenerationConfig`; `torch_generate` (no KV cache exists for `nn.Transformer`) for `torch`.
Throughput counts the new tokens of the returned sentences (not of every beam); latency is one sentence alone.

    python -m bench.bench_generate --preset base --repeats 5 --json bench_generate.json
"""

import argparse
import json
import sys

import torch

from bench import common


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", nargs="+", default=["base"], help="VaswaniConfig presets")
    parser.add_argument(
        "--dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16"], help="weights' dtype"
    )
    parser.add_argument(
        "--impl", nargs="+", default=list(common.IMPLEMENTATIONS), choices=common.IMPLEMENTATIONS
    )
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4], help="1 is greedy")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB, help="shared vocabulary size")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per configuration (median reported)"
    )
    parser.add_argument("--warmup", type=int, default=1)
    common.add_fixed_length_argument(parser)
    parser.add_argument(
        "--share-encoder-outputs",
        action="store_true",
        help="vaswani: beams of a source read one copy of its encoder output (generate's opt-in)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--gpu", action="store_true", help="GPU mode: bf16, SDPA, static cache + torch.compile"
    )
    parser.add_argument(
        "--attention",
        default=common.FAST_ATTENTION,
        help="vaswani's attn_implementation (default vaswani_sdpa, the CPU-fast one the recipe uses; sdpa, eager)",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    parser.add_argument(
        "--memory-child", help=argparse.SUPPRESS
    )  # internal: one configuration in a subprocess
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.batch_size, args.src_len, args.new_tokens = ["small"], 2, 5, 4
        args.vocab, args.repeats, args.warmup = 1000, 1, 1
    return args


def build(name: str, preset: str, dtype: str, args, device: str):
    model = (
        common.build_model(
            name, common.vaswani_config(preset, args.vocab, attn_implementation=args.attention)
        )
        .eval()
        .to(device)
    )
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    return model


def make_job(name: str, model, beams: int, batch_size: int, args, device: str):
    """A closure decoding one batch; checks that exactly `new_tokens` tokens came out."""
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
            extra = (
                {"share_encoder_outputs": True} if name == "vaswani" and args.share_encoder_outputs else {}
            )
            out = model.generate(
                input_ids=source["input_ids"],
                attention_mask=source["attention_mask"],
                generation_config=config,
                **extra,
            )
        if out.shape != (batch_size, 1 + args.new_tokens):
            raise RuntimeError(f"{name} produced shape {tuple(out.shape)}")
        return out

    return job


def memory_child(args) -> None:
    """Subprocess: peak resident memory of one batch decode, printed as a JSON line."""
    name, preset, dtype, beams = args.memory_child.split(",")
    model = build(name, preset, dtype, args, "cpu")
    job = make_job(name, model, int(beams), args.batch_size, args, "cpu")
    print(json.dumps(common.peak_rss_during(job)))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.memory_child:
        memory_child(args)
        return {}
    device, skipped = common.choose_device(args)
    if skipped:
        return skipped
    rows = []
    for preset in args.preset:
        for dtype in args.dtype:
            jobs = {}
            for name in args.impl:
                model = build(name, preset, dtype, args, device)
                for beams in args.beams:
                    jobs[name, beams, "batch"] = make_job(name, model, beams, args.batch_size, args, device)
                    jobs[name, beams, "latency"] = make_job(name, model, beams, 1, args, device)
            times = common.interleaved_times(jobs, args.repeats, args.warmup, device)
            cuda_rise = {}
            # On a GPU, one more batch decode each: how far allocated memory rises over the weights and data.
            if device == "cuda":
                cuda_rise = {
                    key: common.cuda_memory_rise_mib(job) for key, job in jobs.items() if key[2] == "batch"
                }
            for name in args.impl:
                for beams in args.beams:
                    batch_s = common.median(times[name, beams, "batch"])
                    row = {
                        "preset": preset,
                        "dtype": dtype,
                        "impl": name,
                        "decoding": "greedy" if beams == 1 else f"beam-{beams}",
                        "beams": beams,
                        "batch_s": batch_s,
                        "batch_s_all": times[name, beams, "batch"],
                        "tokens_per_s": args.batch_size * args.new_tokens / batch_s,
                        "latency_s": common.median(times[name, beams, "latency"]),
                        "latency_s_all": times[name, beams, "latency"],
                    }
                    if (name, beams, "batch") in cuda_rise:
                        row["mem_rise_mib"] = cuda_rise[name, beams, "batch"]
                    if not args.no_memory:
                        child = ["--memory-child", f"{name},{preset},{dtype},{beams}"]
                        child += ["--batch-size", str(args.batch_size), "--src-len", str(args.src_len)]
                        child += ["--new-tokens", str(args.new_tokens), "--vocab", str(args.vocab)]
                        child += ["--fixed-length", args.fixed_length]
                        memory = common.run_child("bench.bench_generate", child)
                        row["peak_rss_mib"], row["mem_rise_mib"] = memory["peak_rss_mib"], memory["rise_mib"]
                    rows.append(row)
    by_key = {(r["preset"], r["dtype"], r["impl"], r["beams"]): r for r in rows}
    for row in rows:
        for peer in ("marian", "torch"):
            other = by_key.get((row["preset"], row["dtype"], peer, row["beams"]))
            row[f"vs_{peer}"] = row["tokens_per_s"] / other["tokens_per_s"] if other else None
            row[f"latency_vs_{peer}"] = other["latency_s"] / row["latency_s"] if other else None
    columns = [
        ("preset", "preset", ""),
        ("dtype", "dtype", ""),
        ("impl", "impl", ""),
        ("decoding", "decoding", ""),
        ("tokens_per_s", "tok/s", ".0f"),
        ("latency_s", "latency s", ".3f"),
        ("mem_rise_mib", "mem rise MiB", ".0f"),
        ("vs_marian", "x marian", ".2f"),
        ("latency_vs_marian", "lat x marian", ".2f"),
        ("vs_torch", "x torch", ".2f"),
    ]
    print(
        f"\ngeneration: batch {args.batch_size}, source {args.src_len}, {args.new_tokens} new tokens, "
        f"vocab {args.vocab}, median of {args.repeats}, length fixed by {args.fixed_length}; latency: one sentence"
    )
    print(common.table(rows, columns))
    result = {
        "machine": common.machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "memory_child")},
        "memory_measure": "torch.cuda.max_memory_allocated over one more batch decode, minus allocated before it"
        if device == "cuda"
        else "VmHWM of a fresh process over one batch decode; rise = peak minus RSS before it",
        "results": rows,
    }
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
