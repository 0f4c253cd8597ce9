"""int8 on the CPU through transformers' own door: `from_pretrained(folder, quantization_config=TorchAoConfig(...))`
loads, generates, saves and reloads the model, and `vaswani.use_cpu_kernels` runs its torchao int8 layers through
`vaswani.kernels.int8_linear` (torch's int8 GEMM) with the same arithmetic as torchao's own."""

import pytest
import torch
from helpers import batch, tiny_model
from torch import nn
from transformers import AutoModelForSeq2SeqLM, TorchAoConfig

from vaswani import kernels, use_cpu_kernels
from vaswani.kernels import Int8Linear, int8_linear, use_plain_modules

torchao_quantization = pytest.importorskip("torchao.quantization")
Int8DynamicActivationInt8WeightConfig = torchao_quantization.Int8DynamicActivationInt8WeightConfig
Int8WeightOnlyConfig = torchao_quantization.Int8WeightOnlyConfig


def load_int8(folder, config=None) -> nn.Module:
    quantization = TorchAoConfig(config or Int8DynamicActivationInt8WeightConfig())
    return AutoModelForSeq2SeqLM.from_pretrained(
        folder, quantization_config=quantization, device_map="cpu"
    ).eval()


def greedy(model, num_beams=1, **kwargs):
    input_ids, attention_mask, _ = batch()
    return model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=num_beams, **kwargs
    )


def int8_output_class() -> type:
    """The class `use_cpu_kernels` gives the float32 output projection of an int8 model: int8 where the int8 GEMM is
    exact, else float32 as transformers leaves it."""
    return kernels.Int8OutputLinear if kernels.exact_int8_products() else kernels.Linear


@pytest.fixture
def folder(tmp_path):
    tiny_model().save_pretrained(tmp_path / "fp32")
    return tmp_path / "fp32"


def test_int8_linear_is_torchaos_linear_to_the_bit():
    """`int8_linear` against torchao's `F.linear` on its `Int8Tensor`: the same activation quantization and scales,
    and an exact int32 product, give the same floats, for 2-D and 3-D inputs, with and without a bias."""
    torch.manual_seed(0)
    for bias, shape in ((True, (4, 9, 37)), (False, (5, 37)), (True, (1, 1, 37))):
        layer = nn.Sequential(nn.Linear(37, 23, bias=bias))
        torchao_quantization.quantize_(layer, Int8DynamicActivationInt8WeightConfig())
        weight = layer[0].weight
        assert kernels.torchao_int8_dynamic(weight)
        x = torch.randn(shape) * 3
        x[0, ..., 0] = 0.0  # a zero and a large value in the rows
        x.view(-1, 37)[-1, 5] = 40.0
        assert torch.equal(int8_linear(x, weight, layer[0].bias), layer(x))
        if kernels.int8._exact(True):  # oneDNN's int8 linear on the packed weight, where exact: the same floats
            packed = torch.ops.onednn.qlinear_prepack(weight.qdata, None)
            assert torch.equal(int8_linear(x, weight, layer[0].bias, packed), layer(x))


@pytest.mark.parametrize("signed_rows", [True, False])
def test_int8_products_are_exact_wherever_the_kernels_take_them(monkeypatch, signed_rows):
    """oneDNN's int8 linear takes the rows as they are with AMX, and elsewhere as unsigned bytes with zero point 128
    (its VNNI kernels multiply unsigned by signed bytes): with VNNI both give the int32 product exactly, the extremes
    -128 and 127 included, and so does `torch._int_mm`. Without VNNI (AVX2, AVX-512 without VNNI) oneDNN adds byte
    products in saturating 16-bit pairs: the kernels then take neither product (`exact_int8_products`)."""
    if not kernels.int8._ONEDNN_INT8_AVAILABLE:
        pytest.skip("this torch has no oneDNN int8 linear")
    vnni = "vnni" in kernels.onednn_features()
    assert kernels.exact_int8_products() == vnni and kernels.int8._exact(True) == vnni
    if not vnni:
        return
    monkeypatch.setattr(kernels.int8, "_signed_rows_native", lambda: signed_rows)
    torch.manual_seed(0)
    rows = torch.randint(-128, 128, (5, 64), dtype=torch.int8)
    rows[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    weight = torch.randint(-127, 128, (48, 64), dtype=torch.int8)
    exact = (rows.long() @ weight.long().t()).float()
    packed = torch.ops.onednn.qlinear_prepack(weight, None)
    before = rows.clone()
    assert torch.equal(kernels.int8._int8_product(rows, weight, packed), exact)
    assert torch.equal(rows, before)  # the unsigned view does not change the rows in place
    assert torch.equal(kernels.int8._int8_product(rows, weight, None), exact)


def test_a_model_quantized_on_loading_generates_saves_and_reloads(folder, tmp_path):
    """`TorchAoConfig` through `from_pretrained`: the linear layers hold torchao's int8 weights (transformers keeps the
    tied output projection in float32); the model generates, saves to safetensors with torchao's metadata and loads
    back quantized without a `quantization_config`, decoding the same tokens."""
    model = load_int8(folder)
    fc1 = model.model.encoder.layers[0].fc1
    assert kernels.torchao_int8_dynamic(fc1.weight)
    assert type(model.lm_head.weight) is nn.Parameter and model.lm_head.weight is model.model.shared.weight
    tokens = greedy(model)
    model.save_pretrained(tmp_path / "int8")
    assert (tmp_path / "int8" / "model.safetensors").is_file()
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "int8", device_map="cpu").eval()
    assert kernels.torchao_int8_dynamic(reloaded.model.encoder.layers[0].fc1.weight)
    assert torch.equal(reloaded.model.encoder.layers[0].fc1.weight.qdata, fc1.weight.qdata)
    assert torch.equal(greedy(reloaded), tokens)


def float32_head_as_the_kernels_compute_it(model: nn.Module) -> nn.Module:
    """torchao's model with its float32 output projection computed as `use_cpu_kernels(..., int8_output=False)`
    computes it (`kernels.Linear`: oneDNN's GEMM or MKL's by the rows): the reference whose every product is the fast
    model's, so that decoded tokens and scores compare to the bit on every CPU, near ties included."""
    model.lm_head.__class__ = kernels.Linear
    return model


def test_use_cpu_kernels_runs_the_int8_layers_through_the_int8_gemm(folder, tmp_path):
    """`use_cpu_kernels(model, int8_output=False)` on a model loaded with `TorchAoConfig(
    Int8DynamicActivationInt8WeightConfig())` makes its int8 layers `Int8Linear` and decodes what torchao's layers
    decode, to the bit, in greedy and beam search, with the attention left as it is and with the model's attention
    kernel: the int8 layers compute the same floats (or, on a CPU whose int8 GEMM is not exact, are torchao's own)."""
    reference_model = float32_head_as_the_kernels_compute_it(load_int8(folder))
    reference = greedy(reference_model, output_scores=True, return_dict_in_generate=True)
    fast = use_cpu_kernels(load_int8(folder), attention=False, int8_output=False)
    assert {type(m) for m in fast.modules() if isinstance(m, nn.Linear)} == {Int8Linear, kernels.Linear}
    assert type(fast.lm_head) is kernels.Linear
    out = greedy(fast, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference.sequences)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(out.scores, reference.scores, strict=True))
    use_cpu_kernels(fast, int8_output=False)  # and with the model's attention kernel too, on both
    reference_model.set_attn_implementation(kernels.FAST_ATTENTION)
    assert fast.config._attn_implementation == kernels.FAST_ATTENTION
    for beams in (1, 3):
        ours = greedy(fast, num_beams=beams, output_scores=True, return_dict_in_generate=True)
        theirs = greedy(reference_model, num_beams=beams, output_scores=True, return_dict_in_generate=True)
        assert torch.equal(ours.sequences, theirs.sequences)
        assert all(torch.equal(a, b) for a, b in zip(ours.scores, theirs.scores, strict=True))
    use_plain_modules(fast)
    assert {type(m) for m in fast.modules() if isinstance(m, nn.Linear)} == {nn.Linear}


def test_use_cpu_kernels_quantizes_the_tied_output_projection_as_torchao_would(folder, tmp_path):
    """By default `use_cpu_kernels` also computes the float32 output projection (tied to the embeddings, so
    transformers leaves it unquantized) in int8, quantized as torchao quantizes the other layers: the same logits, to
    float32 rounding, as the quantized model whose projection torchao's `quantize_` turned int8 itself. The float32
    weight stays tied and what `save_pretrained` writes is the quantized model's own."""
    reference_model = load_int8(folder)
    reference_model.lm_head.weight = nn.Parameter(reference_model.lm_head.weight.detach().clone())  # untied
    torchao_quantization.quantize_(reference_model.lm_head, Int8DynamicActivationInt8WeightConfig())
    assert kernels.torchao_int8_dynamic(reference_model.lm_head.weight)
    reference = greedy(reference_model, output_scores=True, return_dict_in_generate=True)
    fast = use_cpu_kernels(load_int8(folder), attention=False)
    if not kernels.exact_int8_products():  # the int8 GEMM steps aside: the projection stays float32
        assert type(fast.lm_head) is kernels.Linear
        return
    assert type(fast.lm_head) is kernels.Int8OutputLinear
    assert fast.lm_head.weight is fast.model.shared.weight and type(fast.lm_head.weight) is nn.Parameter
    out = greedy(fast, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference.sequences)
    for ours, theirs in zip(out.scores, reference.scores, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    fast.save_pretrained(tmp_path / "int8")  # the swapped classes save as the model's own
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "int8", device_map="cpu").eval()
    assert type(reloaded.lm_head) is nn.Linear and reloaded.lm_head.weight is reloaded.model.shared.weight
    assert torch.equal(greedy(use_cpu_kernels(reloaded)), out.sequences)
    use_cpu_kernels(fast, int8_output=False)  # declined on a second call: the float32 projection again
    assert type(fast.lm_head) is kernels.Linear and "_vaswani_int8_weight" not in fast.lm_head.__dict__
    use_cpu_kernels(fast)
    assert type(fast.lm_head) is kernels.Int8OutputLinear
    use_plain_modules(fast)
    assert type(fast.lm_head) is nn.Linear and "_vaswani_int8_weight" not in fast.lm_head.__dict__


def test_packed_int8_weights_decode_the_same_tokens_in_inference_mode(folder, monkeypatch):
    """The large layers' path (oneDNN's int8 linear on weights packed once), taken here by every layer, under
    `torch.inference_mode` as in serving: the same tokens and logits as torchao's layers."""
    if not kernels.int8._ONEDNN_INT8_AVAILABLE:
        pytest.skip("torch was built without oneDNN's int8 linear")
    monkeypatch.setattr(kernels.int8, "PACKED_INT8_MIN_WEIGHTS", 0)
    with torch.inference_mode():
        quantized = float32_head_as_the_kernels_compute_it(load_int8(folder))
        reference = greedy(quantized, output_scores=True, return_dict_in_generate=True)
        fast = use_cpu_kernels(load_int8(folder), attention=False, int8_output=False)
        out = greedy(fast, output_scores=True, return_dict_in_generate=True)
        packed = "_vaswani_packed_int8" in fast.model.encoder.layers[0].fc1.__dict__
        assert packed == kernels.int8._exact(True)  # where the packed product is not exact, it is not used
        assert torch.equal(out.sequences, reference.sequences)
        assert all(torch.equal(a, b) for a, b in zip(out.scores, reference.scores, strict=True))
        use_cpu_kernels(fast)  # the output projection's int8 copy, made and packed in inference mode
        assert greedy(fast).shape == reference.sequences.shape


def test_self_attention_projections_share_one_int8_product_and_give_the_same_bits(folder, monkeypatch):
    """`use_cpu_kernels` groups each self-attention's int8 Q, K and V projections (`SharedInputProjections`): one
    product per self-attention call instead of three, and the same scores to the bit as each layer alone, in greedy
    and beam search, with and without `torch.inference_mode`. `use_plain_modules` ungroups them."""
    grouped = use_cpu_kernels(load_int8(folder))
    alone = use_cpu_kernels(load_int8(folder))
    for module in alone.modules():
        module.__dict__.pop("_vaswani_shared_input", None)
    self_attentions = [
        m for m in grouped.modules() if type(m).__name__ == "VaswaniAttention" and not m.is_cross_attention
    ]
    assert self_attentions and all(
        m.k_proj.__dict__["_vaswani_shared_input"] is m.q_proj.__dict__["_vaswani_shared_input"]
        for m in self_attentions
    )
    assert not any(
        "_vaswani_shared_input" in m.__dict__ for m in grouped.model.decoder.layers[0].encoder_attn.modules()
    )
    calls = []
    product = kernels.int8._int8_linear
    monkeypatch.setattr(
        kernels.int8,
        "_int8_linear",
        lambda x, qdata, *a: calls.append(qdata.shape[0]) or product(x, qdata, *a),
    )
    for mode in (torch.no_grad, torch.inference_mode):
        for beams in (1, 3):
            with mode():
                calls.clear()
                ours = greedy(grouped, num_beams=beams, output_scores=True, return_dict_in_generate=True)
                grouped_calls = list(calls)
                calls.clear()
                theirs = greedy(alone, num_beams=beams, output_scores=True, return_dict_in_generate=True)
            assert torch.equal(ours.sequences, theirs.sequences)
            assert all(torch.equal(a, b) for a, b in zip(ours.scores, theirs.scores, strict=True))
            d_model = grouped.config.d_model
            stacked = grouped_calls.count(3 * d_model)  # one product per self-attention call
            if not kernels.exact_int8_products():  # torchao's own layers: no int8 product of the kernels
                assert not grouped_calls and not calls
                continue
            assert stacked > 0 and len(calls) - len(grouped_calls) == 2 * stacked
    use_plain_modules(grouped)
    assert not any("_vaswani_shared_input" in m.__dict__ for m in grouped.modules())


def test_shared_projections_compute_alone_for_another_input_or_a_changed_one(folder):
    """The key's and value's results come from the shared product only for the query's own input, unchanged: another
    input, or the same one changed in place since (its version counter), is computed by the layer alone."""
    model = use_cpu_kernels(load_int8(folder))
    attention = model.model.encoder.layers[0].self_attn
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    x = torch.randn(2, 5, model.config.d_model)
    with torch.no_grad():
        q(x)
        assert torch.equal(k(x), int8_linear(x, k.weight, k.bias))  # served from the shared product
        other = x + 1
        assert torch.equal(v(other), int8_linear(other, v.weight, v.bias))
        q(x)
        x.mul_(2)
        assert torch.equal(k(x), int8_linear(x, k.weight, k.bias))
        assert torch.equal(v(x), int8_linear(x, v.weight, v.bias))


def test_use_cpu_kernels_leaves_other_quantized_weights_to_their_own_linear(folder):
    """Weights quantized otherwise (torchao's weight-only int8, whose activations stay float32) keep torchao's own
    `F.linear`: the kernels neither take them for float32 matrices nor for `Int8Linear`'s layout."""
    quantized = load_int8(folder, Int8WeightOnlyConfig())
    weight = quantized.model.encoder.layers[0].fc1.weight
    assert type(weight).__name__ == "Int8Tensor" and not kernels.torchao_int8_dynamic(weight)
    tokens = greedy(quantized)
    use_cpu_kernels(quantized)
    assert type(quantized.model.encoder.layers[0].fc1) is nn.Linear
    assert not kernels.onednn_linear_applies(torch.randn(2, 15), weight)
    assert torch.equal(greedy(quantized), tokens)


def test_readme_int8_example_runs(folder):
    """The README's int8 example, as written, on a saved folder: the model it leaves decodes."""
    import re
    from pathlib import Path

    import vaswani

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "TorchAoConfig" in b]
    namespace = {"folder": folder, "vaswani": vaswani, "AutoModelForSeq2SeqLM": AutoModelForSeq2SeqLM}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    model = namespace["model"]
    assert type(model.lm_head) is int8_output_class() and greedy(model.eval()).shape[1] == 7


def test_vaswani_translate_runs_a_folder_saved_in_int8(tmp_path):
    """`vaswani-translate` on a folder saved after loading with `TorchAoConfig` (its config records the
    quantization): the command turns the CPU kernels on, as for any folder, and translates with the int8 layers
    (`use_cpu_kernels` keeps torchao's int8 layers: oneDNN float32 layers could not hold their weights)."""
    from helpers import SENTENCES, tiny_tokenizer, translation_model

    from vaswani.commands.translate import main as translate_main
    from vaswani.recipe.tokenization import save_tokenizers

    tokenizer = tiny_tokenizer()
    translation_model(len(tokenizer)).save_pretrained(tmp_path / "fp32")
    load_int8(tmp_path / "fp32").save_pretrained(tmp_path / "int8")
    save_tokenizers(tokenizer, tokenizer, tmp_path / "int8")
    (tmp_path / "src.txt").write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(tmp_path / "int8"), "--input", str(tmp_path / "src.txt")]
    out = translate_main([*argv, "--output", str(tmp_path / "hyp.txt"), "--num_beams", "2", "--no_progress"])
    assert len(out) == 3 and (tmp_path / "hyp.txt").read_text(encoding="utf-8").count("\n") == 3


def test_vaswani_translate_quantization_int8_loads_a_float32_folder_in_int8(tmp_path, capsys):
    """`vaswani-translate --quantization int8` on a float32 folder: the same layers and translations as the folder
    saved after loading with `TorchAoConfig`; refused with --bf16, a GPU or an exported engine, before loading."""
    from helpers import SENTENCES, tiny_tokenizer, translation_model

    from vaswani.commands.translate import main as translate_main
    from vaswani.recipe.tokenization import save_tokenizers
    from vaswani.recipe.translation import load_translation_model

    tokenizer = tiny_tokenizer()
    translation_model(len(tokenizer)).save_pretrained(tmp_path / "fp32")
    load_int8(tmp_path / "fp32").save_pretrained(tmp_path / "int8")
    for name in ("fp32", "int8"):
        save_tokenizers(tokenizer, tokenizer, tmp_path / name)
    (tmp_path / "src.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    if not kernels.exact_int8_products():  # refused where the int8 products saturate
        with pytest.raises(SystemExit):
            translate_main(["--model_name_or_path", str(tmp_path / "fp32"), "--input", str(tmp_path / "src.txt")]
                           + ["--quantization", "int8"])  # fmt: skip
        assert "int8 decoding needs a CPU with VNNI or AMX" in capsys.readouterr().err
        return
    model, _, _ = load_translation_model(tmp_path / "fp32", int8=True)
    assert type(model.lm_head) is int8_output_class()
    assert type(model.model.encoder.layers[0].fc1) is Int8Linear
    outputs = {}
    for name, flags in (("int8", []), ("fp32", ["--quantization", "int8"]), ("plain", [])):
        folder = tmp_path / ("fp32" if name == "plain" else name)
        argv = ["--model_name_or_path", str(folder), "--input", str(tmp_path / "src.txt"), "--no_progress"]
        outputs[name] = translate_main([*argv, "--num_beams", "2", *flags])
    assert outputs["fp32"] == outputs["int8"] and len(outputs["fp32"]) == len(SENTENCES)
    base = [
        "--model_name_or_path",
        str(tmp_path / "fp32"),
        "--input",
        str(tmp_path / "src.txt"),
        "--quantization",
    ]
    for extra, message in (
        (["--bf16"], "drop --bf16"),
        (["--device", "cuda"], "runs on the CPU"),
        (["--engine", "ctranslate2"], "--quantization applies to --engine pytorch"),
    ):
        with pytest.raises(SystemExit):
            translate_main([*base, "int8", *extra])
        assert message in capsys.readouterr().err


def test_int8_decoding_is_refused_where_the_int8_product_is_not_exact(folder, caplog):
    """Without VNNI (AVX2, AVX-512 without VNNI) oneDNN's int8 products, torchao's included, saturate: `--quantization
    int8` (`load_translation_model(int8=True)`) is refused there, and `use_cpu_kernels` on a model quantized anyway
    says so. Where the products are exact, both go on without a word."""
    import logging

    from vaswani.recipe.translation import load_translation_model

    exact = kernels.exact_int8_products()
    with caplog.at_level(logging.WARNING, logger="vaswani.kernels"):
        use_cpu_kernels(load_int8(folder))
    assert ("int8 products are not exact" in caplog.text) == (not exact)
    if exact:
        return
    with pytest.raises(ValueError, match="int8 decoding needs a CPU with VNNI or AMX"):
        load_translation_model(folder, int8=True)
