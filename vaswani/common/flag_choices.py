"""Values that the tools' flags need when a parser is built (defaults, choices), in a module that imports nothing:
`--help` loads neither torch nor transformers' models for them.

`generation_vaswani` keeps its own copy of the paper's decoding values (the file is copied into every saved model
folder, where it may import only its siblings there); tests/test_imports.py checks that the two agree.
"""

# §6.1: beam size 4 and length penalty alpha 0.6, in the form ((5 + |Y|) / 6) ** alpha that §6.1 cites (GNMT's);
# "power" is transformers' |Y| ** alpha (fairseq's --lenpen).
PAPER_NUM_BEAMS = 4
PAPER_LENGTH_PENALTY = 0.6
PAPER_LENGTH_PENALTY_FORM = "gnmt"
LENGTH_PENALTY_FORMS = (PAPER_LENGTH_PENALTY_FORM, "power")

# The inference engines `vaswani-export` writes for.
ENGINES = ("ctranslate2", "onnx")
# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`, checked by the tests); the three
# precisions offered are float32, int8 and bfloat16.
CTRANSLATE2_QUANTIZATIONS = (
    "float32",
    "int8",
    "bfloat16",
    "float16",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
)
