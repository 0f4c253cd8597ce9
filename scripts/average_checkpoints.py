#!/usr/bin/env python
"""`vaswani-average-checkpoints` from a clone: see `vaswani.commands.average_checkpoints` (or `python scripts/average_checkpoints.py --help`)."""

from vaswani.commands.average_checkpoints import main

if __name__ == "__main__":
    main()
