"""Saving and loading: safetensors with ties, Auto classes in-process and through trust_remote_code, PEFT."""

import json
import math
import os
import subprocess
import sys
import textwrap

import peft
import pytest
import torch
from helpers import batch, tiny_config, tiny_model
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, GenerationConfig
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani.generation_vaswani import paper_decoding


@pytest.fixture
def saved(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    return model, tmp_path


def test_save_writes_safetensors_code_and_auto_map(saved):
    _, folder = saved
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert {"model.safetensors", "config.json", "generation_config.json"} <= files
    # the model's code and its siblings for trust_remote_code, the paper's decoding as the folder's custom generate,
    # and nothing of the CPU kernels
    assert {
        "modeling_vaswani.py",
        "configuration_vaswani.py",
        "generation_vaswani.py",
        "pipeline_vaswani.py",
        "utils_vaswani.py",
        "custom_generate/generate.py",
    } <= files
    assert not any("kernels" in name for name in files)
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "vaswani"
    assert config["auto_map"]["AutoConfig"] == "configuration_vaswani.VaswaniConfig"
    assert config["auto_map"]["AutoModel"] == "modeling_vaswani.VaswaniModel"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"


@pytest.mark.parametrize("form", ["gnmt", "power"])
def test_the_length_penalty_form_survives_saving_and_loading(tmp_path, form):
    model = tiny_model()
    paper_decoding(model.generation_config)
    model.generation_config.length_penalty_form = form
    model.save_pretrained(tmp_path)
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path).generation_config.length_penalty_form == form


def test_a_folder_saved_before_length_penalty_form_existed_takes_the_setting(tmp_path):
    model = tiny_model()
    paper_decoding(model.generation_config)
    model.save_pretrained(tmp_path)
    path = tmp_path / "generation_config.json"
    generation = json.loads(path.read_text())
    del generation["length_penalty_form"]
    path.write_text(json.dumps(generation))
    old = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    input_ids, attention_mask, _ = batch()
    kw = dict(attention_mask=attention_mask, max_new_tokens=6, eos_token_id=list(range(2, 12)))
    for form in ("power", "gnmt"):
        torch.testing.assert_close(
            old.generate(input_ids, length_penalty_form=form, **kw),
            model.generate(input_ids, length_penalty_form=form, **kw),
        )
    assert not hasattr(
        old.generation_config, "length_penalty_form"
    )  # decoded with the paper's form by default
    # A generation config passed in without the setting takes it too, and is left as it was.
    given = GenerationConfig(num_beams=2, max_new_tokens=6)
    old.generate(
        input_ids, attention_mask=attention_mask, generation_config=given, length_penalty_form="power"
    )
    assert not hasattr(given, "length_penalty_form")


def test_load_restores_ties_and_identical_logits(saved):
    model, folder = saved
    again = VaswaniForConditionalGeneration.from_pretrained(folder).eval()
    shared = again.model.shared.weight
    assert again.lm_head.weight is shared
    assert (
        again.model.encoder.embed_tokens.weight is shared
        and again.model.decoder.embed_tokens.weight is shared
    )
    input_ids, attention_mask, labels = batch()
    a = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    b = again(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    assert torch.equal(a, b)


def test_auto_classes_in_process(saved):
    model, folder = saved
    assert isinstance(AutoConfig.from_pretrained(folder), VaswaniConfig)
    assert type(AutoModelForSeq2SeqLM.from_pretrained(folder)) is VaswaniForConditionalGeneration
    bare = AutoModel.from_pretrained(folder)
    assert type(bare) is VaswaniModel
    bare.save_pretrained(folder / "bare")  # a model without a generation config saves as a whole folder
    assert type(AutoModel.from_pretrained(folder / "bare")) is VaswaniModel
    input_ids, attention_mask, labels = batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels)
    expected = model.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec)
    got = bare(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec)
    assert torch.equal(expected.last_hidden_state, got.last_hidden_state)
    fresh = AutoModelForSeq2SeqLM.from_config(tiny_config())
    assert isinstance(fresh, VaswaniForConditionalGeneration)


def xavier_bounds(model) -> dict[str, float]:
    """The largest |weight| of each kind of attention projection, over the bound of a Xavier-uniform init of gain 1."""
    found = {}
    for name, parameter in model.named_parameters():
        kind = name.split(".")[-2]
        if kind in ("q_proj", "k_proj", "v_proj", "out_proj"):
            bound = math.sqrt(6 / sum(parameter.shape))
            found[kind] = max(found.get(kind, 0.0), parameter.abs().max().item() / bound)
    return found


def test_qkv_init_gain_scales_wq_wk_wv_in_process_and_in_the_folders_code(saved):
    """fairseq's 1/sqrt(2) on W^Q, W^K, W^V and not on W^O, for a fresh model of the package and of a saved folder's
    code (custom code, which transformers initialises module by module, skipping modules without parameters)."""
    _, folder = saved
    gain = 2**-0.5
    remote_class = get_class_from_dynamic_module("modeling_vaswani.VaswaniForConditionalGeneration", folder)
    assert remote_class.__module__.startswith("transformers_modules")
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    config.qkv_init_gain = gain
    remote = remote_class(config)
    torch.manual_seed(0)
    local = VaswaniForConditionalGeneration(tiny_config(qkv_init_gain=gain))
    for model in (remote, local):
        bounds = xavier_bounds(model)
        for kind in ("q_proj", "k_proj", "v_proj"):
            assert 0.9 * gain < bounds[kind] <= gain  # uniform within gain * the bound, close to it
        assert 0.9 < bounds["out_proj"] <= 1.0
    assert 0.9 < xavier_bounds(tiny_model())["q_proj"] <= 1.0  # the default gain, 1


CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["vaswani"] = None  # the package must not be importable here
    try:
        import vaswani  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("vaswani is importable")
    import torch
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    folder, ids_path, out_path = sys.argv[1:]
    inputs = torch.load(ids_path)
    # how a user loads a model for a GPU: half precision, straight from the folder
    half = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16).eval()
    assert half.dtype == torch.bfloat16
    with torch.no_grad():
        half_beams = half.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=4,
                                   length_penalty=0.6, max_new_tokens=8)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    bare = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    assert model.lm_head.weight is model.model.shared.weight
    # a plain transformers model: torch's modules, the folder's `custom_generate/generate.py` as its generate
    kinds = {type(m).__module__.split(".")[0] for m in model.modules()}
    assert kinds == {"torch", "transformers_modules"}, kinds
    assert type(model.model.encoder.layers[0].fc1) is torch.nn.Linear
    assert "custom_generate" in model.generate.func.__module__, model.generate
    with torch.no_grad():
        logits = model(**inputs).logits
        hidden = bare(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                      decoder_input_ids=model.prepare_decoder_input_ids_from_labels(inputs["labels"])).last_hidden_state
        generated = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=8)
        beams = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=4,
                               length_penalty=0.6, max_new_tokens=8, eos_token_id=list(range(2, 12)),
                               output_scores=True, return_dict_in_generate=True)
    torch.save({"logits": logits, "hidden": hidden, "generated": generated, "half_beams": half_beams,
                "beams": beams.sequences, "beam_scores": beams.sequences_scores}, out_path)
    """
)


def test_trust_remote_code_load_in_a_fresh_interpreter(saved, tmp_path):
    model, folder = saved
    input_ids, attention_mask, labels = batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    torch.save(inputs, tmp_path / "inputs.pt")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env_home = tmp_path / "hf_home"
    result = subprocess.run(
        [sys.executable, str(script), str(folder), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # PYTHONPATH only when set: the compatibility runs put another transformers on it
        env={"HF_HOME": str(env_home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
        | ({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        expected = model(**inputs).logits
        hidden = model.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels),
        ).last_hidden_state
        generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8)
        beams = model.generate(
            input_ids,
            attention_mask=attention_mask,
            num_beams=4,
            length_penalty=0.6,
            max_new_tokens=8,
            eos_token_id=list(range(2, 12)),
            output_scores=True,
            return_dict_in_generate=True,
        )
    # the paper's length penalty through the folder's custom generate, as in-process
    assert torch.equal(out["beams"], beams.sequences)
    torch.testing.assert_close(out["beam_scores"], beams.sequences_scores)
    assert torch.equal(out["logits"], expected)
    assert torch.equal(out["hidden"], hidden)
    assert torch.equal(out["generated"], generated)
    assert out["half_beams"].shape[0] == input_ids.shape[0] and out["half_beams"].dtype == torch.long


def test_a_model_is_plain_torch_until_the_cpu_kernels_are_turned_on(tmp_path):
    """Built from a config or loaded from a folder, the model holds torch's own modules (no module or function of
    `vaswani.kernels`), so it behaves as any transformers model: a second backward through its loss, dropout of
    exactly p, `type(m) is nn.Linear`. `use_cpu_kernels` swaps them in place, `use_plain_modules` back."""
    from torch import nn

    from vaswani.kernels import Dropout, Linear, use_cpu_kernels, use_plain_modules

    built = tiny_model(dropout=0.3)
    built.save_pretrained(tmp_path)
    for model in (built, AutoModelForSeq2SeqLM.from_pretrained(tmp_path)):
        modules = list(model.modules())
        assert not [m for m in modules if type(m).__module__.startswith("vaswani.kernels")]
        linears = [m for m in modules if isinstance(m, nn.Linear)]
        assert linears and all(type(m) is nn.Linear for m in linears)
        dropouts = [m for m in modules if isinstance(m, nn.Dropout)]
        assert dropouts and all(type(m) is nn.Dropout and m.p in (0.3, 0.0) for m in dropouts)
        model.train()
        input_ids, attention_mask, labels = batch()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward(retain_graph=True)
        loss.backward()  # a second backward, as any transformers model allows
        torch.manual_seed(0)
        x = torch.ones(4096)
        assert torch.equal(
            model.model.encoder.dropout(x), (torch.manual_seed(0), nn.functional.dropout(x, 0.3))[1]
        )
        use_cpu_kernels(model)
        assert type(model.lm_head) is Linear and type(model.model.encoder.dropout) is Dropout
        assert model.config._attn_implementation == "vaswani_sdpa"
        assert model.lm_head.weight is model.model.shared.weight  # the tie survives the swap
        use_plain_modules(model)
        assert type(model.lm_head) is nn.Linear and model.config._attn_implementation == "sdpa"


def test_lora_adapter_on_q_and_v_trains_and_saves(tmp_path):
    model = tiny_model().train()
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    n_layers = model.config.encoder_layers + 2 * model.config.decoder_layers  # self + cross in the decoder
    assert len(trainable) == 2 * 2 * n_layers  # (A, B) x (q, v) x attention modules
    input_ids, attention_mask, labels = batch()
    before = {n: p.detach().clone() for n, p in lora.named_parameters()}
    optimizer = torch.optim.Adam([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(5):
        loss = lora(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    after = dict(lora.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)  # base frozen
    lora.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    reloaded = peft.PeftModel.from_pretrained(tiny_model(), tmp_path / "adapter").eval()
    lora.eval()
    with torch.no_grad():
        a = lora(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
        b = reloaded(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    torch.testing.assert_close(a, b)


PIPELINE_CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["vaswani"] = None  # the package must not be importable here
    from transformers import pipeline

    translator = pipeline("translation", model=sys.argv[1], trust_remote_code=True)
    assert type(translator).__module__.startswith("transformers_modules"), type(translator).__module__
    print(translator(["Ein Mann fährt Fahrrad.", ""], max_new_tokens=5))
    """
)


def test_a_plain_save_pretrained_folder_translates_through_the_pipeline(tmp_path):
    """`save_pretrained` alone writes the translation pipeline: a folder with its tokenizer beside it translates
    with `pipeline("translation", model=folder, trust_remote_code=True)` where the package is not installed."""
    from helpers import tiny_tokenizer, tool_model

    tokenizer = tiny_tokenizer()
    folder = tmp_path / "model"
    tool_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.VaswaniTranslationPipeline"
    assert (folder / "pipeline_vaswani.py").is_file()
    script = tmp_path / "child.py"
    script.write_text(PIPELINE_CHILD)
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, str(script), str(folder)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "translation_text" in result.stdout and "{'translation_text': ''}" in result.stdout


TRAINER_CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["vaswani"] = None  # the package must not be importable here
    from pathlib import Path

    from datasets import Dataset
    from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                              Seq2SeqTrainingArguments, pipeline)

    folder, out = sys.argv[1:]
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    pairs = {"src": ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."] * 4,
             "tgt": ["A man rides a bike.", "Two dogs play in the snow."] * 4}
    data = Dataset.from_dict(pairs).map(
        lambda b: tokenizer(b["src"], text_target=b["tgt"]), batched=True, remove_columns=["src", "tgt"]
    )
    args = Seq2SeqTrainingArguments(output_dir=out, max_steps=2, save_steps=1, per_device_train_batch_size=4,
                                    per_device_eval_batch_size=4, predict_with_generate=True, report_to="none",
                                    use_cpu=True, learning_rate=1e-3)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, eval_dataset=data,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                             processing_class=tokenizer)
    trainer.train()
    predictions = trainer.predict(data).predictions  # (pairs, longest generated length)
    trainer.save_model(out)
    for saved in (Path(out), Path(out) / "checkpoint-1"):
        translator = pipeline("translation", model=str(saved), trust_remote_code=True)
        print(saved.name, translator(["Ein Mann fährt Fahrrad."], num_beams=2, max_new_tokens=4))
    print("generated_length", predictions.shape[1])
    """
)


def test_a_folder_fine_tuned_with_seq2seq_trainer_where_the_package_is_missing_is_whole(tmp_path):
    """The transformers docs' way: load with trust_remote_code, fine-tune with Seq2SeqTrainer, `save_model()`. The
    final folder and every checkpoint carry the model's code, the pipeline and custom_generate/generate.py, so the
    translation pipeline loads from them; evaluation with generate() is not cut at transformers' 20 tokens."""
    from helpers import tiny_tokenizer, tool_model

    from vaswani.utils_vaswani import CODE_FILES

    tokenizer = tiny_tokenizer()
    folder = tmp_path / "model"
    tool_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    script = tmp_path / "child.py"
    script.write_text(TRAINER_CHILD)
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = tmp_path / "fine-tuned"
    result = subprocess.run(
        [sys.executable, str(script), str(folder), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for saved in (out, out / "checkpoint-1"):
        assert all((saved / name).is_file() for name in CODE_FILES), sorted(p.name for p in saved.iterdir())
    assert result.stdout.count("translation_text") == 2
    assert (
        int(result.stdout.split("generated_length")[1]) > 20
    )  # a random model runs to the source length + 50


def test_every_code_file_travels_as_a_relative_import_of_the_model_file():
    """Loading a folder with trust_remote_code, transformers copies the model file's own relative imports into its
    module cache (5.5 no deeper); a model loaded from there saves its folder from those copies."""
    import re
    from pathlib import Path

    from vaswani import modeling_vaswani, pipeline_vaswani
    from vaswani.utils_vaswani import CODE_FILES, CUSTOM_PIPELINES

    source = Path(modeling_vaswani.__file__).read_text(encoding="utf-8")
    imported = set(re.findall(r"^from \.(\w+) import", source, flags=re.MULTILINE))
    siblings = {Path(name).stem for name in CODE_FILES.values()} - {"modeling_vaswani"}
    assert siblings <= imported, siblings - imported
    module, name = CUSTOM_PIPELINES["translation"]["impl"].split(".")
    assert getattr(pipeline_vaswani, name).__module__.endswith(module)


def _seq2seq_trainer(model, out, **overrides):
    """transformers' Seq2SeqTrainer on three tiny pairs, saving a checkpoint at every step."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    input_ids, attention_mask, labels = batch()
    data = [
        {"input_ids": i, "attention_mask": m, "labels": y}
        for i, m, y in zip(input_ids, attention_mask, labels, strict=True)
    ]
    fields = dict(max_steps=2, save_steps=1, per_device_train_batch_size=3, report_to="none", use_cpu=True)
    fields.update(overrides)
    args = Seq2SeqTrainingArguments(output_dir=str(out), disable_tqdm=True, **fields)
    return Seq2SeqTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)


class _Warnings:
    """The warnings transformers logs inside the block (its loggers do not propagate to pytest's)."""

    def __enter__(self):
        import logging

        self.records = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = self.records.append
        logging.getLogger("transformers").addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        import logging

        logging.getLogger("transformers").removeHandler(self.handler)

    @property
    def text(self) -> str:
        return "\n".join(record.getMessage() for record in self.records)


def test_resuming_a_seq2seq_trainer_checkpoint_reports_no_missing_tied_weights(saved, tmp_path):
    """The tied embeddings and output projection are saved once; resuming, transformers' Trainer took the two
    others for missing weights ("There were missing keys in the checkpoint model loaded") on every healthy resume."""
    _, folder = saved
    _seq2seq_trainer(VaswaniForConditionalGeneration.from_pretrained(folder), tmp_path / "run").train()
    model = VaswaniForConditionalGeneration.from_pretrained(folder)
    with _Warnings() as logged:
        _seq2seq_trainer(model, tmp_path / "run").train(
            resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1")
        )
    assert "missing keys" not in logged.text, logged.text
    assert model.lm_head.weight is model.model.shared.weight is model.model.encoder.embed_tokens.weight
    # what is tied is saved once; a weight untied by hand is saved as itself
    assert model._keys_to_ignore_on_save == set(model.all_tied_weights_keys)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() + 1)
    model.save_pretrained(tmp_path / "untied")
    assert "lm_head.weight" not in model._keys_to_ignore_on_save
    from safetensors.torch import load_file

    torch.testing.assert_close(
        load_file(tmp_path / "untied" / "model.safetensors")["lm_head.weight"], model.lm_head.weight
    )


def test_a_dropout_rate_changed_after_from_pretrained_trains_and_is_saved(saved, tmp_path):
    """`model.config.dropout = 0.3` then `Seq2SeqTrainer.train()`: the model's save refused the changed config at
    the first checkpoint, after the training so far. Dropout only regularises training: the model follows it."""
    _, folder = saved
    model = VaswaniForConditionalGeneration.from_pretrained(folder)
    model.config.dropout, model.config.activation_dropout = 0.3, 0.2
    _seq2seq_trainer(model, tmp_path / "run").train()
    config = json.loads((tmp_path / "run" / "checkpoint-1" / "config.json").read_text())
    assert (config["dropout"], config["activation_dropout"]) == (0.3, 0.2)
    rates = {
        name.rsplit(".", 1)[-1]: m.p for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout)
    }
    assert rates == {"dropout": 0.3, "activation_dropout": 0.2}
    assert (
        VaswaniForConditionalGeneration.from_pretrained(tmp_path / "run" / "checkpoint-2").config.dropout
        == 0.3
    )


@pytest.mark.parametrize("field, value", [("normalize_before", True), ("activation_function", "gelu")])
def test_an_architecture_field_changed_after_from_pretrained_is_refused_before_training(
    saved, tmp_path, field, value
):
    """A field the modules and weights follow cannot change on a built model: refused, naming it, before the first
    step rather than at the first checkpoint."""
    _, folder = saved
    model = VaswaniForConditionalGeneration.from_pretrained(folder)
    setattr(model.config, field, value)
    trainer = _seq2seq_trainer(model, tmp_path / "run")
    with pytest.raises(
        ValueError, match=rf"changed after the model was built \(`{field}` from .* to {value!r}\)"
    ):
        trainer.train()
    assert trainer.state.global_step == 0
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_a_dropout_rate_changed_on_a_peft_model_leaves_lora_dropout_alone():
    """The model follows its config's dropout rates from the next training step, on its own dropout modules only:
    LoRA's keeps its rate."""
    model = peft.get_peft_model(
        tiny_model(),
        peft.LoraConfig(task_type="SEQ_2_SEQ_LM", target_modules=["q_proj", "v_proj"], lora_dropout=0.05),
    )
    model.config.dropout = 0.3
    input_ids, attention_mask, labels = batch()
    model.train()(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    rates = {name: m.p for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert {p for name, p in rates.items() if "lora_dropout" in name} == {0.05}
    assert {p for name, p in rates.items() if name.endswith(".dropout")} == {0.3}


@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_the_weights_a_folder_leaves_out_are_the_tied_ones(tmp_path, tie_word_embeddings):
    """What transformers' Trainer and common tests read: the keys a saved folder lacks are exactly
    `_keys_to_ignore_on_save` together with `_tied_weights_keys`; an output projection of its own (Marian's layout,
    `tie_word_embeddings=False`) is saved and is no tied weight."""
    from safetensors.torch import load_file

    model = VaswaniForConditionalGeneration(tiny_config(tie_word_embeddings=tie_word_embeddings))
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    missing = set(model.load_state_dict(saved, strict=False).missing_keys)
    assert missing == set(model._keys_to_ignore_on_save) | set(model._tied_weights_keys)
    assert ("lm_head.weight" in saved) is (not tie_word_embeddings)
