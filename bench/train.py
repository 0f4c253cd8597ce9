"""Training throughput, model FLOPs utilisation and peak memory of vaswani, Marian and nn.Transformer at equal sizes.

One training step is the forward pass, the label-smoothed loss (eps_ls 0.1), the backward pass and a fused Adam step,
on a batch of `--batch-size` sentence pairs of `--src-len` source and `--tgt-len` target tokens (no padding).
Throughput counts target tokens. Model FLOPs per step = 6 x parameters x target tokens (2 for the forward and 4 for the
backward multiply-adds of every weight, the shared embedding counted once as the output projection; attention scores
are left out: at 32 tokens they add about 3% at the base size). MFU is that over the step time and the matmul peak
measured in the same run. Memory: the rise of a fresh process's resident peak (`VmHWM`) over two steps; with
`--gpu`, of `torch.cuda.max_memory_allocated` over one more step.

    python -m bench train --preset base --repeats 3 --json bench/results/train_base_cpu.json
    python -m bench train --gpu --preset small base --repeats 3 --json bench/results/gpu_train_h200.json
"""

import argparse
import json
import statistics

import torch

from bench import common


def make_step(name, model, optimizer, batch, dtype, device):
    """One training step of `model` as a closure returning the loss."""

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = common.training_loss(name, model, batch, 0.1)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def build(name, preset, args, device, compiled):
    """The model, its Adam (§5.3, the fused kernel for every implementation alike, so the step measures the models)
    and its forward, compiled or not."""
    config = common.vaswani_config(preset, args.vocab, args.attention)
    model = common.build_model(name, config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    return model, optimizer, torch.compile(model) if compiled else model


def parse_args(argv):
    parser = common.parser("train", __doc__)
    common.model_flags(parser, common.IMPLEMENTATIONS, ["small", "base"])
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=128, help="sentence pairs per batch")
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--gpu", action="store_true", help="GPU mode: bf16, torch.compile; needs CUDA")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)  # one configuration in a subprocess
    parser.set_defaults(attention=common.FAST_ATTENTION)  # vaswani's attn_implementation, as the recipe's
    return common.parse(
        parser, argv, preset=["small"], batch_size=4, src_len=8, tgt_len=8, vocab=1000, repeats=1, warmup=1
    )


def memory_child(args):
    """Subprocess: the peak resident memory of two steps (the first allocates Adam's state), as a JSON line."""
    name, preset, dtype = args.memory_child.split(",")
    batch = common.random_batch(args.batch_size, args.src_len, args.tgt_len, args.vocab)
    _, optimizer, model = build(name, preset, args, "cpu", False)
    step = make_step(name, model, optimizer, batch, dtype, "cpu")
    print(json.dumps(common.peak_rss_during(lambda: [step() for _ in range(2)])))


def main(argv):
    args = parse_args(argv)
    if args.memory_child:
        return memory_child(args)
    device = "cuda" if args.gpu else "cpu"
    if args.gpu:
        if skipped := common.cuda_or_skip(args):
            return skipped
        args.dtype, args.no_memory = ["bf16"], True
    peak = common.matmul_peak((512, 256, 256) if args.quick else None, device=device)
    rows, tokens = [], args.batch_size * args.tgt_len
    for preset in args.preset:
        models, jobs = {}, {}
        for name in args.impl:
            batch = common.random_batch(
                args.batch_size, args.src_len, args.tgt_len, args.vocab, device=device
            )
            model, optimizer, forward = build(name, preset, args, device, args.gpu)
            models[name] = model
            for dtype in args.dtype:
                jobs[name, dtype] = make_step(name, forward, optimizer, batch, dtype, device)
        times = common.interleaved_times(jobs, args.repeats, args.warmup, device)
        for model in models.values():  # the CUDA rise below counts the gradients too
            model.zero_grad(set_to_none=True)
        for (name, dtype), seconds in times.items():
            params, step_s = common.num_parameters(models[name]), statistics.median(seconds)
            row = {
                "preset": preset,
                "impl": name,
                "dtype": dtype,
                "params_m": params / 1e6,
                "step_s": step_s,
                "step_s_all": seconds,
                "tokens_per_s": tokens / step_s,
                "mfu": 6 * params * tokens / step_s / (peak[dtype] * 1e9),
            }
            # on a GPU, how far allocated memory rises over the weights, Adam's state and the data
            common.measure_memory(args, row, jobs[name, dtype], "--memory-child", f"{name},{preset},{dtype}")
            rows.append(row)
        del models, jobs
    columns = [
        "preset",
        "impl",
        "dtype",
        ("params_m", "params M", ".1f"),
        ("step_s", "step s", ".3f"),
        ("tokens_per_s", "tgt tok/s", ".0f"),
        ("mfu", "MFU", ".1%"),
        ("mem_rise_mib", "mem rise MiB", ".0f"),
        *common.add_ratios(rows, ("preset", "dtype"), ("marian", "torch")),
    ]
    title = (
        f"training: {args.batch_size} pairs x {args.src_len}+{args.tgt_len} tokens, median of {args.repeats}"
    )
    return common.report(args, title, rows, columns, matmul_peak_gflops=peak)
