"""Benchmarks of the Transformer against MarianMTModel, torch.nn.Transformer and the exported engines; run as
`python -m bench <command>` (`python -m bench --help` lists them)."""
