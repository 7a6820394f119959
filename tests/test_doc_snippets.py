"""The commands README.md and docs/ show with their output are re-run and
compared (tests/doc_snippets.py says how a block is marked and compared)."""

from __future__ import annotations

import pytest

from tests import doc_snippets
from tests.doc_snippets import Block, blocks_in, doc_files, output_matches, report, run_block


def _all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks_in(path)]


BLOCKS = _all_blocks()


def test_the_readme_shows_checked_output():
    readme = [b for b in BLOCKS if b.path.name == "README.md" and b.path.parent == doc_snippets.REPO]
    assert len([b for b in readme if not b.skip]) >= 3


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.skip], ids=lambda b: b.name)
def test_shown_output_is_what_ddpcheck_prints(block):
    runs = run_block(block)
    assert all(r.ok for r in runs), report(block, runs)


def test_skipped_blocks_say_why():
    for block in BLOCKS:
        if block.skip:
            assert len(block.skip.split()) >= 3, f"{block.name}: say why it is not re-run"


# --- the comparison itself ----------------------------------------------------------------------

def test_wrapping_and_alignment_do_not_count():
    assert output_matches(["a b", "c   d"], "a\nb c d\n")
    assert output_matches(["x  ----  --", "1  2"], "x ------ ---\n1 2\n")


def test_timings_and_temp_folders_are_normalised():
    assert output_matches(["done (3.1 s), 7.6 ms, 1.07 GB/s", "logs: /tmp/ddpcheck-preflight-abc/logs"],
                          "done (12.0 s), 0.4 ms, 20.5 GB/s\nlogs: /tmp/ddpcheck-preflight-x_9/logs")
    assert not output_matches(["8607 samples"], "8608 samples")
    assert output_matches(["peak 16.2 KiB in one step"], "peak 16.3 KiB in one step")
    assert not output_matches(["peak 16.2 KiB in one step"], "peak 17.2 KiB in one step")
    assert not output_matches(["peak 16.2 KiB in one step"], "peak 16.2 MiB in one step")


def test_a_changed_word_fails():
    assert not output_matches(["Found 6 findings"], "Found 7 findings")
    assert not output_matches(["a", "b"], "a\nb\nc")


def test_dots_stand_for_any_text():
    assert output_matches(["first", "...", "last"], "first\nmiddle\nmore\nlast")
    assert not output_matches(["first", "...", "last"], "first\nmiddle\nlast but not")


def test_box_tables_are_read_cell_by_cell():
    narrow = ["┌──┬─────┐", "│ A │ one  │", "│   │ two  │", "├──┼─────┤", "│ B │ three │", "└──┴─────┘"]
    wide = ["┌──┬──────────┐", "│ A │ one two  │", "├──┼──────────┤", "│ B │ three    │", "└──┴──────────┘"]
    assert output_matches(narrow, "\n".join(wide))
    assert not output_matches(narrow, "\n".join(w.replace("three", "four ") for w in wide))


def test_the_exit_status_is_compared(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("<!-- check-output -->\n```text\n$ echo hi; exit 3\nhi\n(exit 1)\n```\n")
    (block,) = blocks_in(doc)
    runs = run_block(block)
    assert runs[0].exit_code == 3 and not runs[0].ok


def test_a_block_without_a_directive_is_refused(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("```text\n$ ddpcheck lint x.py\n```\n")
    with pytest.raises(doc_snippets.DirectiveError):
        blocks_in(doc)
