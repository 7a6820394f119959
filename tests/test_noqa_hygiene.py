"""noqa hygiene: DDP001 for unknown or unused `# noqa: DDPnnn`, file-level
`# ddpcheck: noqa`, and `--add-noqa`."""

from __future__ import annotations

from click.testing import CliRunner

from ddpcheck import cli
from ddpcheck.lint.engine import lint_source
from ddpcheck.lint.noqa import add_noqa, directives, file_exemption
from ddpcheck.rules.base import REGISTRY
from ddpcheck.settings import LintSettings
from tests.conftest import GUARDED_SAVE, MISSING_SET_EPOCH, UNGUARDED_SAVE, needs_rule, write

EVERY_RULE = LintSettings(enabled=frozenset(REGISTRY))
SAVE_LINE = 'torch.save(model.state_dict(), "ckpt.pt")'


def codes(text: str, settings: LintSettings = EVERY_RULE) -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in lint_source(text, "t.py", settings)]


@needs_rule("DDP301")
def test_a_used_noqa_is_silent():
    text = UNGUARDED_SAVE.replace(SAVE_LINE, SAVE_LINE + "  # noqa: DDP301")
    assert all(code != "DDP301" and code != "DDP001" for _, code in codes(text))


@needs_rule("DDP301")
def test_an_unused_noqa_is_reported_under_ddp001():
    text = GUARDED_SAVE.replace(SAVE_LINE, SAVE_LINE + "  # noqa: DDP301")
    found = lint_source(text, "t.py", EVERY_RULE)
    [unused] = [f for f in found if f.code == "DDP001"]
    assert unused.line == 7 and "unused: `DDP301`" in unused.message


def test_an_unknown_code_is_reported_and_other_tools_codes_are_not():
    text = "import torch.distributed as dist\nx = 1  # noqa: DDP999\ny = 2  # noqa: E501, F401\nz = 3  # noqa\n"
    found = lint_source(text, "t.py", EVERY_RULE)
    assert [(f.line, f.code) for f in found] == [(2, "DDP001")]
    assert "unknown: `DDP999`" in found[0].message


def test_lower_case_and_spaced_own_codes_are_judged_in_a_file_without_findings():
    # The cheap guard that skips tokenizing other tools' noqa comments must
    # still see these (codes are compared upper-cased).
    text = "import torch.distributed as dist\nx = 1  # NoQA:ddp999\ny = 2  # noqa: E501,  ddp301\n"
    found = lint_source(text, "t.py", EVERY_RULE)
    assert [(f.line, f.code) for f in found] == [(2, "DDP001"), (3, "DDP001")]


def test_a_disabled_rule_is_not_judged_unused():
    text = "import torch.distributed as dist\nx = 1  # noqa: DDP301\n"
    assert codes(text, LintSettings(enabled=frozenset({"DDP001", "DDP101"}))) == []
    assert codes(text, LintSettings(enabled=frozenset({"DDP001", "DDP301"}))) == [(2, "DDP001")]
    # and DDP001 itself can be turned off
    assert codes(text, LintSettings(enabled=frozenset({"DDP301"}))) == []


def test_file_level_noqa_all_or_listed_codes():
    assert file_exemption("x = 1\n") is False
    assert file_exemption("# ddpcheck: noqa\nx = 1\n") is None
    assert file_exemption("# ddpcheck: noqa: DDP101, DDP301\n") == frozenset({"DDP101", "DDP301"})
    assert file_exemption('s = "# ddpcheck: noqa"\n') is False   # a string, not a comment


@needs_rule("DDP101")
def test_file_level_noqa_silences_the_file():
    everything = "# ddpcheck: noqa\n" + MISSING_SET_EPOCH
    assert codes(everything) == []
    only_101 = "# ddpcheck: noqa: DDP101\n" + MISSING_SET_EPOCH
    remaining = codes(only_101)
    assert remaining and all(code != "DDP101" for _, code in remaining)
    unused = "# ddpcheck: noqa: DDP503\n" + MISSING_SET_EPOCH
    assert (1, "DDP001") in codes(unused)


def test_directives_list_only_code_lists():
    text = "a = 1  # noqa\nb = 2  # noqa: DDP101,DDP301\n# ddpcheck: noqa: DDP102\n"
    found = directives(text)
    assert [(d.line, d.codes, d.file_level) for d in found] == [
        (2, ("DDP101", "DDP301"), False), (3, ("DDP102",), True)]


def test_add_noqa_appends_and_merges():
    from ddpcheck.findings import Finding, Severity

    def f(line, code):
        return Finding("t.py", line, 1, code, "n", Severity.WARNING, "m", "x")

    text = "a = 1\nb = 2  # keep this\nc = 3  # noqa: DDP301\nd = '''\n'''\n"
    new, changed = add_noqa(text, [f(1, "DDP101"), f(2, "DDP101"), f(3, "DDP102"), f(3, "DDP301"), f(4, "DDP101")])
    assert new.splitlines() == ["a = 1  # noqa: DDP101", "b = 2  # keep this  # noqa: DDP101",
                                "c = 3  # noqa: DDP301, DDP102", "d = '''", "'''"]
    assert changed == 3
    assert add_noqa(new, [f(1, "DDP101")]) == (new, 0)


@needs_rule("DDP101")
def test_add_noqa_command_silences_the_current_findings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", MISSING_SET_EPOCH)
    runner = CliRunner()
    before = runner.invoke(cli.main, ["lint", "--no-cache", "."], catch_exceptions=False)
    assert before.exit_code == 1
    added = runner.invoke(cli.main, ["lint", "--no-cache", "--add-noqa", "."], catch_exceptions=False)
    assert added.exit_code == 0 and "Added 2 noqa directives." in added.stderr
    text = (tmp_path / "train.py").read_text()
    assert "for epoch in range(10):  # noqa: DDP101\n" in text
    after = runner.invoke(cli.main, ["lint", "--no-cache", "."], catch_exceptions=False)
    assert after.exit_code == 0 and "All checks passed" in after.stdout
