"""More than one process: how a run is launched (`check_launch`) and FSDP2 on CPU processes over gloo, which
Accelerate offers on accelerator devices only (`enable_fsdp_on_cpu`, `shard_with_fsdp2`)."""

from __future__ import annotations

import logging
import os

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, parse_flag_from_env

logger = logging.getLogger(__name__)

# The variables an MPI launcher sets (and torchrun's WORLD_SIZE): several processes are on their way.
_MPI_WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE")


def check_launch() -> None:
    """`accelerate launch --cpu --num_processes N` (N > 1, no MPI host file) starts one process that would train
    alone: refuse it with the launch that works."""
    # accelerate's simple launcher sets MASTER_ADDR for num_processes > 1
    if (
        parse_flag_from_env("ACCELERATE_USE_CPU")
        and "MASTER_ADDR" in os.environ
        and not any(name in os.environ for name in _MPI_WORLD_SIZE_VARIABLES)
    ):
        raise ValueError(
            "accelerate launch --cpu --num_processes N starts ONE process (Accelerate runs several CPU processes "
            "only through MPI): launch N processes on gloo with `accelerate launch --multi_gpu --num_processes N` "
            "or `torchrun --nproc_per_node N` (both work without a GPU)"
        )


def enable_fsdp_on_cpu(trainer) -> None:
    """Accelerate turns its FSDP plugin on for accelerator devices only; torch's FSDP2 also runs on CPU processes
    over gloo (several CPU machines, or tests). With `--fsdp` on such a run, switch the plugin on here."""
    state = trainer.accelerator.state
    plugin_args = trainer.args.fsdp_plugin_args
    if plugin_args is None or state.distributed_type != DistributedType.MULTI_CPU:
        return
    if plugin_args.get("fsdp_version", 2) != 2:
        raise ValueError("FSDP on CPU processes needs FSDP2: drop `version: 1` from --fsdp_config")
    plugin_args = {**plugin_args, "sync_module_states": False}  # no accelerator device to broadcast from
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
    # Both shared states: each later `AcceleratorState()` copies the process state's distributed type over its own.
    state.distributed_type = PartialState().distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    logger.info("FSDP2 on %d CPU processes (gloo)", state.num_processes)


def shard_with_fsdp2(model: torch.nn.Module, accelerator) -> None:
    """Shard `model` with FSDP2: each encoder and decoder layer is one unit, and the rest (the shared embedding,
    which the encoder, the decoder and the output projection all use, §3.4) is the root unit.

    Accelerate's own FSDP2 wrapping puts the input and output embeddings into a unit of their own, which torch refuses
    for this model: the encoder's and decoder's `embed_tokens` hold the same tied matrix, which would then belong to
    two units. Sharded here first, the model is left as it is by Accelerate (`fsdp2_prepare_model` returns an
    FSDP module unchanged)."""
    # Imported here: FSDP2's public API is torch >= 2.6's (pyproject allows older), needed only by `--fsdp` runs.
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    plugin = accelerator.state.fsdp_plugin
    if isinstance(model, FSDPModule) or plugin.fsdp_version != 2:
        return
    # Resolve the plugin's wrap policy on the plain model (its layer classes by name; from `_no_split_modules`
    # unless --fsdp_config names others): Accelerate resolves it again on the sharded model, whose classes are renamed.
    plugin.set_auto_wrap_policy(model)
    layer_names = set(plugin.transformer_cls_names_to_wrap or model._no_split_modules or ())
    options = {
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    }
    for module in [m for m in model.modules() if type(m).__name__ in layer_names]:
        fully_shard(module, reshard_after_forward=plugin.reshard_after_forward, **options)
    fully_shard(model, **options)  # the root unit, with torch's reshard_after_forward for a root
