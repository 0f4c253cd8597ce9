"""Each fast path of `vaswani.kernels` against the plain-torch reference it stands in for, by name, and
`use_cpu_kernels`, which turns them on in a built model."""

import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import batch, tiny_config, tiny_model
from torch import nn

from vaswani import VaswaniForConditionalGeneration, kernels, shift_tokens_right
from vaswani.kernels import (
    FAST_ATTENTION,
    Linear,
    dropout,
    label_smoothed_cross_entropy,
    linear_label_smoothed_cross_entropy,
    quantized_dropout_probability,
    use_cpu_kernels,
)


# --------------------------------------------------------------------------------------------------------------------
# Linear against nn.Linear / F.linear
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_f_linear_in_value_and_gradient(bias):
    torch.manual_seed(0)
    ours = Linear(37, 23, bias=bias)
    reference = nn.Linear(37, 23, bias=bias)
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(4, 9, 37)
    assert kernels.onednn_linear_applies(x, ours.weight) == ("avx512" in kernels.onednn_features())
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours(x_ours), reference(x_ref)
    torch.testing.assert_close(y_ours, y_ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(y_ref)
    y_ours.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.weight.grad, reference.weight.grad, atol=1e-4, rtol=1e-5)
    if bias:
        torch.testing.assert_close(ours.bias.grad, reference.bias.grad, atol=1e-4, rtol=1e-5)


def test_linear_steps_aside_where_onednn_does_not_apply():
    layer = Linear(8, 8)
    x = torch.randn(2, 8)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not kernels.onednn_linear_applies(x, layer.weight)
    assert not kernels.onednn_linear_applies(x.double(), layer.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not kernels.onednn_linear_applies(x, layer.weight)
        assert layer(x).dtype == torch.bfloat16  # autocast's own product
    assert isinstance(layer, nn.Linear)  # PEFT, isinstance checks and checkpoints see an nn.Linear


@pytest.mark.parametrize("intel", [True, False])
def test_linear_leaves_a_few_rows_to_mkl_on_intel_cpus_and_all_without_avx512(monkeypatch, intel):
    from vaswani.kernels import onednn_linear

    if not onednn_linear._ONEDNN_AVAILABLE:
        pytest.skip("torch was built without oneDNN")
    monkeypatch.setattr(onednn_linear, "_intel_cpu", lambda: intel)
    small, large = Linear(8, 8), Linear(8, 8)
    large.weight = nn.Parameter(torch.empty(onednn_linear.MKL_LARGE_WEIGHT // 8, 8))
    taken = {}
    for name, layer in (("small", small), ("large", large)):
        for rows in (1, 3, 4, 15, 16, 300):
            for shape in ((rows, 8), (1, rows, 8)):  # rows counted over the leading dimensions
                taken[name, rows, len(shape)] = onednn_linear.onednn_linear_applies(
                    torch.zeros(shape), layer.weight
                )
    if "avx512" not in onednn_linear.onednn_features():  # oneDNN without AVX-512: MKL's GEMM at every size
        assert not any(taken.values())
        return
    if not intel:  # oneDNN at every size
        assert all(taken.values())
        return
    for dims in (2, 3):
        assert [taken["small", r, dims] for r in (1, 3, 4, 15, 16, 300)] == [False] * 4 + [True] * 2
        assert [taken["large", r, dims] for r in (1, 3, 4, 15, 16, 300)] == [False] * 2 + [True] * 4
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)  # the few rows go to F.linear itself: the same bits
    assert torch.equal(small(x), F.linear(x, small.weight, small.bias))


def test_cpu_flags_read_the_flags_line():
    from vaswani.kernels import int8, onednn_linear

    flags = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next(
                (line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), None
            )
    except OSError:
        pass
    if flags is None:
        pytest.skip("no flags in /proc/cpuinfo")
    assert onednn_linear._cpuinfo()["flags"].split() == flags
    assert int8._signed_rows_native.__wrapped__() == ("amx_int8" in onednn_linear.onednn_features())


def test_the_kernels_see_the_level_that_torch_and_onednn_report():
    """The kernels choose their paths by `onednn_features`: the CPU's features as oneDNN caps them by
    `ONEDNN_MAX_CPU_ISA`. oneDNN's own report of the level it runs at (the `isa:` line of its verbose output, from a
    child process with this one's environment) names the same features, and torch's dispatch level is the one
    `ATEN_CPU_CAPABILITY` asks for, so that `make test`'s restricted passes test the paths a CPU of that level takes."""
    from vaswani.kernels import onednn_linear

    if not onednn_linear._ONEDNN_AVAILABLE:
        pytest.skip("torch was built without oneDNN")
    code = "import torch; torch.ops.mkldnn._linear_pointwise(torch.ones(1, 1), torch.ones(1, 1), None, 'none', [], '')"
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    report = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    (isa,) = re.findall(r"isa:(.*)", report.stdout)
    features = onednn_linear.onednn_features()
    assert ("avx512" in features) == ("AVX-512" in isa or "AVX10" in isa), isa
    assert ("vnni" in features) == ("DL Boost" in isa or "AMX" in isa or "AVX10" in isa), isa
    assert ("amx_int8" in features) == ("AMX" in isa and "8-bit" in isa), isa
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        assert torch.backends.cpu.get_cpu_capability() == os.environ["ATEN_CPU_CAPABILITY"].upper()


def test_intel_cpu_reads_the_vendor():
    from vaswani.kernels import onednn_linear

    vendor = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            vendor = next((line for line in cpuinfo if line.startswith("vendor_id")), None)
    except OSError:
        pass
    if vendor is None:
        pytest.skip("no vendor_id in /proc/cpuinfo")
    assert onednn_linear._intel_cpu() == ("GenuineIntel" in vendor)


# --------------------------------------------------------------------------------------------------------------------
# dropout against F.dropout
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_each_element_with_probability_one_minus_p_and_scales_it_as_f_dropout(dtype):
    p, n = 0.3, 1 << 20
    applied = quantized_dropout_probability(p)  # p to a multiple of 2**-15
    assert applied != p and abs(applied - p) <= 2**-16
    x = torch.randn(n, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, p, training=True)
    kept = y != 0
    # Bernoulli(1 - p) per element: the kept fraction within 5 standard deviations of 1 - p.
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    # Kept elements are x times 1 / (1 - p') rounded to x's dtype, p' the applied probability: the formula of
    # torch's own dropout, whose expectation is x.
    scaled_mask = kept.to(dtype) * torch.tensor(1 / (1 - applied), dtype=dtype)
    assert y.dtype == dtype and torch.equal(y, x.detach() * scaled_mask)
    out, native_mask = torch.native_dropout(x.detach(), p, True)
    assert torch.equal(out, x.detach() * native_mask.to(dtype) * torch.tensor(1 / (1 - p), dtype=dtype))
    g = torch.randn(n, dtype=dtype)  # the gradient goes through the same mask and scale
    y.backward(g)
    assert torch.equal(x.grad, g * scaled_mask)
    torch.manual_seed(0)  # a seed fixes the mask
    assert torch.equal(dropout(x.detach(), p, training=True), y.detach())


def test_dropout_masks_are_independent_across_the_four_elements_of_one_draw():
    """Four neighbouring elements share one 64-bit draw: each position of the four is kept with probability 1 - p,
    and a pair of them both kept with probability (1 - p)^2, as independent draws are."""
    p, n = 0.5, 1 << 20
    torch.manual_seed(3)
    kept = (dropout(torch.ones(n), p, training=True) != 0).view(-1, 4).float()
    tolerance = 5 * math.sqrt(0.25 / (n // 4))
    for lane in range(4):
        assert abs(kept[:, lane].mean().item() - (1 - p)) < tolerance
    for a in range(4):
        for b in range(a + 1, 4):
            assert abs((kept[:, a] * kept[:, b]).mean().item() - (1 - p) ** 2) < tolerance


def test_dropout_leaves_probabilities_within_2_to_the_minus_16_of_0_or_1_to_f_dropout(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append(p) or x)
    x = torch.randn(64)
    dropout(x, 1e-6, training=True)
    dropout(x, 1 - 1e-6, training=True)
    assert calls == [1e-6, 1 - 1e-6]
    dropout(x, 0.1, training=True)
    assert len(calls) == 2


def test_dropout_is_f_dropout_when_off_and_at_p_zero_or_one():
    x = torch.randn(4, 5)
    assert dropout(x, 0.3, training=False) is x
    assert torch.equal(dropout(x, 0.0, training=True), x)
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))


def test_with_the_cpu_kernels_training_draws_every_dropout_mask_with_the_fast_path(monkeypatch):
    """After `use_cpu_kernels`, each dropout site of the model (embeddings, sublayer outputs, FFN activations) goes
    through the bit mask on the CPU, never through `F.dropout`'s slower `bernoulli_`."""
    model = use_cpu_kernels(tiny_model(dropout=0.2, activation_dropout=0.1), attention=False)
    model.train()
    input_ids, attention_mask, labels = batch()

    def refuse(*args, **kwargs):
        raise AssertionError("F.dropout was called on the CPU in training")

    monkeypatch.setattr(F, "dropout", refuse)
    torch.manual_seed(1)
    first = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    first.backward()
    torch.manual_seed(1)
    again = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    torch.manual_seed(2)
    other = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# --------------------------------------------------------------------------------------------------------------------
# label_smoothed_cross_entropy against F.cross_entropy
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_loss_equals_f_cross_entropy_in_value_and_gradient(dtype, eps):
    """Rows ignored inside and across chunk boundaries (chunks of 3 rows over 10), a scaled upstream gradient."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 7, generator=generator) * 3).to(dtype)
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    labels[0, 2] = labels[1, 0] = labels[1, 1] = -100
    fused_in = logits.clone().requires_grad_()
    fused = label_smoothed_cross_entropy(fused_in, labels, eps, chunk_elements=3 * 7)
    (fused * 0.37).backward()
    plain_in = logits.clone().requires_grad_()
    plain = F.cross_entropy(
        plain_in.flatten(0, 1).float(),
        labels.flatten(),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=eps,
    )
    (plain * 0.37).backward()
    torch.testing.assert_close(fused, plain)
    assert fused_in.grad.dtype == dtype
    torch.testing.assert_close(fused_in.grad, plain_in.grad)
    assert fused_in.grad[0, 2].abs().sum() == 0 and fused_in.grad[1, :2].abs().sum() == 0
    with torch.no_grad():  # no gradient buffer without autograd, same value
        torch.testing.assert_close(label_smoothed_cross_entropy(logits, labels, eps), plain.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_is_exact_where_the_target_probability_underflows(dtype):
    """Logits 200 apart: the target's probability is 0 in float32 (log p_t = -200), which the loss must still
    count from the logits themselves."""
    logits = torch.tensor([[0.0, 200.0, -100.0, 5.0], [3.0, -2.0, 1.0, 0.5]], dtype=dtype)
    labels = torch.tensor([0, 2])
    fused_in = logits.clone().requires_grad_()
    fused = label_smoothed_cross_entropy(fused_in, labels, 0.1)
    fused.backward()
    plain_in = logits.clone().requires_grad_()
    plain = F.cross_entropy(plain_in.float(), labels, reduction="sum", label_smoothing=0.1)
    plain.backward()
    assert torch.isfinite(fused) and fused.item() > 190  # 0.9 * 200 from the first row alone
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(fused_in.grad, plain_in.grad)


def test_fused_loss_refuses_a_second_backward_and_names_a_shape_mismatch():
    logits = torch.randn(4, 6, requires_grad=True)
    loss = label_smoothed_cross_entropy(logits, torch.tensor([1, 2, 3, -100]), 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backpropagated once"):
        loss.backward()
    with pytest.raises(ValueError, match="labels have 3 positions, logits 4"):
        label_smoothed_cross_entropy(logits, torch.tensor([1, 2, 3]), 0.1)


# --------------------------------------------------------------------------------------------------------------------
# linear_label_smoothed_cross_entropy against label_smoothed_cross_entropy(F.linear(...))
# --------------------------------------------------------------------------------------------------------------------
def _projection_and_loss(hidden, weight, bias, labels, loss_fn, autocast: bool):
    """loss_fn's loss (times 0.37) of leaf copies of the inputs, backpropagated: (loss, their gradients)."""
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(*leaves, labels)
    (loss * 0.37).backward()
    return loss, [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_projection_and_loss_equal_the_projection_then_the_loss(autocast, with_bias, eps):
    """Chunks of 4 rows over 18, rows ignored inside and across chunk boundaries, a scaled upstream gradient: the
    loss and the gradients of the hidden states, the weight and the bias equal those of F.linear followed by
    `label_smoothed_cross_entropy` (under bf16 autocast, to bf16 rounding: the weight's gradient is summed chunk by
    chunk)."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 16, generator=generator)
    weight = torch.randn(11, 16, generator=generator) * 0.3
    bias = torch.randn(11, generator=generator) if with_bias else None
    labels = torch.randint(0, 11, (2, 9), generator=generator)
    labels[0, 3] = labels[1, 0] = labels[1, 1] = -100

    fused, fused_grads = _projection_and_loss(
        hidden,
        weight,
        bias,
        labels,
        lambda h, w, b, y: linear_label_smoothed_cross_entropy(h, w, b, y, eps, chunk_elements=4 * 11),
        autocast,
    )
    plain, plain_grads = _projection_and_loss(
        hidden,
        weight,
        bias,
        labels,
        lambda h, w, b, y: label_smoothed_cross_entropy(F.linear(h, w, b), y, eps),
        autocast,
    )
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, plain)
    tolerance = dict(rtol=2e-2, atol=1e-2) if autocast else {}
    for got, expected in zip(fused_grads, plain_grads, strict=True):
        if expected is None:
            assert got is None
            continue
        assert got.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(got, expected, **tolerance)
    assert fused_grads[0][0, 3].abs().sum() == 0 and fused_grads[0][1, :2].abs().sum() == 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # no gradients computed without autograd, same value
        torch.testing.assert_close(
            linear_label_smoothed_cross_entropy(hidden, weight, bias, labels, eps), plain
        )


def test_fused_projection_and_loss_in_a_bf16_training_step_of_the_model():
    """The tiny model's decoder output through its tied output projection: the loss and every parameter's gradient
    of one bf16-autocast step match the step through the model's logits."""
    model = tiny_model(dropout=0.0)
    input_ids, attention_mask, labels = batch(model.config.vocab_size)
    labels[0, -2:] = -100

    def step(fused: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
                hidden = model.base_model(
                    input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
                ).last_hidden_state
                head = model.get_output_embeddings()
                loss = linear_label_smoothed_cross_entropy(hidden, head.weight, head.bias, labels, 0.1)
            else:
                logits = model(input_ids, attention_mask=attention_mask, labels=labels).logits
                loss = label_smoothed_cross_entropy(logits, labels, 0.1)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    fused_loss, fused_grads = step(True)
    plain_loss, plain_grads = step(False)
    torch.testing.assert_close(fused_loss, plain_loss)
    assert fused_grads.keys() == plain_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], rtol=2e-2, atol=2e-3, msg=name)


def test_fused_projection_and_loss_of_ignored_positions_only_is_zero_with_zero_gradients():
    """Every position ignored (the ignored rows are left out of the products): a zero loss, zero gradients."""
    hidden = torch.randn(3, 8, requires_grad=True)
    weight = torch.randn(6, 8, requires_grad=True)
    loss = linear_label_smoothed_cross_entropy(hidden, weight, None, torch.full((3,), -100), 0.1)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(hidden.grad, torch.zeros_like(hidden)) and torch.equal(
        weight.grad, torch.zeros_like(weight)
    )


def test_fused_projection_and_loss_refuse_bad_labels_and_a_second_backward():
    hidden = torch.randn(4, 8, requires_grad=True)
    weight = torch.randn(6, 8, requires_grad=True)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 6\).*e\.g\. 6"):
        linear_label_smoothed_cross_entropy(hidden, weight, None, torch.tensor([1, 6, 2, -100]))
    with pytest.raises(ValueError, match=r"outside the vocabulary.*e\.g\. -3"):
        linear_label_smoothed_cross_entropy(hidden, weight, None, torch.tensor([1, -3, 2, 0]))
    with pytest.raises(ValueError, match="labels have 3 positions, hidden states 4"):
        linear_label_smoothed_cross_entropy(hidden, weight, None, torch.tensor([1, 2, 3]))
    loss = linear_label_smoothed_cross_entropy(hidden, weight, None, torch.tensor([1, 2, 3, -100]), 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backpropagated once"):
        loss.backward()


# --------------------------------------------------------------------------------------------------------------------
# StackedProjections against each projection alone
# --------------------------------------------------------------------------------------------------------------------
def _groups(model: nn.Module) -> dict:
    return {
        m: m.__dict__["_vaswani_shared_input"]
        for m in model.modules()
        if "_vaswani_shared_input" in m.__dict__
    }


@pytest.mark.parametrize("bias", [False, True])
def test_stacked_projections_give_a_bf16_training_step_the_gradients_of_the_projections_one_by_one(
    bias, monkeypatch
):
    """`use_cpu_kernels` groups each self-attention's Q, K, V, and the K, V of every encoder-decoder attention (all
    on the encoder's output); in a bf16-autocast training step each group is one product whose columns the other
    projections are handed, and the
    loss and every parameter's gradient equal those of the projections computed one by one, to bf16 rounding."""
    model = use_cpu_kernels(tiny_model(attention_bias=bias)).train()
    config = model.config
    groups = _groups(model)
    sizes = sorted(len(g.modules) for g in {id(g): g for g in groups.values()}.values())
    assert sizes == [3] * (config.encoder_layers + config.decoder_layers) + [2 * config.decoder_layers]
    handed = []
    original = kernels.StackedProjections.__call__

    def spy(self, module, x):
        y = original(self, module, x)
        handed.append(module is not self.modules[0] and y is not None)
        return y

    monkeypatch.setattr(kernels.StackedProjections, "__call__", spy)
    input_ids, attention_mask, labels = batch()

    def step(autocast: bool = True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    stacked = step()
    assert sum(handed) == 2 * (config.encoder_layers + config.decoder_layers) + 2 * config.decoder_layers - 1
    for module in groups:
        del module.__dict__["_vaswani_shared_input"]
    handed.clear()
    alone = step()
    exact = step(autocast=False)
    assert not handed
    torch.testing.assert_close(stacked[0], alone[0], rtol=1e-2, atol=1e-2)
    for name, grad in exact[
        1
    ].items():  # bf16 rounding errors of the same size as the projections' one by one
        error, reference_error = (stacked[1][name] - grad).norm(), (alone[1][name] - grad).norm()
        assert error <= 1.5 * reference_error + 1e-3, name  # (the key bias: a zero gradient, rounding noise)


def test_stacked_projections_compute_alone_outside_autocast_and_after_an_in_place_change():
    torch.manual_seed(0)
    q, k, v = (Linear(8, 6) for _ in range(3))
    group = kernels.StackedProjections(q, k, v)
    assert kernels.StackedProjections.applies(q, k, v) and not kernels.StackedProjections.applies(
        q, Linear(7, 6)
    )
    for module in (q, k, v):
        module.__dict__["_vaswani_shared_input"] = group
    x = torch.randn(2, 8)
    before = x.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        queries = q(x)
        assert set(group.pending) == {id(k), id(v)}
        x.add_(1.0)  # the pending key and value are of the old input
        keys = k(x)
        assert torch.equal(keys, F.linear(x, k.weight, k.bias))  # computed alone, on the changed input
        torch.testing.assert_close(queries, F.linear(before, q.weight, q.bias))
    values = v(x)  # float32: each alone, the pending one dropped
    assert values.dtype == torch.float32 and not group.pending
    torch.testing.assert_close(values, F.linear(x, v.weight, v.bias))


def test_stacked_projections_keep_no_input_once_each_projection_has_its_result():
    """The group holds the input only while a projection's result waits for it: in training, that input is an
    activation of the step, which must not outlive the step."""
    import weakref

    q, k, v = (Linear(8, 6) for _ in range(3))
    group = kernels.StackedProjections(q, k, v)
    x = torch.randn(2, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = [q(x), k(x)]
        assert group.pending  # the value's result, with its input
        outputs.append(v(x))
    assert not group.pending
    alive = weakref.ref(x)
    del x, outputs
    assert alive() is None


def test_use_plain_modules_ungroups_the_stacked_projections():
    model = use_cpu_kernels(tiny_model())
    use_cpu_kernels(
        model
    )  # a second call regroups: one group per self-attention and one for the memory still
    config = model.config
    assert len({id(g) for g in _groups(model).values()}) == config.encoder_layers + config.decoder_layers + 1
    kernels.use_plain_modules(model)
    assert not _groups(model)


# --------------------------------------------------------------------------------------------------------------------
# attn_implementation="vaswani_sdpa" against "sdpa" and "eager"
# --------------------------------------------------------------------------------------------------------------------
def _count_matmul_calls(monkeypatch):
    """Record the (is_cross_attention, query shape) of every call that `vaswani_sdpa` computes with matmuls."""
    calls = []
    original = kernels.attention.prefers_matmul_attention

    def spy(module, query, key, attention_mask):
        chosen = original(module, query, key, attention_mask)
        if chosen:
            calls.append((module.is_cross_attention, tuple(query.shape)))
        return chosen

    monkeypatch.setattr(kernels.attention, "prefers_matmul_attention", spy)
    return calls


def test_use_cpu_kernels_changes_no_output_and_no_gradient():
    """The swapped modules compute the same arithmetic: logits and gradients of a float32 training step (dropout off)
    and a generation equal the plain model's, to rounding."""
    input_ids, attention_mask, labels = batch()
    results = []
    for fast in (False, True):
        model = tiny_model(dropout=0.0)
        if fast:
            use_cpu_kernels(model)
        model.train()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        model.eval()
        generated = model.generate(input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=6)
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()], generated))
    torch.testing.assert_close(results[1][0], results[0][0])
    for ours, plain in zip(results[1][1], results[0][1], strict=True):
        torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-4)
    assert torch.equal(results[1][2], results[0][2])


def test_vaswani_sdpa_is_registered_and_equals_sdpa_and_eager():
    torch.manual_seed(0)
    models = {}
    for name in ("eager", "sdpa", FAST_ATTENTION):
        models[name] = VaswaniForConditionalGeneration(tiny_config(attn_implementation=name)).eval()
        models[name].load_state_dict(models["eager"].state_dict())
        assert models[name].config._attn_implementation == name
    input_ids, attention_mask, labels = batch()
    outputs = {
        name: m(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        for name, m in models.items()
    }
    for name in ("sdpa", FAST_ATTENTION):
        torch.testing.assert_close(outputs[name].logits, outputs["eager"].logits, atol=1e-5, rtol=1e-5)


def test_vaswani_sdpa_computes_decoding_steps_with_matmuls_and_equals_sdpa(monkeypatch):
    """With the cache, each decoding step has one query per row: `vaswani_sdpa` computes it with matmuls; the
    generations equal plain "sdpa"'s."""
    calls = _count_matmul_calls(monkeypatch)
    torch.manual_seed(0)
    fast = VaswaniForConditionalGeneration(tiny_config(attn_implementation=FAST_ATTENTION)).eval()
    plain = VaswaniForConditionalGeneration(tiny_config(attn_implementation="sdpa")).eval()
    plain.load_state_dict(fast.state_dict())
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=8, num_beams=4, do_sample=False)
    ours = fast.generate(input_ids, **kw)
    # one query per row (3 sources x 4 beams), in self- and encoder-decoder attention
    assert {(False, (12, 5, 1, 3)), (True, (12, 5, 1, 3))} == set(calls)
    calls.clear()
    assert torch.equal(ours, plain.generate(input_ids, **kw))
    assert not calls  # plain "sdpa" never takes the matmul path


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vaswani_sdpa_in_half_precision_training_is_causal_and_as_close_to_float32_as_sdpa(
    dtype, monkeypatch
):
    """In half precision with gradients on the CPU, `vaswani_sdpa` computes attention with matmuls (a faster
    backward); no target position sees a later one, and logits and gradients are as close to float32 as SDPA's."""
    calls = _count_matmul_calls(monkeypatch)
    input_ids, attention_mask, labels = batch()
    dec = shift_tokens_right(labels, 0, 1)
    results = []
    for attention, model_dtype in ((FAST_ATTENTION, dtype), ("sdpa", dtype), ("eager", torch.float32)):
        calls.clear()
        model = tiny_model(dropout=0.0, attn_implementation=attention).to(model_dtype).train()
        embeds = (model.get_input_embeddings()(dec) * model.config.d_model**0.5).detach().requires_grad_()
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_inputs_embeds=embeds
        ).logits
        logits[:, 2].float().sum().backward()
        assert bool(calls) == (attention == FAST_ATTENTION)
        assert embeds.grad[:, 3:].abs().sum() == 0 and embeds.grad[:, :3].abs().sum() > 0
        results.append([t.float() for t in (logits.detach(), embeds.grad, model.lm_head.weight.grad)])
    for ours, kernel, exact in zip(*results, strict=True):  # rounding errors of the same size as the kernel's
        assert (ours - exact).norm() <= 1.5 * (kernel - exact).norm() + 1e-3


@pytest.mark.parametrize("mask", ["padding", "none", "causal", "additive"])
@pytest.mark.parametrize("queries", [7, 1])
def test_matmul_attention_pads_short_softmax_rows_and_equals_eager(mask, queries, monkeypatch):
    """Fewer keys than `SOFTMAX_MIN_KEYS` (torch's slow CPU softmax): `vaswani_sdpa`'s matmul attention takes the
    softmax over scores padded with -inf, and its output, weights and gradients equal the model's eager attention, a
    row whose every key is masked included (uniform weights over its keys, zero gradient)."""
    from vaswani.kernels import attention
    from vaswani.modeling_vaswani import eager_attention_forward

    softmax_widths, original = [], torch.softmax
    monkeypatch.setattr(
        attention.torch, "softmax", lambda x, dim: softmax_widths.append(x.shape[-1]) or original(x, dim)
    )
    module = nn.Module()
    module.is_causal, module.is_cross_attention = mask == "causal", False
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, queries, 4, generator=generator, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 3, 7, 4, generator=generator, dtype=torch.bfloat16) for _ in range(2))
    attention_mask = None
    if mask in ("padding", "additive"):
        attention_mask = torch.ones(2, 1, queries, 7, dtype=torch.bool)
        attention_mask[1, :, :, 5:] = False
        attention_mask[0, 0, queries // 2] = False  # every key masked for one query
        if mask == "additive":
            attention_mask = torch.zeros(attention_mask.shape).masked_fill(
                ~attention_mask, torch.finfo(torch.float32).min
            )
    causal = torch.ones(queries, 7, dtype=torch.bool).tril(7 - queries)
    reference_mask = causal if mask == "causal" else attention_mask
    gradient = torch.randn(2, queries, 3, 4, generator=generator, dtype=torch.bfloat16)
    results = []
    for fast in (True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if fast:
            output, weights = attention.vaswani_sdpa_attention(module, *leaves, attention_mask, scaling=0.5)
        else:
            output, weights = eager_attention_forward(module, *leaves, reference_mask, scaling=0.5)
        output.backward(gradient)
        results.append((output, weights, *(t.grad for t in leaves)))
    assert softmax_widths == [max(attention.SOFTMAX_MIN_KEYS, 7), 7]  # the kernel's, padded, then the reference's
    assert results[0][1].shape == (2, 3, queries, 7)
    for ours, expected in zip(*results, strict=True):
        torch.testing.assert_close(ours, expected)
    if mask == "padding":
        uniform = torch.full((7,), 1 / 7, dtype=torch.bfloat16)
        torch.testing.assert_close(results[0][1][0, 0, queries // 2], uniform)
        assert results[0][2][0, :, queries // 2].abs().sum() == 0  # no gradient through the masked row


def test_vaswani_sdpa_leaves_long_float32_training_to_the_sdpa_kernel(monkeypatch):
    calls = _count_matmul_calls(monkeypatch)
    model = tiny_model(attn_implementation=FAST_ATTENTION).train()
    input_ids, attention_mask, labels = batch()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    assert not calls  # float32 training: SDPA's kernel throughout


def test_vaswani_sdpa_chooses_its_attention_under_torch_compile_as_in_eager(monkeypatch):
    """Inductor does not replace SDPA on the CPU (it calls the same flash-attention kernel, whose backward took half
    of a compiled training step), so a compiled bf16 training forward takes the matmuls where eager does: the traced
    graph holds no SDPA call at a few keys, and SDPA's alone once the keys exceed `MATMUL_ATTENTION_MAX_KEYS`."""
    from vaswani.kernels import attention

    input_ids, attention_mask, labels = batch()  # 5 source and 5 target positions
    for max_keys, expect_sdpa in ((attention.MATMUL_ATTENTION_MAX_KEYS, False), (4, True)):
        monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_KEYS", max_keys)
        model = tiny_model(dropout=0.0, attn_implementation=FAST_ATTENTION).train()
        traced = []

        def backend(graph_module, example_inputs, traced=traced):
            traced.extend(str(node.target) for node in graph_module.graph.nodes if node.op == "call_function")
            return graph_module.forward

        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            compiled(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        calls = [target for target in traced if "scaled_dot_product_attention" in target]
        assert traced and bool(calls) == expect_sdpa, calls
        if expect_sdpa:  # every encoder self-attention and decoder self- and encoder-decoder attention
            assert len(calls) == model.config.encoder_layers + 2 * model.config.decoder_layers
    torch._dynamo.reset()
