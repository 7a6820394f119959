"""GPUs: where tensors and modules go, whether each rank picks its own GPU,
which calls initialise CUDA, and which backend a process group uses.
Helpers in the file or a local module are followed (an OpenCOOD-style
`init_distributed_mode(args)` in utils.py that calls `torch.cuda.set_device`).

Device expressions are classified as
  "per_rank"  a GPU chosen per process: `f"cuda:{local_rank}"`,
              `torch.device("cuda", args.gpu)`, `.cuda(args.gpu)`, `.to(local_rank)`
  "fixed"     the same GPU on every rank: `"cuda"`, `torch.device("cuda")`,
              `.cuda()`, `"cuda:0"` (the current device, GPU 0 unless set_device ran)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from ddpcheck.model.arguments import options
from ddpcheck.model.distributed import init_calls, is_init_call, runs_reaching_init
from ddpcheck.model.guards import is_rank_expr, worlds
from ddpcheck.model.flow import Const, bindings_seen, value_at
from ddpcheck.model.env import env_writes
from ddpcheck.model.memo import query
from ddpcheck.model.worlds import DISTRIBUTED
from ddpcheck.model.values import exclusive, is_ddp_wrap, is_dp_wrap
from ddpcheck.model.script import CallSite, Ctx, FunctionInfo, ScriptModel, owner_class
from ddpcheck.model.names import dotted_name, string_value
from ddpcheck.model.flow import callees, first_call_reaching, functions_reached, resolve_call

PER_RANK = "per_rank"
FIXED = "fixed"
NOTHING: frozenset[str] = frozenset()

# torch.cuda functions that initialise the CUDA driver (after which
# CUDA_VISIBLE_DEVICES is no longer read). is_available() calls
# cudaGetDeviceCount, which runs cuInit (unless PYTORCH_NVML_BASED_CUDA_CHECK=1).
# device_count() asks NVML first and the seeding functions are deferred
# (_lazy_call): neither initialises CUDA, so neither is listed.
CUDA_INIT_FUNCS = {
    "is_available", "set_device", "current_device", "get_device_name", "get_device_properties",
    "get_device_capability", "synchronize", "mem_get_info", "init", "current_stream", "default_stream",
    "Stream", "Event", "device", "get_rng_state", "get_rng_state_all", "is_bf16_supported",
}
# A helper we cannot see whose name says it selects the GPU.
DEVICE_HELPER_NAME = re.compile(r"(set|setup|set_up|init|select|choose|assign)_?(cuda_?)?(device|gpu)", re.I)




def _cuda_string_kind(text: str) -> str | None:
    if text == "cuda":
        return FIXED
    if text.startswith("cuda:"):
        return FIXED   # a literal ordinal is the same GPU on every rank
    return None


def device_kinds(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None,
                 ordinal: bool = False) -> frozenset[str]:
    """What CUDA device `expr` names. `ordinal`: an int means a CUDA ordinal
    here (the argument of `.to(...)`, `.cuda(...)`, `torch.device("cuda", i)`)."""
    if expr is None:
        return NOTHING
    return _device_kinds(model, expr, scope, ordinal)


@query(on_cycle=NOTHING)
def _device_kinds(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None,
                  ordinal: bool) -> frozenset[str]:
    """device_kinds, through any number of names (a name that depends on
    itself adds what its other values name: the memo's fixed point)."""
    s = string_value(expr)
    if s is not None:
        k = _cuda_string_kind(s)
        return frozenset({k}) if k else NOTHING
    if isinstance(expr, cst.FormattedString):
        head = "".join(p.value for p in expr.parts[:1] if isinstance(p, cst.FormattedStringText))
        if head.startswith("cuda"):
            return frozenset({PER_RANK}) if len(expr.parts) > 1 else frozenset({FIXED})
        return NOTHING
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        left = string_value(expr.left)
        return frozenset({PER_RANK}) if left and left.startswith("cuda") else NOTHING
    if isinstance(expr, cst.IfExp):
        return (device_kinds(model, expr.body, scope, ordinal)
                | device_kinds(model, expr.orelse, scope, ordinal))
    if isinstance(expr, cst.Integer):
        return frozenset({FIXED}) if ordinal else NOTHING
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value == "format":
            base = string_value(func.value)
            return frozenset({PER_RANK}) if base and base.startswith("cuda") else NOTHING
        q = model.qualify(func) or ""
        if q == "torch.device":
            args = [a for a in expr.args if not a.star]
            first = args[0].value if args else None
            if len(args) == 1 and first is not None and _ordinal(model, first):
                return device_kinds(model, first, scope, True)   # `torch.device(rank)`
            kinds = device_kinds(model, first, scope)
            if kinds and len(args) > 1:
                index = args[1].value
                return frozenset({FIXED}) if isinstance(index, cst.Integer) else frozenset({PER_RANK})
            return kinds
        if q in ("torch.cuda.current_device",):
            return frozenset({FIXED})
        if q == "int" and expr.args and ordinal:
            return device_kinds(model, expr.args[0].value, scope, ordinal)
        return NOTHING
    if isinstance(expr, cst.Subscript) and ordinal:
        return frozenset({PER_RANK}) if is_rank_expr(model, expr, scope) else NOTHING
    key = dotted_name(expr)
    if key is None:
        return NOTHING
    if ordinal and is_rank_expr(model, expr, scope):
        return frozenset({PER_RANK})
    # what the name holds there (`args.device = torch.device("cuda", args.gpu)` set in another function too)
    assigns = [b for b in bindings_seen(model, expr) if b.kind == "assign"]
    kinds = NOTHING
    for a in assigns:
        if a.value is not None and a.augmented is None:
            kinds |= device_kinds(model, a.value, a.ctx.function, ordinal)
    return kinds


@query
def _ordinal(model: ScriptModel, expr: cst.BaseExpression) -> bool:
    """`expr` is an int (a CUDA ordinal when given to `torch.device(...)`), or a
    value not known to be a string."""
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return False
    value = value_at(model, expr)
    return not any(isinstance(a, Const) and isinstance(a.value, str) for a in value.atoms) and \
        not any(a.is_api("device") for a in value.made)


@query
def placement(model: ScriptModel, site: CallSite) -> frozenset[str]:
    """The CUDA device a call moves or creates something on: `.cuda(...)`,
    `.to(device)`, `torch.zeros(..., device="cuda")`."""
    result = NOTHING
    attr = site.attr
    q = site.qual or ""
    scope = site.ctx.function
    if attr == "cuda" and site.receiver is not None and q != "torch.cuda":
        dev = site.arg("device", 0)
        result = frozenset({FIXED}) if dev is None else (device_kinds(model, dev, scope, ordinal=True) or frozenset({PER_RANK}))
    elif attr == "to" and site.receiver is not None:
        result = device_kinds(model, site.arg("device", 0), scope, ordinal=True)
    elif site.has_keyword("device") and q != "torch.device":
        result = device_kinds(model, site.arg("device"), scope, ordinal=True)
    return result


@query
def placements(model: ScriptModel) -> list[tuple[CallSite, frozenset[str]]]:
    return [(c, k) for c in model.calls if (k := placement(model, c))]


# -- CUDA initialisation --------------------------------------------------------------

def initialises_cuda(model: ScriptModel, site: CallSite) -> bool:
    q = site.qual or ""
    if q.startswith("torch.cuda.") and q.count(".") == 2 and q.rpartition(".")[2] in CUDA_INIT_FUNCS:
        return True
    return bool(placement(model, site))


def function_cuda_init(model: ScriptModel, fn: FunctionInfo | None) -> CallSite | None:
    """The first call in `fn` that initialises CUDA, itself or in a helper it calls."""
    return first_call_reaching(model, fn, initialises_cuda)


@query(on_cycle=None)
def cuda_initialised_before(model: ScriptModel, ctx: Ctx) -> CallSite | None:
    """A call that initialises CUDA and certainly runs before `ctx` on the
    same path: earlier in the same function (not in the other arm of an
    `if`), through a helper called there, or, up the call graph of the file
    (any number of calls up; callers calling each other are the memo's fixed
    point), before a call of the enclosing function."""
    fn = ctx.function
    for c in model.calls_in(fn):
        if c.ctx.order >= ctx.order:
            break
        if exclusive(c.ctx, ctx):
            continue
        if initialises_cuda(model, c):
            return c
        target = resolve_call(model, c)
        if target is not None and target[1] is not fn and function_cuda_init(*target) is not None:
            return c
    if fn is None:
        return None
    for c in model.calls:
        target = resolve_call(model, c)
        if target is not None and target[0] is model and target[1] is fn:
            found = cuda_initialised_before(model, c.ctx)
            if found is not None:
                return found
    return None


# -- picking the GPU per rank ----------------------------------------------------------

def sets_device_call(model: ScriptModel, site: CallSite) -> bool:
    """`torch.cuda.set_device(...)`, `with torch.cuda.device(i):`,
    `init_process_group(..., device_id=...)`, `torch.set_default_device(f"cuda:{rank}")`."""
    q = site.qual or ""
    if q in ("torch.cuda.set_device", "torch.cuda.device"):
        return True
    if q == "torch.set_default_device":
        return PER_RANK in device_kinds(model, site.arg("device", 0), site.ctx.function, ordinal=True)
    return is_init_call(model, site) and site.has_keyword("device_id")


def function_sets_device(model: ScriptModel, fn: FunctionInfo | None) -> bool:
    return first_call_reaching(model, fn, sets_device_call) is not None


@query
def script_sets_device(model: ScriptModel) -> bool | None:
    """True: the script (or a local helper it calls) selects the GPU per
    process. False: certainly not. None: it may, in code we cannot see (a
    process group started by an unresolvable helper, a `setup_device(...)`
    from a package)."""
    result: bool | None = False
    if any(sets_device_call(model, c) for c in model.calls):
        result = True
    else:
        for m, fn, _ in callees(model, model.calls):
            if any(sets_device_call(m, c) for c in m.calls_in(fn)):
                result = True
                break
    if result is False:
        for c in model.calls:
            if is_init_call(model, c) or resolve_call(model, c) is not None:
                continue
            if c in init_calls(model) or (c.attr and DEVICE_HELPER_NAME.search(c.attr)):
                result = None
                break
    return result


# -- process group backends --------------------------------------------------------------

def _strings(model: ScriptModel, expr, scope) -> frozenset[str] | None:
    """Literal strings an expression can hold; None when unknown."""
    if expr is None:
        return None
    return _strings_of(model, expr, scope)


@query(on_cycle=None)
def _strings_of(model: ScriptModel, expr, scope) -> frozenset[str] | None:
    """_strings, through any number of names; a name that depends on itself is unknown."""
    s = string_value(expr)
    if s is not None:
        return frozenset({s.lower()})
    if isinstance(expr, cst.IfExp):
        a = _strings(model, expr.body, scope)
        b = _strings(model, expr.orelse, scope)
        return None if a is None or b is None else a | b
    d = dotted_name(expr)
    if d is None:
        return None
    q = model.imports.qualify(d)
    if q.startswith("torch.distributed.") and ".Backend." in q:
        return frozenset({q.rpartition(".")[2].lower()})
    seen = bindings_seen(model, expr)
    assigns = [b for b in seen if b.kind == "assign"]
    if not assigns and scope is not None and d in scope.params:
        # `def init_dist(backend="nccl")`: the default (callers passing another value are not followed)
        for p in (*scope.node.params.params, *scope.node.params.kwonly_params):
            if p.name.value == d and p.default is not None:
                return _strings(model, p.default, None)
        return None
    if assigns:
        out: frozenset[str] = frozenset()
        for a in assigns:
            v = _strings(model, a.value, a.ctx.function) if a.augmented is None else None
            if v is None:
                return None
            out |= v
        return out
    if "." in d:
        dest = d.rpartition(".")[2]
        for opt in options(model):
            if opt.dest == dest:
                default = string_value(opt.default)
                return frozenset({default.lower()}) if default else None
    return None


def backends(model: ScriptModel, site: CallSite) -> frozenset[str] | None:
    """Backends a direct init_process_group call may use ("default" when
    none is given: torch>=2 then uses NCCL for CUDA tensors); None: unknown."""
    arg = site.arg("backend", 0)
    if arg is None:
        return frozenset({"default"})
    return _strings(model, arg, site.ctx.function)


def init_sites(model: ScriptModel, call: CallSite) -> list[tuple[ScriptModel, CallSite]]:
    """The init_process_group calls a call in this file leads to: itself, or
    those in the helper it calls and in every function of the tree that
    helper leads to in modules that can reach init_process_group, any
    number of calls down (nearest first)."""
    if is_init_call(model, call):
        return [(model, call)]
    target = resolve_call(model, call)
    if target is None:
        return []
    return [(m, c) for m, fn in functions_reached(*target, runs_reaching_init) for c in m.calls_in(fn) if is_init_call(m, c)]


def uses_nccl(bk: frozenset[str] | None) -> bool:
    return bk is not None and any("nccl" in b or b == "default" for b in bk)


def only_cpu_backends(bk: frozenset[str] | None) -> bool:
    return bk is not None and all(b in ("gloo", "mpi") for b in bk)


__all__ = [
    "device_kinds", "placement", "placements", "initialises_cuda", "function_cuda_init", "cuda_initialised_before",
    "sets_device_call", "function_sets_device", "script_sets_device", "backends", "init_sites",
    "uses_nccl", "only_cpu_backends", "PER_RANK", "FIXED",
]


# -- summaries the GPU rules share -------------------------------------------------------

@query
def nccl_init_calls(model: ScriptModel) -> list[CallSite] | None:
    """Calls in this file that start an NCCL (or default-backend) process
    group, directly or through a local helper. None when a group may be
    started by code we cannot see."""
    result: list[CallSite] | None = []
    for c in init_calls(model):
        sites = init_sites(model, c)
        if not sites:
            result = None   # an unresolvable helper named like an init
            break
        if any(uses_nccl(backends(m, s)) for m, s in sites):
            result.append(c)
    return result


@query
def all_ranks_on_one_gpu(model: ScriptModel) -> tuple[CallSite, CallSite] | None:
    """(the NCCL init call, the first fixed-device placement) when the script
    starts an NCCL group, never selects a GPU per process (no set_device, no
    `device_id=`, no per-rank device anywhere, no CUDA_VISIBLE_DEVICES of its
    own) and still puts tensors or the model on a bare "cuda" / `.cuda()`."""

    result = None
    nccl = nccl_init_calls(model)
    if nccl and script_sets_device(model) is False and not env_writes(model, "CUDA_VISIBLE_DEVICES"):
        placed = placements(model)
        if not any(PER_RANK in kinds for _, kinds in placed):
            fixed = [c for c, kinds in placed if FIXED in kinds and worlds(model, c.ctx) & DISTRIBUTED]
            if fixed:
                result = (nccl[0], fixed[0])
    return result


_MODULE_CHAIN = {"float", "half", "bfloat16", "double", "train", "eval", "requires_grad_"}


def module_device(model: ScriptModel, expr: cst.BaseExpression | None, scope: FunctionInfo | None,
                  before: int, class_name: str | None = None) -> frozenset[str]:
    """Where the module `expr` was put before source position `before`:
    `DDP(model.cuda())`, `model = model.to(device)`, an in-place
    `model.cuda(args.gpu)`, a local `build_model()` that returns `net.cuda()`."""
    if expr is None:
        return NOTHING
    return _module_device(model, expr, scope, before, class_name)


@query(on_cycle=NOTHING)
def _module_device(model: ScriptModel, expr: cst.BaseExpression, scope: FunctionInfo | None,
                   before: int, class_name: str | None) -> frozenset[str]:
    """module_device, through any number of names and returns (a recursion
    adds what its other values say: the memo's fixed point)."""
    if isinstance(expr, cst.Call):
        site = model.site_of.get(id(expr))
        if site is None:
            return NOTHING
        p = placement(model, site)
        if p:
            return p
        if site.attr in _MODULE_CHAIN and site.receiver is not None:
            return module_device(model, site.receiver, scope, before, class_name)
        target = resolve_call(model, site)
        kinds = NOTHING
        if target is not None:
            tmodel, fn = target
            for value, ctx in fn.returns:
                kinds |= module_device(tmodel, value, fn, ctx.order, fn.class_name)
        return kinds
    key = dotted_name(expr)
    if key is None:
        return NOTHING
    kinds = NOTHING
    for c in model.calls:
        if c.attr not in ("cuda", "to") or c.receiver is None or dotted_name(c.receiver) != key:
            continue
        same_scope = c.ctx.function is scope and c.ctx.order < before
        same_class = key.startswith("self.") and class_name is not None and owner_class(c.ctx) == class_name
        if same_scope or same_class:
            kinds |= placement(model, c)
    for a in bindings_seen(model, expr):
        if a.kind != "assign" or a.value is None or a.augmented is not None:
            continue
        if isinstance(a.value, cst.Call) or dotted_name(a.value) not in (None, key):
            kinds |= module_device(model, a.value, a.ctx.function, a.ctx.order, class_name)
    return kinds


# -- the index a GPU is picked with -------------------------------------------------------

@dataclass(frozen=True)
class GpuChoice:
    """An expression that picks a GPU by number: `torch.cuda.set_device(i)`,
    `.cuda(i)`, `.to(i)`, `device=i`, `device_ids=[i]`, `output_device=i`,
    `torch.device("cuda", i)`, `f"cuda:{i}"`, `"cuda:%d" % i`,
    `"cuda:{}".format(i)`, `"cuda:" + str(i)`."""

    node: cst.CSTNode            # what to report: the call or the device string
    index: cst.BaseExpression    # the GPU number expression (`i`)
    ctx: Ctx                     # where it is
    how: str                     # the construct as written, for messages


def device_string_index(expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`rank` in `f"cuda:{rank}"`, `"cuda:%d" % rank`, `"cuda:{}".format(rank)`,
    `"cuda:" + str(rank)`; None for anything else."""
    if isinstance(expr, cst.FormattedString):
        parts = expr.parts
        if (len(parts) == 2 and isinstance(parts[0], cst.FormattedStringText) and parts[0].value == "cuda:"
                and isinstance(parts[1], cst.FormattedStringExpression)):
            return parts[1].expression
        return None
    if isinstance(expr, cst.BinaryOperation):
        head = string_value(expr.left)
        if isinstance(expr.operator, cst.Modulo) and head in ("cuda:%d", "cuda:%s", "cuda:%i"):
            right = expr.right
            if isinstance(right, cst.Tuple) and len(right.elements) == 1:
                right = right.elements[0].value
            return right
        if isinstance(expr.operator, cst.Add) and head == "cuda:":
            return expr.right
        return None
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format":
        if string_value(expr.func.value) in ("cuda:{}", "cuda:{0}", "cuda:{:d}", "cuda:{0:d}") and len(expr.args) == 1:
            return expr.args[0].value
    return None


def _ordinal_args(model: ScriptModel, site: CallSite) -> list[tuple[cst.BaseExpression, str]]:
    q = site.qual or ""
    out: list[tuple[cst.BaseExpression, str]] = []
    if q in ("torch.cuda.set_device", "torch.cuda.device"):
        arg = site.arg("device", 0)
        if arg is not None:
            out.append((arg, f"{site.func}(...)"))
    elif q == "torch.device":
        first = site.arg("type", 0)
        kind = string_value(first)
        index = site.arg("index", 1)
        if kind == "cuda" and index is not None:
            out.append((index, f"{site.func}(\"cuda\", ...)"))
        elif first is not None and index is None and _ordinal(model, first):
            out.append((first, f"{site.func}(...)"))   # `torch.device(local_rank)`: a CUDA ordinal
    elif site.attr in ("cuda", "to") and site.receiver is not None and q != "torch.cuda":
        arg = site.arg("device", 0)
        if arg is not None:
            out.append((arg, f".{site.attr}(...)"))
    else:
        if site.has_keyword("device"):
            out.append((site.arg("device"), "device=..."))
        if site.has_keyword("device_id"):
            out.append((site.arg("device_id"), "device_id=..."))
        if site.has_keyword("output_device"):
            out.append((site.arg("output_device"), "output_device=..."))
        ids = site.arg("device_ids")
        if ids is None and (is_ddp_wrap(model, site) or is_dp_wrap(model, site)):
            ids = site.arg("device_ids", 1)
        if isinstance(ids, (cst.List, cst.Tuple)) and len(ids.elements) == 1:
            out.append((ids.elements[0].value, "device_ids=[...]"))
    return [(e, how) for e, how in out if not isinstance(e, cst.Integer)]


@query(on_cycle=())
def gpu_choices(model: ScriptModel) -> tuple[GpuChoice, ...]:
    """Every place the script picks a GPU by a number it computes."""
    found: list[GpuChoice] = []
    seen: set[int] = set()

    def strings_in(expr: cst.BaseExpression | None, ctx: Ctx) -> bool:
        if expr is None:
            return False
        arms = [expr.body, expr.orelse] if isinstance(expr, cst.IfExp) else [expr]
        hit = False
        for arm in arms:
            index = device_string_index(arm)
            if index is None:
                continue
            hit = True
            if id(arm) not in seen:
                seen.add(id(arm))
                found.append(GpuChoice(arm, index, ctx, model.module.code_for_node(arm)))
        return hit

    for site in model.calls:
        for expr, how in _ordinal_args(model, site):
            if not strings_in(expr, site.ctx):
                found.append(GpuChoice(site.node, expr, site.ctx, how))
        for a in site.node.args:
            strings_in(a.value, site.ctx)
    for a in model.assigns:
        if a.value is None or a.augmented is not None:
            continue
        strings_in(a.value, a.ctx)   # `device = f"cuda:{rank}"`
    return tuple(found)
