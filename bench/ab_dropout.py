"""Whole training steps with the model's CPU dropout (`kernels_vaswani.dropout`: a uniform >= p mask) against torch's
`F.dropout` (a `bernoulli_` mask) at every dropout site, same model, same batch, jobs interleaved.

By default the shape of the en->de run of RESULTS.md (the anchor's Transformer-Tiny: d_model 128, 4+4 layers, 4 heads,
d_ff 256, P_drop 0.3, an 8000-token vocabulary) on a batch of 480 pairs of 17 + 17 tokens (8160 tokens a side, one of
its 8192-token batches), bf16 autocast as it trained. A step is the forward pass, the label-smoothed loss, the
backward pass and a fused Adam step. Prints the median seconds per step of each and their ratio.

    python -m bench.ab_dropout --repeats 10 --json bench/results/ab_dropout.json
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from bench import common
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, modeling_vaswani


def torch_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p=p, training=training)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=480, help="sentence pairs per batch")
    parser.add_argument("--length", type=int, default=17, help="source and target tokens per sentence")
    parser.add_argument("--fp32", action="store_true", help="train in float32 instead of bf16 autocast")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps of each (median reported)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.ffn, args.vocab, args.batch_size, args.length, args.repeats = 32, 64, 500, 8, 6, 1
    config = VaswaniConfig.from_preset(
        "small",
        vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        dropout=args.dropout,
        attn_implementation=common.FAST_ATTENTION,  # as the recipe trains on the CPU
    )
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    batch = common.random_batch(args.batch_size, args.length, args.length, args.vocab)
    uniform_mask = modeling_vaswani.dropout

    def step(dropout) -> None:
        modeling_vaswani.dropout = modeling_vaswani._dropout = (
            dropout  # what every dropout site of the model calls
        )
        try:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.fp32):
                loss = common.training_loss("vaswani", model, batch, 0.1)
            loss.backward()
            optimizer.step()
        finally:
            modeling_vaswani.dropout = modeling_vaswani._dropout = uniform_mask

    jobs = {"F.dropout": lambda: step(torch_dropout), "uniform mask": lambda: step(uniform_mask)}
    times = common.interleaved_times(jobs, args.repeats, warmup=2)
    medians = {name: common.median(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        print(f"{name}: median {medians[name]:.3f} s per step ({', '.join(f'{s:.3f}' for s in seconds)})")
    speedup = medians["F.dropout"] / medians["uniform mask"]
    print(f"F.dropout / uniform mask = {speedup:.3f}")
    result = {
        "machine": common.machine(),
        "settings": vars(args),
        "parameters": common.num_parameters(model),
        "seconds": times,
        "median_s": medians,
        "speedup": speedup,
    }
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
