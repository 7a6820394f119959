"""What the engine knows about code it does not read: the methods of library
objects that return the object itself, the calls that iterate what they are
given, the builtins. One table, so no two parts of the engine can disagree
about what `model.eval()` or `enumerate(loader)` holds. A leaf module."""

from __future__ import annotations

import builtins

# Methods that return the object they are called on (nn.Module's in-place
# moves and mode switches; `model = model.eval()` still holds the model, and
# `DDP(model).cuda()` the wrapper).
RETURNS_RECEIVER = frozenset({
    "cuda", "to", "float", "half", "bfloat16", "double", "cpu", "xpu", "train", "eval", "requires_grad_",
    "share_memory", "share_memory_", "apply", "to_empty", "zero_grad_",
})

# Library functions that return the module they are given, changed in place
# (SyncBatchNorm conversion swaps the layers inside and hands back the same
# top-level module: `model = convert_sync_batchnorm(model)` still holds the
# DDP wrapper it was given).
RETURNS_FIRST_ARGUMENT = frozenset({"convert_sync_batchnorm", "convert_syncbn_model"})

# Library functions that return a copy of their first argument: an object of
# the same kind, holding what it held (`best_model = copy.deepcopy(model)`
# of a DDP-wrapped model is a wrapper too: its state_dict keys carry `module.`).
# The engine gives the copy the objects of the original; what the rules judge
# is their kind, never their identity.
RETURNS_COPY_OF_FIRST_ARGUMENT = frozenset({"copy.deepcopy", "copy.copy"})

# Calls whose iteration is the iteration of their arguments: `enumerate(loader)`,
# `tqdm(loader)`, a prefetcher around the loader.
ITERATION_WRAPPERS = frozenset({"enumerate", "zip", "iter", "tqdm", "trange", "cycle", "chain", "islice",
                                "reversed", "log_every", "track", "progress_bar", "Prefetcher",
                                "DataPrefetcher", "data_prefetcher", "CudaDataLoader", "prefetch"})
# Dunder methods written out stand for the builtins that call them: `it.__iter__()` is `iter(it)`,
# `it.__next__()` is `next(it)`, `x.__len__()` is `len(x)`.
DUNDER_BUILTINS = {"__iter__": "iter", "__next__": "next", "__len__": "len"}

# Calls that take a loader but do not iterate it: `range(len(loader))`.
NOT_ITERATING = frozenset({"range", "len", "int", "float", "str", "print", "min", "max", "isinstance",
                           "hasattr", "getattr", "type", "id", "DistributedDataParallel", "DataParallel"})
# Calls that hand the loader to a library that re-shards it and manages its
# sampler (accelerate, ignite, Lightning Fabric): what iterating the result does is theirs.
MANAGED_LOADERS = frozenset({"prepare", "prepare_data_loader", "auto_dataloader", "setup_dataloaders",
                             "distribute_dataloader"})
# Keyword arguments that name the iterable a wrapper iterates.
ITERABLE_KEYWORDS = frozenset({"iterable", "loader", "data_loader", "dataloader", "iterator"})

# Calls whose elements are the elements of their first argument (a `for` over them).
ELEMENTS_OF_FIRST = frozenset({"iter", "tqdm", "trange", "reversed", "sorted", "list", "tuple", "islice",
                               "cycle", "set", "frozenset", "log_every", "track", "progress_bar"})

# Library calls whose object's `__enter__` returns the object itself: `with
# open(path, "rb") as f:` binds `f` to the file `open` made (so `torch.load(f)`
# reads `path`).
ENTER_RETURNS_SELF = frozenset({"open", "io.open", "gzip.open", "bz2.open", "lzma.open", "fsspec.open",
                                "tempfile.NamedTemporaryFile", "tempfile.TemporaryFile"})

# Decorators that make a method something other than a function of its instance.
STATIC = frozenset({"staticmethod"})
CLASS_METHOD = frozenset({"classmethod"})
PROPERTY = frozenset({"property", "cached_property", "functools.cached_property"})

BUILTINS = frozenset(dir(builtins))


__all__ = ["DUNDER_BUILTINS", "RETURNS_RECEIVER", "RETURNS_FIRST_ARGUMENT", "RETURNS_COPY_OF_FIRST_ARGUMENT", "ITERATION_WRAPPERS", "NOT_ITERATING", "MANAGED_LOADERS", "ITERABLE_KEYWORDS",
           "ELEMENTS_OF_FIRST", "ENTER_RETURNS_SELF", "STATIC", "CLASS_METHOD", "PROPERTY", "BUILTINS"]
