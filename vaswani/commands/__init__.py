"""The command-line tools, installed as console commands by `pip install` (`[project.scripts]` in pyproject.toml):

| command | module | what it does |
|---|---|---|
| `vaswani-train` | `commands.train` | train with the paper's recipe, average, translate the test split, score (§5, §6.1) |
| `vaswani-train-tokenizer` | `commands.train_tokenizer` | learn the joint BPE vocabulary (§5.1) |
| `vaswani-average-checkpoints` | `commands.average_checkpoints` | average the last N checkpoints (§6.1) |
| `vaswani-translate` | `commands.translate` | beam search with length penalty; n-best lists; interactive (§6.1) |
| `vaswani-evaluate` | `commands.evaluate` | sacreBLEU BLEU and chrF of a translation file |
| `vaswani-plot` | `commands.plot` | learning curves, attention maps |
| `vaswani-push-to-hub` | `commands.push_to_hub` | publish a model folder with its card |
| `vaswani-export` | `commands.export` | export a model folder to CTranslate2 or ONNX |
| `vaswani-convert` | `commands.convert` | import an OPUS-MT (Marian) or fairseq WMT (FSMT) model |

Each is `main(argv=None)` built on `vaswani.commands.cli` (shared flags, arguments files, one-line errors): it parses its flags,
then calls the library (`vaswani.recipe.run`, `vaswani.recipe.finish`, `vaswani.interop.export`, ...). `scripts/*.py` are thin wrappers that
call them, for a clone without installing. `python -m vaswani.commands.train` also works (e.g.
under `torchrun`).
"""

from . import cli  # noqa: F401  (first: it silences other libraries' noise before a tool's imports load them)
