"""The kernel choices inside the model, each against its alternative, at the shapes of a base training step.

Four questions the model's code answers with a choice; this script measures them in one run (jobs interleaved,
median of `--repeats`) so the choice can be checked on any machine:

- attention: torch's SDPA kernel against the same formula in batched matmuls (`eager_attention_forward`, float32
  softmax), forward + backward, fp32 and bf16, encoder-style (padding mask) and causal, at several lengths; and
  forward only for one query per hypothesis (a decoding step with the KV cache), and for the 4 beams of a source
  sharing one encoder-decoder attention call. `kernels.prefers_matmul_attention` (attn_implementation="vaswani_sdpa") picks matmuls for half
  precision with gradients up to 128 keys and for decoding steps.
- attention over fewer keys than a float32 vector holds (`--what short-softmax`, the en->de recipe's short captions):
  torch's CPU softmax over rows of under 16 elements against `kernels.matmul_attention`, which pads them with -inf.
- the weight gradient of a linear layer, dW = dY^T X: oneDNN's linear on the transposed operands (copied to be
  contiguous) against torch's default `mm`, which reads them transposed in place.
- the label-smoothed loss with its backward: `F.cross_entropy(label_smoothing=...)` against the chunked
  `kernels.label_smoothed_cross_entropy`, fp32 and bf16 logits.
- dropout with its backward: `F.dropout` (a `bernoulli_` mask on the CPU) against `kernels.dropout` (a
  mask of 15 random bits per element, four elements per 64-bit draw), fp32 and bf16, at a base batch (tokens x 512) and at the en->de run of RESULTS.md
  (8192 x 128).
- a float32 linear layer's forward (`--what linear`), calls of 1 to 320 rows (decoding steps, one sentence to a batch's
  beams): torch's `F.linear` (MKL's GEMM) against oneDNN's linear, which `kernels.Linear` takes except below
  `MKL_FEWER_ROWS` rows on an Intel CPU.
- the int8 product of `kernels.Int8Linear` (`--what int8`), rows x K @ (N x K)^T in int32, 200 calls a job:
  `torch._int_mm`, which repacks the weight at every call, against oneDNN's int8 linear on a weight packed once, at
  the rows of decoding steps (batch 16, beam 4) and of a batch's encoder; `kernels.int8` picks by the thresholds
  `PACKED_INT8_MIN_WEIGHTS` and `PACKED_INT8_MIN_PRODUCT` (rows x weights).

    python -m bench.bench_kernels --repeats 5 --json bench/results/kernels.json
    python -m bench.bench_kernels --what int8 --repeats 5 --json bench/results/kernels_int8.json
    python -m bench.bench_kernels --what linear --repeats 5 --json bench/results/kernels_linear.json
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from bench import common
from vaswani.kernels import dropout, label_smoothed_cross_entropy, matmul_attention
from vaswani.modeling_vaswani import eager_attention_forward

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Module:  # what the attention functions read from their module argument
    training = True
    is_causal = False


def attention_jobs(tokens: int, heads: int, head_dim: int, lengths: list[int]) -> dict:
    jobs = {}
    for length in lengths:
        batch = max(1, tokens // length)
        for dtype_name, dtype in DTYPES.items():
            for causal in (False, True):
                q, k, v = (
                    torch.randn(batch, heads, length, head_dim, dtype=dtype, requires_grad=True)
                    for _ in "qkv"
                )
                padding = torch.ones(batch, 1, 1, length, dtype=torch.bool)
                padding[0, ..., length // 2 :] = False
                mask = torch.ones(length, length, dtype=torch.bool).tril() if causal else padding
                scale = head_dim**-0.5

                def kernel(q=q, k=k, v=v, padding=padding, causal=causal, scale=scale):
                    out = F.scaled_dot_product_attention(
                        q, k, v, attn_mask=None if causal else padding, is_causal=causal, scale=scale
                    )
                    out.float().sum().backward()

                def matmuls(q=q, k=k, v=v, mask=mask, scale=scale):
                    out, _ = eager_attention_forward(_Module(), q, k, v, mask, scaling=scale)
                    out.float().sum().backward()

                key = ("attention", f"T={length} B={batch}", dtype_name, "causal" if causal else "padding")
                jobs[key + ("sdpa kernel",)] = kernel
                jobs[key + ("matmuls",)] = matmuls
    return jobs


def short_softmax_jobs(tokens: int, heads: int, head_dim: int, lengths: list[int]) -> dict:
    """bf16 training attention of fewer keys than `SOFTMAX_MIN_KEYS`, forward + backward: the model's
    `eager_attention_forward` (torch's softmax over the short rows) against `kernels.matmul_attention` (the rows
    padded with -inf)."""
    jobs = {}
    for length in lengths:
        batch = max(1, tokens // length)
        q, k, v = (
            torch.randn(batch, heads, length, head_dim, dtype=torch.bfloat16, requires_grad=True)
            for _ in "qkv"
        )
        padding = torch.ones(batch, 1, 1, length, dtype=torch.bool)
        padding[::3, ..., length - 2 :] = False
        key = ("short softmax rows", f"T={length} B={batch} h={heads}", "bf16", "padding")
        for path, function in (
            ("torch softmax", eager_attention_forward),
            ("padded to 16", matmul_attention),
        ):

            def job(q=q, k=k, v=v, padding=padding, function=function):
                out, _ = function(_Module(), q, k, v, padding, scaling=head_dim**-0.5)
                out.float().sum().backward()

            jobs[key + (path,)] = job
    return jobs


def decoding_attention_jobs(rows: int, heads: int, head_dim: int, cases: list[tuple[int, int]]) -> dict:
    """A step of incremental decoding, forward only: each of `rows` hypotheses has one query, against `length`
    cached keys. With `queries` > 1 the hypotheses of a source share one call (encoder-decoder attention in beam
    search: the beams' queries together against the source's one copy of its keys), so rows / queries calls."""
    jobs = {}
    for queries, length in cases:
        calls = rows // queries
        q = torch.randn(calls, heads, queries, head_dim)
        k, v = torch.randn(calls, heads, length, head_dim), torch.randn(calls, heads, length, head_dim)
        padding = torch.ones(calls, 1, 1, length, dtype=torch.bool)
        case = f"{queries} quer{'y' if queries == 1 else 'ies'}, {length} keys, B={calls}"
        key = ("decoding step attention", case, "fp32", "")

        @torch.inference_mode()
        def kernel(q=q, k=k, v=v, padding=padding):
            F.scaled_dot_product_attention(q, k, v, attn_mask=padding, scale=head_dim**-0.5)

        @torch.inference_mode()
        def matmuls(q=q, k=k, v=v, padding=padding):
            eager_attention_forward(_Module(), q, k, v, padding, scaling=head_dim**-0.5)

        jobs[key + ("sdpa kernel",)] = kernel
        jobs[key + ("matmuls",)] = matmuls
    return jobs


def weight_gradient_jobs(tokens: int, shapes: list[tuple[int, int]]) -> dict:
    jobs = {}
    for out_features, in_features in shapes:
        x, grad = torch.randn(tokens, in_features), torch.randn(tokens, out_features)
        key = ("dW = dY^T X", f"{out_features}x{in_features}, N={tokens}", "fp32", "")
        if torch.backends.mkldnn.is_available():
            jobs[key + ("onednn linear",)] = lambda x=x, g=grad: torch.ops.mkldnn._linear_pointwise(
                g.t(), x.t(), None, "none", [], ""
            )
        jobs[key + ("torch mm",)] = lambda x=x, g=grad: g.t().mm(x)
    return jobs


def loss_jobs(tokens: int, vocab: int) -> dict:
    jobs = {}
    labels = torch.randint(0, vocab, (tokens,))
    for dtype_name, dtype in DTYPES.items():
        logits = torch.randn(tokens, vocab).to(dtype)
        key = ("label-smoothed loss", f"{tokens}x{vocab}", dtype_name, "")

        def plain(logits=logits):
            z = logits.clone().requires_grad_()
            F.cross_entropy(z.float(), labels, reduction="sum", label_smoothing=0.1).backward()

        def chunked(logits=logits):
            z = logits.clone().requires_grad_()
            label_smoothed_cross_entropy(z, labels, 0.1).backward()

        jobs[key + ("F.cross_entropy",)] = plain
        jobs[key + ("chunked",)] = chunked
    return jobs


def dropout_jobs(shapes: list[tuple[int, int]], probabilities: list[float]) -> dict:
    jobs = {}
    for tokens, width in shapes:
        for dtype_name, dtype in DTYPES.items():
            x = torch.randn(tokens, width, dtype=dtype, requires_grad=True)
            grad = torch.randn(tokens, width, dtype=dtype)
            for p in probabilities:
                key = ("dropout", f"{tokens}x{width}", dtype_name, f"p={p}")
                jobs[key + ("F.dropout",)] = lambda x=x, g=grad, p=p: F.dropout(x, p, True).backward(g)
                jobs[key + ("bit mask",)] = lambda x=x, g=grad, p=p: dropout(x, p, True).backward(g)
    return jobs


def int8_product_jobs(shapes: list[tuple[int, int]], rows: list[int], calls: int = 200) -> dict:
    from vaswani.kernels import int8

    jobs = {}
    if not int8._ONEDNN_INT8_AVAILABLE:
        return jobs
    for out_features, in_features in shapes:
        qdata, _ = int8._quantize_rows(torch.randn(out_features, in_features))
        packed = torch.ops.onednn.qlinear_prepack(qdata, None)
        for n in rows:
            x, _ = int8._quantize_rows(torch.randn(n, in_features))
            key = (
                "int8 product",
                f"{n}x{in_features} @ {out_features}x{in_features}",
                "int8",
                f"{calls} calls",
            )
            for path, weight in (("torch._int_mm", None), ("oneDNN packed", packed)):
                jobs[key + (path,)] = lambda x=x, q=qdata, w=weight: [
                    int8._int8_product(x, q, w) for _ in range(calls)
                ]
    return jobs


def linear_jobs(shapes: list[tuple[int, int]], rows: list[int], calls: int = 20) -> dict:
    from vaswani.kernels import onednn_linear

    jobs = {}
    if not onednn_linear._ONEDNN_AVAILABLE:
        return jobs
    for out_features, in_features in shapes:
        weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
        for n in rows:
            x = torch.randn(n, in_features)
            key = (
                "float32 linear",
                f"{n}x{in_features} @ {out_features}x{in_features}",
                "fp32",
                f"{calls} calls",
            )
            jobs[key + ("F.linear (MKL)",)] = lambda x=x, w=weight, b=bias: [
                F.linear(x, w, b) for _ in range(calls)
            ]
            jobs[key + ("oneDNN",)] = lambda x=x, w=weight, b=bias: [
                torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "") for _ in range(calls)
            ]
    return jobs


WHAT = ("attention", "decoding", "short-softmax", "weight-gradient", "loss", "dropout", "int8", "linear")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per batch (128 pairs x 32)")
    parser.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--decode-sentences", type=int, default=128, help="batch 32 x beam 4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--what",
        nargs="+",
        choices=WHAT,
        default=WHAT[:-2],
        help="which choices (default: all but int8 and linear)",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    d_model, heads = 512, 8
    if args.quick:
        args.tokens, args.vocab, args.lengths, args.repeats, d_model = 64, 500, [8], 1, 32
        args.decode_sentences = 4
    jobs = {}
    if "attention" in args.what:
        jobs |= attention_jobs(args.tokens, heads, d_model // heads, args.lengths)
    if "decoding" in args.what:
        cases = [
            (1, 20),
            (1, 60),
            (1, 256),
            (4, 20),
            (4, 60),
        ]  # (queries per call, keys): 4 = a source's beams
        jobs |= decoding_attention_jobs(args.decode_sentences, heads, d_model // heads, cases)
    if "short-softmax" in args.what:
        # the en->de recipe's attention: d_model 128, 4 heads, 8192-token batches
        lengths = [8] if args.quick else [8, 12, 15]
        jobs |= short_softmax_jobs(2 * args.tokens, 4, 32, lengths)
    shapes = [(d_model, d_model), (4 * d_model, d_model), (d_model, 4 * d_model), (args.vocab, d_model)]
    if "weight-gradient" in args.what:
        jobs |= weight_gradient_jobs(args.tokens, shapes)
    if "loss" in args.what:
        jobs |= loss_jobs(args.tokens, args.vocab)
    if "dropout" in args.what:
        jobs |= dropout_jobs([(args.tokens, d_model), (2 * args.tokens, d_model // 4)], [0.1, 0.3])
    if "int8" in args.what:  # decoding steps of batch 16: greedy, beam 4; a batch of 16 sources of 20 tokens
        rows = [2] if args.quick else [1, 16, 24, 64, 320]
        jobs |= int8_product_jobs([(d_model, d_model), (2 * d_model, d_model), (4 * d_model, d_model)], rows)
    if "linear" in args.what:
        rows = [2] if args.quick else [1, 2, 4, 8, 12, 16, 32, 64, 320]
        jobs |= linear_jobs(shapes, rows)
    times = common.interleaved_times(jobs, args.repeats, warmup=1)
    rows = []
    for (what, shape, dtype, variant, path), seconds in times.items():
        rows.append(
            {
                "what": what,
                "shape": shape,
                "dtype": dtype,
                "variant": variant,
                "path": path,
                "ms": 1e3 * common.median(seconds),
                "ms_all": [1e3 * s for s in seconds],
            }
        )
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["what"], row["shape"], row["dtype"], row["variant"]), []).append(row)
    for group in groups.values():  # each path as a multiple of the slowest in its group: > 1 is faster
        slowest = max(r["ms"] for r in group)
        for row in group:
            row["speedup"] = slowest / row["ms"]
    columns = [
        ("what", "what", ""),
        ("shape", "shape", ""),
        ("dtype", "dtype", ""),
        ("variant", "case", ""),
        ("path", "path", ""),
        ("ms", "ms", ".1f"),
        ("speedup", "x slowest", ".2f"),
    ]
    print(f"kernel choices, forward + backward where there is one, median of {args.repeats}")
    print(common.table(rows, columns))
    result = {"machine": common.machine(), "settings": vars(args), "results": rows}
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
