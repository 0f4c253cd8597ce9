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
tokens): `vaswani` through its own `labels` path, the peers on their logits with `label_smoothed_ce`.

Timing helpers interleave the implementations inside one run and take medians, because the benchmark machines are
shared. Peak memory is measured in a fresh subprocess per configuration (see `peak_rss_during`).
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
from torch import nn

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, shift_tokens_right
from vaswani.kernels import FAST_ATTENTION, use_cpu_kernels
from vaswani.recipe.losses import fused_output_loss, label_smoothed_loss

IMPLEMENTATIONS = ("vaswani", "marian", "torch")
PAD, BOS, EOS = 0, 1, 2
DEFAULT_VOCAB = 37000  # §5.1: the shared EN-DE BPE vocabulary of about 37000 tokens


# --------------------------------------------------------------------------------------------------------------------
# Models at equal sizes
# --------------------------------------------------------------------------------------------------------------------
def decoding_parser(doc: str, implementations: tuple[str, ...], batch_size: int) -> argparse.ArgumentParser:
    """The flags every decoding benchmark of exported engines shares: the model's size, the batch, the repeats."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base", help="VaswaniConfig preset")
    parser.add_argument("--impl", nargs="+", default=list(implementations), choices=implementations)
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4], help="1 is greedy")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--src-len", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=DEFAULT_VOCAB, help="shared vocabulary size")
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="threads of every engine"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per configuration (median reported)"
    )
    parser.add_argument("--warmup", type=int, default=1)
    add_fixed_length_argument(
        parser,
        "; the exported engines hold their end token back with their own minimum length either way",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    return parser


def add_fixed_length_argument(parser: argparse.ArgumentParser, engines_note: str = "") -> None:
    """`--fixed-length`: how a PyTorch `generate()` is held to exactly `--new-tokens` tokens a sentence."""
    parser.add_argument(
        "--fixed-length",
        choices=["min-new-tokens", "no-eos"],
        default="min-new-tokens",
        help="how every sentence is made exactly --new-tokens long: `min-new-tokens` keeps the EOS id and adds "
        "generate()'s MinNewTokensLength processor (a vocabulary-wide mask per step, work of the benchmark, not of "
        "the model); `no-eos` decodes without an EOS id, so there is nothing to suppress" + engines_note,
    )


def vaswani_config(preset: str, vocab_size: int, **overrides) -> VaswaniConfig:
    """The model as a CPU user should run it: attention through `attn_implementation="vaswani_sdpa"`
    (`vaswani.kernels`; the same as "sdpa" on a GPU)."""
    overrides.setdefault("attn_implementation", FAST_ATTENTION)
    return VaswaniConfig.from_preset(preset, vocab_size=vocab_size, **overrides)


def sinusoids(num_positions: int, d_model: int) -> torch.Tensor:
    """The §3.5 table, sines on even and cosines on odd dimensions, (num_positions, d_model)."""
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]


class TorchTransformerLM(nn.Module):
    """`torch.nn.Transformer` with a shared scaled embedding, sinusoidal positions and a tied output projection."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=PAD)
        nn.init.normal_(self.shared.weight, std=config.d_model**-0.5)
        self.embed_scale = math.sqrt(config.d_model)
        self.register_buffer("positions", sinusoids(config.max_position_embeddings, config.d_model), False)
        self.transformer = nn.Transformer(
            d_model=config.d_model,
            nhead=config.encoder_attention_heads,
            num_encoder_layers=config.encoder_layers,
            num_decoder_layers=config.decoder_layers,
            dim_feedforward=config.encoder_ffn_dim,
            dropout=config.dropout,
            activation="relu",
            batch_first=True,
            norm_first=False,
        )
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.shared.weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.shared(ids) * self.embed_scale + self.positions[: ids.shape[1]]

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        padding = None if attention_mask is None else attention_mask == 0
        return self.transformer.encoder(self.embed(input_ids), src_key_padding_mask=padding)

    def decode(
        self, decoder_input_ids: torch.Tensor, memory: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        length = decoder_input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=memory.device)
        padding = None if attention_mask is None else attention_mask == 0
        hidden = self.transformer.decoder(
            self.embed(decoder_input_ids),
            memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=padding,
        )
        return self.lm_head(hidden)

    def forward(self, input_ids, attention_mask, decoder_input_ids) -> torch.Tensor:
        return self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)


def build_model(name: str, config: VaswaniConfig, seed: int = 0) -> nn.Module:
    """One of `IMPLEMENTATIONS` at the sizes of `config`, random weights from `seed`."""
    torch.manual_seed(seed)
    if name == "vaswani":  # the attention is the config's (`vaswani_config`)
        return use_cpu_kernels(VaswaniForConditionalGeneration(config), attention=False)
    if name == "marian":
        from transformers import MarianConfig, MarianMTModel

        marian = MarianConfig(
            vocab_size=config.vocab_size,
            decoder_vocab_size=config.vocab_size,
            d_model=config.d_model,
            encoder_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers,
            encoder_attention_heads=config.encoder_attention_heads,
            decoder_attention_heads=config.decoder_attention_heads,
            encoder_ffn_dim=config.encoder_ffn_dim,
            decoder_ffn_dim=config.decoder_ffn_dim,
            activation_function="relu",
            dropout=config.dropout,
            attention_dropout=0.0,
            activation_dropout=0.0,
            max_position_embeddings=config.max_position_embeddings,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=True,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            forced_eos_token_id=None,
            decoder_start_token_id=BOS,
        )
        return MarianMTModel(marian)
    if name == "torch":
        return TorchTransformerLM(config)
    raise ValueError(f"Unknown implementation {name!r}; choose from {IMPLEMENTATIONS}.")


def num_parameters(model: nn.Module) -> int:
    """Trainable parameters, tied matrices counted once (Marian's frozen sinusoid tables are not counted)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def label_smoothed_ce(logits: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
    """Label-smoothed cross-entropy in float32, token mean, the way the peers' users compute it (the Trainer's
    label smoother does the same)."""
    total = F.cross_entropy(
        logits.flatten(0, 1).float(),
        labels.flatten(),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=eps,
    )
    return total / (labels != -100).sum()


def training_loss(
    name: str, model: nn.Module, batch: dict[str, torch.Tensor], eps: float, fused_output: bool = True
) -> torch.Tensor:
    """Forward pass and loss of one implementation, in the way a user of that implementation trains it. Ours is the
    recipe's loss as `VaswaniTrainer` computes it: under CPU autocast the output projection and the loss in one kernel
    (`losses.fused_output_loss`, unless `fused_output` is False), else the model's logits into
    `losses.label_smoothed_loss`."""
    decoder_input_ids = shift_tokens_right(batch["labels"], PAD, BOS)
    if name == "vaswani":
        inputs = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "decoder_input_ids": decoder_input_ids,
        }
        if fused_output and model.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            return fused_output_loss(model, {**inputs, "labels": batch["labels"]}, eps)
        return label_smoothed_loss(model(**inputs), batch["labels"], epsilon=eps)
    if name == "marian":
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_input_ids,
        ).logits
    else:
        logits = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids)
    return label_smoothed_ce(logits, batch["labels"], eps)


def random_batch(batch_size: int, src_len: int, tgt_len: int, vocab_size: int, seed: int = 0, device="cpu"):
    """Random ids above the special ids, no padding (a length-bucketed batch), labels ending with EOS."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (batch_size, src_len), generator=g)
    labels = torch.randint(3, vocab_size, (batch_size, tgt_len), generator=g)
    labels[:, -1] = EOS
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    return {k: v.to(device) for k, v in batch.items()}


def fixed_length_generation_config(
    beams: int, new_tokens: int, suppress_eos: bool, static_cache: bool = False
):
    """Greedy (`beams` 1) or beam decoding of exactly `new_tokens` tokens with length penalty 1: either with the EOS
    id kept and suppressed by `min_new_tokens` (`suppress_eos`) or with no EOS id at all (see `bench_generate`)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        num_beams=beams,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens if suppress_eos else None,
        do_sample=False,
        length_penalty=1.0,
        use_cache=True,
        bos_token_id=BOS,
        eos_token_id=EOS if suppress_eos else None,
        pad_token_id=PAD,
        decoder_start_token_id=BOS,
        cache_implementation="static" if static_cache else None,
    )


# --------------------------------------------------------------------------------------------------------------------
# Decoding for nn.Transformer (no KV cache: the decoder reruns over the whole prefix at every step)
# --------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def torch_generate(
    model: TorchTransformerLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_beams: int,
    new_tokens: int,
) -> torch.Tensor:
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
def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved_times(
    jobs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, device: str = "cpu"
) -> dict[str, list[float]]:
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


def cuda_memory_rise_mib(work: Callable[[], object]) -> float:
    """How far CUDA memory allocated by torch rises above its level before `work` while `work` runs, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    work()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def median(values: list[float]) -> float:
    return statistics.median(values)


# --------------------------------------------------------------------------------------------------------------------
# Matmul peak
# --------------------------------------------------------------------------------------------------------------------
GPU_PEAK_SIZE = (8192, 8192, 8192)


def matmul_peak(
    size: tuple[int, int, int] | None = None, repeats: int = 10, device: str = "cpu"
) -> dict[str, float]:
    """Measured matmul throughput in GFLOP/s (median of `repeats`), for (M, K) x (K, N).

    `fp32_default`: `F.linear`, torch's default CPU path (MKL sgemm here); `fp32_onednn`: oneDNN's fp32 linear with
    a prepacked weight (`torch.ops.mkldnn._linear_pointwise`); `fp32_numpy`: numpy's BLAS; `bf16`: `F.linear` in
    bfloat16, which torch sends to oneDNN. With `device="cuda"`: fp32 (TF32 off, torch's default) and bf16 through
    cuBLAS. The default size is 4096 x 512 x 2048 on the CPU and `GPU_PEAK_SIZE` on a GPU, where a CPU-sized
    product is too short to keep the device busy.

    On the CPU each path is timed in a block of its own, not interleaved with the others: numpy's BLAS and torch's
    OpenMP keep their threads spinning for a while after a call, and on a 2-core machine the next path's threads
    then share the cores with them (interleaved, bf16 measured about half its rate alone).
    """
    if size is None:
        size = GPU_PEAK_SIZE if device.startswith("cuda") else (4096, 512, 2048)
    m, k, n = size
    flops = 2 * m * k * n
    if device.startswith("cuda"):
        x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        xb, wb = x.bfloat16(), w.bfloat16()
        jobs = {"fp32_default": lambda: F.linear(x, w), "bf16": lambda: F.linear(xb, wb)}
        times = interleaved_times(jobs, repeats, warmup=3, device="cuda")
        return {name: flops / median(t) / 1e9 for name, t in times.items()}

    x, w = torch.randn(m, k), torch.randn(n, k)
    xn, wn = x.numpy(), w.t().contiguous().numpy()
    xb, wb = x.bfloat16(), w.bfloat16()
    jobs = {
        "fp32_default": lambda: F.linear(x, w),
        "fp32_numpy": lambda: xn @ wn,
        "bf16": lambda: F.linear(xb, wb),
    }
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        jobs["fp32_onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    result = {}
    for name, job in jobs.items():
        time.sleep(0.25)  # past the spinning of the previous path's threads
        result[name] = flops / median(interleaved_times({name: job}, repeats, warmup=2)[name]) / 1e9
    return result


# --------------------------------------------------------------------------------------------------------------------
# Peak memory
# --------------------------------------------------------------------------------------------------------------------
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_rss_during(work: Callable[[], object]) -> dict[str, float]:
    """Resident-set high-water mark of this process while `work` runs, in MiB (Linux only).

    Resets the kernel's high-water mark (`/proc/self/clear_refs` <- 5), runs `work`, and reads `VmHWM`. Returns the
    peak and its rise over the resident size before `work` (weights and data already allocated). It counts every
    page the process touches, torch's allocations included (tracemalloc does not see them); glibc returns large
    freed blocks to the system, so the peak follows the largest set of live tensors closely.
    """
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    work()
    peak = _rss_kib("VmHWM")
    return {"peak_rss_mib": peak / 1024, "before_mib": before / 1024, "rise_mib": (peak - before) / 1024}


def run_child(module: str, args: list[str]) -> dict:
    """Run `python -m module args` in a fresh process (for a clean memory high-water mark); return its JSON line."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=root, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------------------------
def machine() -> dict[str, object]:
    """What the numbers were measured on."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(
            ["python -m bench." + os.path.basename(sys.argv[0]).removesuffix(".py"), *sys.argv[1:]]
        ),
    }
    import transformers

    info["transformers"] = transformers.__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Plain-text table: `columns` are (key, header, format spec)."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append(
            [format(row[key], spec) if row.get(key) is not None else "-" for key, _, spec in columns]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json(path: str | None, payload: dict) -> None:
    if path:
        with open(path, "w") as out:
            json.dump(payload, out, indent=2)


def choose_device(args) -> tuple[str, dict | None]:
    """`("cpu", None)`, or for `--gpu` `("cuda", None)` with bf16 and no memory subprocesses; without CUDA, `--gpu`
    prints that it is skipped, writes `{"skipped": ...}` to `--json` and returns that as the second item."""
    if not args.gpu:
        return "cpu", None
    if not torch.cuda.is_available():
        print("GPU mode skipped: no CUDA device on this machine.")
        result = {"machine": machine(), "skipped": "no CUDA device", "results": []}
        write_json(args.json, result)
        return "cpu", result
    args.dtype, args.no_memory = ["bf16"], True
    return "cuda", None
