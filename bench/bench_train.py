"""Training throughput, model FLOPs utilisation and peak memory of the three implementations at equal sizes.

One training step is the forward pass, the label-smoothed loss, the backward pass and a (fused) Adam step, on a batch of
`--batch-size` sentence pairs of `--src-len` source and `--tgt-len` target tokens (no padding). Throughput counts
target tokens. Model FLOPs per step = 6 x parameters x target tokens (2 for the forward and 4 for the backward
multiply-adds of every weight, the shared embedding counted once as the output projection; source and target lengths
are equal here, so encoder weights see as many tokens as decoder weights; attention scores are left out: at 32
tokens they add about 3% at the base size). MFU is that divided by the step time and by the matmul peak measured in
the same run.

    python -m bench.bench_train --preset small base --dtype fp32 bf16 --repeats 5 --json bench_train.json
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
    parser.add_argument("--preset", nargs="+", default=["small", "base"], help="VaswaniConfig presets")
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument(
        "--impl", nargs="+", default=list(common.IMPLEMENTATIONS), choices=common.IMPLEMENTATIONS
    )
    parser.add_argument("--batch-size", type=int, default=128, help="sentence pairs per batch")
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB, help="shared vocabulary size")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed steps per configuration (median reported)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per configuration first")
    parser.add_argument(
        "--curve-steps", type=int, default=20, help="steps of the fp32-vs-bf16 loss curve (0: skip)"
    )
    parser.add_argument("--curve-batch-size", type=int, default=32)
    parser.add_argument("--curve-preset", nargs="*", default=["small"], help="presets that get a loss curve")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--gpu", action="store_true", help="GPU mode (bf16, SDPA, torch.compile); needs CUDA")
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
        args.preset, args.batch_size, args.src_len, args.tgt_len = ["small"], 4, 8, 8
        args.vocab, args.repeats, args.warmup, args.curve_steps, args.curve_batch_size = 1000, 1, 1, 2, 4
    return args


def make_step(name, model, optimizer, batch, dtype: str, device: str):
    """One training step of `model` as a closure returning the loss."""
    eps = 0.1

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = common.training_loss(name, model, batch, eps)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def build(name: str, preset: str, args, device: str):
    config = common.vaswani_config(preset, args.vocab, attn_implementation=args.attention)
    model = common.build_model(name, config).to(device).train()
    if args.gpu:
        model = torch.compile(model)
    # §5.3's Adam; the fused kernel (CPU and CUDA) for every implementation alike, so the step measures the models.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    return config, model, optimizer


def memory_child(args) -> None:
    """Subprocess: peak resident memory of two training steps of one configuration, printed as a JSON line."""
    name, preset, dtype = args.memory_child.split(",")
    _, model, optimizer = build(name, preset, args, "cpu")
    batch = common.random_batch(args.batch_size, args.src_len, args.tgt_len, args.vocab)
    step = make_step(name, model, optimizer, batch, dtype, "cpu")
    result = common.peak_rss_during(
        lambda: [step() for _ in range(2)]
    )  # the first step allocates Adam's state
    print(json.dumps(result))


def loss_curve(preset: str, args, device: str) -> dict:
    """Our model trained on a copy task from one initialisation in fp32 and in bf16 autocast, same dropout masks."""
    curves = {}
    for dtype in ("fp32", "bf16"):
        _, model, optimizer = build("vaswani", preset, args, device)
        for group in optimizer.param_groups:
            group["lr"] = 5e-4
        losses = []
        for i in range(args.curve_steps):
            batch = common.random_batch(
                args.curve_batch_size, args.src_len, args.src_len, args.vocab, seed=i + 1
            )
            batch["labels"] = batch["input_ids"].clone()  # copy task: learnable, so the curve falls
            torch.manual_seed(1000 + i)
            losses.append(make_step("vaswani", model, optimizer, batch, dtype, device)())
        curves[dtype] = losses
    diffs = [abs(b - a) / a for a, b in zip(curves["fp32"], curves["bf16"], strict=True)]
    return {**curves, "max_rel_diff": max(diffs), "final_rel_diff": diffs[-1]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.memory_child:
        memory_child(args)
        return {}
    device, skipped = common.choose_device(args)
    if skipped:
        return skipped
    if args.quick:
        peak = common.matmul_peak((512, 256, 256), repeats=3, device=device)
    else:
        peak = common.matmul_peak(device=device)
    print("matmul peak (GFLOP/s): " + ", ".join(f"{k} {v:.0f}" for k, v in peak.items()))
    tokens = args.batch_size * args.tgt_len
    rows, curves = [], {}
    for preset in args.preset:
        models, jobs = {}, {}
        for name in args.impl:
            config, model, optimizer = build(name, preset, args, device)
            batch = common.random_batch(
                args.batch_size, args.src_len, args.tgt_len, args.vocab, device=device
            )
            models[name] = model
            for dtype in args.dtype:
                jobs[name, dtype] = make_step(name, model, optimizer, batch, dtype, device)
        times = common.interleaved_times(jobs, args.repeats, args.warmup, device)
        cuda_rise = {}
        # On a GPU, one more step each: how far allocated memory rises over the weights, Adam state and data.
        if device == "cuda":
            for model in models.values():
                model.zero_grad(set_to_none=True)
            cuda_rise = {key: common.cuda_memory_rise_mib(job) for key, job in jobs.items()}
        for (name, dtype), seconds in times.items():
            step_s = common.median(seconds)
            flops = 6 * common.num_parameters(models[name]) * tokens
            row = {
                "preset": preset,
                "impl": name,
                "dtype": dtype,
                "params_m": common.num_parameters(models[name]) / 1e6,
                "step_s": step_s,
                "step_s_all": seconds,
                "tokens_per_s": tokens / step_s,
                "tokens_per_s_best": tokens / min(seconds),  # the least disturbed step, on a shared machine
                "gflops": flops / step_s / 1e9,
            }
            if dtype == "bf16":
                row["mfu"] = row["gflops"] / peak["bf16"]
            else:
                row["mfu"] = row["gflops"] / peak["fp32_default"]
                if "fp32_onednn" in peak:
                    row["mfu_onednn"] = row["gflops"] / peak["fp32_onednn"]
            if (name, dtype) in cuda_rise:
                row["mem_rise_mib"] = cuda_rise[name, dtype]
            if not args.no_memory:
                child = ["--memory-child", f"{name},{preset},{dtype}", "--batch-size", str(args.batch_size)]
                child += [
                    "--src-len",
                    str(args.src_len),
                    "--tgt-len",
                    str(args.tgt_len),
                    "--vocab",
                    str(args.vocab),
                ]
                memory = common.run_child("bench.bench_train", child)
                row["peak_rss_mib"], row["mem_rise_mib"] = memory["peak_rss_mib"], memory["rise_mib"]
            rows.append(row)
        del models, jobs
        if args.curve_steps and preset in args.curve_preset:
            curves[preset] = loss_curve(preset, args, device)
    by_key = {(r["preset"], r["impl"], r["dtype"]): r for r in rows}
    for row in rows:
        marian_fp32 = by_key.get((row["preset"], "marian", "fp32"))
        same_dtype = by_key.get((row["preset"], "marian", row["dtype"]))
        torch_same = by_key.get((row["preset"], "torch", row["dtype"]))
        row["vs_marian"] = row["tokens_per_s"] / same_dtype["tokens_per_s"] if same_dtype else None
        row["vs_marian_fp32"] = row["tokens_per_s"] / marian_fp32["tokens_per_s"] if marian_fp32 else None
        row["vs_torch"] = row["tokens_per_s"] / torch_same["tokens_per_s"] if torch_same else None
        if same_dtype and "mem_rise_mib" in row:
            row["mem_vs_marian"] = row["mem_rise_mib"] / same_dtype["mem_rise_mib"]
    columns = [
        ("preset", "preset", ""),
        ("impl", "impl", ""),
        ("dtype", "dtype", ""),
        ("params_m", "params M", ".1f"),
        ("step_s", "step s", ".3f"),
        ("tokens_per_s", "tgt tok/s", ".0f"),
        ("tokens_per_s_best", "best tok/s", ".0f"),
        ("gflops", "GFLOP/s", ".0f"),
        ("mfu", "MFU", ".1%"),
        ("mfu_onednn", "MFU/oneDNN", ".1%"),
        ("mem_rise_mib", "mem rise MiB", ".0f"),
        ("peak_rss_mib", "peak RSS MiB", ".0f"),
        ("vs_marian", "x marian", ".2f"),
        ("vs_marian_fp32", "x marian fp32", ".2f"),
        ("vs_torch", "x torch", ".2f"),
    ]
    print(
        f"\ntraining: {args.batch_size} pairs x {args.src_len}+{args.tgt_len} tokens, vocab {args.vocab}, "
        f"median of {args.repeats}, FLOPs = 6 x params x target tokens"
    )
    print(common.table(rows, columns))
    for preset, curve in curves.items():
        print(
            f"\nloss curve ({preset}, copy task, {args.curve_steps} steps): fp32 {curve['fp32'][0]:.3f} -> "
            f"{curve['fp32'][-1]:.3f}, bf16 {curve['bf16'][0]:.3f} -> {curve['bf16'][-1]:.3f}, "
            f"max relative difference {curve['max_rel_diff']:.2%}"
        )
    result = {
        "machine": common.machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "memory_child")},
        "matmul_peak_gflops": peak,
        "flop_formula": "6 * parameters * target tokens per step",
        "memory_measure": "torch.cuda.max_memory_allocated over one more step, minus allocated before it"
        if device == "cuda"
        else "VmHWM of a fresh process over two training steps; rise = peak minus RSS before them",
        "results": rows,
        "loss_curves": curves,
    }
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
