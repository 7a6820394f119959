"""Imports resolved the way Python resolves them, and the call graph across
modules: the script's folder, package roots, a src/ layout with
package-absolute imports inside its helpers, classes and their bases in two
helper modules, re-exports, star imports."""

from __future__ import annotations

from ddpcheck.model.flow import call_targets, called_qual_from, resolve_call, value_at
from tests.conftest import write
from tests.semantics.helpers import build_file, marked


def made(model, marker: str = "use") -> set[str]:
    expr, _ = marked(model, marker)
    value = value_at(model, expr)
    names = {(a.site.func or "?") for a in value.made}
    return names | ({"?"} if not value.known else set())


def test_a_helper_module_beside_the_script(tmp_path):
    write(tmp_path / "data.py", "from torch.utils.data import DataLoader, DistributedSampler\n"
                                "def build(ds):\n    return DataLoader(ds, sampler=DistributedSampler(ds))\n")
    train = write(tmp_path / "train.py", "from data import build\nloader = build(ds)\nuse(loader)\n")
    assert made(build_file(train)) == {"DataLoader"}


def test_src_layout_with_package_absolute_imports_inside_the_helpers(tmp_path):
    # scripts/train.py runs with src/ on the path (the project root names it);
    # mypkg/engine.py imports its sibling by the package's absolute name
    write(tmp_path / "src" / "mypkg" / "__init__.py", "")
    write(tmp_path / "src" / "mypkg" / "loaders.py",
          "from torch.utils.data import DataLoader\ndef make(ds):\n    return DataLoader(ds)\n")
    write(tmp_path / "src" / "mypkg" / "engine.py",
          "from mypkg.loaders import make\ndef loader_for(ds):\n    return make(ds)\n")
    train = write(tmp_path / "scripts" / "train.py",
                  "from mypkg.engine import loader_for\nuse(loader_for(ds))\n")
    assert made(build_file(train, root=tmp_path)) == {"DataLoader"}


def test_a_subclass_and_its_base_in_two_helper_modules(tmp_path):
    write(tmp_path / "base.py", "class BaseTrainer:\n"
                                "    def fit(self):\n        return self.make_loader()\n"
                                "    def make_loader(self):\n        return None\n")
    write(tmp_path / "trainer.py", "from torch.utils.data import DataLoader\nfrom base import BaseTrainer\n"
                                   "class Trainer(BaseTrainer):\n"
                                   "    def make_loader(self):\n        return DataLoader(self.ds)\n")
    train = write(tmp_path / "train.py", "from trainer import Trainer\nt = Trainer()\nuse(t.fit())\n")
    model = build_file(train)
    assert made(model) == {"DataLoader"}
    fit = next(c for c in model.calls if c.func == "t.fit")
    (tmodel, fn) = resolve_call(model, fit)
    assert tmodel.path.endswith("base.py") and fn.qualname == "BaseTrainer.fit"


def test_a_package_init_that_re_exports(tmp_path):
    write(tmp_path / "utils" / "__init__.py", "from .dist import save_on_master\n")
    write(tmp_path / "utils" / "dist.py", "import torch\ndef save_on_master(*a):\n    torch.save(*a)\n")
    train = write(tmp_path / "train.py", "import utils\nutils.save_on_master(sd, 'x.pt')\n")
    model = build_file(train)
    site = next(c for c in model.calls if c.func == "utils.save_on_master")
    targets = call_targets(model, site)
    assert [(m.path.rpartition("/")[2], fn.name) for m, fn in targets] == [("dist.py", "save_on_master")]


def test_a_star_import_of_a_helper(tmp_path):
    write(tmp_path / "helpers.py", "from torch.utils.data import DataLoader\ndef get(ds):\n    return DataLoader(ds)\n")
    train = write(tmp_path / "train.py", "from helpers import *\nuse(get(ds))\n")
    assert made(build_file(train)) == {"DataLoader"}


def test_a_library_name_is_never_parsed_as_a_helper(tmp_path):
    # a checkout that has a torch/ folder beside the script: still the library
    write(tmp_path / "torch" / "__init__.py", "def save(*a):\n    pass\n")
    train = write(tmp_path / "train.py", "import torch\ntorch.save(sd, 'x.pt')\n")
    model = build_file(train)
    site = next(c for c in model.calls if c.func == "torch.save")
    assert call_targets(model, site) == ()


def test_a_call_of_a_parameter_runs_what_the_caller_passes(tmp_path):
    write(tmp_path / "ctx.py", "from contextlib import contextmanager\n"
                               "@contextmanager\n"
                               "def maybe(flag, manager, *args, **kwargs):\n"
                               "    if flag:\n"
                               "        with manager(*args, **kwargs):\n"
                               "            yield\n"
                               "    else:\n"
                               "        yield\n"
                               "def rebinding(flag, manager):\n"
                               "    manager = print\n"
                               "    manager()\n")
    train = write(tmp_path / "train.py", "import wandb\nfrom ctx import maybe, rebinding\n"
                                         "with maybe(True, wandb.init, project='p'):\n    pass\n"
                                         "rebinding(True, wandb.init)\n")
    model = build_file(train)
    outer = next(c for c in model.calls if c.func == "maybe")
    tmodel, fn = resolve_call(model, outer)
    inner = next(c for c in tmodel.calls_in(fn) if c.func == "manager")
    assert called_qual_from(tmodel, inner, (model, outer)) == "wandb.init"
    assert called_qual_from(tmodel, inner, None) is None   # no caller: unknown
    other = next(c for c in model.calls if c.func == "rebinding")
    rmodel, rfn = resolve_call(model, other)
    rebound = next(c for c in rmodel.calls_in(rfn) if c.func == "manager")
    assert called_qual_from(rmodel, rebound, (model, other)) == "print"   # rebound: not what was passed


def test_a_module_of_a_namespace_package(tmp_path):
    # a folder with no __init__.py is a namespace package: `from helpers import loaders`
    # imports helpers/loaders.py, as Python 3 does
    write(tmp_path / "helpers" / "loaders.py",
          "from torch.utils.data import DataLoader\ndef build(ds):\n    return DataLoader(ds)\n")
    train = write(tmp_path / "train.py", "from helpers import loaders as ld\nuse(ld.build(ds))\n")
    assert made(build_file(train)) == {"DataLoader"}
    # a name the folder has no module for stays a library name
    other = write(tmp_path / "other.py", "from helpers import missing\nuse(missing.build(ds))\n")
    assert "DataLoader" not in made(build_file(other))
