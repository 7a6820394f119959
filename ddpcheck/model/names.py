"""Import aliases and dotted names.

Resolving `dist.all_reduce` to `torch.distributed.all_reduce` only needs the
file's import statements, so instead of libcst's QualifiedNameProvider (about 6x
the cost of a parse) the builder records a small alias table in the same visit.
"""

from __future__ import annotations

import libcst as cst


# libcst's node classes are ABCs, so an isinstance test that fails runs the
# ABC's __instancecheck__ (a Python call); neither of these two has subclasses,
# so comparing the type is the same test without it (dotted_name is asked of
# every name, attribute and call of every module).
_NAME, _ATTRIBUTE = cst.Name, cst.Attribute   # tests/model/test_children.py checks they have none


def dotted_name(node: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    node_type = type(node)
    if node_type is _NAME:
        return node.value
    if node_type is not _ATTRIBUTE:
        return None
    parts: list[str] = []
    while type(node) is _ATTRIBUTE:
        parts.append(node.attr.value)
        node = node.value
    if type(node) is _NAME:
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def string_value(expr) -> str | None:
    """The text of a string literal (`"nccl"`, `'a' 'b'`), else None."""
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def module_dotted(node: cst.BaseExpression | None) -> str:
    if node is None:
        return ""
    return dotted_name(node) or ""


class ImportTable:
    """Local name -> what it was imported as (`dist` -> `torch.distributed`).

    Flow-insensitive on purpose: training scripts import at the top or inside
    `main()`, and a name imported twice as two different things is rare enough
    that the last import winning is fine."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        # local name -> (module, relative level, imported attribute or None)
        self.sources: dict[str, tuple[str, int, str | None]] = {}
        self.star_modules: list[str] = []

    def add_import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = module_dotted(alias.name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
                self.aliases[local] = full
                self.sources[local] = (full, 0, None)
            else:
                root = full.split(".")[0]
                self.aliases[root] = root
                self.sources[root] = (root, 0, None)

    def add_import_from(self, node: cst.ImportFrom) -> None:
        module = module_dotted(node.module)
        level = len(node.relative)
        prefix = ("." * level) + module
        if isinstance(node.names, cst.ImportStar):
            self.star_modules.append(prefix)
            return
        for alias in node.names:
            name = module_dotted(alias.name)
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.aliases[local] = f"{prefix}.{name}" if prefix else name
            self.sources[local] = (module, level, name)

    def qualify(self, dotted: str) -> str:
        """Replace the first component by what it was imported as."""
        head, _, rest = dotted.partition(".")
        target = self.aliases.get(head)
        if target is None:
            return dotted
        return f"{target}.{rest}" if rest else target

    def is_imported(self, name: str) -> bool:
        return name.split(".")[0] in self.aliases


def is_environ(imports: "ImportTable", expr: cst.BaseExpression) -> bool:
    """`os.environ`, however `os` or `environ` was imported."""
    d = dotted_name(expr)
    return bool(d) and imports.qualify(d) == "os.environ"


def environ_key(imports: "ImportTable", node: cst.Subscript) -> str | None:
    """"LOCAL_RANK" for `os.environ["LOCAL_RANK"]`, else None."""
    if not is_environ(imports, node.value) or len(node.slice) != 1:
        return None
    idx = node.slice[0].slice
    return string_value(idx.value) if isinstance(idx, cst.Index) else None


def last(qualname: str) -> str:
    return qualname.rpartition(".")[2]


def is_torch_api(qualname: str | None, *names: str, module: str = "torch") -> bool:
    """True if `qualname` is one of torch's `names`, however it was reached
    (`torch.nn.parallel.DistributedDataParallel`,
    `torch.nn.parallel.distributed.DistributedDataParallel`, a star import...).

    A bare, unimported name counts too: star imports from torch are common in
    scripts, and a local definition of the same name is checked by the caller."""
    if not qualname:
        return False
    if last(qualname) not in names:
        return False
    if "." not in qualname:
        return True
    return qualname.startswith(module + ".") or qualname == module


WRAPPER_CLASSES = ("DataParallel", "DistributedDataParallel")


def wrapper_classes_named(imports: ImportTable, classes: cst.BaseExpression) -> frozenset[str] | None:
    """The torch wrapper classes (`DataParallel`, `DistributedDataParallel`)
    that an `isinstance` second argument names, one class or a tuple of them;
    None when it names anything else (a class of the tree, an alias the
    imports do not tell)."""
    named = [e.value for e in classes.elements] if isinstance(classes, cst.Tuple) else [classes]
    kinds = set()
    for cls in named:
        qual = imports.qualify(dotted_name(cls) or "")
        if "." not in qual or not is_torch_api(qual, *WRAPPER_CLASSES):
            return None
        kinds.add(last(qual))
    return frozenset(kinds)
