"""Figures of a training run and of a model's attention (Vaswani et al., 2017, Figures 3-5).

- `plot_learning_curves`: training loss, eval loss, eval BLEU and learning rate against the step, from a run's
  `trainer_state.json` (the Trainer's `log_history`).
- `attention_maps` + `plot_attention_maps`: for one sentence pair, the attention weights of every layer and head
  of the encoder self-attention, the decoder (masked) self-attention and the encoder-decoder attention, one PNG
  per kind with a grid of layers x heads and the tokens on the axes, like the paper's Figures 3-5.

Attention weights come from `output_attentions=True`, which needs the eager attention: load the model with
`attn_implementation="eager"` (`load_attention_model` does). Figures are drawn on matplotlib `Figure` objects
without pyplot (`savefig` draws a PNG with the Agg canvas), so nothing here changes the process's matplotlib
backend.
"""

import itertools
import json
import logging
import os
from collections import namedtuple
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..common.fileio import atomic_write
from .averaging import find_checkpoints
from .translation import load_translation_model, translate

logger = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.json"
# Series of `plot_learning_curves`: log_history key -> label.
CURVES = {
    "loss": "training loss (label-smoothed)",
    "eval_loss": "eval loss (cross-entropy)",
    "eval_bleu": "eval BLEU",
    "learning_rate": "learning rate",
}
# The kinds of attention: the title of each one's figure, and the `AttentionMaps` labels of its rows (the queries)
# and columns (the keys).
ATTENTION_KINDS = {
    "encoder": ("Encoder self-attention", "source_tokens", "source_tokens"),
    "decoder": ("Decoder self-attention (masked)", "target_tokens", "target_tokens"),
    "cross": ("Encoder-decoder attention", "target_tokens", "source_tokens"),
}


# ----------------------------------------------------------------------------------------------------------------
# Learning curves
# ----------------------------------------------------------------------------------------------------------------
def find_trainer_state(path):
    """The `trainer_state.json` for a file, a checkpoint folder or a run folder.

    A run folder's own `trainer_state.json` (written by `trainer.save_state()` at the end of training) is preferred;
    otherwise the newest `checkpoint-<step>/trainer_state.json`, whose history is the longest.
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.exists():
        raise FileNotFoundError(f"No run folder at {path} (no such path) to read {TRAINER_STATE_FILE} from")
    for folder in [path, *reversed(find_checkpoints(path))]:
        if (folder / TRAINER_STATE_FILE).is_file():
            return folder / TRAINER_STATE_FILE
    raise FileNotFoundError(f"No {TRAINER_STATE_FILE} in {path} or in its checkpoint-<step> folders")


def learning_curves(log_history):
    """`{key: (steps, values)}` for each key of `CURVES`, from the log entries that have the key and a step."""
    curves = {key: ([], []) for key in CURVES}
    for entry in log_history:
        for key, (steps, values) in curves.items():
            if "step" in entry and isinstance(entry.get(key), (int, float)):
                steps.append(entry["step"])
                values.append(float(entry[key]))
    return curves


def _save(figure, output_path, dpi):
    """Write `figure` as a PNG at `output_path`; returns the path."""
    output_path = Path(output_path)
    with atomic_write(output_path, "wb") as handle:  # a PNG is complete or absent
        figure.savefig(handle, dpi=dpi, format="png")
    logger.info("Wrote %s", output_path)
    return output_path


def plot_learning_curves(log_history_or_path, output_path, title=None):
    """Plot loss (training and eval), eval BLEU and learning rate against the step into one PNG.

    `log_history_or_path`: a `log_history` list, or a run, checkpoint or `trainer_state.json` whose `log_history` is
    read (see `find_trainer_state`). Panels whose series was never logged say so. Returns the PNG's path.
    """
    log_history = log_history_or_path
    if isinstance(log_history_or_path, (str, os.PathLike)):
        title = title or str(log_history_or_path)
        state_file = find_trainer_state(log_history_or_path)
        try:
            log_history = json.loads(state_file.read_text())["log_history"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{state_file} is not a Trainer state with a log_history: {err}") from err
    curves = learning_curves(log_history)
    figure = Figure(figsize=(15, 4.2), layout="constrained")
    panels = {"loss": ("loss", "eval_loss"), "BLEU": ("eval_bleu",), "learning rate": ("learning_rate",)}
    for ax, (ylabel, keys) in zip(figure.subplots(1, 3), panels.items(), strict=True):
        drawn = [key for key in keys if curves[key][0]]
        for key in drawn:
            ax.plot(
                *curves[key], marker="o" if key.startswith("eval_") else None, markersize=3, label=CURVES[key]
            )
        if drawn:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set(xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))  # the learning rate's
    if title:
        figure.suptitle(title)
    return _save(figure, output_path, 120)


# ----------------------------------------------------------------------------------------------------------------
# Attention maps
# ----------------------------------------------------------------------------------------------------------------
# Attention weights of one sentence pair; every row (one query position) sums to 1. `source_tokens` label the
# encoder positions (`</s>` included), `target_tokens` the decoder input positions (`<s>` first: the row of a target
# token is the query that predicts the next one). Shapes: `encoder` (layers, heads, Ts, Ts); `decoder`
# (layers, heads, Tt, Tt), zero above the diagonal; `cross` (layers, heads, Tt, Ts).
AttentionMaps = namedtuple("AttentionMaps", "source_tokens target_tokens encoder decoder cross")


def load_attention_model(model_path, tokenizer_path=None, device=None):
    """`(model, source_tokenizer, target_tokenizer)` with the eager attention that returns attention weights."""
    return load_translation_model(model_path, tokenizer_path, device=device, attn_implementation="eager")


def token_labels(tokenizer, ids):
    """A label per token: the text it adds to the decoded sentence, a space shown as "▁" so that word starts stay
    visible; special tokens as themselves. A token that ends inside a multi-byte character (byte-level BPE) is
    labelled "�", and the character goes to the token that completes it."""
    labels, previous = [], ""
    for i, token_id in enumerate(ids):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        if token_id in tokenizer.all_special_ids:
            labels.append(tokenizer.convert_ids_to_tokens(token_id))
        elif text.endswith("\ufffd"):  # an incomplete character
            labels.append("\ufffd")
        else:
            piece = text[len(previous) :] if text.startswith(previous) else tokenizer.decode([token_id])
            previous = text
            labels.append(piece.replace(" ", "▁") or "▁")  # empty: a space the decoder strips at the start
    return labels


@torch.inference_mode()
def attention_maps(model, source_tokenizer, source, target=None, target_tokenizer=None):
    """The attention weights of `model` on `source` and `target`, the target fed to the decoder (teacher forcing).

    Without `target`, the model's own translation of `source` (§6.1 decoding, `translation.translate`) is used.
    The model must use the eager attention (see `load_attention_model`).
    """
    model.set_attn_implementation("eager")  # transformers' switch; nothing to do for a model that has it
    if model.config._attn_implementation != "eager":
        raise ValueError(
            f"Attention weights need the eager attention, but the model uses "
            f"{model.config._attn_implementation!r} and cannot switch: load it with "
            'from_pretrained(..., attn_implementation="eager") (or use `load_attention_model`).'
        )
    if model.training:
        logger.warning(
            "The model is in training mode: dropout changes the attention weights; call model.eval()"
        )
    target_tokenizer = target_tokenizer or source_tokenizer
    if target is None:
        (target,) = translate([source], model, source_tokenizer, target_tokenizer, show_progress=False)
        logger.info("Plotting the model's translation: %r", target)
    source_ids = source_tokenizer(source)["input_ids"]  # ends with </s>
    labels = torch.tensor([target_tokenizer(target)["input_ids"]], device=model.device)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)  # <s> y_1 ... y_n
    outputs = model(
        input_ids=torch.tensor([source_ids], device=model.device),
        decoder_input_ids=decoder_input_ids,
        output_attentions=True,
        use_cache=False,
    )
    return AttentionMaps(
        token_labels(source_tokenizer, source_ids),
        token_labels(target_tokenizer, decoder_input_ids[0].tolist()),
        # L x (h, Tq, Tk) -> (L, h, Tq, Tk)
        *(
            torch.stack([layer[0] for layer in getattr(outputs, f"{kind}_attentions")]).float().cpu()
            for kind in ATTENTION_KINDS
        ),
    )


def plot_attention_maps(maps, output_dir, prefix="attention", layers=None, heads=None):
    """Write `<prefix>_encoder.png`, `<prefix>_decoder.png` and `<prefix>_cross.png` to `output_dir`: for each kind
    of attention, a grid of heatmaps, a row per layer and a column per head; returns their paths by kind.

    `layers` / `heads` (0-based) restrict the grid, e.g. for the big model's 6 x 16 heads. Colours share one
    scale from 0 to 1.
    """
    layers, heads = layers or range(len(maps.encoder)), heads or range(maps.encoder.shape[1])
    paths = {}
    for kind, (title, rows, columns) in ATTENTION_KINDS.items():
        rows, columns = getattr(maps, rows), getattr(maps, columns)
        cell = min(max(2.5, 0.24 * max(len(rows), len(columns)) + 1.3), 9.0)  # inches: a label per token
        figure = Figure(figsize=(cell * len(heads) + 1.0, cell * len(layers) + 0.6), layout="constrained")
        axes = figure.subplots(len(layers), len(heads), squeeze=False)
        for ax, (layer, head) in zip(axes.flat, itertools.product(layers, heads), strict=True):
            # the weights of (rows, columns)
            image = ax.imshow(
                getattr(maps, kind)[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto"
            )
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
            ax.set_yticks(range(len(rows)), rows, fontsize=7)
        figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
        figure.suptitle(f"{title}: rows attend to columns")
        paths[kind] = _save(figure, Path(output_dir) / f"{prefix}_{kind}.png", 100)
    return paths
