"""A `translation` pipeline for the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

transformers 5 removed its `translation` pipeline. This class takes its place for our models: published folders
name it in `config.custom_pipelines`, so that

    pipeline("translation", model="<repo or folder>", trust_remote_code=True)

builds it from the folder's copy of this file, the way `AutoModel` builds the model from `modeling_vaswani.py`.
In a process where the package is installed, build it directly: `VaswaniTranslationPipeline(model, tokenizer)`.

Decoding is the model's `generate()` with its `generation_config.json` (the paper's beam size 4 and length penalty
0.6, §6.1, and, unless a length is set, at most input length + 50 tokens: `generation_vaswani.generate`); any
generation parameter passed at construction or call time overrides it.

This file is copied into saved model folders, so it imports only torch and transformers.
"""

import torch
from transformers import Pipeline


class VaswaniTranslationPipeline(Pipeline):
    """Translate text: `pipe("Ein Satz.")` returns `[{"translation_text": "A sentence."}]`.

    Inputs are a string or a list of strings (a list returns one dict per string, or one list of dicts per
    string when `num_return_sequences > 1`). `batch_size` batches the inputs through `generate`; `truncation=True`
    cuts sources to the tokenizer's `model_max_length`; `return_tensors=True` returns the generated ids as
    `translation_token_ids` instead of text. Every other keyword (`num_beams`, `max_new_tokens`, ...) goes to
    `model.generate`.
    """

    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _pipeline_calls_generate = True

    def _sanitize_parameters(
        self, truncation=None, return_tensors=None, skip_special_tokens=None, **generate_kwargs
    ):
        postprocess_params = {"return_tensors": return_tensors, "skip_special_tokens": skip_special_tokens}
        return (
            {} if truncation is None else {"truncation": truncation},
            generate_kwargs,
            {key: value for key, value in postprocess_params.items() if value is not None},
        )

    def __call__(self, inputs, **kwargs):
        # a generator or a dataset, as transformers' pipelines take them
        if not isinstance(inputs, (str, list)):
            return super().__call__(inputs, **kwargs)
        # An empty (or all-whitespace) text translates to "" without running the model, as `vaswani.translate`
        # does: a decoder given only `</s>` would otherwise invent a sentence.
        texts = [inputs] if isinstance(inputs, str) else inputs
        blank = [isinstance(text, str) and not text.strip() for text in texts]
        todo = [text for text, is_blank in zip(texts, blank, strict=True) if not is_blank]
        done = iter(super().__call__(todo, **kwargs) if todo else [])
        if kwargs.get("return_tensors"):
            empty = {"translation_token_ids": torch.zeros(0, dtype=torch.long)}
        else:
            empty = {"translation_text": ""}
        empty = [empty] * int(kwargs.get("num_return_sequences") or 1)
        results = [list(empty) if is_blank else next(done) for is_blank in blank]
        results = [result if isinstance(result, list) else [result] for result in results]
        if isinstance(inputs, str):
            return results[0]
        # One translation per input: a list of inputs gives a list of dicts, as transformers 4's pipeline did.
        return [result[0] for result in results] if all(len(result) == 1 for result in results) else results

    def preprocess(self, text, truncation=False):
        if not isinstance(text, str):
            raise TypeError(f"The translation pipeline translates strings, got {type(text).__name__}.")
        return self.tokenizer(text, truncation=truncation, return_tensors="pt")

    def _generate_kwargs_for_call(self, generate_kwargs):
        """The call's generation parameters on top of those given at construction (unless the call passes a whole
        `generation_config`), with the tokenizer's pad id.

        Newer transformers releases keep construction-time parameters in the pipeline's `_generate_kwargs`; older
        ones pass them to `_sanitize_parameters` with the call's. That attribute, read where it exists, is the only
        transformers internal used: this file runs as remote code on the user's release."""
        if "generation_config" not in generate_kwargs:
            generate_kwargs = {**getattr(self, "_generate_kwargs", {}), **generate_kwargs}
        pad_token_id = self.tokenizer.pad_token_id
        return {**({} if pad_token_id is None else {"pad_token_id": pad_token_id}), **generate_kwargs}

    def _forward(self, model_inputs, **generate_kwargs):
        output_ids = self.model.generate(
            input_ids=model_inputs["input_ids"],
            attention_mask=model_inputs["attention_mask"],
            **self._generate_kwargs_for_call(generate_kwargs),
        )
        sequences = output_ids if torch.is_tensor(output_ids) else output_ids.sequences
        # (batch * num_return_sequences, T) -> (batch, num_return_sequences, T), so batches unbatch per input.
        return {"output_ids": sequences.reshape(len(model_inputs["input_ids"]), -1, sequences.shape[-1])}

    def postprocess(self, model_outputs, return_tensors=False, skip_special_tokens=True):
        output_ids = model_outputs["output_ids"][0]  # (num_return_sequences, T)
        if return_tensors:
            return [{"translation_token_ids": ids} for ids in output_ids]
        texts = self.tokenizer.batch_decode(output_ids, skip_special_tokens=skip_special_tokens)
        return [{"translation_text": text} for text in texts]


__all__ = ["VaswaniTranslationPipeline"]
