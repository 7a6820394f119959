"""The public API of `torch.nn.Module`, `DistributedDataParallel` and
`DataParallel`: what a script may reach through the wrapper itself.

Anything else (a method or attribute the user's model defines: `freeze_bn`,
`encoder`, `generate`, `config`) is not on the wrapper, and `wrapper.X` raises
AttributeError; it lives on `wrapper.module`.

Taken from torch 2.13: the public names of the three classes (`dir(cls)`)
plus the attributes their `__init__` methods set (`self.X = ...`), e.g.
`device_ids`, `process_group`, `reducer`. Names with a leading underscore are
never judged (private state, dunders, `_orig_mod` of a compiled module).
"""

from __future__ import annotations

NN_MODULE_API = frozenset({
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile",
    "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer",
    "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia",
    "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule", "share_memory",
    "state_dict", "to", "to_empty", "train", "training", "type", "xpu", "zero_grad",
})

DDP_API = frozenset({
    "batched_grad_copy", "broadcast_bucket_size", "broadcast_buffers", "bucket_bytes_cap",
    "bucket_bytes_cap_default", "bucket_bytes_cap_list", "buffer_hook", "device", "device_ids", "device_mesh",
    "device_type", "dim", "find_unused_parameters", "forward_sync_buffers", "gather", "gradient_as_bucket_view",
    "is_multi_device_module", "join", "join_device", "join_hook", "join_process_group", "logger",
    "mixed_precision", "module", "modules_buffers", "named_module_buffers", "no_sync", "output_device",
    "parameters_to_ignore", "process_group", "reducer", "register_comm_hook", "require_backward_grad_sync",
    "require_forward_param_sync", "scatter", "skip_all_reduce_unused_params", "static_graph", "to_kwargs",
    "use_side_stream_for_tensor_copies", "will_sync_module_buffers",
})

DATA_PARALLEL_API = frozenset({
    "device_ids", "dim", "gather", "module", "output_device", "parallel_apply", "replicate", "scatter",
    "src_device_obj",
})

# What `wrapper.X` may name for either wrapper.
WRAPPER_API = NN_MODULE_API | DDP_API | DATA_PARALLEL_API


def on_wrapper(attr: str) -> bool:
    """`attr` is the wrapper's own (or private, which is not judged)."""
    return attr.startswith("_") or attr in WRAPPER_API


__all__ = ["NN_MODULE_API", "DDP_API", "DATA_PARALLEL_API", "WRAPPER_API", "on_wrapper"]
