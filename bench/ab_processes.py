"""One training process using every core against several processes of one thread each, on the CPU: the en->de
recipe's update, the same tokens per update, through `vaswani-train` itself.

- one process: `vaswani-train ... --max_tokens T`, torch's intra-op threads = the machine's cores;
- P processes: `torchrun --nproc_per_node P -m vaswani.commands.train ... --max_tokens T/P`, one thread each
  (OMP_NUM_THREADS=1), gradients all-reduced over gloo (DistributedDataParallel through Accelerate), as fairseq's
  anchor run trained on 2 GPUs at `--max-tokens 4096` each.

The question: the small matrices of the `tiny` preset keep two threads of one process from doubling its speed;
would two processes, each multiplying its own half of the batch on one core, be faster? Each job trains `--steps` updates of the recipe (the `tiny`
preset, vocabulary 8000, warm-up 2000, bf16 autocast where the CPU computes in bf16) from the same tokenizer, jobs
alternating for `--repeats` rounds. The seconds per update are the trainer's own `seconds_per_step` log records
(wall time per update between records, `trainer_state.json`), the first record (the first step's set-up) left out.

    python -m bench.ab_processes --steps 80 --log_every 20 --repeats 2 --json bench/results/processes_tiny_cpu.json
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import common

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def computes_in_bf16() -> bool:
    """Whether the CPU has bf16 matrix instructions (AVX512-BF16 or AMX): the `Makefile`'s test for `--bf16`."""
    try:
        return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", Path("/proc/cpuinfo").read_text()))
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def recipe_args(args, data: Path, max_tokens: int, output_dir: Path, tokenizer: Path | None) -> list[str]:
    flags = [
        "--dataset_name", str(data), "--validation_split", "val", "--source_lang", args.src,
        "--target_lang", args.tgt, "--preset", "tiny", "--vocab_size", str(args.vocab),
        "--max_tokens", str(max_tokens), "--warmup_steps", "2000", "--learning_rate_constant", "2.53",
        "--max_steps", str(args.steps), "--logging_steps", str(args.log_every), "--save_steps", str(args.steps),
        "--save_total_limit", "1", "--eval_strategy", "no", "--do_eval", "false", "--average_last", "0",
        "--seed", "1", "--output_dir", str(output_dir), "--overwrite_output_dir", "--disable_tqdm", "true",
    ]  # fmt: skip
    if computes_in_bf16():
        flags += ["--bf16", "--use_cpu"]
    if tokenizer is not None:
        flags += ["--tokenizer_name", str(tokenizer)]
    return flags


def run_job(args, processes: int, data: Path, work: Path, tokenizer: Path | None) -> dict:
    """Train `--steps` updates with `processes` processes; return the seconds per update and the last loss."""
    max_tokens = args.max_tokens // processes
    output_dir = work / f"p{processes}"
    flags = recipe_args(args, data, max_tokens, output_dir, tokenizer)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if processes == 1:
        env["OMP_NUM_THREADS"] = str(os.cpu_count())
        command = [sys.executable, "-m", "vaswani.commands.train", *flags]
    else:
        env["OMP_NUM_THREADS"] = "1"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--master_port", str(free_port()), "-m", "vaswani.commands.train", *flags,
        ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    state = json.loads((output_dir / f"checkpoint-{args.steps}" / "trainer_state.json").read_text())
    records = [r for r in state["log_history"] if "seconds_per_step" in r]
    if len(records) < 2:
        raise RuntimeError(
            f"--steps {args.steps} / --log_every {args.log_every} leaves fewer than 2 log records"
        )
    return {
        "processes": processes,
        "threads_each": 1 if processes > 1 else os.cpu_count(),
        "max_tokens_each": max_tokens,
        "seconds_per_step": statistics.fmean(float(r["seconds_per_step"]) for r in records[1:]),
        "last_loss": float(records[-1]["loss"]),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=MULTI30K, help="a folder of train/val files (Multi30k)")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument(
        "--max_tokens", type=int, default=8192, help="tokens per update, all processes together"
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count(), help="processes of the second job")
    parser.add_argument("--steps", type=int, default=120, help="updates per job")
    parser.add_argument("--log_every", type=int, default=20, help="updates between step-time records")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the two jobs (median reported)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--quick", action="store_true", help="a small synthetic corpus, a few steps: a smoke test"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.max_tokens, args.steps, args.log_every, args.repeats = 300, 512, 4, 2, 1
    if args.processes < 2:
        raise SystemExit(
            f"--processes must be at least 2 (the job set against one process), got {args.processes}"
        )
    if args.max_tokens % args.processes:
        raise SystemExit(
            f"--max_tokens {args.max_tokens} does not split evenly over {args.processes} processes: the two jobs "
            "would train on different tokens per update"
        )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = args.data
        if args.quick:
            from bench.synthetic_corpus import write_corpus

            data = write_corpus(work / "corpus", pairs=400, validation=20, test=20, vocab=300)
        tokenizer, runs = None, {1: [], args.processes: []}
        for _ in range(args.repeats):
            for processes in runs:
                result = run_job(args, processes, data, work, tokenizer)
                # The first job's tokenizer, kept apart: a job's --overwrite_output_dir removes its own.
                if tokenizer is None:
                    tokenizer = shutil.copytree(work / f"p{processes}" / "tokenizer", work / "tokenizer")
                runs[processes].append(result)
                print(f"{processes} process(es): {result['seconds_per_step']:.3f} s a step", file=sys.stderr)
    rows = [
        {**results[0], "seconds_per_step": common.median([r["seconds_per_step"] for r in results])}
        for results in runs.values()
    ]
    for row in rows:
        row["speedup"] = rows[0]["seconds_per_step"] / row["seconds_per_step"]
    print(
        common.table(
            rows,
            [
                ("processes", "processes", "d"),
                ("threads_each", "threads each", "d"),
                ("max_tokens_each", "max_tokens each", "d"),
                ("seconds_per_step", "s / update", ".3f"),
                ("speedup", "x one process", ".2f"),
                ("last_loss", "last loss", ".3f"),
            ],
        )
    )
    result = {"machine": common.machine(), "args": {**vars(args), "data": str(args.data)}, "results": rows}
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
