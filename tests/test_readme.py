"""The README's Python example runs as written, and its two commands are the Makefile's."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_example_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["beams"].shape[0] == 1


def test_the_seq2seq_trainer_example_runs_offline(tmp_path, monkeypatch):
    """The fine-tuning example of docs/recipe.md, on a tiny model folder in place of a trained run's: the metric loads without
    the network (transformers' guide's `evaluate.load("sacrebleu")` does not), and evaluation gives BLEU and chrF."""
    from helpers import tiny_tokenizer, tool_model

    text = (ROOT / "docs" / "recipe.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "Seq2SeqTrainer(" in b]
    tokenizer = tiny_tokenizer()
    tool_model(len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert '"runs/de-en/averaged"' in block and "max_steps=100" in block
    block = block.replace('"runs/de-en/averaged"', repr(str(tmp_path / "model"))).replace(
        "max_steps=100", "max_steps=2"
    )
    namespace: dict = {}
    exec(compile(block, "docs/recipe.md", "exec"), namespace)  # noqa: S102
    assert {"eval_bleu", "eval_chrf"} <= set(namespace["metrics"])
    assert namespace["model"].config.dropout == 0.3
    assert (
        json.loads((tmp_path / "runs" / "de-en-tuned" / "checkpoint-2" / "config.json").read_text())[
            "dropout"
        ]
        == 0.3
    )


def test_readme_commands_exist_in_makefile_and_ci():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make run" in readme and "make test" in readme
    assert re.search(r"^run:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    """The README is a front page (about 8 KB) and every page it sends a reader to exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 9 * 1024
    links = re.findall(r"\]\(((?:docs|recipes)/[^)#]+|[A-Z]+\.md)\)", text)
    assert {"docs/model.md", "docs/recipe.md", "docs/interop.md", "docs/ARCHITECTURE.md"} <= set(links)
    for link in links:
        assert (ROOT / link).is_file(), link
    assert len((ROOT / "BENCHMARKS.md").read_text().encode()) <= 16 * 1024


def test_the_documented_commands_translate_the_test_split_the_training_command_reads():
    """README and docs/ told a new user to translate `test.de`, which no data set has: every `--input` of their
    command blocks is the test split of the data their `vaswani-train` command reads, as that folder names it."""
    readme = (ROOT / "README.md").read_text()
    data, split = re.search(r"--dataset_name (\S+)", readme)[1], re.search(r"--test_split (\S+)", readme)[1]
    for page in ("README.md", "docs/recipe.md", "docs/interop.md"):
        commands = " ".join(re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), flags=re.S))
        inputs = re.findall(r"--input (\S+)", commands)
        assert inputs, page
        for path in inputs:
            assert path in (f"{data}/{split}.de.gz", f"{data}/{split}.en.gz"), (page, path)
