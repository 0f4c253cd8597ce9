"""The BPE vocabulary of §5.1: exact round trip, the model's special ids, save/reload, separate vocabularies."""

import gzip
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, tiny_tokenizer, tool_model
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vaswani.recipe.tokenization import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    load_tokenizers,
    lowercases,
    save_tokenizers,
    train_bpe_tokenizer,
    train_separate_tokenizers,
)

REPO = Path(__file__).resolve().parents[1]

_DE = (
    ["Ein Mann", "Eine Frau", "Zwei Hunde", "Ein Mädchen", "Der Junge", "Drei Männer"],
    ["läuft über", "spielt auf", "fährt durch", "schläft vor"],
    ["die Straße.", "einer grünen Wiese.", "den Schnee!", "einem großen Gebäude, oder?"],
)
_EN = (
    ["A man", "A woman", "Two dogs", "A girl", "The boy", "Three men"],
    ["runs across", "plays on", "drives through", "sleeps in front of"],
    ["the street.", "a green meadow.", "the snow!", "a large building, right?"],
)


def corpus(n: int = 96) -> tuple[list[str], list[str]]:
    """`n` German-English-like sentence pairs with umlauts, ß and punctuation."""
    de = [" ".join(words) for words in itertools.product(*_DE)][:n]
    en = [" ".join(words) for words in itertools.product(*_EN)][:n]
    return de, en


@pytest.fixture(scope="module")
def joint_tok() -> PreTrainedTokenizerFast:
    de, en = corpus()
    return train_bpe_tokenizer(iter(de + en), vocab_size=400, min_frequency=2, show_progress=False)


def test_special_tokens_have_the_model_ids(joint_tok):
    assert (joint_tok.pad_token, joint_tok.pad_token_id) == ("<pad>", PAD_ID) == ("<pad>", 0)
    assert (joint_tok.bos_token, joint_tok.bos_token_id) == ("<s>", BOS_ID) == ("<s>", 1)
    assert (joint_tok.eos_token, joint_tok.eos_token_id) == ("</s>", EOS_ID) == ("</s>", 2)
    assert (joint_tok.unk_token, joint_tok.unk_token_id) == ("<unk>", UNK_ID) == ("<unk>", 3)
    assert joint_tok.padding_side == "right"
    assert joint_tok.model_max_length == 1024
    assert 260 < len(joint_tok) <= 400  # specials + 256 bytes + merges, never above vocab_size


@pytest.mark.parametrize(
    "text",
    [
        "Ein Mann fährt über die Straße.",
        "Das Mädchen isst ein Brötchen, oder?",
        "Größe: „1,5 m“ – naïve Café-Öl (ÄÖÜ äöü ß)!",
        "Zwei  Leerzeichen und ein Tab\tdazwischen ",
        " führendes Leerzeichen",
        "a man , a dog .",  # Moses-tokenized text must not be "cleaned up"
        "Ünseen characters: 中文, €, 🙂",
        "",
    ],
)
def test_decode_restores_text_exactly(joint_tok, text):
    ids = joint_tok(text)["input_ids"]
    assert UNK_ID not in ids  # byte-level: nothing is unknown
    assert joint_tok.decode(ids, skip_special_tokens=True) == text


def test_sentence_initial_word_is_the_same_token_as_inside(joint_tok):
    alone = joint_tok("Hunde")["input_ids"][:-1]
    inside = joint_tok("Zwei Hunde")["input_ids"][:-1]
    assert inside[-len(alone) :] == alone
    assert joint_tok.convert_ids_to_tokens(alone)[0].startswith("Ġ")  # the byte-level mark of a leading space


def test_eos_appended_to_sources_and_labels(joint_tok):
    de, en = corpus(6)
    batch = joint_tok(de, text_target=en)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for ids in batch["input_ids"] + batch["labels"]:
        assert ids[-1] == EOS_ID and ids.count(EOS_ID) == 1
        assert BOS_ID not in ids  # the model prepends <s> when shifting labels right
    padded = joint_tok(["Ein Mann", "Zwei Hunde spielen im Schnee!"], padding=True)
    assert padded["input_ids"][0][-1] == PAD_ID
    assert padded["attention_mask"][0][-1] == 0
    assert joint_tok.decode(padded["input_ids"][0], skip_special_tokens=True) == "Ein Mann"


def test_bad_training_inputs_raise(tmp_path):
    de, en = corpus()
    (tmp_path / "train.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    for given in (["Ein Mann fährt."], [tmp_path / "train.de"], tmp_path / "train.de", str(tmp_path / "train.de")):
        with pytest.raises(TypeError, match="an iterator over sentences.*iter"):
            train_bpe_tokenizer(given, 400)  # neither sentences in a list nor file names are learned as text
    with pytest.raises(ValueError, match="too small"):
        train_bpe_tokenizer(iter(["Ein Mann"]), vocab_size=100)


def test_save_and_reload_through_autotokenizer(joint_tok, tmp_path):
    joint_tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    de, en = corpus(12)
    assert reloaded(de, text_target=en, padding=True) == joint_tok(de, text_target=en, padding=True)
    assert reloaded.decode(reloaded(de[3])["input_ids"], skip_special_tokens=True) == de[3]
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id, reloaded.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert (reloaded.padding_side, reloaded.model_max_length) == ("right", 1024)


def test_load_tokenizers_joint_layout_returns_one_object(joint_tok, tmp_path):
    save_tokenizers(joint_tok, joint_tok, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    src_tok, tgt_tok = load_tokenizers(tmp_path)
    assert src_tok is tgt_tok
    assert src_tok("Drei Männer")["input_ids"] == joint_tok("Drei Männer")["input_ids"]


def test_separate_vocabularies(tmp_path):
    de, en = corpus()
    src_tok, tgt_tok = train_separate_tokenizers(
        iter(de),
        iter(en),
        vocab_size=330,
        target_vocab_size=300,
        show_progress=False,
    )
    save_tokenizers(src_tok, tgt_tok, tmp_path)
    assert (len(src_tok), len(tgt_tok)) == (330, 300)
    assert src_tok.get_vocab() != tgt_tok.get_vocab()
    for tok in (src_tok, tgt_tok):
        assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (tmp_path / "source" / "tokenizer.json").is_file() and (
        tmp_path / "target" / "tokenizer.json"
    ).is_file()
    loaded_src, loaded_tgt = load_tokenizers(tmp_path)
    assert loaded_src is not loaded_tgt
    assert loaded_src(de[:5])["input_ids"] == src_tok(de[:5])["input_ids"]
    assert loaded_tgt(en[:5])["input_ids"] == tgt_tok(en[:5])["input_ids"]
    assert loaded_tgt.decode(loaded_tgt(en[7])["input_ids"], skip_special_tokens=True) == en[7]


def test_lowercase_option_encodes_and_decodes_lowercase_and_survives_reload(joint_tok, tmp_path):
    de, en = corpus()
    tok = train_bpe_tokenizer(iter(de + en), vocab_size=400, show_progress=False, lowercase=True)
    assert lowercases(tok) and not lowercases(joint_tok)
    # learned on lowercased text: no merge holds an ASCII capital (the byte alphabet has them as single symbols)
    merged = [token for token in tok.get_vocab() if len(token) > 1 and token not in ("<pad>", "<unk>")]
    assert merged and not any("A" <= ch <= "Z" for token in merged for ch in token)
    assert any("A" <= ch <= "Z" for token in joint_tok.get_vocab() if len(token) > 1 for ch in token)
    for text in (de[3], en[40], "Ein GROSSES Äpfelchen, ÜBER alles!"):
        assert tok(text)["input_ids"] == tok(text.lower())["input_ids"]
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text.lower()
    assert tok.convert_ids_to_tokens(tok("Ein Mann")["input_ids"])[-1] == "</s>"  # special tokens untouched
    save_tokenizers(tok, tok, tmp_path)
    reloaded, _ = load_tokenizers(tmp_path)
    assert lowercases(reloaded) and lowercases(AutoTokenizer.from_pretrained(tmp_path))
    assert reloaded(de[:4])["input_ids"] == tok(de[:4])["input_ids"]
    source, target = train_separate_tokenizers(
        iter(de), iter(en), vocab_size=330, show_progress=False, lowercase=True
    )
    assert lowercases(source) and lowercases(target)


def test_load_tokenizers_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizers(tmp_path)
    # A tokenizer whose special tokens sit at other ids would silently break the model: refuse it.
    vocab = {"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3, "a": 4}
    wrong = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    wrong.save_pretrained(tmp_path / "wrong")
    with pytest.raises(ValueError, match="wrong.*special tokens"):
        load_tokenizers(tmp_path / "wrong")


@pytest.mark.slow
@pytest.mark.parametrize(
    "separate, lowercase",
    [(False, False), (True, False), (False, True)],
    ids=["joint", "separate", "lowercase"],
)
def test_train_tokenizer_script(tmp_path, separate, lowercase):
    de, en = corpus()
    data = tmp_path / "data"
    data.mkdir()
    with gzip.open(data / "train.de.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(de) + "\n")
    (data / "train.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    out = tmp_path / "tok"
    command = [sys.executable, str(REPO / "scripts" / "train_tokenizer.py"), "--source", str(data)]
    command += ["--src_lang", "de", "--tgt_lang", "en", "--vocab_size", "350", "--output_dir", str(out)]
    command += ["--cache_dir", str(tmp_path / "cache")]
    command += ["--separate_vocab", "--target_vocab_size", "320"] if separate else []
    command += ["--lowercase"] if lowercase else []
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    expected = "source 350, target 320 (separate)" if separate else "source 350, target 350 (joint)"
    assert f"Vocabulary size: {expected} from 96 sentence pairs" in result.stderr
    # the flags of the tokenizer tool before they took the names every tool shares: still accepted, with a warning
    assert "--src_lang is deprecated; use --source_lang" in result.stderr
    assert "--source is deprecated; use --dataset_name" in result.stderr
    src_tok, tgt_tok = load_tokenizers(out)
    assert (src_tok is tgt_tok) is not separate
    assert lowercases(src_tok) is lowercases(tgt_tok) is lowercase
    case = str.lower if lowercase else str
    assert src_tok.decode(src_tok(de[5])["input_ids"], skip_special_tokens=True) == case(de[5])
    assert tgt_tok.decode(tgt_tok(en[5])["input_ids"], skip_special_tokens=True) == case(en[5])


@pytest.mark.parametrize("separate", [False, True], ids=["joint", "separate"])
def test_bpe_trains_on_a_random_sample_of_the_pairs_and_says_so(monkeypatch, caplog, separate):
    """`--max_tokenizer_samples N`: the BPE learns from N pairs drawn at random with a fixed seed (both sides), with
    the number of sentences given to the trainer for its progress bar, and a log line saying how many."""
    from datasets import Dataset

    from vaswani.recipe import run
    from vaswani.recipe.arguments import DataArguments
    from vaswani.recipe.data import sample_pairs

    de, en = corpus()
    train = Dataset.from_dict({"de": de, "en": en})
    seen = []

    def spy(batches, *args, **kwargs):
        sentences = [s for batch in batches for s in batch]
        seen.append((sentences, kwargs.get("length", args[5] if len(args) > 5 else None)))
        return train_bpe_tokenizer(iter(sentences), *args, **kwargs)

    monkeypatch.setattr(run, "train_bpe_tokenizer", spy)
    monkeypatch.setattr(
        "vaswani.recipe.tokenization.train_bpe_tokenizer", spy
    )  # what train_separate_tokenizers calls
    args = DataArguments(
        dataset_name="unused", vocab_size=300, max_tokenizer_samples=40, separate_vocabularies=separate
    )
    with caplog.at_level("INFO", logger="vaswani.recipe.run"):
        source, target = run.train_new_tokenizers(args, train, show_progress=False)
    sample = sample_pairs(train, 40)
    sample_de, sample_en = list(sample["de"]), list(sample["en"])
    if separate:
        assert seen == [(sample_de, 40), (sample_en, 40)] and source is not target
    else:
        assert [sorted(s) for s, _ in seen] == [sorted(sample_de + sample_en)] and seen[0][1] == 80
        assert source is target
    assert "on 80 sentences: 40 of the 96 training pairs, drawn at random" in caplog.text
    assert DataArguments(dataset_name="unused").max_tokenizer_samples is None  # default: the whole split


def test_a_torn_tokenizer_is_never_written_and_a_bad_one_is_named(tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from vaswani.recipe.tokenization import load_tokenizers, save_tokenizers

    tokenizer = tiny_tokenizer()
    save_tokenizers(tokenizer, tokenizer, tmp_path / "tokenizer")
    good = (tmp_path / "tokenizer" / "tokenizer.json").read_bytes()
    original = PreTrainedTokenizerFast.save_pretrained

    def killed_while_writing(self, directory, *args, **kwargs):
        original(self, directory, *args, **kwargs)
        written = Path(directory) / "tokenizer.json"
        written.write_bytes(written.read_bytes()[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        save_tokenizers(tokenizer, tokenizer, tmp_path / "tokenizer")
    assert (tmp_path / "tokenizer" / "tokenizer.json").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]
    monkeypatch.undo()

    (tmp_path / "tokenizer" / "tokenizer.json").write_bytes(
        good[: len(good) // 2]
    )  # torn by an older version
    with pytest.raises(ValueError, match=r"tokenizer/tokenizer\.json is corrupt or truncated"):
        load_tokenizers(tmp_path / "tokenizer")


def test_separate_tokenizers_of_two_trainings_are_not_loaded_as_one_pair(tmp_path):
    """`vaswani-train-tokenizer --separate_vocabularies` killed between the renames of source/ and target/ would
    leave one side of the new training beside one of the old: that folder is refused, naming both sides."""
    from vaswani.recipe.tokenization import load_tokenizers, save_tokenizers, train_separate_tokenizers

    sentences = ["ein mann fährt rad", "zwei hunde spielen", "a man rides a bike", "two dogs play"]
    old = train_separate_tokenizers(
        iter(sentences[:2]), iter(sentences[2:]), vocab_size=300, min_frequency=1, show_progress=False
    )
    new = train_separate_tokenizers(
        iter(sentences), iter(sentences), vocab_size=320, min_frequency=1, show_progress=False
    )
    save_tokenizers(*old, tmp_path / "tok")
    save_tokenizers(*new, tmp_path / "new")
    load_tokenizers(tmp_path / "tok")  # a whole pair loads
    for name in (
        "tokenizer.json",
        "vaswani_tokenizer_pair.json",
    ):  # the source side of the new one arrived first
        (tmp_path / "tok" / "source" / name).write_bytes((tmp_path / "new" / "source" / name).read_bytes())
    with pytest.raises(ValueError, match=r"are not one pair of tokenizers"):
        load_tokenizers(tmp_path / "tok")


def test_the_tokenizer_of_a_model_folder_loads_silently(tmp_path):
    """The tokenizer is a plain fast tokenizer: after `import vaswani`, `AutoTokenizer` loads it without a question
    or a warning; where the package is missing, `PreTrainedTokenizerFast` does (AutoTokenizer reads the model's
    config.json first, which is custom code there, so it asks for `trust_remote_code=True` as for any such model)."""
    tokenizer = tiny_tokenizer()
    tool_model(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    expected = tokenizer("Ein Mann fährt Fahrrad.")["input_ids"]
    env = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ROOT,
    }
    for code in (
        "import vaswani; vaswani.register(); from transformers import AutoTokenizer as T",  # README's registration
        "import sys; sys.modules['vaswani'] = None; from transformers import PreTrainedTokenizerFast as T",
        "import sys; sys.modules['vaswani'] = None; from functools import partial; "
        "from transformers import AutoTokenizer; T = type('T', (), {'from_pretrained': staticmethod("
        "partial(AutoTokenizer.from_pretrained, trust_remote_code=True))})",
    ):
        script = (
            f"{code}\nprint(T.from_pretrained({str(tmp_path)!r})('Ein Mann fährt Fahrrad.')['input_ids'])"
        )
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == str(expected)
        assert "Do you wish" not in result.stdout + result.stderr and "model of type" not in result.stderr
