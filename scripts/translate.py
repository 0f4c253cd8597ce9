#!/usr/bin/env python
"""`vaswani-translate` from a clone: see `vaswani.commands.translate` (or `python scripts/translate.py --help`)."""

from vaswani.commands.translate import main

if __name__ == "__main__":
    main()
