#!/usr/bin/env python
"""`vaswani-plot` from a clone: see `vaswani.commands.plot` (or `python scripts/plot.py --help`)."""

from vaswani.commands.plot import main

if __name__ == "__main__":
    main()
