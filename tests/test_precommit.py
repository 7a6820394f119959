"""The real pre-commit hook: `pre-commit try-repo` builds its own virtualenv,
pip-installs ddpcheck from this checkout (a wheel, not editable) and runs the
`ddpcheck` hook. Slow (one virtualenv), so it is a single test."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GUARDED_SAVE, MISSING_SET_EPOCH, REPO, WITH_SET_EPOCH, git_available, needs_rule, write

pytestmark = pytest.mark.skipif(not git_available(), reason="pre-commit needs git")
PRE_COMMIT = (sys.executable, "-m", "pre_commit")  # a test dependency, installed with ddpcheck[test]

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def run(*cmd: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def snapshot_checkout(dest: Path, env: dict) -> Path:
    """A one-commit git repo holding this checkout's files as they are now
    (committed, modified and new-but-not-ignored), so the hook is tested on
    the working tree, not only on HEAD. Build outputs and venvs are ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        source = REPO / rel
        if source.is_symlink():
            # ddpcheck/rule_pages -> ../rules is how the pages get into the wheel
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(source), dest / rel)
        elif source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "snapshot", "--no-gpg-sign"]):
        subprocess.run(cmd, cwd=dest, env=env, check=True, capture_output=True)
    return dest


@needs_rule("DDP101")
def test_precommit_hook_fails_on_a_buggy_script_and_passes_on_a_fixed_one(tmp_path):
    env = dict(os.environ, **GIT_ENV, PRE_COMMIT_HOME=str(tmp_path / "cache"), NO_COLOR="1")
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    hook_repo = snapshot_checkout(tmp_path / "ddpcheck-src", env)

    project = tmp_path / "project"
    write(project / "train_buggy.py", MISSING_SET_EPOCH)
    write(project / "train_fixed.py", WITH_SET_EPOCH)
    write(project / "save_ok.py", GUARDED_SAVE)
    subprocess.run(["git", "init", "-q"], cwd=project, env=env, check=True)
    subprocess.run(["git", "add", "-A"], cwd=project, env=env, check=True)

    bad = run(*PRE_COMMIT, "try-repo", str(hook_repo), "ddpcheck", "--files", "train_buggy.py",
              cwd=project, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Failed" in bad.stdout and "train_buggy.py:" in bad.stdout and "DDP101" in bad.stdout

    # The passing run goes through a real .pre-commit-config.yaml, as a user
    # would set it up; its environment then stays in PRE_COMMIT_HOME to inspect.
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hook_repo, capture_output=True, text=True,
                         check=True).stdout.strip()
    write(project / ".pre-commit-config.yaml",
          f"repos:\n  - repo: {hook_repo}\n    rev: {rev}\n    hooks:\n      - id: ddpcheck\n")
    good = run(*PRE_COMMIT, "run", "--files", "train_fixed.py", "save_ok.py", cwd=project, env=env)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout

    # The hook's environment got a real (non-editable) install: the rule pages
    # shipped inside the wheel, and torch was not pulled in.
    [hook_bin] = glob.glob(str(tmp_path / "cache" / "repo*" / "py_env-*" / "bin"))
    page = run(os.path.join(hook_bin, "ddpcheck"), "rule", "DDP101", cwd=project, env=env)
    assert page.returncode == 0 and "## What it does" in page.stdout, page.stderr
    no_torch = run(os.path.join(hook_bin, "python"), "-c",
                   "import importlib.util, ddpcheck; "
                   "assert 'site-packages' in ddpcheck.__file__, ddpcheck.__file__; "
                   "assert importlib.util.find_spec('torch') is None",
                   cwd=project, env=env)
    assert no_torch.returncode == 0, no_torch.stderr
