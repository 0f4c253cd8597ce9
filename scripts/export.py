#!/usr/bin/env python
"""`vaswani-export` from a clone: see `vaswani.commands.export` (or `python scripts/export.py --help`).

    python scripts/export.py --model_name_or_path runs/multi30k-de-en/averaged --engine ctranslate2 \
        --quantization int8 --output_dir runs/multi30k-de-en/ct2-int8
"""

from vaswani.commands.export import main

if __name__ == "__main__":
    main()
