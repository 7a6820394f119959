"""The edits the fixable rules attach to their hits (see rules/base.py's
Edit): each function gets the nodes and names the rule already holds and
returns an Edit, or None when the fix is not certain here. These decide only
whether the mechanical rewrite keeps the script correct in every run (the
names it uses are bound, the object it touches is the one the rule means);
what is wrong was decided by the rule."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.flow import sole_binding
from ddpcheck.model.names import dotted_name
from ddpcheck.model.script import Branch, CallSite, Ctx, Loop, ScriptModel
from ddpcheck.rules.base import AddArg, Edit, InsertAfter, InsertAtBodyStart, MoveBefore, RemoveArg, ReplaceExpr


def _within(inner: tuple[Branch, ...], outer: tuple[Branch, ...]) -> bool:
    """Every `if` arm around `inner` is also around `outer`: whatever runs
    `outer` ran `inner` (the same `if` node, the same arm)."""
    arms = {(id(b.test), b.positive) for b in outer}
    return all((id(b.test), b.positive) in arms for b in inner)


def _bound_before(model: ScriptModel, key: str, ctx: Ctx) -> bool:
    """`key` is assigned, on every path, before `ctx` in the same function and
    never reassigned to anything but a call (a constructor or a factory)."""
    mine = [a for a in model.assigns if a.key == key and a.ctx.function is ctx.function]
    before = [a for a in mine if a.ctx.order < ctx.order]
    return (bool(before) and all(a.value is not None and isinstance(a.value, cst.Call) and a.augmented is None
                                 for a in mine)
            and any(_within(a.ctx.branches, ctx.branches) and not a.ctx.opaque for a in before))


# --- DDP101: `sampler.set_epoch(epoch)` at the top of the epoch loop ---------------

def set_epoch_edit(model: ScriptModel, loop: Loop, sampler: str, sampler_value: cst.CSTNode | None) -> Edit | None:
    """Insert `<sampler>.set_epoch(<loop variable>)` as the loop's first
    statement when the loop is `for <name> in ...` and `sampler` is certainly
    the DistributedSampler there: a name bound to it before the loop on every
    path, or `self.<loader>.sampler` of a loader built with the sampler
    inline (`sampler_value`, the constructor call)."""
    if not loop.is_for or not isinstance(loop.node.target, cst.Name) or model.module is None:
        return None
    if not isinstance(loop.node.body, cst.IndentedBlock):
        return None
    epoch = loop.node.target.value
    call = f"{sampler}.set_epoch({epoch})"
    root = sampler.split(".")[0]
    if root == "self":
        if loop.ctx.function is None or loop.ctx.function.class_name is None or not isinstance(sampler_value, cst.Call):
            return None
    elif "." in sampler:
        return None
    elif not _bound_before(model, sampler, loop.ctx):
        # `if args.distributed: sampler = DistributedSampler(...)`: the same
        # test around the call, torchvision's `if args.distributed:
        # train_sampler.set_epoch(epoch)`
        test = _sole_guard(model, sampler, loop.ctx)
        if test is None:
            return None
        return InsertAtBodyStart(block_owner=loop.node, code=f"if {test}:\n    {call}\n")
    return InsertAtBodyStart(block_owner=loop.node, code=call)


def _sole_guard(model: ScriptModel, key: str, ctx: Ctx) -> str | None:
    """The test of the one `if` arm, outside the loop, in which `key` is
    bound (to a call, before `ctx`, same function), when the test is a flag
    (`args.distributed`, `not opt.single_gpu`) nothing assigns after it."""
    mine = [a for a in model.assigns if a.key == key and a.ctx.function is ctx.function]
    if not mine or any(a.value is None or not isinstance(a.value, cst.Call) or a.augmented is not None
                       or a.ctx.order > ctx.order or a.ctx.opaque for a in mine):
        return None
    extra = {(id(b.test), b.positive): b for a in mine for b in a.ctx.branches
             if (id(b.test), b.positive) not in {(id(o.test), o.positive) for o in ctx.branches}}
    if len(extra) != 1 or any(not _within(tuple(x for x in a.ctx.branches
                                                 if (id(x.test), x.positive) not in extra), ctx.branches)
                              for a in mine):
        return None
    (branch,) = extra.values()
    test = branch.test
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    flag = dotted_name(test.expression if negated else test)
    if flag is None:
        return None
    guard_order = min(a.ctx.order for a in mine)
    if any(a.key == flag and guard_order < a.ctx.order < ctx.order for a in model.assigns):
        return None
    positive = branch.positive != negated
    return flag if positive else f"not {flag}"


# --- DDP102: the sampler decides the order --------------------------------------------

def shuffle_edit(site: CallSite, shuffle: cst.BaseExpression, sampler: cst.BaseExpression) -> Edit:
    """`shuffle=(sampler is None)` when the sampler is a name (True exactly
    where the loader had no sampler, so a single-process run keeps its
    shuffle); drop `shuffle=True` when the sampler is built inline."""
    name = dotted_name(sampler)
    if name is not None:
        return ReplaceExpr(node=shuffle, code=f"({name} is None)")
    if site.has_keyword("shuffle"):
        return RemoveArg(call=site.node, keyword="shuffle")
    return ReplaceExpr(node=shuffle, code="False")


# --- DDP302: save through `.module` ---------------------------------------------------

def unwrap_edit(model: ScriptModel, state_dict_site: CallSite, key: str, wrap_site: CallSite) -> Edit | None:
    """`model.state_dict()` -> `model.module.state_dict()` when `model` is
    certainly the wrapper there: the last assignment before, in the same
    function, is the wrap itself, and every `if` around the wrap is around
    the save too (no run where `model` is still the bare module)."""
    receiver = state_dict_site.receiver
    if receiver is None or key.startswith("self."):
        return None
    bound = sole_binding(model, receiver)
    if bound is None or getattr(bound, "value", None) is not wrap_site.node or bound.ctx.opaque:
        return None
    return ReplaceExpr(node=receiver, code=f"{key}.module")


# --- DDP303: map_location -------------------------------------------------------------

def map_location_edit(model: ScriptModel, site: CallSite) -> Edit:
    """Add `map_location="cpu"`. Safe when the loaded object goes straight
    into `load_state_dict(...)`, which copies every tensor to the parameter's
    own device; elsewhere the loaded tensors now start on the CPU, which code
    using them directly may not expect (unsafe)."""
    direct = any(c.attr == "load_state_dict" and any(_contains(a.value, site.node) for a in c.node.args)
                 for c in model.calls_in(site.ctx.function))
    return AddArg(call=site.node, keyword="map_location", code='"cpu"', safe=direct)


def _contains(expr: cst.CSTNode, target: cst.CSTNode) -> bool:
    while True:
        if expr is target:
            return True
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        else:
            return False


# --- DDP501: accept both spellings ---------------------------------------------------

def local_rank_edit(site: CallSite) -> Edit | None:
    """`add_argument("--local_rank", ...)` -> `add_argument("--local_rank",
    "--local-rank", ...)`: the first long flag still names the attribute
    (`args.local_rank`), and torch>=2.0's launcher's spelling is accepted."""
    positional = [a for a in site.node.args if a.keyword is None and not a.star]
    for index, a in enumerate(positional):
        if isinstance(a.value, cst.SimpleString) and a.value.evaluated_value == "--local_rank":
            quote = a.value.quote if a.value.quote in ('"', "'") else '"'
            return AddArg(call=site.node, code=f"{quote}--local-rank{quote}", after=index)
    return None


# --- DDP402: destroy the group at the end ----------------------------------------------

def destroy_edit(model: ScriptModel, site: CallSite) -> Edit | None:
    """Append `<dist>.destroy_process_group()` to the end of the function
    whose body starts the group (or of the module for a module-level
    script), when that function is the entry point: called only from module
    level or handed to a launcher (`mp.spawn(main_worker, ...)`), no `return`
    leaves it early, and the group module is imported under a name
    (`dist.init_process_group`)."""
    func = site.func or ""
    if not func.endswith(".init_process_group"):
        return None
    prefix = func.rpartition(".")[0]
    fn = site.ctx.function
    if fn is None:
        if not any(s is site.stmt for s in model.module.body):
            return None
        return InsertAfter(anchor=model.module.body[-1], code=f"{prefix}.destroy_process_group()")
    body = fn.node.body
    if not isinstance(body, cst.IndentedBlock) or not any(s is site.stmt for s in body.body):
        return None
    if fn.class_name is not None or _has_return(fn.node):
        return None
    calls = {id(c.node.func): c for c in model.calls}
    for ref in model.refs_to(fn):
        call = calls.get(id(ref.node))
        if call is not None and call.ctx.function is not None:
            return None   # a set-up helper called by another function: the end of training is elsewhere
    last = body.body[-1]
    if isinstance(last, cst.SimpleStatementLine) and any(isinstance(s, (cst.Raise, cst.Return)) for s in last.body):
        return None
    return InsertAfter(anchor=last, code=f"{prefix}.destroy_process_group()")


def _has_return(fn: cst.FunctionDef) -> bool:
    stack = list(fn.body.children)
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Return):
            return True
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        stack.extend(node.children)
    return False


# --- DDP201: convert before the wrap (unsafe) ------------------------------------------

def convert_first_edit(model: ScriptModel, site: CallSite, key: str | None, wrap_site: CallSite | None) -> Edit | None:
    """Move `model = SyncBatchNorm.convert_sync_batchnorm(model)` (or the
    `if args.sync_bn:` holding only that line) to just before
    `model = DDP(model, ...)` (`wrap_site`) in the same block. Unsafe: code
    between the two (an optimizer built from `model.parameters()`, a hook)
    now sees the converted module."""
    if key is None or wrap_site is None or wrap_site.ctx.function is not site.ctx.function:
        return None
    stmt, wrap_stmt = site.stmt, wrap_site.stmt
    if not (_assigns_call(stmt, key, site.node) and _assigns_call(wrap_stmt, key, wrap_site.node)):
        return None
    first = wrap_site.node.args[0].value if wrap_site.node.args else None
    if first is None or dotted_name(first) != key:
        return None
    fn = wrap_site.ctx.function
    block = fn.node.body.body if fn is not None and isinstance(fn.node.body, cst.IndentedBlock) else model.module.body
    if not any(s is wrap_stmt for s in block):
        return None
    if not any(s is stmt for s in block):
        # `if args.sync_bn: model = convert(model)`: move the whole `if`
        holder = next((s for s in block if isinstance(s, cst.If) and s.orelse is None
                       and isinstance(s.body, cst.IndentedBlock) and len(s.body.body) == 1
                       and s.body.body[0] is stmt), None)
        if holder is None:
            return None
        stmt = holder
    return MoveBefore(statement=stmt, anchor=wrap_stmt, safe=False)


def _assigns_call(stmt, key: str, call: cst.Call) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    assign = stmt.body[0]
    return (isinstance(assign, cst.Assign) and len(assign.targets) == 1
            and dotted_name(assign.targets[0].target) == key and assign.value is call)


# --- DDP307: `exist_ok=True` ----------------------------------------------------------

def exist_ok_edit(site: CallSite, checked: bool) -> Edit | None:
    """`os.makedirs(d)` / `Path(d).mkdir()` -> `..., exist_ok=True)`; `os.mkdir`
    has no such argument, and an explicit `exist_ok=False` is the author's
    choice. Safe under `if not os.path.exists(d):` (the call never met an
    existing folder in a single process either); otherwise unsafe: a script
    that relied on the error to refuse reusing a folder would go on."""
    if site.qual == "os.mkdir" or site.has_star_args or site.arg("exist_ok", 2) is not None:
        return None
    return AddArg(call=site.node, keyword="exist_ok", code="True", safe=checked)
