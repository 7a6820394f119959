"""`ddpcheck lint --diff` prints a patch that `git apply` and `patch -p1`
accept, for every kind of file `--fix` can change, and applying it gives what
`--fix` writes: files without a final newline, CRLF files, files in another
encoding declared by a PEP 263 cookie, files with a UTF-8 BOM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import git_available, needs_rule

GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")


def ddpcheck_bytes(*args: str, cwd, input: bytes | None = None) -> subprocess.CompletedProcess:
    """The real CLI, its output as bytes (a diff is in each file's own encoding)."""
    return subprocess.run([sys.executable, "-m", "ddpcheck", *args], cwd=cwd, input=input,
                          capture_output=True, timeout=300)

BODY = (
    "import torch.distributed as dist\n"
    "from torch.utils.data import DataLoader, DistributedSampler\n"
    "\n"
    "dist.init_process_group(\"nccl\")\n"
    "sampler = DistributedSampler(ds)\n"
    "loader = DataLoader(ds, batch_size=8, sampler=sampler)\n"
    "for epoch in range(10):\n"
    "    for batch in loader:\n"
    "        step(batch)  # {note}\n"
)
COOKIE = "# -*- coding: {encoding} -*-\n"

# name -> the file's bytes. The fixes (DDP101 inserts set_epoch at the top of
# the loop, DDP402 appends destroy_process_group() at the end) touch the first
# lines of the loop and the very last line.
CASES = {
    "plain.py": BODY.format(note="plain").encode(),
    "no_final_newline.py": BODY.format(note="no newline at the end").rstrip("\n").encode(),
    "crlf.py": BODY.format(note="windows").replace("\n", "\r\n").encode(),
    "crlf_no_final_newline.py": BODY.format(note="both").replace("\n", "\r\n").rstrip("\r\n").encode(),
    "latin1.py": (COOKIE.format(encoding="latin-1") + BODY.format(note="café, naïve")).encode("latin-1"),
    "latin1_crlf_no_newline.py": (COOKIE.format(encoding="latin-1") + BODY.format(note="été"))
    .replace("\n", "\r\n").rstrip("\r\n").encode("latin-1"),
    "cp1252.py": (COOKIE.format(encoding="cp1252") + BODY.format(note="“quoted” €")).encode("cp1252"),
    "bom.py": b"\xef\xbb\xbf" + BODY.format(note="BOM, ünïcode").encode(),
    "form_feed.py": BODY.format(note="a form feed \x0c and a line separator \u2028 in a comment").encode(),
}

pytestmark = [pytest.mark.skipif(not git_available(), reason="needs git"), needs_rule("DDP101"),
              needs_rule("DDP402")]


def _tree(root, cases):
    root.mkdir()
    for name, data in cases.items():
        (root / name).write_bytes(data)
    return root


def _contents(root, cases):
    return {name: (root / name).read_bytes() for name in cases}


@pytest.fixture(scope="module")
def fixed_and_diff(tmp_path_factory):
    base = tmp_path_factory.mktemp("diff")
    fixed = _tree(base / "fixed", CASES)
    result = ddpcheck_bytes("lint", "--no-cache", "--fix", "--select", "DDP101,DDP402", *CASES, cwd=fixed)
    assert result.returncode in (0, 1), result.stderr.decode()
    diffed = _tree(base / "diffed", CASES)
    diff = ddpcheck_bytes("lint", "--no-cache", "--diff", "--select", "DDP101,DDP402", *CASES, cwd=diffed)
    assert diff.returncode == 1, diff.stderr.decode()
    assert _contents(diffed, CASES) == CASES, "--diff wrote a file"
    return base, _contents(fixed, CASES), diff.stdout


def test_fix_changes_every_case_and_keeps_its_encoding(fixed_and_diff):
    _, fixed, _ = fixed_and_diff
    for name, data in CASES.items():
        assert fixed[name] != data, name
        assert b"set_epoch(epoch)" in fixed[name] and b"destroy_process_group()" in fixed[name], name
    assert "café, naïve".encode("latin-1") in fixed["latin1.py"]
    assert "“quoted” €".encode("cp1252") in fixed["cp1252.py"]
    assert fixed["bom.py"].startswith(b"\xef\xbb\xbf") and fixed["bom.py"].count(b"\xef\xbb\xbf") == 1
    crlf = fixed["crlf.py"]
    assert crlf.count(b"\r\n") == crlf.count(b"\n"), "a CRLF file got LF lines"
    assert not fixed["no_final_newline.py"].endswith(b"\n")


def test_the_diff_marks_a_last_line_without_newline(fixed_and_diff):
    _, _, diff = fixed_and_diff
    assert diff.count(b"\n\\ No newline at end of file\n") >= 6   # old and new side of 3 files


def test_git_apply_gives_what_fix_writes(fixed_and_diff):
    base, fixed, diff = fixed_and_diff
    repo = _tree(base / "git", CASES)
    env = GIT_ENV
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x", "--no-gpg-sign"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    (base / "fix.patch").write_bytes(diff)
    done = subprocess.run(["git", "apply", "--check", str(base / "fix.patch")], cwd=repo, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    done = subprocess.run(["git", "apply", str(base / "fix.patch")], cwd=repo, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert _contents(repo, CASES) == fixed


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch")
def test_patch_gives_what_fix_writes(fixed_and_diff):
    base, fixed, diff = fixed_and_diff
    tree = _tree(base / "patch", CASES)
    done = subprocess.run(["patch", "-p1", "--batch", "--no-backup-if-mismatch"], cwd=tree, input=diff,
                          capture_output=True)
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")
    assert _contents(tree, CASES) == fixed
    assert not [p.name for p in tree.iterdir() if p.suffix in (".rej", ".orig")]


def test_the_diff_of_stdin_applies(tmp_path):
    source = CASES["no_final_newline.py"]
    (tmp_path / "train.py").write_bytes(source)
    diff = ddpcheck_bytes("lint", "--no-cache", "--diff", "--select", "DDP101", "-", "--stdin-filename",
                          "train.py", cwd=tmp_path, input=source)
    assert diff.returncode == 1
    done = subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=diff.stdout, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert b"sampler.set_epoch(epoch)" in (tmp_path / "train.py").read_bytes()
