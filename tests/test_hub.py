"""Publishing to the Hub, without the network: the folder, the card, the one-commit upload, bad inputs, and loading the
published folder with plain transformers in an interpreter where `vaswani` cannot be imported."""

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import ROOT, assert_one_line_error, invoke, tiny_config
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl, constants
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from vaswani import VaswaniForConditionalGeneration
from vaswani.commands import push_to_hub as push_command
from vaswani.common.errors import PublishError
from vaswani.generation_vaswani import EXTRA_OUTPUT_TOKENS, paper_decoding
from vaswani.pipeline_vaswani import VaswaniTranslationPipeline
from vaswani.publishing.hub import check_folder, publish
from vaswani.publishing.model_card import EvalResults, TrainingSummary, render_card, validate_card
from vaswani.utils_vaswani import AUTO_MAP

REPO_ID = "someone/vaswani-de-en"
PUBLISHED_FILES = {
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "configuration_vaswani.py",
    "modeling_vaswani.py",
    "generation_vaswani.py",
    "pipeline_vaswani.py",
    "utils_vaswani.py",
    "custom_generate/generate.py",
    "tokenizer.json",
    "tokenizer_config.json",
}


def files_in(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


SOURCES = ["ein mann fährt rad .", "zwei hunde spielen im schnee .", "eine frau"]
# As vaswani.recipe.finish writes test_results.json.
RESULTS = {
    "bleu": 31.4159,
    "bleu_signature": "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
    "chrf": 55.5,
    "chrf_signature": "chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.0",
    "bleu_lowercase_moses_tokenized": 35.25,
    "bleu_lowercase_moses_tokenized_signature": "BLEU|nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.4.0",
    "dataset": "bentrevett/multi30k",
    "split": "test",
    "num_beams": 4,
    "length_penalty": 0.6,
    "length_penalty_form": "gnmt",
    "model": "/runs/de-en/averaged",  # a key the card does not use
}
SUMMARY = {
    "source_lang": "de",
    "target_lang": "en",
    "dataset": "bentrevett/multi30k",
    "preset": "small",
    "steps": 12000,
    "batch_tokens": 25000,
    "schedule": "inverse square root with linear warm-up (§5.3)",
    "warmup_steps": 4000,
    "peak_learning_rate": 0.0006987712429686844,
    "label_smoothing": 0.1,
    "hardware": "1x NVIDIA H200",
    "precision": "bf16 autocast",
    "train_runtime": 3725.0,
}


# --------------------------------------------------------------------------------------------------------------------
# Fixtures: no network, no token, a trained-model folder and its dry-run publication
# --------------------------------------------------------------------------------------------------------------------
def _refuse_connection(*args, **kwargs):
    raise AssertionError("a test tried to open a network connection")


@pytest.fixture(autouse=True)
def no_network_no_token(monkeypatch, tmp_path):
    """Every socket connection fails the test, and no token is found unless a test sets HF_TOKEN."""
    monkeypatch.setattr(socket.socket, "connect", _refuse_connection)
    monkeypatch.setattr(socket, "create_connection", _refuse_connection)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A small word-level BPE with the project's special ids, `</s>` appended to every sequence."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = SOURCES + ["a man rides a bike .", "two dogs play in the snow .", "a woman"]
    trainer = trainers.BpeTrainer(
        vocab_size=80, special_tokens=["<pad>", "<s>", "</s>", "<unk>"], show_progress=False
    )
    tokenizer.train_from_iterator(corpus * 3, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_input_names=["input_ids", "attention_mask"],
    )


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory) -> Path:
    """What training leaves: a model saved with `save_pretrained`, its tokenizer, and the Trainer's pickle."""
    directory = tmp_path_factory.mktemp("trained")
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(tiny_config(vocab_size=len(tokenizer)))
    paper_decoding(model.generation_config)  # as the recipe writes it
    model.config.use_cache = False  # as Trainer saves it
    model.save_pretrained(directory)
    # As every folder trained before `length_penalty_form` existed: a generation config without it, marked as made
    # from the model config (which makes loading drop unknown keys).
    generation = json.loads((directory / "generation_config.json").read_text())
    del generation["length_penalty_form"]
    generation["_from_model_config"] = True
    (directory / "generation_config.json").write_text(json.dumps(generation))
    tokenizer.save_pretrained(directory)
    torch.save({"not": "published"}, directory / "training_args.bin")
    (directory / "results.json").write_text(json.dumps(RESULTS))
    (directory / "summary.json").write_text(json.dumps(SUMMARY))
    return directory


@pytest.fixture(scope="module")
def published(trained_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("published") / "hub"
    result = publish(
        trained_dir,
        REPO_ID,
        folder,
        dry_run=True,
        results=trained_dir / "results.json",
        summary=trained_dir / "summary.json",
        example_text=SOURCES[2],  # short: the example decodes up to input length + 50 tokens
    )
    assert result.folder == folder and result.commit is None
    return folder


def in_process(trained_dir):
    model = VaswaniForConditionalGeneration.from_pretrained(trained_dir).eval()
    return model, PreTrainedTokenizerFast.from_pretrained(trained_dir)


class HubRecorder:
    """Stands in for the network methods of `HfApi`; records calls and what the upload would send."""

    def __init__(self):
        self.calls = []
        self.uploaded_files = None
        self.uploaded_card = None

    def install(self, monkeypatch):
        recorder = self

        def create_repo(api, repo_id, **kwargs):
            recorder.calls.append(("create_repo", repo_id, kwargs, api.token))
            return RepoUrl(f"https://huggingface.co/{repo_id}")

        def whoami(api, **kwargs):
            recorder.calls.append(("whoami", None, kwargs, api.token))
            return {"name": "someone"}

        def create_branch(api, repo_id, **kwargs):
            recorder.calls.append(("create_branch", repo_id, kwargs, api.token))

        def upload_folder(api, **kwargs):
            recorder.calls.append(("upload_folder", kwargs.pop("repo_id"), kwargs, api.token))
            folder = Path(kwargs["folder_path"])  # a temporary folder: look at it now
            recorder.uploaded_files = {
                p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
            }
            recorder.uploaded_card = (folder / "README.md").read_text(encoding="utf-8")
            return CommitInfo(
                commit_url="https://huggingface.co/someone/vaswani-de-en/commit/0",
                commit_message=kwargs["commit_message"],
                commit_description="",
                oid="0" * 40,
            )

        for name, method in [
            ("create_repo", create_repo),
            ("create_branch", create_branch),
            ("whoami", whoami),
            ("upload_folder", upload_folder),
        ]:
            monkeypatch.setattr(HfApi, name, method)
        for name in ("create_commit", "upload_file", "create_pull_request"):
            monkeypatch.setattr(
                HfApi, name, lambda *a, _name=name, **k: pytest.fail(f"unexpected HfApi.{_name}")
            )
        return self


@pytest.fixture
def hub(monkeypatch) -> HubRecorder:
    return HubRecorder().install(monkeypatch)


# --------------------------------------------------------------------------------------------------------------------
# The published folder and its card
# --------------------------------------------------------------------------------------------------------------------
def test_dry_run_writes_exactly_the_published_files(published, trained_dir):
    assert files_in(published) == PUBLISHED_FILES  # no training_args.bin, no pickles
    config = json.loads((published / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    assert config["custom_pipelines"]["translation"] == {
        "impl": "pipeline_vaswani.VaswaniTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
    }
    assert config["use_cache"] is True  # the Trainer's use_cache=False is not published
    generation = json.loads((published / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)  # §6.1
    assert generation["length_penalty_form"] == "gnmt"  # the form §6.1 cites
    # The code files are the package's own, and the weights those trained.
    for name in ("configuration_vaswani.py", "modeling_vaswani.py", "pipeline_vaswani.py"):
        assert (published / name).read_text() == (ROOT / "vaswani" / name).read_text()
    model, _ = in_process(trained_dir)
    weights = load_file(published / "model.safetensors")
    for name, tensor in model.state_dict().items():
        if name in weights:
            torch.testing.assert_close(weights[name], tensor, rtol=0, atol=0)
    check_folder(published)


def test_card_metadata_and_contents(published):
    card = ModelCard.load(published / "README.md")
    data = card.data
    assert data.language == ["de", "en"]
    assert data.license == "other"  # none chosen: the card says the data's terms apply
    assert "chose no license for these weights" in card.text
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "translation"
    assert data.datasets == ["bentrevett/multi30k"]
    assert data.metrics == ["bleu", "chrf"]
    assert {"translation", "custom_code"} <= set(data.tags)
    assert data.model_name == "vaswani-de-en"
    scores = {r.metric_name: r for r in data.eval_results}
    assert set(scores) == {"BLEU (sacreBLEU)", "chrF (sacreBLEU)", "BLEU (lowercased, Moses-tokenized)"}
    bleu = scores["BLEU (sacreBLEU)"]
    assert (bleu.metric_type, bleu.metric_value, bleu.metric_config) == (
        "bleu",
        31.42,
        RESULTS["bleu_signature"],
    )
    assert scores["chrF (sacreBLEU)"].metric_value == 55.5
    assert scores["BLEU (lowercased, Moses-tokenized)"].metric_value == 35.25
    assert bleu.dataset_type == "bentrevett/multi30k" and bleu.dataset_split == "test"
    assert bleu.task_type == "translation"
    # model-index in the YAML as the Hub reads it
    assert card.content.split("---")[1].count("model-index:") == 1
    text = card.text
    config = tiny_config(vocab_size=json.loads((published / "config.json").read_text())["vocab_size"])
    params = sum(p.numel() for p in VaswaniForConditionalGeneration(config).parameters())
    for expected in [
        f"{params:,}",  # parameter count
        "post-norm",
        "12,000",  # steps
        "~25,000 tokens",
        SUMMARY["schedule"],
        "1x NVIDIA H200",
        "| Precision | bf16 autocast |",
        "| Peak learning rate | 0.000699 |",  # three significant digits, not a float's repr
        "| Label smoothing (ε_ls) | 0.1 |",
        "1 h 02 min",
        RESULTS["bleu_signature"],
        RESULTS["chrf_signature"],
        RESULTS["bleu_lowercase_moses_tokenized_signature"],
        "4 beams, length penalty α = 0.6 in the form ((5 + |Y|) / 6)^α",
        "log P(Y) / ((5 + |Y|) / 6)^α",  # the usage section, from generation_config.json
        "trust_remote_code=True",
        'pipeline("translation"',
        "## Limitations",
        "@inproceedings{vaswani2017attention",
        "Attention Is All You Need",
    ]:
        assert expected in text, expected
    validate_card(card.content)


def test_card_without_run_information_still_validates(trained_dir):
    model, _ = in_process(trained_dir)
    card = render_card(model, REPO_ID)
    assert card.data.eval_results is None and "No evaluation results" in card.text
    assert "training recipe was not recorded" in card.text


def test_validate_card_rejects_bad_cards(published):
    text = (published / "README.md").read_text()
    with pytest.raises(PublishError, match="pipeline_tag"):
        validate_card(text.replace("pipeline_tag: translation\n", ""))
    with pytest.raises(PublishError, match="placeholders"):
        validate_card(text + "\n{{ forgotten }}\n")
    with pytest.raises(ValueError):  # a model-index that does not parse
        validate_card(text.replace("      value: 31.42\n", ""))


def test_card_says_when_the_model_writes_lowercase_only(trained_dir, tmp_path):
    model, _ = in_process(trained_dir)
    results = EvalResults(
        bleu=30.0, bleu_signature="BLEU|nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
    )
    lowercased = render_card(model, REPO_ID, results=results, lowercase=True).text
    assert "reads and writes lowercase only" in lowercased and "case-insensitive (`case:lc`" in lowercased
    cased = render_card(model, REPO_ID, results=results).text
    assert "lowercase only" not in cased and "case-insensitive" not in cased
    # publishing reads it off the tokenizer
    folder = _copy_without(trained_dir, tmp_path / "lowercased")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.save_pretrained(folder)
    publish(folder, REPO_ID, tmp_path / "hub", dry_run=True, results=folder / "results.json")
    assert "reads and writes lowercase only" in (tmp_path / "hub" / "README.md").read_text()


def test_the_folder_decoding_is_published(trained_dir, tmp_path):
    """A length penalty the folder's generation config holds (`vaswani-train --length_penalty` chooses one on
    validation) is published as it is, and the card states it; keys the folder lacks are the paper's."""
    folder = _copy_without(trained_dir, tmp_path / "chosen")
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "length_penalty": 1.5}))
    publish(folder, REPO_ID, tmp_path / "hub", dry_run=True, results=folder / "results.json")
    published = json.loads((tmp_path / "hub" / "generation_config.json").read_text())
    assert (published["num_beams"], published["length_penalty"], published["length_penalty_form"]) == (
        4,
        1.5,
        "gnmt",  # absent from the folder: the paper's
    )
    card = (tmp_path / "hub" / "README.md").read_text()
    assert "beam search with 4 beams and length penalty\nα = 1.5 (§6.1 of the paper uses 0.6)" in card
    model, _ = in_process(trained_dir)  # the paper's own alpha is named as the paper's
    model.generation_config.length_penalty = 0.6
    assert "length penalty\nα = 0.6 (§6.1 of the paper)" in render_card(model, REPO_ID).text


def test_card_names_a_local_dataset_without_its_path(trained_dir):
    model, _ = in_process(trained_dir)
    local = "/data/corpora/multi30k"
    card = render_card(
        model,
        REPO_ID,
        results=EvalResults(bleu=20.0, dataset=local),
        summary=TrainingSummary(source_lang="de", target_lang="en", dataset=local),
    )
    assert card.data.datasets is None  # the metadata lists Hub datasets only
    assert card.data.eval_results[0].dataset_type == "multi30k"
    assert "`multi30k`" in card.text and local not in card.text
    # the publisher names the local copy's Hub id, and a license
    card = render_card(
        model,
        REPO_ID,
        results=EvalResults(bleu=20.0, dataset=local),
        summary=TrainingSummary(source_lang="de", target_lang="en", dataset=local),
        dataset_tags=["bentrevett/multi30k"],
        license="cc-by-nc-4.0",
    )
    assert card.data.datasets == ["bentrevett/multi30k"] and card.data.license == "cc-by-nc-4.0"
    assert card.data.eval_results[0].dataset_type == "bentrevett/multi30k"
    assert "`bentrevett/multi30k`" in card.text and "`multi30k`" not in card.text
    assert "released these weights under the license" in card.text


def test_run_json_files(tmp_path):
    assert EvalResults.from_json(_write(tmp_path / "r.json", RESULTS)).bleu == 31.4159
    prefixed = EvalResults.from_json(_write(tmp_path / "p.json", {"test_bleu": 12.0, "test_runtime": 1.5}))
    assert (prefixed.bleu, prefixed.split) == (12.0, "test")
    summary = TrainingSummary.from_json(_write(tmp_path / "s.json", SUMMARY))
    assert (summary.source_lang, summary.train_time) == ("de", "1 h 02 min")
    with pytest.raises(PublishError, match="required"):
        EvalResults.from_json(_write(tmp_path / "bad.json", {"chrf": 50.0}))
    with pytest.raises(PublishError, match="No training summary file"):
        TrainingSummary.from_json(tmp_path / "missing.json")


def _write(path: Path, values: dict) -> Path:
    path.write_text(json.dumps(values))
    return path


# --------------------------------------------------------------------------------------------------------------------
# Upload: one commit, at the HfApi boundary
# --------------------------------------------------------------------------------------------------------------------
def test_push_creates_repo_and_uploads_one_commit(trained_dir, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    result = publish(
        trained_dir,
        REPO_ID,
        results=trained_dir / "results.json",
        summary=trained_dir / "summary.json",
        private=True,
        revision="v1",
        commit_message="Publish the de-en model",
    )
    assert result.folder is None  # built in a temporary folder
    assert result.commit.commit_url.endswith("/commit/0")
    assert [call[0] for call in hub.calls] == ["create_repo", "create_branch", "upload_folder"]
    (_, repo, create_kwargs, token), (_, _, branch_kwargs, _), (_, upload_repo, upload_kwargs, _) = hub.calls
    assert (repo, upload_repo, token) == (REPO_ID, REPO_ID, "hf_from_env")
    assert create_kwargs == {"private": True, "exist_ok": True, "repo_type": "model"}
    assert branch_kwargs["branch"] == "v1" and branch_kwargs["exist_ok"] is True
    assert upload_kwargs["revision"] == "v1"
    assert upload_kwargs["commit_message"] == "Publish the de-en model"
    assert "*.bin" in upload_kwargs["delete_patterns"]  # stale pickles go in the same commit
    assert hub.uploaded_files == PUBLISHED_FILES
    card = ModelCard(hub.uploaded_card)  # the card is in the commit, not replaced by a default one
    assert card.data.pipeline_tag == "translation" and card.data.eval_results[0].metric_value == 31.42


def test_push_with_output_dir_keeps_the_folder_and_uses_the_token_argument(trained_dir, hub, tmp_path):
    # A repo id without namespace goes to the token's user, and the card names the full id.
    result = publish(trained_dir, "vaswani-de-en", tmp_path / "out", token="hf_argument")
    assert result.folder == tmp_path / "out" and files_in(result.folder) == PUBLISHED_FILES
    assert [(call[0], call[1], call[3]) for call in hub.calls] == [
        ("whoami", None, "hf_argument"),
        ("create_repo", REPO_ID, "hf_argument"),
        ("upload_folder", REPO_ID, "hf_argument"),
    ]
    assert f'model="{REPO_ID}"' in hub.uploaded_card
    assert hub.calls[1][2]["private"] is None  # the Hub's default visibility
    assert hub.calls[2][2]["revision"] is None


def _copy_without(source: Path, destination: Path, *names: str) -> Path:
    shutil.copytree(source, destination)
    for name in names:
        (destination / name).unlink()
    return destination


def test_bad_inputs_fail_before_any_upload(trained_dir, hub, tmp_path, monkeypatch):
    with pytest.raises(PublishError, match="No Hugging Face token"):
        publish(trained_dir, REPO_ID)
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    with pytest.raises(PublishError, match="Invalid repo id"):
        publish(trained_dir, "someone/bad..name")
    with pytest.raises(PublishError, match="Invalid repo id"):
        publish(trained_dir, "a/b/c")
    no_weights = _copy_without(trained_dir, tmp_path / "no-weights", "model.safetensors")
    with pytest.raises(PublishError, match="has no weights"):
        publish(no_weights, REPO_ID)
    no_tokenizer = _copy_without(trained_dir, tmp_path / "no-tok", "tokenizer.json", "tokenizer_config.json")
    with pytest.raises(PublishError, match="has no tokenizer"):
        publish(no_tokenizer, REPO_ID)
    separate = _copy_without(trained_dir, tmp_path / "separate", "tokenizer.json", "tokenizer_config.json")
    (separate / "source").mkdir()
    with pytest.raises(PublishError, match="separate source and target tokenizers"):
        publish(separate, REPO_ID)
    small = tmp_path / "small-vocab"
    VaswaniForConditionalGeneration(tiny_config(vocab_size=20)).save_pretrained(small)
    with pytest.raises(PublishError, match="the model only 20"):
        publish(small, REPO_ID, tokenizer_dir=trained_dir)
    with pytest.raises(PublishError, match="No model folder at .*nowhere.*: no such folder"):
        publish(tmp_path / "nowhere", REPO_ID)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishError, match="no config.json"):
        publish(tmp_path / "empty", REPO_ID)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("stale")
    with pytest.raises(PublishError, match="not empty"):
        publish(trained_dir, REPO_ID, tmp_path / "full")
    with pytest.raises(PublishError, match="Nothing to do"):
        publish(trained_dir)
    assert hub.calls == []


def test_check_folder_rejects_pickles_and_missing_files(published, tmp_path):
    with_pickle = shutil.copytree(published, tmp_path / "pickle")
    torch.save({}, with_pickle / "pytorch_model.bin")
    with pytest.raises(PublishError, match="should not be published.*pytorch_model.bin"):
        check_folder(with_pickle)
    without_pipeline = _copy_without(published, tmp_path / "nopipe", "pipeline_vaswani.py")
    with pytest.raises(PublishError, match="pipeline_vaswani.py"):
        check_folder(without_pipeline)


def test_script_dry_run(trained_dir, tmp_path, hub):
    spec = importlib.util.spec_from_file_location("push_to_hub", ROOT / "scripts" / "push_to_hub.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "dry"
    published = script.main(
        ["--model_dir", str(trained_dir), "--repo_id", REPO_ID, "--dry_run", "--output_dir", str(out)]
        + ["--results_json", str(trained_dir / "results.json")]
        + ["--training_summary_json", str(trained_dir / "summary.json")]
    )
    assert published.commit is None and files_in(out) == PUBLISHED_FILES
    assert hub.calls == []  # a dry run needs no token and calls nothing


# --------------------------------------------------------------------------------------------------------------------
# The pipeline in this process
# --------------------------------------------------------------------------------------------------------------------
def test_pipeline_outputs_batching_and_generation_settings(trained_dir):
    model, tokenizer = in_process(trained_dir)
    pipe = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer, device="cpu", num_beams=2)
    single = pipe(SOURCES[0], max_new_tokens=6)
    assert isinstance(single, list) and list(single[0]) == ["translation_text"]
    one_by_one = [pipe(text, max_new_tokens=6)[0] for text in SOURCES]
    assert pipe(SOURCES, max_new_tokens=6, batch_size=3) == one_by_one  # padding changes nothing
    # Settings given at construction (num_beams=2) reach generate(), under those of the call.
    inputs = tokenizer(SOURCES[:1], return_tensors="pt")
    expected = model.generate(**inputs, num_beams=2, max_new_tokens=6)
    assert single[0]["translation_text"] == tokenizer.decode(expected[0], skip_special_tokens=True)
    pairs = pipe(SOURCES[:2], max_new_tokens=6, num_beams=3, num_return_sequences=2, batch_size=2)
    assert [len(p) for p in pairs] == [2, 2]
    # Without a length setting, the paper's limit: input length + 50 (§6.1). EOS is banned so the limit is reached.
    ids = pipe(SOURCES[1], return_tensors=True, num_beams=1, suppress_tokens=[2])[0]["translation_token_ids"]
    source_length = len(tokenizer(SOURCES[1])["input_ids"])
    assert len(ids) == 1 + source_length + EXTRA_OUTPUT_TOKENS  # decoder start + new tokens
    with pytest.raises(TypeError, match="strings"):
        pipe(123)



def test_pipeline_from_a_folder_in_this_process_without_trusting_its_code(published):
    """With the package installed, `pipeline_class=vaswani.VaswaniTranslationPipeline` builds the translation pipeline
    of a folder from this process's classes; transformers (5 removed its own `translation` task) otherwise builds a task
    named in the config's `custom_pipelines` only from the folder's code, with `trust_remote_code=True`."""
    from transformers import pipeline

    import vaswani

    translator = pipeline("translation", model=str(published), pipeline_class=vaswani.VaswaniTranslationPipeline)
    assert type(translator) is VaswaniTranslationPipeline
    assert type(translator.model) is VaswaniForConditionalGeneration  # the registered class, not the folder's copy
    model = VaswaniForConditionalGeneration.from_pretrained(published).eval()
    direct = VaswaniTranslationPipeline(model=model, tokenizer=translator.tokenizer, device="cpu")
    assert translator(SOURCES, max_new_tokens=6) == direct(SOURCES, max_new_tokens=6)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("translation", model=str(published))

# --------------------------------------------------------------------------------------------------------------------
# The published folder in a fresh interpreter, where `vaswani` cannot be imported
# --------------------------------------------------------------------------------------------------------------------
NO_PACKAGE = """\
sys.modules["vaswani"] = None  # as on a machine without this package
try:
    import vaswani
except ImportError:
    pass
else:
    raise SystemExit("vaswani is importable")
"""
NO_NETWORK = """\
def _refuse(*args, **kwargs):
    raise OSError("network access in a test")
socket.socket.connect = _refuse
socket.create_connection = _refuse
"""
CHILD_PRELUDE = "import json, socket, sys\n" + NO_PACKAGE + NO_NETWORK


def run_child(code: str, tmp_path: Path, package: bool = False) -> str:
    """`code` in a fresh interpreter, offline, where this package cannot be imported (with `package`, where it can)."""
    script = tmp_path / "child.py"
    prelude = CHILD_PRELUDE.replace(NO_PACKAGE, "") if package else CHILD_PRELUDE
    script.write_text(prelude + textwrap.dedent(code))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]) if package else "",
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.mark.slow
def test_fresh_interpreter_loads_published_folder(published, trained_dir, tmp_path):
    out = run_child(
        f"""
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        folder, sources = {str(published)!r}, {SOURCES!r}
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        bare = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        translator = pipeline("translation", model=folder, trust_remote_code=True, device="cpu")
        classes = [type(o).__module__ + "." + type(o).__name__ for o in (config, bare, model, translator)]
        inputs = tokenizer(sources, return_tensors="pt", padding=True)
        with torch.no_grad():
            encoded = bare(**inputs, decoder_input_ids=inputs["input_ids"][:, :2]).encoder_last_hidden_state
        print(json.dumps({{
            "classes": classes,
            "ids": inputs["input_ids"].tolist(),
            "encoded": encoded.tolist(),
            "generated": model.generate(**inputs, max_new_tokens=7).tolist(),
            "batched": translator(sources, batch_size=2, max_new_tokens=7),
            "default_length": translator(sources[2]),
            "greedy": translator(sources[2], num_beams=1, max_new_tokens=5),
        }}))
        """,
        tmp_path,
    )
    child = json.loads(out.strip().splitlines()[-1])
    assert all(name.startswith("transformers_modules.") for name in child["classes"]), child["classes"]
    assert [name.rsplit(".", 1)[1] for name in child["classes"]] == [
        "VaswaniConfig",
        "VaswaniModel",
        "VaswaniForConditionalGeneration",
        "VaswaniTranslationPipeline",
    ]

    model, tokenizer = in_process(trained_dir)
    inputs = tokenizer(SOURCES, return_tensors="pt", padding=True)
    assert child["ids"] == inputs["input_ids"].tolist()
    with torch.no_grad():
        encoded = model(**inputs, decoder_input_ids=inputs["input_ids"][:, :2]).encoder_last_hidden_state
    torch.testing.assert_close(torch.tensor(child["encoded"]), encoded)
    # Beam search with the published generation config (4 beams, alpha 0.6) gives the same tokens and text.
    generated = model.generate(**inputs, num_beams=4, length_penalty=0.6, max_new_tokens=7)
    assert child["generated"] == generated.tolist()
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert child["batched"] == [{"translation_text": text} for text in texts]
    single = tokenizer(SOURCES[2], return_tensors="pt")
    paper = model.generate(
        **single, num_beams=4, length_penalty=0.6, max_new_tokens=single["input_ids"].shape[1] + 50
    )
    assert child["default_length"] == [
        {"translation_text": tokenizer.decode(paper[0], skip_special_tokens=True)}
    ]
    greedy = model.generate(**tokenizer(SOURCES[2], return_tensors="pt"), num_beams=1, max_new_tokens=5)
    assert child["greedy"] == [{"translation_text": tokenizer.decode(greedy[0], skip_special_tokens=True)}]


@pytest.mark.slow
def test_card_usage_example_runs_against_the_folder(published, tmp_path):
    """The card rendered from hub_card.md, its Python blocks run as written, with the repo id pointing at the folder:
    the pipeline, `generate()`, and LoRA through PEFT on the loaded model, where this package is not installed; and
    int8 on the CPU, which takes the package's `use_cpu_kernels`, where it is."""
    card = (published / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.DOTALL)
    assert len(blocks) == 4 and all(json.dumps(REPO_ID) in block for block in blocks[:3])
    int8 = blocks.pop(2)
    assert "import vaswani" in int8 and not any("import vaswani" in block for block in blocks)
    code = "\n".join(blocks[1:2] + [int8]).replace(json.dumps(REPO_ID), repr(str(published)))
    translated = run_child(code, tmp_path, package=True).strip().splitlines()
    assert len(translated) == 2 and translated[1].startswith("['")  # generate() in float32, then in int8
    code = "\n".join(blocks).replace(json.dumps(REPO_ID), repr(str(published)))
    code += "\nprint(sorted({n.split('.')[-3] for n, p in lora.named_parameters() if p.requires_grad}))"
    out = run_child(code, tmp_path)
    printed = out.strip().splitlines()
    assert printed[0].startswith("[{'translation_text': ")
    assert printed[1].startswith("[{'translation_text': ") and printed[1].count("translation_text") == 2
    assert printed[2].startswith("['")
    assert printed[3] == "['lora_A', 'lora_B']"


@pytest.mark.slow
def test_training_with_push_to_hub_publishes_once_with_the_run_results(hub, monkeypatch, tmp_path):
    """`scripts/train.py --push_to_hub --hub_model_id ...`: the Trainer itself pushes nothing; after training, the
    averaged model goes up in one commit whose card carries the test scores and the recipe actually used."""
    import importlib
    import random

    # scripts/ on the path for this test only, with the evaluate package loaded first: scripts/evaluate.py would
    # shadow it, here and in every later test
    importlib.import_module("evaluate")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    train_script = importlib.import_module("train")

    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    rng = random.Random(0)
    words = "ein mann läuft über die straße a man runs across the street".split()
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 60), ("val", 6)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(n)]
        (data / f"{split}.de").write_text("\n".join(lines) + "\n")
        (data / f"{split}.en").write_text("\n".join(line.upper() for line in lines) + "\n")
    out = tmp_path / "run"
    train_script.main([
        "--dataset_name", str(data), "--validation_split", "val", "--test_split", "val", "--vocab_size", "300",
        "--preset", "small", "--d_model", "16", "--encoder_layers", "1", "--decoder_layers", "1",
        "--encoder_attention_heads", "2", "--decoder_attention_heads", "2", "--encoder_ffn_dim", "16",
        "--decoder_ffn_dim", "16", "--max_tokens", "128", "--max_steps", "4", "--save_steps", "2",
        "--eval_strategy", "no", "--average_last", "2", "--plots", "false", "--output_dir", str(out),
        "--push_to_hub", "--hub_model_id", "someone/vaswani-tiny",
    ])  # fmt: skip
    assert [call[0] for call in hub.calls] == ["create_repo", "upload_folder"]
    assert hub.calls[1][1] == "someone/vaswani-tiny" and hub.calls[1][3] == "hf_from_env"
    assert hub.uploaded_files == PUBLISHED_FILES
    card = ModelCard(hub.uploaded_card)
    scores = json.loads((out / "test_results.json").read_text())
    assert card.data.eval_results[0].metric_value == pytest.approx(scores["bleu"], abs=0.01)
    assert "| Steps | 4 |" in hub.uploaded_card


@pytest.mark.parametrize("bleu", ['"high"', "NaN", "250.0"])
def test_results_that_a_card_cannot_state_are_refused(bleu, model_dir, tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text('{"bleu": ' + bleu + ', "bleu_signature": "BLEU|nrefs:1"}')
    argv = ["--model_name_or_path", model_dir, "--dry_run", "--output_dir", tmp_path / "hub"]
    code, _, err = invoke(push_command.main, argv + ["--results_json", results], capsys)
    assert_one_line_error(code, err, "results.json", "'bleu'")
    assert not (tmp_path / "hub").exists()
