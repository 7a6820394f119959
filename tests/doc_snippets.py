"""Re-run the commands that README.md and docs/ show with their output, and
compare: the documentation cannot drift from what ddpcheck prints.

A fenced ```text block whose lines start with `$ ddpcheck` (or another `$ `
command) shows commands and their output. It must be preceded by a
directive comment that says how to reproduce it, or why it is not re-run:

    <!-- check-output -->                 run in a fresh empty temp folder
    <!-- check-output
    copy: fixtures/scripts/ssd_like/train_buggy.py train.py
    setup: printf 'x = 1\\n' > a.py
    -->                                   copy files/folders from the repository,
                                          run shell set-up lines, then the commands
    <!-- check-output: run-in: repo -->   run in the repository (read-only commands)
    <!-- check-output: skip: REASON -->   not re-run (a benchmark's figures: say
                                          where they were measured)

Each `$ COMMAND` line (a trailing backslash continues it) runs in bash with
this Python's scripts folder first on PATH, stdout and stderr together,
COLUMNS=100 and no colour. The lines up to the next `$ ` are the expected
output; an optional last line `(exit N)` is compared with the exit status.
Comparison is on words, so re-wrapped lines and re-aligned table columns do
not count: box-drawn tables are read back cell by cell, timings (`3.1 s`,
`7.6 ms`, `1.07 GB/s`), the tenths of memory sizes (`16.2 KiB`: a CPU training step's
measured peak moves by a few bytes from run to run)
and temp folder names are normalised, and a `...`
line (or word) in the expected output stands for any text.

`python tests/doc_snippets.py [FILE...]` checks from the command line;
`--write` replaces the expected output of every re-run block that has no
`...` with what the commands print now.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = ("README.md", "docs")

_DIRECTIVE = re.compile(r"<!--\s*check-output\s*(?::\s*(?P<inline>.*?))?\s*(?P<body>\n.*?)?-->", re.DOTALL)
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_EXIT = re.compile(r"^\(exit (\d+)\)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIME = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|GB/s|MB/s|GiB/s|MiB/s)(?![\w/])")
_SIZE_TENTHS = re.compile(r"\b(\d+)\.\d\s?(KiB|MiB|GiB)\b")
_TEMP = re.compile(r"/tmp/ddpcheck-[\w.-]+")
_BOX_ROW = "│┃"
_BOX_RULE = re.compile(r"^[┌├└╞╘╒┏┣┗][─━┬┼┴╪═┳╋┻┐┤┘╡╛╕┓┫┛]+$")


@dataclass
class Command:
    line: str
    expected: list[str]
    exit_code: int | None


@dataclass
class Block:
    path: Path
    lineno: int
    skip: str | None = None
    run_in_repo: bool = False
    copies: list[tuple[str, str]] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    span: tuple[int, int] = (0, 0)  # the block's code, as offsets in the file's text

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path}:{self.lineno}"


class DirectiveError(Exception):
    pass


def doc_files() -> list[Path]:
    files = []
    for name in DOC_FILES:
        p = REPO / name
        files += sorted(p.rglob("*.md")) if p.is_dir() else [p]
    return files


def _shows_output(code: str) -> bool:
    return any(line.startswith("$ ") for line in code.splitlines())


def _parse_directive(block: Block, inline: str | None, body: str | None) -> None:
    lines = ([inline] if inline else []) + [ln.strip() for ln in (body or "").splitlines() if ln.strip()]
    for line in lines:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "skip":
            if not value:
                raise DirectiveError(f"{block.name}: `skip:` needs a reason")
            block.skip = value
        elif key == "run-in" and value == "repo":
            block.run_in_repo = True
        elif key == "copy":
            parts = value.split()
            if len(parts) != 2:
                raise DirectiveError(f"{block.name}: `copy: SOURCE DEST`, got {value!r}")
            block.copies.append((parts[0], parts[1]))
        elif key == "setup":
            block.setup.append(value)
        else:
            raise DirectiveError(f"{block.name}: unknown check-output line {line!r}")


def _parse_commands(code: str) -> list[Command]:
    commands: list[Command] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if commands:
                commands[-1].expected.append(line)
            i += 1
            continue
        cmd = line[2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1] + " " + lines[i].strip()
        commands.append(Command(cmd, [], None))
        i += 1
    for c in commands:
        while c.expected and not c.expected[-1].strip():
            c.expected.pop()
        if c.expected and (m := _EXIT.match(c.expected[-1].strip())):
            c.exit_code = int(m.group(1))
            c.expected.pop()
    return commands


def blocks_in(path: Path) -> list[Block]:
    """Every output-showing block of a markdown file, with its directive."""
    text = path.read_text(encoding="utf-8")
    found = []
    for fence in _FENCE.finditer(text):
        code = fence["code"]
        if fence["lang"] not in ("", "text", "console", "shell-session") or not _shows_output(code):
            continue
        block = Block(path, text.count("\n", 0, fence.start()) + 1, span=(fence.start("code"), fence.end("code")))
        before = text[:fence.start()].rstrip()
        directive = None
        if before.endswith("-->"):
            directive = list(_DIRECTIVE.finditer(before[before.rfind("<!--"):]))
        if not directive:
            raise DirectiveError(f"{block.name}: a block that shows `$ ` commands needs a "
                                 f"<!-- check-output ... --> comment just before it (see tests/doc_snippets.py)")
        _parse_directive(block, directive[-1]["inline"], directive[-1]["body"])
        block.commands = _parse_commands(code)
        found.append(block)
    return found


# --- normalising and comparing ---------------------------------------------------------------

def _box_table_words(lines: list[str]) -> list[str]:
    """A box-drawn table's rows read back cell by cell: wrapping inside a cell
    does not matter."""
    words: list[str] = []
    row: list[list[str]] = []

    def flush():
        for cell in row:
            words.extend(" ".join(cell).split())
            words.append("|")
        row.clear()

    for line in lines:
        if _BOX_RULE.match(line.strip()):
            flush()
            continue
        cells = re.split(f"[{_BOX_ROW}]", line.strip())[1:-1]
        while len(row) < len(cells):
            row.append([])
        for i, cell in enumerate(cells):
            row[i].append(cell.strip())
    flush()
    return words


def normalise(text: str, tmp: str | None = None) -> list[str]:
    text = _ANSI.sub("", text)
    if tmp:
        text = text.replace(tmp + os.sep, "").replace(tmp, ".")
    text = _TEMP.sub("<temp>", text)
    text = _TIME.sub("<time>", text)
    text = _SIZE_TENTHS.sub(r"\1.x \2", text)
    words: list[str] = []
    table: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped[:1] in _BOX_ROW or _BOX_RULE.match(stripped or "x"):
            table.append(line)
            continue
        if table:
            words += _box_table_words(table)
            table = []
        words += ["---" if re.fullmatch(r"-{2,}", w) else w for w in line.split()]
    if table:
        words += _box_table_words(table)
    return words


def output_matches(expected: list[str], actual: str, tmp: str | None = None) -> bool:
    want = normalise("\n".join(expected))
    got = " ".join(normalise(actual, tmp))
    pattern = r"\s*".join(".*?" if w == "..." else re.escape(w) for w in want)
    return re.fullmatch(r"\s*" + pattern + r"\s*", got, re.DOTALL) is not None


# --- running ------------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["COLUMNS"] = "100"
    env["NO_COLOR"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DDPCHECK_CACHE_DIR", None)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "SLURM_PROCID", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return env


@dataclass
class Run:
    command: Command
    output: str
    exit_code: int
    folder: str

    @property
    def ok(self) -> bool:
        exit_ok = self.command.exit_code is None or self.command.exit_code == self.exit_code
        return exit_ok and output_matches(self.command.expected, self.output, self.folder)


def run_block(block: Block, timeout: float = 300) -> list[Run]:
    env = _env()
    with tempfile.TemporaryDirectory(prefix="ddpcheck-docs-") as tmp:
        folder = str(REPO) if block.run_in_repo else tmp
        if not block.run_in_repo:
            env["DDPCHECK_CACHE_DIR"] = os.path.join(tmp, ".cache-outside")
        for source, dest in block.copies:
            src, dst = REPO / source, Path(tmp) / dest
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
        for line in block.setup:
            subprocess.run(["bash", "-c", line], cwd=folder, env=env, check=True, timeout=timeout)
        runs = []
        for command in block.commands:
            done = subprocess.run(["bash", "-c", command.line], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace", timeout=timeout)
            runs.append(Run(command, done.stdout, done.returncode, os.path.realpath(folder)))
        return runs


def report(block: Block, runs: list[Run]) -> str:
    out = []
    for run in runs:
        if run.ok:
            continue
        out.append(f"{block.name}: `$ {run.command.line}` printed (exit {run.exit_code}):\n{run.output}"
                   f"\nexpected{'' if run.command.exit_code is None else f' (exit {run.command.exit_code})'}:\n"
                   + "\n".join(run.command.expected))
    return "\n\n".join(out)


def _shown(run: Run) -> str:
    text = run.output.rstrip("\n")
    if run.folder != str(REPO):
        text = text.replace(run.folder + os.sep, "")
    return f"$ {run.command.line}\n{text}\n" + (f"(exit {run.exit_code})\n" if run.command.exit_code is not None else "")


def write_block(block: Block, runs: list[Run]) -> None:
    """Replace the block's expected output with what the commands printed now."""
    text = block.path.read_text(encoding="utf-8")
    start, end = block.span
    block.path.write_text(text[:start] + "".join(_shown(r) for r in runs) + text[end:], encoding="utf-8")


def main(argv: list[str]) -> int:
    write = "--write" in argv
    paths = [Path(a).resolve() for a in argv if a != "--write"] or doc_files()
    failed = 0
    for path in paths:
        # last block first: writing one block leaves the offsets of the earlier ones valid
        for block in reversed(blocks_in(path)):
            if block.skip:
                continue
            runs = run_block(block)
            if all(r.ok for r in runs):
                print(f"ok      {block.name}")
                continue
            if write and not any("..." in line.split() for c in block.commands for line in c.expected):
                write_block(block, runs)
                print(f"written {block.name}")
                continue
            failed += 1
            print(report(block, runs))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
