"""The model in other engines and from other models.

- `export`: a model folder to CTranslate2 (`to_ctranslate2`) or ONNX (`to_onnx`), with the tokenizers and the
  decoding settings (`vaswani-export`);
- `engines`: translation with an exported folder, the same decoding as the PyTorch model
  (`vaswani-translate --engine`);
- `convert`: an OPUS-MT (Marian) or fairseq WMT (FSMT) model as a `vaswani` folder (`vaswani-convert`).
"""
