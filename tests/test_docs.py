"""README.md, the rule tables and the version say what the code does."""

from __future__ import annotations

import re

import ddpcheck
from ddpcheck.rules.base import REGISTRY
from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
_TABLE_ROW = re.compile(r"^\| \[(DDP\d{3})\]\((?:rules/)?DDP\d{3}\.md\) \| ([\w-]+) \| ([a-z]+)", re.MULTILINE)
_LINK = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_fits_and_starts_with_the_user():
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300)"
    first = "\n".join(lines[:60])
    for needed in ("pip install ddpcheck", "pip install 'ddpcheck[preflight]'", "ddpcheck lint train.py",
                   "ddpcheck preflight --gpus 2 --dataset-size 8607", "ddpcheck preflight --gpus 2 -- train.py"):
        assert needed in first, f"the first 60 lines of README.md lack {needed!r}"


def _table(text: str) -> dict[str, tuple[str, str]]:
    return {code: (name, severity) for code, name, severity in _TABLE_ROW.findall(text)}


def test_rule_tables_list_every_rule_with_its_name_and_severity():
    expected = {code: (rule.name, str(rule.severity)) for code, rule in REGISTRY.items()}
    for path in (REPO / "README.md", REPO / "rules" / "README.md"):
        assert _table(path.read_text(encoding="utf-8")) == expected, path


def test_readme_links_lead_to_files():
    missing = [target for target in _LINK.findall(README) if not (REPO / target).exists()]
    assert not missing, missing


def test_snippets_use_the_released_version():
    tag = f"v{ddpcheck.__version__}"
    for path in (REPO / "README.md", REPO / "docs" / "output-and-ci.md"):
        text = path.read_text(encoding="utf-8")
        revs = re.findall(r"rev: (\S+)", text) + re.findall(r"ddpcheck/ddpcheck@(\S+?)[\"']", text)
        assert revs and set(revs) == {tag}, (path, revs)


def test_the_changelog_has_the_version():
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(ddpcheck.__version__)} ", changelog, re.MULTILINE)


def test_snippets_name_the_repository_the_rule_pages_point_at():
    from ddpcheck.pages import HOME_URL

    assert f"repo: {HOME_URL}\n" in README
