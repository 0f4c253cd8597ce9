"""Shared pieces of the benchmarks: the three implementations at equal sizes, timing, peak memory, matmul peak.

The three implementations, built from one `VaswaniConfig` preset so that sizes are equal:

- `vaswani`: `VaswaniForConditionalGeneration` (this repository), as configured by the preset, with the CPU kernels
  turned on as the recipe's tools turn them on (`vaswani.kernels.use_cpu_kernels`; on a GPU they step aside).
- `marian`: transformers' `MarianMTModel`, the same architecture family (post-norm, sinusoidal positions, one
  shared embedding matrix scaled by sqrt(d_model) and tied to the output projection, ReLU). Its attention
  projections carry biases and its logits get `final_logits_bias` added (zeros: no effect on values, but the add
  over the vocabulary is part of its work).
- `torch`: `torch.nn.Transformer` (post-norm, batch-first) wrapped with the same shared scaled embedding,
  sinusoidal positions and tied output projection (`TorchTransformerLM`). `nn.Transformer` adds a final
  LayerNorm to the encoder and decoder stacks and biases to its projections; it has no KV cache, so its decoding
  recomputes the target prefix at every step.

Every training step computes the same label-smoothed cross-entropy (eps_ls = 0.1, float32, mean over target
tokens): `vaswani` through its own `labels` path, the peers on their logits (`training_loss`).

Timing helpers interleave the implementations inside one run and take medians, because the benchmark machines are
shared. Peak memory is measured in a fresh subprocess per configuration (see `peak_rss_during`).
"""

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, shift_tokens_right
from vaswani.interop.convert import SAME_FIELDS
from vaswani.kernels import FAST_ATTENTION, use_cpu_kernels
from vaswani.recipe.losses import fused_output_loss, label_smoothed_loss

IMPLEMENTATIONS = ("vaswani", "marian", "torch")
PAD, BOS, EOS = 0, 1, 2
ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"  # the local copy of Multi30k, where there is one
DEFAULT_VOCAB = 37000  # §5.1: the shared EN-DE BPE vocabulary of about 37000 tokens


# --------------------------------------------------------------------------------------------------------------------
# Models at equal sizes
# --------------------------------------------------------------------------------------------------------------------
def vaswani_config(preset, vocab_size, attention=FAST_ATTENTION):
    """The model as a CPU user should run it: attention through `attn_implementation="vaswani_sdpa"`
    (`vaswani.kernels`; the same as "sdpa" on a GPU)."""
    return VaswaniConfig.from_preset(preset, vocab_size=vocab_size, attn_implementation=attention)


def sinusoids(num_positions, d_model):
    """The §3.5 table, sines on even and cosines on odd dimensions, (num_positions, d_model)."""
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]


class TorchTransformerLM(nn.Module):
    """`torch.nn.Transformer` with a shared scaled embedding, sinusoidal positions and a tied output projection."""

    def __init__(self, config):
        super().__init__()
        self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=PAD)
        nn.init.normal_(self.shared.weight, std=config.d_model**-0.5)
        self.embed_scale = math.sqrt(config.d_model)
        self.register_buffer("positions", sinusoids(config.max_position_embeddings, config.d_model), False)
        self.transformer = nn.Transformer(  # post-norm and ReLU: nn.Transformer's defaults
            d_model=config.d_model,
            nhead=config.encoder_attention_heads,
            num_encoder_layers=config.encoder_layers,
            num_decoder_layers=config.decoder_layers,
            dim_feedforward=config.encoder_ffn_dim,
            dropout=config.dropout,
            batch_first=True,
        )
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.shared.weight

    def embed(self, ids):
        return self.shared(ids) * self.embed_scale + self.positions[: ids.shape[1]]

    def encode(self, input_ids, attention_mask):
        return self.transformer.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)

    def decode(self, decoder_input_ids, memory, attention_mask):
        causal = nn.Transformer.generate_square_subsequent_mask(
            decoder_input_ids.shape[1], device=memory.device
        )
        hidden = self.transformer.decoder(
            self.embed(decoder_input_ids),
            memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=attention_mask == 0,
        )
        return self.lm_head(hidden)

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        return self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)


def build_model(name, config):
    """One of `IMPLEMENTATIONS` (the commands' `--impl` choices) at the sizes of `config`, random weights from seed
    0."""
    torch.manual_seed(0)
    if name == "vaswani":  # the attention is the config's (`vaswani_config`)
        return use_cpu_kernels(VaswaniForConditionalGeneration(config), attention=False)
    if name == "marian":
        from transformers import MarianConfig, MarianMTModel

        marian = MarianConfig(
            # the fields MarianConfig shares with VaswaniConfig (Marian keeps its own initialisation scale)
            **{name: getattr(config, name) for name in SAME_FIELDS if name != "init_std"},
            vocab_size=config.vocab_size,
            decoder_vocab_size=config.vocab_size,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=True,
            forced_eos_token_id=None,
        )
        return MarianMTModel(marian)
    return TorchTransformerLM(config)


def num_parameters(model):
    """Trainable parameters, tied matrices counted once (Marian's frozen sinusoid tables are not counted)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def training_loss(name, model, batch, eps):
    """Forward pass and loss of one implementation, in the way a user of that implementation trains it. Ours is the
    recipe's loss as `VaswaniTrainer` computes it: under CPU autocast the output projection and the loss in one kernel
    (`losses.fused_output_loss`), else the model's logits into `losses.label_smoothed_loss`. The peers': their
    logits' label-smoothed cross-entropy in float32, token mean, the way their users compute it (the Trainer's label
    smoother does the same)."""
    inputs = {**batch, "decoder_input_ids": shift_tokens_right(batch["labels"], PAD, BOS)}
    labels = inputs.pop("labels")
    if name == "vaswani":
        if model.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            return fused_output_loss(model, {**inputs, "labels": labels}, eps)
        return label_smoothed_loss(model(**inputs), labels, epsilon=eps)
    logits = model(**inputs).logits if name == "marian" else model(*inputs.values())
    total = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", label_smoothing=eps
    )
    return total / (labels != -100).sum()  # cross_entropy leaves out the labels -100


def random_batch(batch_size, src_len, tgt_len, vocab_size, seed=0, device="cpu"):
    """Random ids above the special ids, no padding (a length-bucketed batch), labels ending with EOS."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (batch_size, src_len), generator=g)
    labels = torch.randint(3, vocab_size, (batch_size, tgt_len), generator=g)
    labels[:, -1] = EOS
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    return {k: v.to(device) for k, v in batch.items()}


# --------------------------------------------------------------------------------------------------------------------
# Decoding for nn.Transformer (no KV cache: the decoder reruns over the whole prefix at every step)
# --------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def torch_generate(
    model,
    input_ids,
    attention_mask,
    num_beams,
    new_tokens,
):
    """Greedy (`num_beams=1`) or beam search for exactly `new_tokens` tokens (EOS suppressed, as `min_new_tokens`).

    Returns the best hypothesis per sentence, (B, 1 + new_tokens) with the start token first."""
    batch_size = input_ids.shape[0]
    memory = model.encode(input_ids, attention_mask)
    if num_beams > 1:
        memory = memory.repeat_interleave(num_beams, dim=0)
        attention_mask = attention_mask.repeat_interleave(num_beams, dim=0)
    tokens = torch.full((batch_size * num_beams, 1), BOS, dtype=torch.long, device=input_ids.device)
    scores = torch.zeros(batch_size, num_beams, device=input_ids.device)
    scores[:, 1:] = -math.inf  # all beams start identical: keep one
    for _ in range(new_tokens):
        log_probs = model.decode(tokens, memory, attention_mask)[:, -1].float().log_softmax(-1)  # (B * k, V)
        log_probs[:, EOS] = -math.inf
        if num_beams == 1:
            tokens = torch.cat([tokens, log_probs.argmax(-1, keepdim=True)], dim=1)
            continue
        vocab = log_probs.shape[-1]
        candidates = (scores[:, :, None] + log_probs.view(batch_size, num_beams, vocab)).view(batch_size, -1)
        scores, index = candidates.topk(num_beams, dim=-1)  # (B, k)
        beam = (index // vocab + torch.arange(batch_size, device=index.device)[:, None] * num_beams).flatten()
        tokens = torch.cat([tokens[beam], (index % vocab).view(-1, 1)], dim=1)
    return tokens.view(batch_size, num_beams, -1)[:, 0]


# --------------------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------------------
def synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved_times(jobs, repeats, warmup=1, device="cpu"):
    """Seconds per call of each job, the jobs interleaved round-robin so that machine load hits them alike."""
    for _ in range(warmup):
        for job in jobs.values():
            job()
            synchronize(device)
    times = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, job in jobs.items():
            synchronize(device)
            start = time.perf_counter()
            job()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


# --------------------------------------------------------------------------------------------------------------------
# Matmul peak
# --------------------------------------------------------------------------------------------------------------------
def matmul_peak(size=None, repeats=10, device="cpu"):
    """Measured `F.linear` throughput in GFLOP/s (median of `repeats`) for (M, K) x (K, N), in fp32 (TF32 off,
    torch's default) and bf16: 4096 x 512 x 2048 on the CPU and 8192 x 8192 x 8192 on a GPU, where a CPU-sized product is
    too short to keep the device busy. Each dtype is timed in a block of its own: torch's OpenMP threads keep
    spinning for a while after a call, and on a 2-core machine the next block's threads would share the cores."""
    m, k, n = size or ((8192, 8192, 8192) if device.startswith("cuda") else (4096, 512, 2048))
    result = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, w = torch.randn(m, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype)
        time.sleep(0.25)
        seconds = interleaved_times({name: lambda x=x, w=w: F.linear(x, w)}, repeats, 2, device)[name]
        result[name] = 2 * m * k * n / statistics.median(seconds) / 1e9
    return result


# --------------------------------------------------------------------------------------------------------------------
# Peak memory
# --------------------------------------------------------------------------------------------------------------------
def rss_mib(field):
    """`field` of /proc/self/status (VmRSS, VmHWM, RssAnon, ...) in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss():
    """Resets the kernel's resident-set high-water mark (`VmHWM`) of this process."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def peak_rss_during(work):
    """Resident-set high-water mark of this process while `work` runs, in MiB (Linux only).

    Resets the kernel's high-water mark (`/proc/self/clear_refs` <- 5), runs `work`, and reads `VmHWM`. Returns the
    peak and its rise over the resident size before `work` (weights and data already allocated). It counts every
    page the process touches, torch's allocations included (tracemalloc does not see them); glibc returns large
    freed blocks to the system, so the peak follows the largest set of live tensors closely.
    """
    before = rss_mib("VmRSS")
    reset_peak_rss()
    work()
    peak = rss_mib("VmHWM")
    return {"peak_rss_mib": peak, "before_mib": before, "rise_mib": peak - before}


def add_ratios(rows, same, peers):
    """`vs_<peer>`: each row's tokens per second over its peer's, among rows alike in the keys `same`; returns the
    table's columns of these ratios."""
    by_key = {(row["impl"], *(row[key] for key in same)): row for row in rows}
    for row in rows:
        for peer in peers:
            other = by_key.get((peer, *(row[key] for key in same)))
            row[f"vs_{peer.replace('-', '_')}"] = (
                row["tokens_per_s"] / other["tokens_per_s"] if other else None
            )
    return [(f"vs_{peer.replace('-', '_')}", f"x {peer}", ".2f") for peer in peers]


def measure_memory(args, row, job, *child):
    """Into `row`: with `--gpu`, how far CUDA memory rises while `job` runs; else, unless `--no-memory`, the peak
    resident memory of the command rerun with the `child` flags in a fresh process, and its rise over the work."""
    if args.gpu:  # the rise of the memory torch allocates over its level before `job`, in MiB
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        job()
        torch.cuda.synchronize()
        row["mem_rise_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    elif not args.no_memory:
        memory = json.loads(run_child(args.bench, [*args.argv, *child]).splitlines()[-1])
        row["peak_rss_mib"], row["mem_rise_mib"] = memory["peak_rss_mib"], memory["rise_mib"]


def run_child(what, argv, processes=1):
    """Run `python -m bench what argv` in a fresh process (for a clean memory high-water mark), or in `processes`
    ranks under torchrun, offline; return what it printed."""
    launcher = [sys.executable, "-m"]
    if processes > 1:
        launcher = [
            Path(sys.executable).parent / "torchrun",
            "--standalone",
            "--nproc_per_node",
            processes,
            "-m",
        ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [*map(str, launcher), "bench", what, *map(str, argv)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return done.stdout


# --------------------------------------------------------------------------------------------------------------------
# The command line and the result every command writes
# --------------------------------------------------------------------------------------------------------------------
HIDDEN = (
    "json",
    "argv",
    "bench",
    "memory",
    "memory_child",
    "engine_child",
    "child",
    "record",
    "launched",
    "rest",
)


def parser(what, doc, repeats=5):
    """The flags every command shares: `--json`, `--quick`, and where it times jobs (`repeats`), `--repeats` and
    `--warmup`."""
    parser = argparse.ArgumentParser(
        f"python -m bench {what}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if repeats:
        parser.add_argument(
            "--repeats", type=int, default=repeats, help="timed runs of each job (median reported)"
        )
        parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each job first")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    return parser


def model_flags(parser, impl, presets):
    """The models compared: `--impl`, `--preset` (several where `presets` is a list), `--vocab`."""
    parser.add_argument("--impl", nargs="+", default=impl, choices=impl)
    nargs = "+" if isinstance(presets, list) else None
    parser.add_argument("--preset", nargs=nargs, default=presets, help="VaswaniConfig preset")
    parser.add_argument("--vocab", type=int, default=DEFAULT_VOCAB, help="shared vocabulary size")


def parse(parser, argv, **quick):
    """The parsed flags, `quick`'s values in place under `--quick`; `argv` kept for the command's children."""
    args = parser.parse_args(argv)
    args.argv, args.bench = list(argv), parser.prog.split()[-1]
    if args.quick:
        vars(args).update(quick)
    return args


def report(args, title, rows, columns, **extra):
    """Print `title` and `rows` as a table of `columns` ((key, header, format spec), or a key
    that is its own header), and return (and write to
    `--json`) the one result every command writes: the machine, the settings, `extra`, the rows as `results`."""
    columns = [(column, column, "") if isinstance(column, str) else column for column in columns]
    cells = [[header for _, header, _ in columns]]
    cells += [
        [format(row[k], spec) if row.get(k) is not None else "-" for k, _, spec in columns] for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in cells]
    print("\n".join([f"\n{title}", lines[0], "  ".join("-" * width for width in widths), *lines[1:]]))
    settings = {key: value for key, value in vars(args).items() if key not in HIDDEN}
    result = {
        "machine": machine(f"python -m bench {args.bench} {' '.join(args.argv)}"),
        "settings": settings,
        **extra,
        "results": rows,
    }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return result


def machine(command):
    """What the numbers were measured on, and the command that measured them."""
    import transformers

    model = platform.processor()
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as cpuinfo:
        model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
    }


def cuda_or_skip(args):
    """None where CUDA is present; else says that the GPU run is skipped and returns (and writes) that result."""
    if not torch.cuda.is_available():
        return report(args, "skipped: no CUDA device on this machine", [], [], skipped="no CUDA device")
