"""Import an OPUS-MT (`MarianMTModel`) or fairseq WMT (`FSMTForConditionalGeneration`) model as a vaswani model folder:
the `vaswani-convert` command (`vaswani.convert.main`).

    python scripts/convert.py --model_name_or_path Helsinki-NLP/opus-mt-de-en --output_dir models/opus-mt-de-en
    python scripts/convert.py --model_name_or_path path/to/wmt19-de-en --output_dir models/wmt19-de-en
"""

import sys

from vaswani.convert import main

if __name__ == "__main__":
    sys.exit(main())
