"""The kernel choices inside the model, each against its alternative, at the shapes of a base training step.

The choices the model's code makes, each measured in one run (jobs interleaved, median of `--repeats`) so that it can
be checked on any machine; `--what` picks them:

- attention: torch's SDPA kernel against the same formula in batched matmuls (`eager_attention_forward`, float32
  softmax), forward + backward, fp32 and bf16, encoder-style (padding mask) and causal, at several lengths; and
  forward only for one query per hypothesis (a decoding step with the KV cache), and for the 4 beams of a source
  sharing one encoder-decoder attention call (`decoding`). `kernels.prefers_matmul_attention` (attn_implementation
  "vaswani_sdpa") picks matmuls for half precision with gradients up to 128 keys and for decoding steps.
- attention over fewer keys than a float32 vector holds (`--what short-softmax`, the en->de recipe's short captions):
  torch's CPU softmax over rows of under 16 elements against `kernels.matmul_attention`, which pads them with -inf.
- the weight gradient of a linear layer, dW = dY^T X: oneDNN's linear on the transposed operands (copied to be
  contiguous) against torch's default `mm`, which reads them transposed in place.
- the label-smoothed loss with its backward: `F.cross_entropy(label_smoothing=...)` against the chunked
  `kernels.label_smoothed_cross_entropy`, fp32 and bf16 logits.
- dropout with its backward: `F.dropout` (a `bernoulli_` mask on the CPU) against `kernels.dropout` (a
  mask of 15 random bits per element, four elements per 64-bit draw), fp32 and bf16, at a base batch (tokens x 512)
  and at the en->de run of RESULTS.md (8192 x 128).
- a float32 linear layer's forward (`--what linear`), calls of 1 to 320 rows (decoding steps, one sentence to a batch's
  beams): torch's `F.linear` (MKL's GEMM) against oneDNN's linear, which `kernels.Linear` takes except below
  `MKL_FEWER_ROWS` rows on an Intel CPU.
- the int8 product of `kernels.Int8Linear` (`--what int8`), rows x K @ (N x K)^T in int32, 200 calls a job:
  `torch._int_mm`, which repacks the weight at every call, against oneDNN's int8 linear on a weight packed once, at
  the rows of decoding steps (batch 16, beam 4) and of a batch's encoder; `kernels.int8` picks by the thresholds
  `PACKED_INT8_MIN_WEIGHTS` and `PACKED_INT8_MIN_PRODUCT` (rows x weights).

    python -m bench kernels --repeats 5 --json bench/results/kernels_cpu.json
    python -m bench kernels --what int8 --repeats 5 --json bench/results/kernels_int8.json
    python -m bench kernels --what linear --repeats 5 --json bench/results/kernels_linear.json
"""

import statistics

import torch
import torch.nn.functional as F

from bench import common
from vaswani.kernels import dropout, int8, label_smoothed_cross_entropy, matmul_attention, onednn_linear
from vaswani.modeling_vaswani import eager_attention_forward

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Module:  # what the attention functions read from their module argument
    training = True
    is_causal = False


def sdpa(causal):
    """torch's SDPA kernel in the signature of the model's attention functions."""

    def attention(module, q, k, v, mask, scaling):
        mask = None if causal else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scaling), None

    return attention


def attention_jobs(key, paths, q, k, v, mask):
    """One attention call through each of `paths` ((name, function)), with its backward where `q` needs one."""
    jobs = {}
    for path, function in paths:

        @torch.inference_mode(not q.requires_grad)
        def job(function=function):
            out, _ = function(_Module(), q, k, v, mask, scaling=q.shape[-1] ** -0.5)
            if q.requires_grad:
                out.float().sum().backward()

        jobs[(*key, path)] = job
    return jobs


def qkv(batch, heads, queries, keys, head_dim, dtype=torch.float32, grad=True):
    q = torch.randn(batch, heads, queries, head_dim, dtype=dtype, requires_grad=grad)
    k, v = (torch.randn(batch, heads, keys, head_dim, dtype=dtype, requires_grad=grad) for _ in "kv")
    return q, k, v, torch.ones(batch, 1, 1, keys, dtype=torch.bool)


def training_attention(args, d_model, heads=8):
    jobs = {}
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        for dtype_name, dtype in DTYPES.items():
            for causal in (False, True):
                q, k, v, padding = qkv(batch, heads, length, length, d_model // heads, dtype)
                padding[0, ..., length // 2 :] = False
                mask = torch.ones(length, length, dtype=torch.bool).tril() if causal else padding
                key = ("attention", f"T={length} B={batch}", dtype_name, "causal" if causal else "padding")
                paths = [("sdpa kernel", sdpa(causal)), ("matmuls", eager_attention_forward)]
                jobs |= attention_jobs(key, paths, q, k, v, mask)
    return jobs


def short_softmax(args, d_model):
    """bf16 training attention of fewer keys than `SOFTMAX_MIN_KEYS` at the en->de recipe's shape (d_model 128, 4
    heads, 8192-token batches): torch's softmax over the short rows against the rows padded with -inf."""
    jobs = {}
    for length in [8] if args.quick else [8, 12, 15]:
        batch = 2 * args.tokens // length
        q, k, v, padding = qkv(batch, 4, length, length, 32, torch.bfloat16)
        padding[::3, ..., length - 2 :] = False
        key = ("short softmax rows", f"T={length} B={batch} h=4", "bf16", "padding")
        paths = [("torch softmax", eager_attention_forward), ("padded to 16", matmul_attention)]
        jobs |= attention_jobs(key, paths, q, k, v, padding)
    return jobs


def decoding_attention(args, d_model, heads=8):
    """A step of incremental decoding, forward only: each of `--decode-sentences` hypotheses has one query against
    `keys` cached keys; with 4 queries, a source's beams share one call (encoder-decoder attention in beam search)."""
    jobs = {}
    for queries, keys in [(1, 20), (1, 60), (1, 256), (4, 20), (4, 60)]:
        calls = args.decode_sentences // queries
        q, k, v, padding = qkv(calls, heads, queries, keys, d_model // heads, grad=False)
        key = ("decoding step attention", f"{queries} queries, {keys} keys, B={calls}", "fp32", "")
        jobs |= attention_jobs(
            key, [("sdpa kernel", sdpa(False)), ("matmuls", eager_attention_forward)], q, k, v, padding
        )
    return jobs


def weight_gradient(args, d_model):
    jobs, onednn = {}, torch.backends.mkldnn.is_available()
    for out_features, in_features in shapes(args, d_model):
        x, grad = torch.randn(args.tokens, in_features), torch.randn(args.tokens, out_features)
        key = ("dW = dY^T X", f"{out_features}x{in_features}, N={args.tokens}", "fp32", "")
        if onednn:
            jobs[(*key, "onednn linear")] = lambda x=x, g=grad: torch.ops.mkldnn._linear_pointwise(
                g.t(), x.t(), None, "none", [], ""
            )
        jobs[(*key, "torch mm")] = lambda x=x, g=grad: g.t().mm(x)
    return jobs


def loss(args, d_model):
    jobs, labels = {}, torch.randint(0, args.vocab, (args.tokens,))
    paths = {
        "F.cross_entropy": lambda z: F.cross_entropy(z.float(), labels, reduction="sum", label_smoothing=0.1),
        "chunked": lambda z: label_smoothed_cross_entropy(z, labels, 0.1),
    }
    for dtype_name, dtype in DTYPES.items():
        logits = torch.randn(args.tokens, args.vocab).to(dtype)
        for path, function in paths.items():
            key = ("label-smoothed loss", f"{args.tokens}x{args.vocab}", dtype_name, "", path)
            jobs[key] = lambda f=function, x=logits: f(x.clone().requires_grad_()).backward()
    return jobs


def dropouts(args, d_model):
    jobs = {}
    for tokens, width in [(args.tokens, d_model), (2 * args.tokens, d_model // 4)]:
        for dtype_name, dtype in DTYPES.items():
            x = torch.randn(tokens, width, dtype=dtype, requires_grad=True)
            grad = torch.randn(tokens, width, dtype=dtype)
            for p in (0.1, 0.3):
                key = ("dropout", f"{tokens}x{width}", dtype_name, f"p={p}")
                for path, function in (("F.dropout", F.dropout), ("bit mask", dropout)):
                    jobs[(*key, path)] = lambda x=x, g=grad, p=p, f=function: f(x, p, True).backward(g)
    return jobs


def int8_products(args, d_model, calls=200):
    """Decoding steps of batch 16, greedy and beam 4, and a batch of 16 sources of 20 tokens."""
    jobs = {}
    for out_features in [d_model, 2 * d_model, 4 * d_model] if int8._ONEDNN_INT8_AVAILABLE else []:
        qdata, _ = int8._quantize_rows(torch.randn(out_features, d_model))
        packed = torch.ops.onednn.qlinear_prepack(qdata, None)
        for n in [2] if args.quick else [1, 16, 24, 64, 320]:
            x, _ = int8._quantize_rows(torch.randn(n, d_model))
            key = ("int8 product", f"{n}x{d_model} @ {out_features}x{d_model}", "int8", f"{calls} calls")
            for path, weight in (("torch._int_mm", None), ("oneDNN packed", packed)):
                jobs[(*key, path)] = lambda x=x, q=qdata, w=weight: [
                    int8._int8_product(x, q, w) for _ in range(calls)
                ]
    return jobs


def linears(args, d_model, calls=20):
    jobs = {}
    for out_features, in_features in shapes(args, d_model) if onednn_linear._ONEDNN_AVAILABLE else []:
        weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
        for n in [2] if args.quick else [1, 2, 4, 8, 12, 16, 32, 64, 320]:
            x = torch.randn(n, in_features)
            key = (
                "float32 linear",
                f"{n}x{in_features} @ {out_features}x{in_features}",
                "fp32",
                f"{calls} calls",
            )
            jobs[(*key, "F.linear (MKL)")] = lambda x=x, w=weight, b=bias: [
                F.linear(x, w, b) for _ in range(calls)
            ]
            jobs[(*key, "oneDNN")] = lambda x=x, w=weight, b=bias: [
                torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "") for _ in range(calls)
            ]
    return jobs


def shapes(args, d_model):
    """(out, in) of the base model's weights: attention, FFN in and out, the output projection."""
    return [(d_model, d_model), (4 * d_model, d_model), (d_model, 4 * d_model), (args.vocab, d_model)]


WHAT = {
    "attention": training_attention,
    "decoding": decoding_attention,
    "short-softmax": short_softmax,
    "weight-gradient": weight_gradient,
    "loss": loss,
    "dropout": dropouts,
    "int8": int8_products,
    "linear": linears,
}


def main(argv):
    parser = common.parser("kernels", __doc__)
    # tokens a batch (128 pairs x 32), attention lengths, decoding hypotheses (batch 32 x beam 4)
    parser.set_defaults(tokens=4096, vocab=common.DEFAULT_VOCAB, lengths=[32, 128, 256], decode_sentences=128)
    parser.add_argument(
        "--what", nargs="+", choices=WHAT, default=list(WHAT)[:-2], help="default: all but int8, linear"
    )
    args = common.parse(parser, argv, tokens=64, vocab=500, lengths=[8], repeats=1, decode_sentences=4)
    d_model = 32 if args.quick else 512
    jobs = {key: job for what in args.what for key, job in WHAT[what](args, d_model).items()}
    times = common.interleaved_times(jobs, args.repeats, args.warmup)
    ms = {key: 1e3 * statistics.median(seconds) for key, seconds in times.items()}
    slowest = {}
    for key, value in ms.items():
        slowest[key[:4]] = max(slowest.get(key[:4], 0.0), value)
    fields = ("what", "shape", "dtype", "variant", "path")
    rows = [  # each path as a multiple of the slowest in its group
        {**dict(zip(fields, key, strict=True)), "ms": value, "speedup": slowest[key[:4]] / value}
        for key, value in ms.items()
    ]
    columns = [
        *fields,
        ("ms", "ms", ".1f"),
        ("speedup", "x slowest", ".2f"),
    ]
    return common.report(args, f"kernel choices, median of {args.repeats}", rows, columns)
