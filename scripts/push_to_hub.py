#!/usr/bin/env python
"""`vaswani-push-to-hub` from a clone: see `vaswani.commands.push_to_hub` (or `python scripts/push_to_hub.py --help`)."""

from vaswani.commands.push_to_hub import main

if __name__ == "__main__":
    main()
