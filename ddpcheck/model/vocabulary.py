"""The names training scripts use for the same few things, in one place.

Every pattern a query or a rule matches against a name (not against source
text: see model/reads.py) lives here, so two rules can never disagree about
what `world_size`, `global_batch_size` or `val_loader` means.
"""

from __future__ import annotations

import re

# -- ranks and the main process -------------------------------------------------------
MAIN_PREDICATES = {
    "is_main_process", "is_main", "main_process", "is_master", "is_master_process",
    "master_process", "is_rank_zero", "is_rank0", "rank_zero", "rank0", "is_rank_0",
    "is_primary", "is_chief", "is_local_main_process", "is_global_zero", "is_local_master",
    "is_leader", "is_main_worker", "is_logging_process", "is_world_process_zero",
    "is_local_process_zero", "master", "is_main_rank", "main_proc", "is_main_proc",
}
MAIN_DECORATORS = {
    "rank_zero_only", "master_only", "main_process_only", "on_main_process",
    "on_local_main_process", "rank_zero", "only_rank_zero", "run_on_main_process", "main_only",
}
DIST_FLAGS = {
    "distributed", "is_distributed", "multi_gpu", "multiprocessing_distributed", "use_ddp",
    "ddp", "use_distributed", "is_dist", "dist_enabled", "use_dist",
}
DIST_PREDICATES = {"is_initialized", "is_dist_avail_and_initialized", "is_distributed", "dist_is_initialized"}
RANK_NAMES = {
    "rank", "local_rank", "global_rank", "ddp_rank", "ddp_local_rank", "world_rank", "rank_id",
    "local_process_index", "process_index", "gpu", "gpu_id", "local_gpu", "proc_id",
}
RANK_FUNCTIONS = {"get_rank", "get_local_rank", "get_global_rank", "get_ordinal", "get_process_index", "get_world_rank"}
RANK_ENV = {"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}

# -- the world size ----------------------------------------------------------------------
# exact names a `world_size > 1` test compares (guards)
WORLD_SIZE_NAMES = {"world_size", "num_processes", "nprocs", "ddp_world_size", "num_replicas"}
# a name that carries the number of processes / GPUs (searched in each name read)
WORLD_SIZE = re.compile(
    r"world_size|get_world_size|world|nprocs?|n_?procs?|ngpus?|num_gpus?|n_gpus?|gpus|gpu_count|device_count"
    r"|num_replicas|num_processes|num_devices|n_devices", re.I)

# -- batches -------------------------------------------------------------------------------
# a batch size named as the batch of all ranks together
GLOBAL_BATCH = re.compile(
    r"(global|total|base|baseline|effective|eff|overall)_?(train_?)?batch(_?size)?|batch_?size_?(total|global|all)",
    re.I)
GLOBAL_HELP = re.compile(r"\b(total|global|across all|all gpus|all devices|all processes|overall|effective)\b", re.I)
PER_RANK_HELP = re.compile(r"per[ -](gpu|device|process|rank|replica|card|worker)|each (gpu|device|process)", re.I)

# -- evaluation and training data ----------------------------------------------------------
EVAL_NAME = re.compile(
    r"(^|[_.])(val|valid|validation|test|testing|eval|evaluation|dev|query|gallery|infer|inference)(\b|_|\d|$)",
    re.I)
# `testloader`, `valloader`, `val_dl` (tutorial spellings EVAL_NAME leaves out)
EVAL_LOADER_NAME = re.compile(r"(^|[_.])(val|valid|validation|test|testing|eval|evaluation|dev)(loader|dl|iter|set|data)", re.I)
EVAL_FUNCTION = re.compile(
    r"(^|_)(val|valid|validate|validation|test|testing|eval|evaluate|evaluation|evaluator|infer|inference|predict)(_|\d|$)",
    re.I,
)
TRAIN_NAME = re.compile(r"train", re.I)

# -- learning rates ------------------------------------------------------------------------
LR_NAME = re.compile(r"(^|[._\['\"])(\w*lr\w*|\w*learning_rate\w*)(['\"\]]*)$", re.I)
LR_SCALING_CALL = re.compile(r"scale\w*_lr|lr\w*_scal|scal\w*_learning_rate|linear_scal|sqrt_scal|scale_learning_rate", re.I)
