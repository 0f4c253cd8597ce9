"""Smoke tests of the export benchmarks: `python -m bench engines` (speed and memory) and `python -m bench int8`
(int8 in PyTorch against CTranslate2)."""

from helpers import run_script


def test_bench_engines_times_every_engine_against_its_peer(tmp_path):
    stdout, result = run_script("engines", tmp_path, "--no-memory")
    assert "x marian-ct2-int8" in stdout and "----" in stdout
    rows = {(row["impl"], row["decoding"]): row for row in result["results"]}
    implementations = ["vaswani", "marian", "vaswani-onnx"]
    implementations += [f"{model}-ct2-{q}" for model in ("vaswani", "marian") for q in ("float32", "int8")]
    assert set(rows) == {(impl, decoding) for impl in implementations for decoding in ("greedy", "beam-4")}
    assert all(row["tokens_per_s"] > 0 for row in rows.values())
    # Each export against its peer: ONNX against our PyTorch path, our CTranslate2 export against CTranslate2's Marian.
    assert rows["vaswani-onnx", "greedy"]["vs_vaswani"] > 0 and rows["vaswani", "greedy"]["vs_vaswani"] == 1.0
    assert rows["marian-ct2-int8", "beam-4"]["vs_marian_ct2_int8"] == 1.0
    assert rows["vaswani-ct2-float32", "greedy"]["vs_marian_ct2_float32"] > 0
    assert result["versions"]["ctranslate2"] and result["versions"]["onnxruntime"]


def test_bench_engines_measures_the_memory_of_each(tmp_path):
    _, result = run_script("engines", tmp_path, "--impl", "vaswani", "vaswani-ct2-int8", "--beams", "1")
    assert [row["impl"] for row in result["results"]] == ["vaswani", "vaswani-ct2-int8"]
    assert all(row["peak_rss_mib"] > row["mem_rise_mib"] >= 0 for row in result["results"])


def test_bench_int8_times_torchao_int8_against_float32_and_ctranslate2(tmp_path):
    stdout, result = run_script(
        "int8",
        tmp_path,
        *("--impl", "fp32", "int8-kernels", "ct2-int8", "--beams", "1", "--fixed-length", "no-eos"),
    )
    assert "x ct2-int8" in stdout and result["settings"]["fixed_length"] == "no-eos"
    rows = {row["impl"]: row for row in result["results"]}
    assert set(rows) == {"fp32", "int8-kernels", "ct2-int8"} and rows["fp32"]["vs_fp32"] == 1.0
    assert rows["int8-kernels"]["vs_ct2_int8"] > 0 and 0 <= rows["ct2-int8"]["same_sentences_as_fp32"] <= 1
    assert result["versions"]["torchao"]
