"""`python -m bench <command> [flags]`: the benchmarks, each with `--help`. Every command prints a table and writes
one JSON result with `--json`: {"machine", "settings", ..., "results": [one row a measurement]}.

    train          training steps of vaswani, Marian and nn.Transformer at equal sizes (CPU, or --gpu)
    gpu-wmt        the paper's 25,000-token training step on one GPU, eager and compiled, beside Marian
    generate       greedy and beam decoding of the three at equal sizes (CPU, or --gpu)
    engines        the ONNX and CTranslate2 exports beside PyTorch and CTranslate2's Marian
    int8           torchao int8 in PyTorch beside float32 and CTranslate2 int8
    kernels        each kernel choice of vaswani.kernels against its alternative
    profile-train  where the en->de recipe's training step spends its time (torch.profiler)
    data-scale     vaswani-train's data stages on a WMT-sized synthetic corpus, time and memory
    corpus         write that synthetic WMT-shaped corpus
"""

import importlib
import sys

COMMANDS = {  # the module and the function that run each command
    "train": "train:main",
    "gpu-wmt": "gpu_wmt:main",
    "generate": "decode:generate",
    "engines": "decode:engines",
    "int8": "decode:int8",
    "kernels": "kernels:main",
    "profile-train": "profile_train:main",
    "data-scale": "data_scale:main",
    "corpus": "synthetic_corpus:main",
}

if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "--help"
    if what in ("-h", "--help"):
        print(__doc__)
    elif what not in COMMANDS:
        sys.exit(f"python -m bench: unknown command {what!r}; choose from {', '.join(COMMANDS)}")
    else:
        module, function = COMMANDS[what].split(":")
        getattr(importlib.import_module(f"bench.{module}"), function)(sys.argv[2:])
