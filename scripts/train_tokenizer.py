#!/usr/bin/env python
"""`vaswani-train-tokenizer` from a clone: see `vaswani.commands.train_tokenizer` (or `python scripts/train_tokenizer.py --help`)."""

from vaswani.commands.train_tokenizer import main

if __name__ == "__main__":
    main()
