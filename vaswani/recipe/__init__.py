"""The paper's training recipe (Vaswani et al., 2017, §5 and §6.1) around the model, as `vaswani-train` runs it.

| stage | modules |
|---|---|
| the command's flags | `arguments` (data, model, the model's fields, training, and what transformers' and fairseq's flags mean here), `checks` (everything checked before any data is read) |
| data (§5.1) | `data` (parallel text through `datasets`), `tokenization` (joint BPE), `batching` (token-budget batches) |
| training (§5.2–5.4) | `trainer` (`VaswaniTrainer`), `schedule` (warm-up), `losses` (label smoothing), `callbacks`, `distributed`, `checkpoints` (resuming) |
| after training (§6.1) | `averaging`, `translation` (beam search), `model_folders` (a model folder and its languages, checked before loading), `evaluation`, `metrics` (sacreBLEU), `plotting` |
| the run | `run` (raw text to a trained model), `run_folder` (the `--output_dir` a run owns), `summary`, `finish` (average, translate the test split, score, draw, publish) |

The recipe builds on the model (`vaswani.*_vaswani`) and publishes through `vaswani.publishing`; it never imports
`vaswani.commands`.
"""
