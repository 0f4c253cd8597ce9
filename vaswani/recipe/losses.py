"""The training loss of §5.4, label-smoothed cross-entropy, as `VaswaniTrainer` computes it: from the model's logits
(`label_smoothed_loss`, a `compute_loss_func`) or with the output projection inside the loss, without the logits
(`fused_output_loss`)."""

import torch

from ..kernels import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy


def label_smoothed_loss(outputs, labels, num_items_in_batch=None, epsilon=0.1):
    """The training loss of §5.4 as a `compute_loss_func`: label-smoothed cross-entropy of the model's logits against
    `labels` (-100 ignored), the mean over target tokens or the sum divided by `num_items_in_batch` (all target tokens
    of a gradient-accumulation step)."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    total = label_smoothed_cross_entropy(logits, labels, epsilon)
    return _per_target_token(total, labels, num_items_in_batch)


def fused_output_loss(model, inputs, epsilon, num_items_in_batch=None):
    """`label_smoothed_loss(model(**inputs without labels), labels, ...)` without the logits: the decoder's last
    hidden states (`model.base_model`) and the output projection's weights go to
    `kernels.linear_label_smoothed_cross_entropy`, which never holds the (tokens, V) logits. The mean over
    target tokens, or the sum divided by `num_items_in_batch`."""
    inputs = dict(inputs)
    labels = inputs.pop("labels")
    if inputs.get("decoder_input_ids") is None and inputs.get("decoder_inputs_embeds") is None:
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels)
    hidden = model.base_model(**inputs, use_cache=False).last_hidden_state
    head = model.get_output_embeddings()
    total = linear_label_smoothed_cross_entropy(hidden, head.weight, head.bias, labels, epsilon)
    return _per_target_token(total, labels, num_items_in_batch)


def _per_target_token(total, labels, num_items_in_batch=None):
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum().clamp(min=1)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch
