"""What the tests share: the tiny model, tokenizer and corpus they run on, and how they run a tool and read
its error. Test modules import from here (`from helpers import tiny_model`), never from each other;
`conftest.py` holds the fixtures built from these. `train_runner.py` beside this file is a script the training
tests run as a process."""

import json
import random
import subprocess
import sys
from pathlib import Path

import torch

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.generation_vaswani import paper_decoding
from vaswani.recipe.tokenization import train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[2]  # the repository
BIN = Path(sys.executable).parent  # the console scripts of the environment the tests run in


# ---- the tiny model ------------------------------------------------------------------------------------------------
def tiny_config(**overrides) -> VaswaniConfig:
    """Odd sizes everywhere and no dropout, so shape and equality bugs cannot hide."""
    fields = dict(
        vocab_size=53,
        d_model=15,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=3,
        decoder_attention_heads=5,
        encoder_ffn_dim=17,
        decoder_ffn_dim=19,
        dropout=0.0,
        max_position_embeddings=64,
    )
    fields.update(overrides)
    return VaswaniConfig(**fields)


# The shapes of the model whose contracts are tested: the paper, and each departure on in at least one of them.
SHAPES = {
    "paper": {},
    "pre-norm": {"normalize_before": True},
    "learned-positions-attention-bias": {"position_embedding_type": "learned", "attention_bias": True},
    "separate-vocabularies": {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 61},
    "marian-layout": {
        "sinusoid_layout": "concatenated",
        "output_bias": True,
        "activation_function": "swish",
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
}


def tiny_model(**overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(tiny_config(**overrides)).eval()


def batch(vocab_size: int = 53, batch_size: int = 3, src_len: int = 7, tgt_len: int = 6, seed: int = 0):
    """Random source/target ids above the special ids, with right padding on the source of later rows."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (batch_size, src_len), generator=g)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch_size):
        attention_mask[row, src_len - row :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = torch.randint(4, vocab_size, (batch_size, tgt_len), generator=g)
    return input_ids, attention_mask, labels


# ---- a model the tools translate with: a tokenizer's vocabulary, the paper's decoding ------------------------------
SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf der Straße.",
    "A man rides a bike.",
    "Two dogs play in the snow.",
    "A woman reads a book in the park.",
    "Children play football in the street.",
]


def tiny_tokenizer(sentences=SENTENCES):
    return train_bpe_tokenizer(iter(sentences), vocab_size=300, min_frequency=1, show_progress=False)


def tool_model(
    vocab_size: int, seed: int = 0, decoder_vocab_size: int | None = None, **overrides
) -> VaswaniForConditionalGeneration:
    """A random tiny model over a tokenizer's vocabulary (or two), with the paper's decoding in its generation
    config, as the recipe trains them: `tiny_config` at even sizes and the default `max_position_embeddings`."""
    fields = dict(
        vocab_size=vocab_size,
        decoder_vocab_size=decoder_vocab_size,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=1024,
    )
    if decoder_vocab_size not in (None, vocab_size):
        fields.update(share_encoder_decoder_embeddings=False)
    torch.manual_seed(seed)
    model = VaswaniForConditionalGeneration(tiny_config(**{**fields, **overrides})).eval()
    paper_decoding(model.generation_config)
    return model


def translation_model(vocab_size: int, seed: int = 4, **overrides) -> VaswaniForConditionalGeneration:
    """A random tiny model whose `</s>` logit is enlarged, so that some beam searches end early and others run
    to the length limit: outputs of different lengths, padded in a batch, as with a trained model (seed 4 gives
    eleven different outputs for the eleven test sentences)."""
    model = tool_model(vocab_size, seed=seed, **overrides)
    with torch.no_grad():
        model.get_output_embeddings().weight[2] *= 1.3
    return model


# ---- running a tool ------------------------------------------------------------------------------------------------
DE = "ein eine mann frau kind hund läuft über die straße wiese spielt ball im park große rote".split()
EN = "a an man woman child dog runs across the street meadow plays ball in park big red".split()
TOKEN = "hf_NotARealToken0123456789abcdef"  # given on the command line: no file a run writes may hold it


def write_corpus(folder: Path) -> Path:
    """120 training and 8 validation pairs of made-up German and English captions, as {split}.{de,en} files."""
    rng = random.Random(1)
    for split, n in (("train", 120), ("val", 8)):
        src, tgt = [], []
        for _ in range(n):
            idx = [rng.randrange(len(DE)) for _ in range(rng.randint(3, 7))]
            src.append(" ".join(DE[i] for i in idx).capitalize() + " .")
            tgt.append(" ".join(EN[i] for i in idx).capitalize() + " .")
        (folder / f"{split}.de").write_text("\n".join(src) + "\n")
        (folder / f"{split}.en").write_text("\n".join(tgt) + "\n")
    return folder


def run_args(corpus, output_dir, *extra):
    """`vaswani-train`'s arguments for a run of a few seconds on `write_corpus`'s files."""
    return [str(arg) for arg in [
        "--dataset_name", corpus, "--validation_split", "val", "--source_lang", "de", "--target_lang", "en",
        "--preset", "small", "--vocab_size", "300", "--d_model", "16", "--encoder_layers", "1",
        "--decoder_layers", "1", "--encoder_attention_heads", "2", "--decoder_attention_heads", "2",
        "--encoder_ffn_dim", "16", "--decoder_ffn_dim", "16", "--max_tokens", "96", "--warmup_steps", "4",
        "--logging_steps", "2", "--eval_strategy", "no", "--plots", "false", "--seed", "3",
        "--output_dir", output_dir, *extra,
    ]]  # fmt: skip


def invoke(main, argv, capsys) -> tuple[int, str, str]:
    """Run a tool's main in this process: (exit status, stdout, stderr)."""
    try:
        main(list(map(str, argv)))
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *expected):
    assert code != 0
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for text in expected:
        assert text in errors[0], errors[0]


def run_script(what: str, tmp_path: Path, *extra: str) -> tuple[str, dict]:
    """`python -m bench <what> --quick` in a process: what it printed, and the JSON result it wrote."""
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", what, "--quick", "--json", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (
        result["machine"]["command"]
        == f"python -m bench {what} --quick --json {out} {' '.join(extra)}".rstrip()
    )
    return done.stdout, result
