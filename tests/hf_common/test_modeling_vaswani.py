"""transformers' own common model tests (`ModelTesterMixin`, `GenerationTesterMixin`, `ConfigTester`), run against
`VaswaniModel` and `VaswaniForConditionalGeneration` in several shapes of the model.

This module is not collected by the project's own `pytest` run: it imports the mixins from the transformers
repository's `tests/` tree, which `make hf-common` builds with `../shared/tools/hf-common-tests/` (see its README):

    make hf-common MIRROR_ROOT=/work/.mirror            # all shapes
    make hf-common MIRROR_ROOT=/work/.mirror HF_COMMON_ARGS="-k Paper"   # one shape

Each shape is a `VaswaniModelTester` with other config fields; each of the paper's departures is on in at least one.
"""

import tempfile
import unittest

import torch
from tests.generation.test_utils import GenerationTesterMixin
from tests.test_configuration_common import ConfigTester
from tests.test_modeling_common import ModelTesterMixin, ids_tensor
from transformers import PreTrainedModel, is_torch_available
from transformers.models.auto import modeling_auto
from transformers.testing_utils import require_torch, torch_device

import vaswani
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

# The mixins branch on transformers' name tables: register the classes there as `import vaswani` does with the
# Auto classes.
modeling_auto.MODEL_MAPPING_NAMES.setdefault("vaswani", "VaswaniModel")
modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.setdefault(
    "vaswani", "VaswaniForConditionalGeneration"
)
assert vaswani.VaswaniConfig is VaswaniConfig

# `tests/generation/` comes from the transformers snapshot (5.16.0.dev0), whose `PreTrainedModel` declares
# `_is_stateful = False` and whose generation tests read it; later releases (5.25) dropped the attribute. Declare it as
# the snapshot does, so those tests run on the installed release instead of failing on the lookup (Marian, in the
# same tree, fails them alike without it).
if not hasattr(PreTrainedModel, "_is_stateful"):
    PreTrainedModel._is_stateful = False


class VaswaniModelTester:
    """Small random models and inputs. Sizes are odd where they can be, so that no two axes share a size."""

    def __init__(self, parent, batch_size=3, seq_length=7, vocab_size=99, config_overrides=None):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.encoder_seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.vocab_size = vocab_size
        self.hidden_size = 16
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.is_training = True
        self.config_overrides = config_overrides or {}

    def get_config(self):
        return VaswaniConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            dropout=0.1,
            attention_dropout=0.1,
            max_position_embeddings=100,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            **self.config_overrides,
        )

    def prepare_config_and_inputs(self):
        config = self.get_config()
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = config.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], config.decoder_vocab_size).clamp(3)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, :2] = 0  # one padded source row
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": torch.ones_like(decoder_input_ids),
        }
        return config, inputs

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


@require_torch
class VaswaniCommonTests(ModelTesterMixin, GenerationTesterMixin):
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration) if is_torch_available() else ()
    all_generative_model_classes = (VaswaniForConditionalGeneration,)
    is_encoder_decoder = True
    config_overrides: dict = {}

    def setUp(self):
        self.model_tester = VaswaniModelTester(self, config_overrides=self.config_overrides)
        self.config_tester = ConfigTester(
            self,
            config_class=VaswaniConfig,
            d_model=16,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            **self.config_overrides,
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_save_load_strict(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                _, info = model_class.from_pretrained(folder, output_loading_info=True)
            self.assertEqual(info["missing_keys"], set())
            self.assertEqual(info["unexpected_keys"], set())

    def test_cached_decoding_matches_full_forward(self):
        config, inputs = self.model_tester.prepare_config_and_inputs()
        model = VaswaniForConditionalGeneration(config).to(torch_device).eval()
        full = model(**inputs).logits
        prefix = {
            **inputs,
            "decoder_input_ids": inputs["decoder_input_ids"][:, :4],
            "decoder_attention_mask": inputs["decoder_attention_mask"][:, :4],
        }
        out = model(**prefix, use_cache=True)
        step = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            decoder_input_ids=inputs["decoder_input_ids"][:, 4:],
            decoder_attention_mask=inputs["decoder_attention_mask"],
            cache=out.cache,
            use_cache=True,
        ).logits
        torch.testing.assert_close(step, full[:, 4:], atol=1e-4, rtol=1e-4)


class VaswaniPaperModelTest(VaswaniCommonTests, unittest.TestCase):
    """The paper: post-norm, sinusoidal positions, one shared vocabulary, no attention biases."""


class VaswaniPreNormModelTest(VaswaniCommonTests, unittest.TestCase):
    """Pre-norm residual blocks with final LayerNorms."""

    config_overrides = {"normalize_before": True}


class VaswaniLearnedPositionsModelTest(VaswaniCommonTests, unittest.TestCase):
    """Learned absolute positions (Table 3 row E) and biases in the attention projections."""

    config_overrides = {"position_embedding_type": "learned", "attention_bias": True}


class VaswaniSeparateVocabulariesModelTest(VaswaniCommonTests, unittest.TestCase):
    """Separate source and target vocabularies, the target's larger, with a tied target projection.

    Three upstream tests assume one vocabulary: `test_inputs_embeds` and `test_inputs_embeds_matches_input_ids` embed
    the target ids with `get_input_embeddings()` (the source matrix), and `test_resize_embeddings_untied` expects
    `resize_token_embeddings` to resize the output projection with the source vocabulary. They are replaced here by
    the same checks with each side's own matrix (Marian's API: `resize_decoder_token_embeddings` for the target).
    """

    config_overrides = {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 113}

    def _embedded_inputs(self, model, inputs):
        inputs = dict(inputs)
        inputs["inputs_embeds"] = model.get_input_embeddings()(inputs.pop("input_ids"))
        inputs["decoder_inputs_embeds"] = model.get_decoder().embed_tokens(inputs.pop("decoder_input_ids"))
        return inputs

    def test_inputs_embeds(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).to(torch_device).eval()
            with torch.no_grad():
                model(**self._embedded_inputs(model, inputs))

    def test_inputs_embeds_matches_input_ids(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).to(torch_device).eval()
            with torch.no_grad():
                torch.testing.assert_close(
                    model(**self._embedded_inputs(model, inputs))[0], model(**inputs)[0]
                )

    def test_resize_embeddings_untied(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        config.tie_word_embeddings = False
        model = VaswaniForConditionalGeneration(config).to(torch_device).eval()
        source, target = config.vocab_size, config.decoder_vocab_size
        model.resize_token_embeddings(source + 10)
        self.assertEqual(model.get_input_embeddings().weight.shape[0], source + 10)
        self.assertEqual(
            model.get_output_embeddings().weight.shape[0], target
        )  # the target side is untouched
        model.resize_decoder_token_embeddings(target - 15)
        self.assertEqual(model.config.decoder_vocab_size, target - 15)
        self.assertEqual(model.get_output_embeddings().weight.shape[0], target - 15)
        self.assertEqual(model.get_decoder().embed_tokens.weight.shape[0], target - 15)
        inputs["decoder_input_ids"] = inputs["decoder_input_ids"].clamp(max=target - 16)
        self.assertEqual(model(**inputs).logits.shape[-1], target - 15)


class VaswaniMarianLayoutModelTest(VaswaniCommonTests, unittest.TestCase):
    """The layout converted Marian models use: sines before cosines, biases in attention and on the output
    projection, swish, and an output projection of its own over the shared vocabulary."""

    config_overrides = {
        "sinusoid_layout": "concatenated",
        "output_bias": True,
        "activation_function": "swish",
        "attention_bias": True,
        "tie_word_embeddings": False,
    }
