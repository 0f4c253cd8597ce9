"""The machine's matmul peak: fp32 through torch's default path, through oneDNN and numpy, and bf16.

The training benchmark measures the same peak in its own run for its MFU column; this script reports it alone,
for several shapes (the base model's FFN and attention projections and a square one).

    python -m bench.bench_matmul --repeats 10 --json bench_matmul.json
"""

import argparse
import sys

from bench import common

SHAPES = [(4096, 512, 2048), (4096, 2048, 512), (4096, 512, 512), (2048, 2048, 2048)]  # (M, K, N)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    shapes = [(256, 128, 128)] if args.quick else SHAPES
    repeats = 2 if args.quick else args.repeats
    rows = [{"shape": "x".join(map(str, shape)), **common.matmul_peak(shape, repeats)} for shape in shapes]
    paths = [key for key in rows[0] if key != "shape"]
    print(f"matmul GFLOP/s, (M x K) @ (K x N), median of {repeats}")
    print(common.table(rows, [("shape", "M x K x N", "")] + [(p, p, ".0f") for p in paths]))
    result = {"machine": common.machine(), "settings": vars(args), "results": rows}
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
