#!/usr/bin/env python
"""`vaswani-convert` from a clone: see `vaswani.commands.convert` (or `python scripts/convert.py --help`).

python scripts/convert.py --model_name_or_path Helsinki-NLP/opus-mt-de-en --output_dir models/opus-mt-de-en
python scripts/convert.py --model_name_or_path path/to/wmt19-de-en --output_dir models/wmt19-de-en
"""

from vaswani.commands.convert import main

if __name__ == "__main__":
    main()
