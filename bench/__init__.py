"""Benchmarks of the Transformer against MarianMTModel and torch.nn.Transformer; run as `python -m bench.<script>`."""
