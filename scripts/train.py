#!/usr/bin/env python
"""`vaswani-train` from a clone: see `vaswani.commands.train` (or `python scripts/train.py --help`)."""

from vaswani.commands.train import main

if __name__ == "__main__":
    main()
