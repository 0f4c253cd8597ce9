"""Beam search with the encoder side shared by a source's beams (`generate(share_encoder_outputs=True)`) against
transformers' layout, the default (the encoder output copied once per beam), same model and weights, jobs
interleaved.

Base preset, batch 32, source 20, exactly 30 new tokens (no EOS id), beam 4, random weights. Checks that both give
the same sequences, then prints the median seconds per batch of each and their ratio.

    python -m bench.ab_shared_encoder --repeats 5 --json bench/results/ab_shared_encoder.json
"""

import argparse
import sys

import torch

from bench import common


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="base")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    model = common.build_model("vaswani", common.vaswani_config(args.preset, args.vocab)).eval()
    source = common.random_batch(32, 20, 1, args.vocab, seed=args.beams)
    config = common.fixed_length_generation_config(args.beams, 30, suppress_eos=False)

    def decode(share: bool) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(
                input_ids=source["input_ids"],
                attention_mask=source["attention_mask"],
                generation_config=config,
                share_encoder_outputs=share,
            )

    jobs = {"shared": lambda: decode(True), "copied per beam": lambda: decode(False)}
    if not torch.equal(jobs["shared"](), jobs["copied per beam"]()):
        raise RuntimeError("the two layouts generated different sequences")
    times = common.interleaved_times(jobs, args.repeats)
    result = {name: common.median(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        print(f"{name}: median {result[name]:.3f} s per batch ({', '.join(f'{s:.3f}' for s in seconds)})")
    speedup = result["copied per beam"] / result["shared"]
    print(f"copied / shared = {speedup:.3f}")
    common.write_json(
        args.json,
        {
            "machine": common.machine(),
            "settings": vars(args),
            "seconds": times,
            "median_s": result,
            "speedup": speedup,
        },
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
