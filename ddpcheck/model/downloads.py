"""Calls that download into a shared folder: a data set class asked to
download (`torchvision.datasets.CIFAR10(root, download=True)`, torchaudio's
data sets, and a repo's own class that follows their convention:
`COCO_Dataset(root, split="train", download=True)`) and the plain fetchers that write straight to a named file
(torchvision's `download_url` / `download_and_extract_archive`,
`urllib.request.urlretrieve`, `wget.download`).

Not downloads for this question: `download=False` or a value computed at run
time (unknown stays unknown), `torch.hub` / torchvision `weights=` /
`pretrained=True` (the hub writes to a temporary file and renames it into
place, so concurrent fetches waste bandwidth but do not corrupt the cache),
Hugging Face `from_pretrained` / `load_dataset` (they take file locks)."""

from __future__ import annotations

import libcst as cst

from ddpcheck.model.names import dotted_name
from ddpcheck.model.paths import per_rank_path
from ddpcheck.model.script import CallSite, ScriptModel

# Packages whose data set classes take `download=True`.
DATASET_PACKAGES = ("torchvision.datasets.", "torchaudio.datasets.", "torchtext.datasets.")
# Functions that write the fetched bytes straight to the target path.
FETCHERS = {
    "torchvision.datasets.utils.download_url", "torchvision.datasets.utils.download_and_extract_archive",
    "torchvision.datasets.utils.download_file_from_google_drive", "torchvision.datasets.utils.download_and_extract",
    "urllib.request.urlretrieve", "wget.download",
}


def _literal_true(site: CallSite, keyword: str) -> bool:
    value = site.arg(keyword)
    return isinstance(value, cst.Name) and value.value == "True"


def _names_a_data_set(site: CallSite) -> bool:
    """A class (`COCO_Dataset`, `VOCSegmentation`, a subclass of CIFAR10) or a
    builder that says it makes a data set (`build_dataset`, `get_data`):
    torchvision's `download=True` convention, which training repos copy for
    their own data set classes."""
    q = site.qual or site.func or ""
    if q.startswith(DATASET_PACKAGES):
        return True
    last = q.rpartition(".")[2]
    return last[:1].isupper() or "data" in last.lower()


def _looked_up_in_a_data_set_module(model: ScriptModel, site: CallSite) -> bool:
    """The class is picked by name from a module of data sets
    (`datasets.__dict__[args.name](...)`, `getattr(datasets, name)(...)`,
    `datasets` being `torchvision.datasets` or a package's own `datasets`)."""
    func = site.node.func
    module = None
    if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Attribute) and func.value.attr.value == "__dict__":
        module = func.value.value
    elif isinstance(func, cst.Call) and dotted_name(func.func) == "getattr" and func.args:
        module = func.args[0].value
    name = dotted_name(module) if module is not None else None
    if name is None:
        return False
    qual = model.imports.qualify(name) + "."
    return qual.startswith(DATASET_PACKAGES) or "data" in name.rpartition(".")[2].lower()


def download_call(model: ScriptModel, site: CallSite) -> str | None:
    """What the call downloads ("the data set", "the file"), or None."""
    q = site.qual or ""
    if _literal_true(site, "download") and (_names_a_data_set(site) or _looked_up_in_a_data_set_module(model, site)):
        return "data set"
    if q in FETCHERS:
        return "file"
    return None


def same_download(model: ScriptModel, site: CallSite) -> bool:
    """A download every rank makes into the same place (a root of its own
    per rank, `Path(data_path) / str(rank)`, is not one)."""
    return download_call(model, site) is not None and not per_rank_path(
        model, site.arg("root", 0), site.ctx.function)


__all__ = ["download_call", "same_download", "DATASET_PACKAGES", "FETCHERS"]
