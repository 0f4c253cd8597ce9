"""Where the time of one beam-4 decode goes, by aten operator (`torch.profiler`), with and without an EOS id.

The same decode as `bench_generate` (base preset, batch 32, source 20, 30 new tokens, random weights), for one
implementation, once with the EOS id removed and once with `min_new_tokens` suppressing it; prints the wall time of
each and the operators by self CPU time. Used to see which part of a decode each model controls.

    python -m bench.profile_decode vaswani
    python -m bench.profile_decode marian
"""

import argparse
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import common


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("impl", choices=["vaswani", "marian"])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    parser.add_argument("--rows", type=int, default=14, help="operators to print")
    args = parser.parse_args(argv)
    model = common.build_model(args.impl, common.vaswani_config(args.preset, args.vocab)).eval()
    source = common.random_batch(32, 20, 1, args.vocab, seed=args.beams)
    inputs = {"input_ids": source["input_ids"], "attention_mask": source["attention_mask"]}

    def decode(suppress_eos: bool) -> torch.Tensor:
        config = common.fixed_length_generation_config(args.beams, 30, suppress_eos)
        with torch.inference_mode():
            return model.generate(**inputs, generation_config=config)

    decode(True), decode(False)  # warm-up
    for suppress_eos in (False, True):
        start = time.perf_counter()
        decode(suppress_eos)
        print(
            f"{args.impl}, {'min_new_tokens' if suppress_eos else 'no EOS'}: {time.perf_counter() - start:.3f} s"
        )
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decode(suppress_eos)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main(sys.argv[1:])
