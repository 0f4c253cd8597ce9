#!/usr/bin/env python
"""`vaswani-evaluate` from a clone: see `vaswani.commands.evaluate` (or `python scripts/evaluate.py --help`)."""

from vaswani.commands.evaluate import main

if __name__ == "__main__":
    main()
