"""Importing OPUS-MT (`MarianMTModel`) and fairseq WMT (`FSMTForConditionalGeneration`) models: random source models of
several shapes, built here with tiny tokenizers, convert with logits and beam outputs equal to the originals, and the
converted folders translate through the pipeline where the package is not importable."""

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sentencepiece
import torch
import transformers
from packaging.version import Version
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    FSMTConfig,
    FSMTForConditionalGeneration,
    FSMTTokenizer,
    MarianConfig,
    MarianMTModel,
    MarianTokenizer,
    MBartConfig,
)

from vaswani import VaswaniForConditionalGeneration
from vaswani.commands.convert import main
from vaswani.interop.convert import (
    check_parity,
    check_source_config,
    convert,
    convert_model,
    vaswani_config,
)

SOURCE = [
    "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "Der Hund läuft im Park.",
    "Zwei Frauen unterhalten sich auf der Straße.",
    "Ein kleines Mädchen spielt mit einem Ball.",
    "Die Kinder schwimmen im See.",
]
TARGET = [
    "A man rides a bicycle through the city.",
    "The dog runs in the park.",
    "Two women are talking in the street.",
    "A little girl plays with a ball.",
    "The children swim in the lake.",
]


# --------------------------------------------------------------------------------------------------------------------
# Tiny tokenizers, as transformers' own tests build them: a sentencepiece model for Marian, BPE files for FSMT
# --------------------------------------------------------------------------------------------------------------------
def sentencepiece_model(sentences: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences * 4),
        model_writer=model,
        vocab_size=vocab_size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        minloglevel=2,
        num_threads=1,  # the same model on every run
    )
    return model.getvalue()


def marian_vocabulary(spm: bytes, pad_last: bool) -> dict[str, int]:
    """Marian's vocab.json: `</s>` 0, `<unk>` 1, the pieces, and `<pad>` last (OPUS-MT) or at 2."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=spm)
    tokens = ["</s>", "<unk>"] + ([] if pad_last else ["<pad>"])
    tokens += [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    tokens += ["<pad>"] if pad_last else []
    return {token: i for i, token in enumerate(dict.fromkeys(tokens))}


def marian_tokenizer(folder: Path, separate_vocabs: bool) -> MarianTokenizer:
    folder.mkdir(parents=True)
    if separate_vocabs:  # a source and a target sentencepiece model, each with its own vocabulary
        source, target = sentencepiece_model(SOURCE, 40), sentencepiece_model(TARGET, 36)
        (folder / "target_vocab.json").write_text(json.dumps(marian_vocabulary(target, pad_last=False)))
    else:
        source = target = sentencepiece_model(SOURCE + TARGET, 48)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    (folder / "vocab.json").write_text(json.dumps(marian_vocabulary(source, pad_last=not separate_vocabs)))
    settings = {"source_lang": "de", "target_lang": "en", "separate_vocabs": separate_vocabs}
    if separate_vocabs:
        settings["target_vocab_file"] = str(folder / "target_vocab.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return MarianTokenizer.from_pretrained(folder)


def bpe_vocabulary(sentences: list[str], merged: list[str]) -> dict[str, int]:
    """fairseq's dictionary order for the specials, then every character (inside and at the end of a word)."""
    characters = sorted({c for sentence in sentences for c in sentence if not c.isspace()})
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *characters, *(c + "</w>" for c in characters), *merged]
    return {token: i for i, token in enumerate(dict.fromkeys(tokens))}


def fsmt_tokenizer(folder: Path) -> FSMTTokenizer:
    folder.mkdir(parents=True)
    (folder / "vocab-src.json").write_text(json.dumps(bpe_vocabulary(SOURCE, ["ei", "er</w>", "ch"])))
    (folder / "vocab-tgt.json").write_text(json.dumps(bpe_vocabulary(TARGET, ["th", "the</w>", "in"])))
    (folder / "merges.txt").write_text("t h\nth e</w>\ni n\ne i\ne r</w>\nc h\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"langs": ["de", "en"]}))
    return FSMTTokenizer.from_pretrained(folder)


# --------------------------------------------------------------------------------------------------------------------
# Random source models of several shapes
# --------------------------------------------------------------------------------------------------------------------
def teach_copying(model, steps: int, seed: int = 0, train_positions: bool = False) -> None:
    """Train a random source model briefly to copy its source: beam search then has real choices (of tokens and of
    lengths) to make, where an untrained model repeats one token until the length limit. FSMT's position tables are
    parameters; they stay the sinusoids unless `train_positions`."""
    config = model.config
    for name, parameter in model.named_parameters():
        if "embed_positions" in name:
            parameter.requires_grad_(train_positions)
    fsmt = config.model_type == "fsmt"
    vocab_size = min(config.src_vocab_size, config.tgt_vocab_size) if fsmt else config.decoder_vocab_size
    special = {config.pad_token_id, config.eos_token_id, config.decoder_start_token_id, config.bos_token_id}
    tokens = torch.tensor([i for i in range(3, vocab_size) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(steps):
        lengths = torch.randint(2, 9, (16, 1), generator=generator)
        positions = torch.arange(10)[None]
        ids = tokens[torch.randint(len(tokens), (16, 10), generator=generator)]
        ids = ids.where(positions < lengths, config.pad_token_id).where(
            positions != lengths, config.eos_token_id
        )
        attention_mask = (positions <= lengths).long()
        decoder_input_ids = torch.cat([torch.full((16, 1), config.decoder_start_token_id), ids[:, :-1]], 1)
        logits = model(
            input_ids=ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False
        ).logits
        labels = ids.masked_fill(attention_mask == 0, -100)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


SIZES = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=4,
    encoder_ffn_dim=20,
    decoder_ffn_dim=24,
    d_model=16,
    dropout=0.0,
    max_position_embeddings=128,
)
# name -> (family, separate vocabularies, config overrides)
CASES = {
    "marian-shared-swish": ("marian", False, dict(activation_function="swish", scale_embedding=True)),
    "marian-separate-gelu": (
        "marian",
        True,
        dict(
            share_encoder_decoder_embeddings=False,
            activation_function="gelu",
            d_model=24,
            encoder_layers=1,
            decoder_layers=3,
            encoder_attention_heads=3,
            decoder_attention_heads=2,
        ),
    ),
    # shared vocabulary, untied: transformers 5 then ties nothing, so three matrices (and odd widths)
    "marian-untied-relu-odd": (
        "marian",
        False,
        dict(
            tie_word_embeddings=False,
            activation_function="relu",
            d_model=15,
            encoder_attention_heads=3,
            decoder_attention_heads=5,
            encoder_ffn_dim=17,
        ),
    ),
    "fsmt-separate-relu": ("fsmt", True, dict()),
    # fine-tuning moves FSMT's position tables: they become learned positions
    "fsmt-learned-positions": ("fsmt", False, dict(encoder_layers=1, max_position_embeddings=40)),
    "fsmt-tied-gelu": (
        "fsmt",
        False,
        dict(
            tie_word_embeddings=True,
            activation_function="gelu",
            scale_embedding=False,
            d_model=20,
            encoder_attention_heads=5,
            decoder_attention_heads=4,
            decoder_layers=3,
        ),
    ),
}


def source_model(name: str, folder: Path, steps: int = 150):
    """Write a source model of case `name`, random and taught to copy for `steps` steps, with its tokenizer into
    `folder`; returns (model, tokenizer)."""
    family, separate, overrides = CASES[name]
    torch.manual_seed(len(name))  # the same weights on every run, whatever ran before
    if family == "marian":
        tokenizer = marian_tokenizer(folder, separate_vocabs=separate)
        config = MarianConfig(
            vocab_size=len(tokenizer.encoder),
            decoder_vocab_size=len(tokenizer.target_encoder) if separate else None,
            pad_token_id=tokenizer.pad_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            forced_eos_token_id=tokenizer.eos_token_id,
            **{**SIZES, **overrides},
        )
        model = MarianMTModel(config)
        model.generation_config.bad_words_ids = [[config.pad_token_id]]  # as OPUS-MT's generation configs say
        model.generation_config.num_beams = 4
    else:
        tokenizer = fsmt_tokenizer(folder)
        src, tgt = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
        config = FSMTConfig(
            langs=["de", "en"],
            src_vocab_size=src,
            tgt_vocab_size=tgt if separate else src,
            **{**SIZES, **overrides},
        )
        model = FSMTForConditionalGeneration(config)
    teach_copying(model, steps, seed=len(name), train_positions=name == "fsmt-learned-positions")
    model.save_pretrained(folder)
    return model.eval(), tokenizer


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is faster, and steady on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(one_thread, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """case -> (source folder, converted folder); the first case converts through the command line."""
    root = tmp_path_factory.mktemp("convert")
    result = {}
    for i, name in enumerate(CASES):
        source, output = root / name, root / f"{name}-vaswani"
        source_model(name, source)
        if i == 0:
            main(["--model_name_or_path", str(source), "--output_dir", str(output)])
        else:
            convert(source, output)
        result[name] = source, output
    return result


# FSMT's generate() computes its model from transformers 5.18 on. Before, `FSMTDecoder.forward`
# (models/fsmt/modeling_fsmt.py) embeds the positions of the one new token that a cached generate() passes, so every
# step is at the first position (5.18 adds the cache's length); without a cache, `FSMTModel.forward` makes no causal
# mask (only from `input_ids`, which generate() does not pass). There, FSMT's forward is the reference.
FSMT_GENERATES_ITS_MODEL = Version(transformers.__version__) >= Version("5.18.0")


def generates_its_model(name: str) -> bool:
    return CASES[name][0] == "marian" or FSMT_GENERATES_ITS_MODEL


def beams(config, num_beams: int) -> int:
    """`num_beams`, or greedy search where the source model cannot beam search over a target vocabulary of another
    size: transformers' own beam search before 5.18 sizes beams by `config.vocab_size` (Marian's fails with a reshape
    error; ours runs its own loop)."""
    old = Version(transformers.__version__) < Version("5.18.0")
    return 1 if old and config.vocab_size != config.decoder_vocab_size else num_beams


def load_pair(folders, name):
    source_dir, output = folders[name]
    source = AutoModelForSeq2SeqLM.from_pretrained(source_dir).eval()
    converted = AutoModelForSeq2SeqLM.from_pretrained(
        output
    ).eval()  # in-process: `import vaswani` registered it
    return source, converted


def right_padded_batch(config, pad: int):
    """Three sources and decoder prefixes of ordinary tokens, right-padded to different lengths."""
    generator = torch.Generator().manual_seed(0)
    low = 4
    input_ids = torch.randint(low, config.vocab_size - 1, (3, 9), generator=generator)
    decoder_input_ids = torch.randint(low, config.decoder_vocab_size - 1, (3, 7), generator=generator)
    input_ids[input_ids == pad] = low
    decoder_input_ids[decoder_input_ids == pad] = low
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    attention_mask, decoder_mask = torch.ones_like(input_ids), torch.ones_like(decoder_input_ids)
    for row, (source_pad, target_pad) in enumerate([(0, 0), (3, 2), (5, 4)]):
        attention_mask[row, input_ids.shape[1] - source_pad :] = 0
        decoder_mask[row, decoder_input_ids.shape[1] - target_pad :] = 0
    input_ids[attention_mask == 0] = pad
    input_ids[torch.arange(3), attention_mask.sum(1) - 1] = config.eos_token_id
    decoder_input_ids[decoder_mask == 0] = pad
    return input_ids, attention_mask, decoder_input_ids, decoder_mask


# --------------------------------------------------------------------------------------------------------------------
# Parity
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASES)
def test_converted_logits_equal_the_source_logits_at_real_positions(folders, name):
    source, converted = load_pair(folders, name)
    assert isinstance(converted, VaswaniForConditionalGeneration)
    pad = converted.config.pad_token_id
    input_ids, attention_mask, decoder_input_ids, decoder_mask = right_padded_batch(converted.config, pad)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():
        expected = source(
            **inputs, use_cache=False
        ).logits  # FSMT applies its causal mask only without a cache
        actual = converted(**inputs).logits
    real = decoder_mask.bool()
    assert expected.abs()[real].max() > 1.0  # the random model's logits are far from uniform
    assert (expected[real] - actual[real]).abs().max() <= 1e-5


# Each model's own generation config (FSMT's: 5 beams; Marian's here: 4 beams, no pad), several returned beams, and a
# strong length penalty applied to every finished hypothesis (`early_stopping="never"`), where its form decides.
BEAM_SETTINGS = (
    dict(max_new_tokens=16),
    dict(num_beams=3, length_penalty=0.6, num_return_sequences=2, max_new_tokens=12),
    dict(num_beams=4, length_penalty=2.0, early_stopping="never", max_new_tokens=16),
)


@pytest.mark.parametrize("name", CASES)
def test_beam_search_gives_the_source_models_outputs_and_scores(folders, name):
    source, converted = load_pair(folders, name)
    input_ids, attention_mask, _, _ = right_padded_batch(converted.config, converted.config.pad_token_id)
    if not generates_its_model(name):  # the source's forward is the reference: greedy takes its argmax
        with torch.no_grad():
            ids = converted.generate(input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=16)
            inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=ids[:, :-1])
            argmax = source(**inputs, use_cache=False).logits.argmax(-1)
        chosen, eos = ids[:, 1:], ids[:, 1:] == converted.config.eos_token_id
        real = eos.cumsum(1) - eos.long() == 0  # up to each row's end of sentence
        real[:, 15:] = False  # the 16th token is FSMT's forced_eos_token_id, not an argmax
        assert real.sum() > 2 * len(ids) and torch.equal(argmax[real], chosen[real])
        return
    if beams(converted.config, 2) == 1:  # the source cannot beam search over these vocabularies here; ours can
        assert converted.generate(input_ids, attention_mask=attention_mask).shape[0] == len(input_ids)
        greedy = dict(attention_mask=attention_mask, num_beams=1, max_new_tokens=16)
        with torch.no_grad():
            expected = source.generate(input_ids, **greedy)
            assert torch.equal(converted.generate(input_ids, **greedy), expected)
        return
    lengths = set()
    for settings in BEAM_SETTINGS:
        kwargs = dict(
            attention_mask=attention_mask, return_dict_in_generate=True, output_scores=True, **settings
        )
        with torch.no_grad():
            expected = source.generate(input_ids, **kwargs)
            actual = converted.generate(input_ids, **kwargs)
        assert torch.equal(actual.sequences, expected.sequences), settings
        torch.testing.assert_close(actual.sequences_scores, expected.sequences_scores, rtol=0, atol=1e-5)
        rows = expected.sequences.tolist()
        assert len({tuple(row) for row in rows}) > 1  # not one degenerate output for every source
        lengths |= {row.index(converted.config.eos_token_id, 1) for row in rows}
    assert len(lengths) > 1  # hypotheses end at different lengths, so the length penalty has choices to make


def test_the_paper_length_penalty_form_would_change_the_outputs(folders):
    """The converted models decode with transformers' |Y|^alpha, as their sources do; the paper's form would choose
    other hypotheses, so the test above can tell the two apart."""
    for name in filter(generates_its_model, CASES):
        source, converted = load_pair(folders, name)
        assert converted.generation_config.length_penalty_form == "power"
        input_ids, attention_mask, _, _ = right_padded_batch(converted.config, converted.config.pad_token_id)
        settings = dict(attention_mask=attention_mask, **BEAM_SETTINGS[-1])
        settings["num_beams"] = beams(converted.config, settings["num_beams"])
        if settings["num_beams"] == 1:
            continue  # greedy search has no length penalty to compare (`beams`: transformers < 5.18)
        with torch.no_grad():
            paper = converted.generate(input_ids, length_penalty_form="gnmt", **settings)
            assert not torch.equal(paper, source.generate(input_ids, **settings)), name


def test_generation_settings_travel_with_the_model(folders):
    for name in CASES:
        source, converted = load_pair(folders, name)
        expected, actual = source.generation_config.to_diff_dict(), converted.generation_config.to_diff_dict()
        assert actual.pop("length_penalty_form") == "power"
        for key in ("transformers_version", "_from_model_config"):
            actual.pop(key), expected.pop(key)
        assert actual == expected
    assert source.generation_config.num_beams == 5 and source.generation_config.max_length == 200  # FSMT's
    marian = load_pair(folders, "marian-shared-swish")[1]
    assert marian.generation_config.bad_words_ids == [[marian.config.pad_token_id]]


def test_each_departure_from_the_paper_is_a_config_field(folders):
    configs = {name: load_pair(folders, name)[1].config for name in CASES}
    for name, config in configs.items():
        family = CASES[name][0]
        assert (
            config.sinusoid_layout == "concatenated" and config.attention_bias and not config.normalize_before
        )
        learned = name == "fsmt-learned-positions"
        assert config.position_embedding_type == ("learned" if learned else "sinusoidal")
        if family == "marian":
            assert (config.sinusoid_frequencies, config.position_offset, config.output_bias) == (
                "paper",
                0,
                True,
            )
        else:
            assert (config.sinusoid_frequencies, config.position_offset, config.output_bias) == (
                "fairseq",
                2,
                False,
            )
    assert configs["marian-shared-swish"].activation_function == "swish"
    flags = {name: (c.share_encoder_decoder_embeddings, c.tie_word_embeddings) for name, c in configs.items()}
    assert flags == {
        "marian-shared-swish": (True, True),
        "marian-separate-gelu": (False, True),
        "marian-untied-relu-odd": (False, False),
        "fsmt-separate-relu": (False, False),
        "fsmt-learned-positions": (False, False),
        "fsmt-tied-gelu": (True, True),
    }
    assert (
        configs["fsmt-learned-positions"].max_position_embeddings == 40
    )  # FSMT's table: 40 + padding_idx + 1
    assert configs["marian-separate-gelu"].decoder_vocab_size != configs["marian-separate-gelu"].vocab_size
    assert configs["fsmt-separate-relu"].decoder_vocab_size != configs["fsmt-separate-relu"].vocab_size
    assert configs["fsmt-tied-gelu"].scale_embedding is False


# --------------------------------------------------------------------------------------------------------------------
# The folder: tokenizer, pipeline, a fresh interpreter without the package
# --------------------------------------------------------------------------------------------------------------------
def test_the_folder_carries_the_source_tokenizer(folders):
    _, marian = folders["marian-separate-gelu"]
    _, fsmt = folders["fsmt-separate-relu"]
    assert {"source.spm", "target.spm", "vocab.json", "target_vocab.json", "tokenizer_config.json"} <= {
        p.name for p in marian.iterdir()
    }
    assert {"vocab-src.json", "vocab-tgt.json", "merges.txt"} <= {p.name for p in fsmt.iterdir()}
    for folder, cls in ((marian, MarianTokenizer), (fsmt, FSMTTokenizer)):
        source_tokenizer = AutoTokenizer.from_pretrained(folders_source(folders, folder))
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert type(tokenizer) is cls
        assert tokenizer(SOURCE).input_ids == source_tokenizer(SOURCE).input_ids
    config = json.loads((marian / "config.json").read_text())
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.VaswaniTranslationPipeline"
    assert (marian / "pipeline_vaswani.py").is_file() and (marian / "model.safetensors").is_file()


def folders_source(folders, output: Path) -> Path:
    return next(source for source, out in folders.values() if out == output)


CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["vaswani"] = None  # the package must not be importable here
    try:
        import vaswani  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("vaswani is importable")
    from transformers import AutoModelForSeq2SeqLM, pipeline

    sentences, settings, folders = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
    out = {}
    for folder in folders:
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        translator = pipeline("translation", model=folder, trust_remote_code=True, device="cpu")
        out[folder] = [r["translation_text"] for r in translator(sentences, **settings)]
    print(json.dumps(out))
    """
)


def test_converted_folders_translate_through_the_pipeline_without_the_package(folders, tmp_path):
    two_vocabularies = ("marian-separate-gelu", "fsmt-separate-relu")
    names = list(filter(generates_its_model, two_vocabularies))
    settings = dict(num_beams=beams(load_pair(folders, names[0])[1].config, 4), max_new_tokens=12)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    outputs = [str(folders[name][1]) for name in names]
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(SOURCE[:3]), json.dumps(settings), *outputs],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
        | ({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    translations = json.loads(result.stdout.strip().splitlines()[-1])
    for name, output in zip(names, outputs, strict=True):
        source_dir = folders[name][0]
        source = AutoModelForSeq2SeqLM.from_pretrained(source_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(source_dir)
        expected = []
        for sentence in SOURCE[:3]:
            with torch.no_grad():
                ids = source.generate(**tokenizer(sentence, return_tensors="pt"), **settings)
            expected.append(tokenizer.decode(ids[0], skip_special_tokens=True))
        assert translations[output] == expected
        assert any(expected)  # the random models produce text, not only special tokens


# --------------------------------------------------------------------------------------------------------------------
# What is refused
# --------------------------------------------------------------------------------------------------------------------
def marian_config(**overrides) -> MarianConfig:
    return MarianConfig(
        vocab_size=40, pad_token_id=39, decoder_start_token_id=39, eos_token_id=0, **overrides
    )


@pytest.mark.parametrize(
    "config, message",
    [
        (MBartConfig(vocab_size=40), "model_type 'mbart' cannot be converted"),
        (marian_config(architectures=["MarianForCausalLM"]), "architectures ['MarianForCausalLM']"),
        (marian_config(normalize_before=True), "normalize_before=True is not supported"),
        (marian_config(normalize_embedding=True), "normalize_embedding=True"),
        (marian_config(add_final_layer_norm=True), "add_final_layer_norm=True"),
        (marian_config(static_position_embeddings=False), "static_position_embeddings=False"),
        (marian_config(add_bias_logits=True), "add_bias_logits=True"),
        (marian_config(activation_function="gelu_fast"), "activation_function='gelu_fast' is not supported"),
        (FSMTConfig(langs=["de", "en"], d_model=15, encoder_attention_heads=3), "d_model=15 is odd"),
    ],
)
def test_variants_that_cannot_be_represented_are_refused_naming_what_differs(config, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        check_source_config(config)


def test_layerdrop_is_dropped_with_a_warning(caplog):
    config = marian_config(encoder_layerdrop=0.1)
    with caplog.at_level("WARNING", logger="vaswani.interop.convert"):
        converted = vaswani_config(config, share_embeddings=True, tie_output=True)
    assert "encoder_layerdrop=0.1 is dropped" in caplog.text
    assert converted.vocab_size == 40 and converted.output_bias


def edit_weights(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    weights = load_file(path)
    edit(weights)
    save_file(weights, path, metadata={"format": "pt"})


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda w: w.pop("model.encoder.layers.0.fc1.bias"),
            "do not match its config.json: missing model.encoder.layers.0.fc1.bias",
        ),
        (
            lambda w: w.update({"model.encoder.layernorm_embedding.weight": torch.ones(16)}),
            "do not match its config.json: unexpected model.encoder.layernorm_embedding.weight",
        ),
    ],
)
def test_checkpoints_with_weights_missing_or_left_over_are_refused(tmp_path, edit, message):
    source = tmp_path / "source"
    source_model("fsmt-separate-relu", source, steps=0)
    edit_weights(source, edit)
    with pytest.raises(ValueError, match=message):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_source_config_with_a_mistyped_key_is_refused_by_the_weights_it_leaves_out(tmp_path, capsys):
    """A config whose "decoder_layers" is mistyped falls back to the default of 6 layers: the command names the key the
    model does not know and the weights that would be made up, and writes nothing."""
    source = tmp_path / "source"
    source_model("fsmt-separate-relu", source, steps=0)
    config = json.loads((source / "config.json").read_text())
    config["decoder_layer"] = config.pop("decoder_layers")
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", str(source), "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "has keys the model does not know, which it ignores: decoder_layer" in err
    assert f"error: The weights of {source} do not match its config.json: missing model.decoder.layers." in err
    assert not (tmp_path / "out").exists()


def test_a_source_module_the_vaswani_model_lacks_is_refused_not_dropped():
    """A weight the converter has no place for (a future or patched Marian with an embedding LayerNorm) stops it."""
    source = MarianMTModel(
        marian_config(d_model=16, encoder_attention_heads=2, decoder_attention_heads=2)
    ).eval()
    source.model.encoder.layernorm_embedding = torch.nn.LayerNorm(16)
    with pytest.raises(
        ValueError,
        match="^source weights with no place in the vaswani model: "
        "model.encoder.layernorm_embedding.bias, model.encoder.layernorm_embedding.weight$",
    ):
        convert_model(source)


def test_a_conversion_whose_logits_differ_from_the_source_is_refused():
    source = MarianMTModel(
        marian_config(d_model=16, encoder_attention_heads=2, decoder_attention_heads=2)
    ).eval()
    converted = convert_model(source)
    assert check_parity(source, converted) <= 1e-5
    with torch.no_grad():
        converted.lm_head.bias[5] += 0.01
    with pytest.raises(
        ValueError, match=r"^the converted model's logits differ from the source's by [0-9.e-]+ "
    ):
        check_parity(source, converted)


def test_the_command_line_names_the_problem_on_one_line_and_keeps_an_existing_folder(
    folders, tmp_path, capsys
):
    source, output = folders["fsmt-tied-gelu"]
    before = sorted(p.name for p in output.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        main(["--model_name_or_path", str(source), "--output_dir", str(output)])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and "\n" not in error
    assert (
        error
        == f"vaswani-convert: error: {output} exists and is not empty: pass --overwrite_output_dir to replace it"
    )
    assert sorted(p.name for p in output.iterdir()) == before
    (tmp_path / "config.json").write_text(json.dumps(marian_config(normalize_before=True).to_dict()))
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "out")])
    assert "error: normalize_before=True is not supported" in capsys.readouterr().err
    with pytest.raises(ValueError, match="normalize_before"):
        main(["--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "out"), "--debug"])
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "out")])
    missing = tmp_path / "missing"
    assert (
        capsys.readouterr().err
        == f"vaswani-convert: error: No model folder at {missing}: no such path (and '{missing}' is not a Hub "
        "model id 'namespace/name')\n"
    )
    assert not (tmp_path / "out").exists()


def test_overwrite_output_dir_replaces_a_converted_folder(folders, tmp_path):
    source, _ = folders["fsmt-separate-relu"]
    output = tmp_path / "out"
    output.mkdir()
    (output / "stale.txt").write_text("old")
    convert(source, output, overwrite_output_dir=True)
    assert not (output / "stale.txt").exists() and (output / "model.safetensors").is_file()


def test_the_recipes_tools_translate_a_converted_folder(folders, tmp_path):
    """`vaswani-translate` (and everything else that loads tokenizers with `vaswani.recipe.tokenization`) takes a converted
    folder: its own tokenizer encodes the source and decodes the target, as the source model's generate() does."""
    from vaswani.commands.translate import main as translate_main

    for name in filter(generates_its_model, ("marian-separate-gelu", "fsmt-separate-relu")):
        source_dir, converted = folders[name]
        source, model = load_pair(folders, name)
        num_beams = beams(model.config, 2)
        tokenizer = AutoTokenizer.from_pretrained(source_dir)
        inputs = tmp_path / f"{name}.txt"
        inputs.write_text("\n".join(SOURCE) + "\n")
        ours = translate_main(
            [
                "--model_name_or_path",
                str(converted),
                "--input",
                str(inputs),
                "--output",
                str(tmp_path / "hyp"),
                "--length_penalty_form",
                "power",
                "--num_beams",
                str(num_beams),
                "--max_new_tokens",
                "8",
                "--no_progress",
            ]
        )
        with torch.no_grad():
            ids = source.generate(
                **tokenizer(SOURCE, return_tensors="pt", padding=True),
                num_beams=num_beams,
                max_new_tokens=8,
            )  # the source's own length penalty, which the converted generation config keeps
        assert ours == [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


@pytest.fixture(scope="module")
def converted_marian(tmp_path_factory):
    """A small Marian model (sentencepiece vocabulary, no beginning-of-sentence id, a generation config without a
    length penalty), taught to copy, and its `vaswani-convert` folder."""
    from vaswani.interop.convert import convert

    root = tmp_path_factory.mktemp("marian")
    name = next(name for name, case in CASES.items() if case[0] == "marian")
    source_model(name, root / "marian", steps=40)
    convert(root / "marian", root / "converted")
    return root / "marian", root / "converted"


@pytest.mark.parametrize("engine", ["ctranslate2", "onnx"])
def test_a_converted_marian_model_exports_and_translates_as_pytorch_does(converted_marian, tmp_path, engine):
    """CTranslate2 needs a beginning-of-sentence token the Marian config lacks (the decoder start serves), and a
    generation config without a length penalty decodes with transformers' default, 1.0."""
    from vaswani.interop.engines import load_exported
    from vaswani.interop.engines import translate as translate_exported
    from vaswani.interop.export import export
    from vaswani.recipe.translation import load_translation_model, translate

    _, converted = converted_marian
    export(converted, tmp_path / engine, engine)
    model, source, target = load_translation_model(converted)
    sentences = ["▁a b c d", "c d e", "b a"]
    expected = translate(sentences, model, source, target, show_progress=False)
    loaded, source, target = load_exported(tmp_path / engine)
    assert translate_exported(sentences, loaded, source, target, show_progress=False) == expected


def test_exporting_an_unconverted_marian_folder_names_the_fix(converted_marian, tmp_path):
    from vaswani.interop.export import export

    marian, _ = converted_marian
    with pytest.raises(ValueError, match=r"holds a 'marian' model, not a vaswani one: convert it first"):
        export(marian, tmp_path / "out", "ctranslate2")
    assert not (tmp_path / "out").exists()


def test_a_failed_export_leaves_the_earlier_export_whole_and_no_folder_behind(
    converted_marian, tmp_path, monkeypatch
):
    """Built beside its destination: a failure (here the exporter raises half-way) leaves the earlier export as it
    was, and a first export that fails leaves nothing, so a retry is not refused."""
    from vaswani.interop.export import export, to_onnx

    _, converted = converted_marian
    out = tmp_path / "onnx"
    export(converted, out, "onnx")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def broken(model, output_dir):
        (output_dir / to_onnx.ENCODER_FILE).write_bytes(b"half")
        raise RuntimeError("killed half-way")

    monkeypatch.setattr(to_onnx, "export_graphs", broken)
    with pytest.raises(RuntimeError, match="half-way"):
        export(converted, out, "onnx", force=True)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(RuntimeError, match="half-way"):
        export(converted, tmp_path / "first", "onnx")
    assert not (tmp_path / "first").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["onnx"]  # no temporary folder left
