"""The settings one file is linted with: a leaf module, so the driver, the
model and the rules all read the same typed object."""

from __future__ import annotations

from dataclasses import dataclass

# Globs (gitignore-style, as `exclude`) naming test code: a test is judged as
# what it is, not as a training script (each rule's page says whether it looks
# at tests). `test-files` in config replaces this list; `[]` lints tests as scripts.
DEFAULT_TEST_FILES: tuple[str, ...] = ("tests", "test", "test_*.py", "*_test.py", "conftest.py")


@dataclass(frozen=True)
class LintSettings:
    """What to run on one file. The runner resolves config (select/ignore,
    per-file-ignores) into `enabled` before calling the engine."""

    enabled: frozenset[str]
    # Extra helper names that mean "only rank 0 runs this" (config key
    # main-process-guards), e.g. ("is_chief", "on_master").
    main_process_guards: tuple[str, ...] = ()
    # Folder that bounds the search for local modules a script imports
    # (`from utils import save_on_master`); None: the file's own folder and up
    # to the nearest folder without a package marker.
    root: str | None = None
    # Files that are test code (config key test-files) ...
    test_files: tuple[str, ...] = DEFAULT_TEST_FILES
    # ... and files that are training scripts whatever their place or shape
    # (config key script-files): every rule looks at them.
    script_files: tuple[str, ...] = ()
    # The folder the run was started from: where a project with no marker of
    # its own (no `.git`, packaging file or license above the script, say a
    # downloaded archive) is taken to begin when its launch documents are
    # looked for (model/launch.py). None: the script's own folder.
    invoked_from: str | None = None
