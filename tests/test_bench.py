"""Smoke tests of `python -m bench`: each command runs with `--quick` in a subprocess, prints a table, writes its
JSON result."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT, run_script


def test_bench_kernels(tmp_path):
    stdout, result = run_script("kernels", tmp_path)
    assert "x slowest" in stdout and "----" in stdout
    paths = {(r["what"], r["path"]) for r in result["results"]}
    assert {("attention", "sdpa kernel"), ("attention", "matmuls"), ("dW = dY^T X", "torch mm")} <= paths
    assert {("label-smoothed loss", "F.cross_entropy"), ("label-smoothed loss", "chunked")} <= paths
    assert {("dropout", "F.dropout"), ("dropout", "bit mask")} <= paths
    assert {("short softmax rows", "torch softmax"), ("short softmax rows", "padded to 16")} <= paths
    assert all(r["ms"] > 0 and r["speedup"] >= 1.0 for r in result["results"])


@pytest.mark.parametrize(
    "what, available, paths",
    [
        ("int8", "_ONEDNN_INT8_AVAILABLE", {"torch._int_mm", "oneDNN packed"}),
        ("linear", "_ONEDNN_AVAILABLE", {"F.linear (MKL)", "oneDNN"}),
    ],
)
def test_bench_kernels_times_both_paths_of_a_choice(tmp_path, what, available, paths):
    from vaswani.kernels import int8

    if not getattr(int8, available):
        pytest.skip(f"torch was built without the oneDNN operator of --what {what}")
    stdout, result = run_script("kernels", tmp_path, "--what", what)
    assert {r["path"] for r in result["results"]} == paths and len(
        {r["what"] for r in result["results"]}
    ) == 1
    if what == "linear":  # decoding rows against every weight shape, the output projection included
        assert {r["shape"] for r in result["results"]} >= {"2x32 @ 32x32", "2x32 @ 500x32"}


def test_profile_train_shares_the_step_among_its_parts(tmp_path):
    """The profile of the recipe's training steps, on a tiny corpus and model: every part of the table, shares that
    add up to the step."""
    from bench import profile_train

    folder = tmp_path / "corpus"
    folder.mkdir()
    words = "ein mann eine frau ein hund läuft spielt im park".split()
    (folder / "train.en").write_text("\n".join(" ".join(words[i % 7 : i % 7 + 3]) for i in range(60)) + "\n")
    (folder / "train.de").write_text("\n".join(" ".join(words[i % 5 : i % 5 + 4]) for i in range(60)) + "\n")
    result = profile_train.main(
        ["--data", str(folder), "--warmup", "1", "--repeats", "2", "--max-tokens", "64", "--json", str(tmp_path / "p.json"),
         "--", "--vocab_size", "300", "--d_model", "16", "--encoder_ffn_dim", "24", "--decoder_ffn_dim", "24",
         "--encoder_layers", "1", "--decoder_layers", "1"]
    )  # fmt: skip
    parts = {row["part"]: row for row in result["results"]}
    assert list(parts) == list(profile_train.PARTS)
    assert sum(row["share"] for row in parts.values()) == pytest.approx(1.0, abs=0.02)
    assert parts["attention"]["ms_per_step"] > 0 and parts["optimizer"]["ms_per_step"] > 0
    assert parts["output projection and loss"]["ms_per_step"] > 0 and parts["data"]["ms_per_step"] > 0
    products = result["matrix_products"]
    assert products["gflop_per_step"] > 0 and 0 < products["share"] < 1
    assert products["floor_s_at_machine_rate"] == pytest.approx(
        products["gflop_per_step"] / products["machine_bf16_gemm_gflops"]
    )


@pytest.mark.parametrize("memory", [False, True], ids=["timing", "memory"])
def test_bench_train(tmp_path, memory):
    extra = ("--impl", "vaswani", "--dtype", "fp32") if memory else ("--no-memory",)
    stdout, result = run_script("train", tmp_path, *extra)
    assert "tgt tok/s" in stdout and "----" in stdout
    assert {"machine", "settings", "matmul_peak_gflops", "results"} <= set(result)
    row = result["results"][0]
    assert {"preset", "impl", "dtype", "tokens_per_s", "mfu", "vs_marian"} <= set(row) and row["mfu"] > 0
    assert ("mem_rise_mib" in row) == memory
    if not memory:
        assert {(r["impl"], r["dtype"]) for r in result["results"]} == {
            (i, d) for i in ("vaswani", "marian", "torch") for d in ("fp32", "bf16")
        }
        assert all(r["vs_marian"] == 1.0 for r in result["results"] if r["impl"] == "marian")


@pytest.mark.parametrize("fixed_length", ["min-new-tokens", "no-eos"])
def test_bench_generate(tmp_path, fixed_length):
    stdout, result = run_script("generate", tmp_path, "--no-memory", "--fixed-length", fixed_length)
    assert result["settings"]["fixed_length"] == fixed_length and fixed_length in stdout
    assert "tok/s" in stdout and "----" in stdout
    rows = result["results"]
    assert {(r["impl"], r["decoding"]) for r in rows} == {
        (i, d) for i in ("vaswani", "marian", "torch") for d in ("greedy", "beam-4")
    }
    assert all(r["tokens_per_s"] > 0 and r["latency_s"] > 0 for r in rows)


@pytest.mark.parametrize("what", ["train", "generate"])
def test_gpu_mode_skips_without_cuda(tmp_path, what):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: GPU mode runs instead of skipping")
    stdout, result = run_script(what, tmp_path, "--gpu")
    assert "skipped" in stdout and result["skipped"]


def test_gpu_wmt_runs_on_the_cpu_with_a_tiny_config(tmp_path):
    """The GPU command of the paper-scale step, checked here on the CPU: it times both implementations, reports
    tokens per second, MFU and the paper schedule's GPU-hours per preset (none for a preset not in the paper)."""
    from bench import gpu_wmt

    _, result = run_script("gpu-wmt", tmp_path, "--compile", "eager")
    assert result["settings"]["device"] == "cpu" and result["settings"]["batch_tokens"] == 200
    rows = {row["impl"]: row for row in result["results"]}
    assert set(rows) == {"vaswani", "marian"}
    assert all(row["tokens_per_s"] > 0 and row["tokens_per_update"] == 200 for row in rows.values())
    assert rows["marian"]["vs_marian"] == 1.0 and rows["vaswani"]["vs_marian"] > 0
    assert "paper_gpu_hours" not in rows["vaswani"]  # tiny is not a preset of the paper
    assert all(row["mfu"] > 0 for row in rows.values())
    skipped = gpu_wmt.main(["--device", "cuda"]) if not __import__("torch").cuda.is_available() else None
    assert skipped is None or skipped["skipped"] == "no CUDA device"


def test_bench_data_scale(tmp_path, capsys):
    """Every stage from raw text to the first step, timed with its peak memory in fresh processes: the first run and
    the rerun from the cache, which tokenizes nothing."""
    from bench import data_scale

    result = data_scale.main(["--quick", "--work-dir", str(tmp_path), "--json", str(tmp_path / "out.json")])
    stdout = capsys.readouterr().out
    assert "to first step" in stdout and "from the cache" in stdout and "----" in stdout
    assert json.loads((tmp_path / "out.json").read_text())["results"] == result["results"]
    rows = {(row["run"], row["stage"]): row for row in result["results"]}
    assert {row["rank"] for row in result["results"]} == {0}
    stages = ("text -> Arrow", "BPE", "tokenize", "sampler", "first step", "to first step")
    for run in ("first", "from the cache"):
        for stage in stages:
            row = rows[run, stage]
            assert row["seconds"] >= 0 and row["peak_rss_mib"] > 100, (run, stage)
            assert 0 < row["peak_anon_mib"] <= row["peak_rss_mib"], (run, stage)
    first, cached = result["records"]["first"][0], result["records"]["cached"][0]
    assert first["tokenized_batches"] > 0 and cached["tokenized_batches"] == 0  # the rerun maps the cache
    assert first["train_pairs"] == 2000 and rows["first", "BPE"]["pairs"] == 2000


def test_bench_data_scale_bpe_on_every_pair(tmp_path):
    """The BPE on every pair (`vaswani-train-tokenizer`'s child, here in this process): its stages timed."""
    from bench import data_scale
    from bench.synthetic_corpus import write_corpus

    data = write_corpus(tmp_path / "data", 300, validation=10, test=10)
    flags = ["--dataset_name", str(data), "--source_lang", "en", "--target_lang", "de", "--vocab_size", "300"]
    flags += ["--output_dir", str(tmp_path / "tok"), "--cache_dir", str(tmp_path / "cache")]
    data_scale.main(["--child", "bpe", "--record", str(tmp_path), "--", *flags])
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert set(record["stages"]) == {"text -> Arrow", "BPE"} and record["stages"]["BPE"]["seconds"] > 0
    assert (
        record["peak_rss_mib"] >= record["stages"]["BPE"]["peak_rss_mib"] > 0 and record["peak_anon_mib"] > 0
    )
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def test_bench_data_scale_sampler_alone(tmp_path):
    """The sampler alone (`--sampler-only`'s child, here in this process): build, one epoch's arrays, the epoch."""
    from bench import data_scale

    data_scale.main(["--child", "sampler", "--record", str(tmp_path), "--pairs", "50000"])
    row = json.loads((tmp_path / "rank0.json").read_text())
    assert row["pairs"] == 50000 and row["batches"] > 0 and row["epoch_arrays_s"] > 0
    assert 0 <= row["rise_mib"] < 100 and row["peak_rss_mib"] > 0


def test_corpus_writes_the_three_splits_and_an_unknown_command_is_refused(tmp_path):
    run = [sys.executable, "-m", "bench", "corpus", "--pairs", "20", "--validation", "2", "--test", "3"]
    done = subprocess.run(
        [*run, "--output-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for split, pairs in (("train", 20), ("val", 2), ("test", 3)):
        for lang in ("en", "de"):
            assert len((tmp_path / f"{split}.{lang}").read_text().splitlines()) == pairs
    done = subprocess.run(
        [sys.executable, "-m", "bench", "bench_train"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode != 0 and "unknown command 'bench_train'" in done.stderr
