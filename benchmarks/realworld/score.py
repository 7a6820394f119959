"""Score `ddpcheck lint` against hand-written labels on a corpus of real scripts.

A corpus is a folder of cases (one folder per training script or repository
subtree, copied from a public repository at a known commit), a manifest that
says where each case came from and what to lint, and one label file per case
that says what a careful reader found there: the real problems, each with its
rule, line and severity class, and the idioms that must not be reported.

    python benchmarks/realworld/score.py --manifest M.toml --corpus DIR --checkout PATH

lints every case with `python -m ddpcheck` imported from the checkout PATH (so
any commit can be scored: make a `git worktree add --detach` of it), matches
the findings to the labels and prints precision and recall for errors+warnings
and for all rules, per rule and per case, then every unmatched finding and
every miss. The format of the manifest and the labels is in README.md next to
this file. Nothing here imports ddpcheck: the checkout under test runs in a
subprocess, one per case, from the case's own folder (as a user runs it from
their repository).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, asdict
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

SEVERITIES = ("error", "warning", "info")
SERIOUS = frozenset({"error", "warning"})
DEFAULT_TOLERANCE = 2


class FormatError(Exception):
    """A manifest or label file that does not follow the format."""


# --- the data ------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    repository: str
    commit: str
    entry: str
    files: tuple[str, ...]
    lint: tuple[str, ...]
    upstream: str = ""
    notes: str = ""
    sha256: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def multi_file(self) -> bool:
        return sum(1 for name in self.files if name.endswith(".py")) > 1


@dataclass(frozen=True)
class Expected:
    """A real problem a reader found: the finding the linter owes."""
    case: str
    file: str
    rule: str
    lines: tuple[int, ...]          # any of these lines; empty when anywhere
    severity: str                   # the class the finding deserves
    why: str = ""
    anywhere: bool = False          # matched by file and rule alone
    optional: bool = False          # debatable: neither credited nor missed
    tolerance: int = DEFAULT_TOLERANCE
    elsewhere: tuple[tuple[str, int], ...] = ()   # other (file, line) places it may be reported at

    @property
    def where(self) -> str:
        if self.anywhere:
            return f"{self.file}:*"
        text = f"{self.file}:{'/'.join(str(n) for n in self.lines)}"
        return " or ".join([text] + [f"{f}:{n}" for f, n in self.elsewhere])


@dataclass(frozen=True)
class MustNot:
    """An idiom the linter must stay quiet about (a finding there is false)."""
    case: str
    file: str
    rule: str                       # a code, or "*" for every rule
    lines: tuple[int, ...]
    why: str = ""
    anywhere: bool = False
    tolerance: int = DEFAULT_TOLERANCE
    elsewhere: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Finding:
    case: str
    file: str
    line: int
    rule: str
    severity: str
    short: str = ""


@dataclass
class CaseLabels:
    case: str
    expected: list[Expected]
    must_not: list[MustNot]


# --- reading the formats --------------------------------------------------------

def _lines_of(entry: dict, where: str) -> tuple[tuple[int, ...], bool]:
    anywhere = bool(entry.get("anywhere", False))
    if "line" in entry and "lines" in entry:
        raise FormatError(f"{where}: give `line` or `lines`, not both")
    raw = entry.get("lines", [entry["line"]] if "line" in entry else [])
    if not isinstance(raw, list) or not all(isinstance(n, int) and n > 0 for n in raw):
        raise FormatError(f"{where}: `line`/`lines` must be positive integers")
    if anywhere and raw:
        raise FormatError(f"{where}: `anywhere = true` takes no line")
    if not anywhere and not raw:
        raise FormatError(f"{where}: needs `line`, `lines` or `anywhere = true`")
    return tuple(raw), anywhere


def _places(entry: dict, where: str) -> tuple[str, tuple[int, ...], tuple[tuple[str, int], ...]]:
    """`at = ["utils.py:90", "train.py:349"]`: the first place is the label's file and line, the
    others are where the same problem may be reported instead (a helper's write at its call)."""
    if "at" not in entry:
        return "", (), ()
    if any(key in entry for key in ("file", "line", "lines", "anywhere")):
        raise FormatError(f"{where}: `at` replaces `file`, `line`, `lines` and `anywhere`")
    places = []
    for item in entry["at"] if isinstance(entry["at"], list) else [None]:
        file, _, line = item.rpartition(":") if isinstance(item, str) else ("", "", "")
        if not file or not line.isdigit() or int(line) < 1:
            raise FormatError(f"{where}: `at` must be a list of \"file:line\" strings")
        places.append((file, int(line)))
    if not places:
        raise FormatError(f"{where}: `at` is empty")
    return places[0][0], (places[0][1],), tuple(places[1:])


def _string(entry: dict, key: str, where: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str) or (default is None and not value):
        raise FormatError(f"{where}: `{key}` must be a non-empty string")
    return value


def load_manifest(path: Path) -> list[Case]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    cases = []
    seen = set()
    for index, entry in enumerate(data.get("case", [])):
        where = f"{path}: case #{index + 1}"
        case_id = _string(entry, "id", where)
        where = f"{path}: case {case_id!r}"
        if case_id in seen:
            raise FormatError(f"{where}: duplicate id")
        seen.add(case_id)
        files = entry.get("files")
        if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
            raise FormatError(f"{where}: `files` must be a non-empty list of paths")
        entry_script = _string(entry, "entry", where)
        if entry_script not in files:
            raise FormatError(f"{where}: the entry {entry_script!r} is not among `files`")
        lint = entry.get("lint", [f for f in files if f.endswith(".py")])
        if not isinstance(lint, list) or not all(isinstance(f, str) and f in files for f in lint):
            raise FormatError(f"{where}: `lint` must list paths that are among `files`")
        sha = entry.get("sha256", {})
        if not isinstance(sha, dict):
            raise FormatError(f"{where}: `sha256` must be a table of path = hash")
        cases.append(Case(
            id=case_id, repository=_string(entry, "repository", where), commit=_string(entry, "commit", where),
            entry=entry_script, files=tuple(files), lint=tuple(lint), upstream=entry.get("upstream", ""),
            notes=entry.get("notes", ""), sha256=dict(sha)))
    if not cases:
        raise FormatError(f"{path}: no [[case]] entries")
    return cases


def parse_labels(text: str, origin: str) -> CaseLabels:
    data = tomllib.loads(text)
    case = _string(data, "case", origin)
    expected = []
    for index, entry in enumerate(data.get("expect", [])):
        where = f"{origin}: expect #{index + 1}"
        file, lines, elsewhere = _places(entry, where)
        anywhere = False
        if not file:
            file = _string(entry, "file", where)
            lines, anywhere = _lines_of(entry, where)
        severity = _string(entry, "severity", where)
        if severity not in SEVERITIES:
            raise FormatError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
        expected.append(Expected(
            case=case, file=file, rule=_string(entry, "rule", where), lines=lines,
            severity=severity, why=entry.get("why", ""), anywhere=anywhere,
            optional=bool(entry.get("optional", False)),
            tolerance=int(entry.get("tolerance", DEFAULT_TOLERANCE)), elsewhere=elsewhere))
    must_not = []
    for index, entry in enumerate(data.get("not", [])):
        where = f"{origin}: not #{index + 1}"
        file, lines, elsewhere = _places(entry, where)
        anywhere = False
        if not file:
            file = _string(entry, "file", where)
            lines, anywhere = _lines_of(entry, where)
        must_not.append(MustNot(
            case=case, file=file, rule=_string(entry, "rule", where), lines=lines,
            why=entry.get("why", ""), anywhere=anywhere,
            tolerance=int(entry.get("tolerance", DEFAULT_TOLERANCE)), elsewhere=elsewhere))
    return CaseLabels(case=case, expected=expected, must_not=must_not)


def load_labels(folder: Path, cases: list[Case]) -> dict[str, CaseLabels]:
    """One `<case id>.toml` per case; a case without a file is an error."""
    labels = {}
    for case in cases:
        path = folder / f"{case.id}.toml"
        if not path.is_file():
            raise FormatError(f"{path}: no label file for case {case.id!r}")
        parsed = parse_labels(path.read_text(encoding="utf-8"), str(path))
        if parsed.case != case.id:
            raise FormatError(f"{path}: says case {parsed.case!r}, expected {case.id!r}")
        for item in [*parsed.expected, *parsed.must_not]:
            for file in [item.file, *(f for f, _ in item.elsewhere)]:
                if file not in case.files:
                    raise FormatError(f"{path}: {file!r} is not among the case's files")
        labels[case.id] = parsed
    return labels


# --- matching ---------------------------------------------------------------------

def distance(finding: Finding, label: Expected | MustNot) -> int | None:
    """How far the finding is from the label, or None when it cannot match."""
    if label.rule != "*" and finding.rule != label.rule:
        return None
    if label.anywhere:
        return label.tolerance + 1 if finding.file == label.file else None   # after every line match
    places = [(label.file, n) for n in label.lines] + list(label.elsewhere)
    gaps = [abs(finding.line - n) for file, n in places if file == finding.file]
    if not gaps or min(gaps) > label.tolerance:
        return None
    return min(gaps)


def match(findings: list[Finding], labels: list[Expected]) -> list[tuple[Finding, Expected]]:
    """A largest one-to-one matching of findings to labels, nearest lines first.

    Kuhn's augmenting paths over the candidate pairs, each side's candidates
    tried nearest first: a label that two findings could take goes to the one
    that leaves the other a label of its own."""
    candidates: dict[int, list[int]] = {}
    for f_index, finding in enumerate(findings):
        options = [(distance(finding, label), l_index) for l_index, label in enumerate(labels)]
        candidates[f_index] = [l for d, l in sorted(o for o in options if o[0] is not None)]
    owner: dict[int, int] = {}              # label index -> finding index

    def augment(f_index: int, visited: set[int]) -> bool:
        for l_index in candidates[f_index]:
            if l_index in visited:
                continue
            visited.add(l_index)
            if l_index not in owner or augment(owner[l_index], visited):
                owner[l_index] = f_index
                return True
        return False

    order = sorted(candidates, key=lambda f: (len(candidates[f]) == 0, findings[f].file, findings[f].line))
    for f_index in order:
        if candidates[f_index]:
            augment(f_index, set())
    pairs = [(findings[f], labels[l]) for l, f in owner.items()]
    return sorted(pairs, key=lambda pair: (pair[0].case, pair[0].file, pair[0].line, pair[0].rule))


@dataclass
class Score:
    """The outcome of one scope (errors+warnings, or all rules)."""
    true: list[tuple[Finding, Expected]] = field(default_factory=list)
    false: list[Finding] = field(default_factory=list)
    missed: list[Expected] = field(default_factory=list)
    debatable: list[tuple[Finding, Expected]] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        found = len(self.true) + len(self.false)
        return len(self.true) / found if found else None

    @property
    def recall(self) -> float | None:
        owed = len(self.true) + len(self.missed)
        return len(self.true) / owed if owed else None


def score(findings: list[Finding], expected: list[Expected], serious_only: bool) -> Score:
    """Match per case: required labels first, then the rest against debatable ones."""
    if serious_only:
        findings = [f for f in findings if f.severity in SERIOUS]
        expected = [e for e in expected if e.severity in SERIOUS]
    required = [e for e in expected if not e.optional]
    optional = [e for e in expected if e.optional]
    result = Score()
    for case in sorted({f.case for f in findings} | {e.case for e in expected}):
        case_findings = [f for f in findings if f.case == case]
        true = match(case_findings, [e for e in required if e.case == case])
        taken = {id(f) for f, _ in true}
        rest = [f for f in case_findings if id(f) not in taken]
        debatable = match(rest, [e for e in optional if e.case == case])
        taken |= {id(f) for f, _ in debatable}
        matched_labels = {id(e) for _, e in true}
        result.true += true
        result.debatable += debatable
        result.false += [f for f in case_findings if id(f) not in taken]
        result.missed += [e for e in required if e.case == case and id(e) not in matched_labels]
    return result


def must_not_hits(findings: list[Finding], notes: list[MustNot]) -> dict[int, MustNot]:
    """id(finding) -> the "must not report" note it breaks."""
    hits = {}
    for finding in findings:
        for note in notes:
            if note.case == finding.case and distance(finding, note) is not None:
                hits[id(finding)] = note
                break
    return hits


# --- running a checkout -----------------------------------------------------------

@dataclass
class LintRun:
    findings: list[Finding]
    problems: list[str]                 # unreadable inputs, internal errors, crashes
    checkout: str = ""
    commit: str = ""
    files_linted: int = 0


def _env(checkout: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONSAFEPATH"] = "1"         # the case folder is not on sys.path: its modules shadow nothing
    env["NO_COLOR"] = "1"
    return env


def checkout_commit(checkout: Path) -> str:
    result = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = result.stdout.strip() if result.returncode == 0 else "unknown"
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--", "ddpcheck"],
                           capture_output=True, text=True)
    return commit + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def verify_import(python: str, checkout: Path) -> None:
    """The ddpcheck that runs must be the checkout's, not an installed one."""
    probe = subprocess.run([python, "-c", "import ddpcheck, os; print(os.path.realpath(ddpcheck.__file__))"],
                           capture_output=True, text=True, env=_env(checkout), cwd="/")
    where = probe.stdout.strip()
    expected = os.path.realpath(checkout / "ddpcheck" / "__init__.py")
    if probe.returncode != 0 or where != expected:
        raise SystemExit(f"score.py: {python} imports ddpcheck from {where or probe.stderr.strip()!r}, "
                         f"not from the checkout {checkout}")


def lint_case(case: Case, case_dir: Path, python: str, checkout: Path, jobs: int) -> tuple[list[Finding], list[str]]:
    command = [python, "-m", "ddpcheck", "lint", "--output-format", "json", "--no-cache", "--exit-zero",
               "--jobs", str(jobs), *case.lint]
    result = subprocess.run(command, cwd=case_dir, capture_output=True, text=True, env=_env(checkout))
    problems = []
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return [], [f"{case.id}: ddpcheck exited {result.returncode} without a JSON report: {tail[0]}"]
    for error in report.get("errors", []):
        problems.append(f"{case.id}: {error.get('path')}: {error.get('kind')}: {error.get('message')}")
    findings = [Finding(case=case.id, file=os.path.normpath(item["path"]), line=int(item["line"]),
                        rule=item["code"], severity=item["severity"], short=item.get("short", ""))
                for item in report.get("findings", [])]
    outside = [f for f in findings if f.file not in case.files]
    for finding in outside:
        problems.append(f"{case.id}: finding in a file outside the manifest: {finding.file}:{finding.line}")
    return findings, problems


def lint_corpus(cases: list[Case], corpus: Path, python: str, checkout: Path, jobs: int) -> LintRun:
    verify_import(python, checkout)
    run = LintRun(findings=[], problems=[], checkout=str(checkout), commit=checkout_commit(checkout))
    for case in cases:
        case_dir = corpus / case.id
        absent = [name for name in case.files if not (case_dir / name).is_file()]
        if absent:
            run.problems.append(f"{case.id}: files missing from {case_dir}: {', '.join(absent)}")
            continue
        for name, digest in case.sha256.items():
            actual = hashlib.sha256((case_dir / name).read_bytes()).hexdigest()
            if actual != digest:
                run.problems.append(f"{case.id}: {name} differs from the manifest's sha256 (labels may not fit)")
        findings, problems = lint_case(case, case_dir, python, checkout, jobs)
        run.findings += findings
        run.problems += problems
        run.files_linted += len(case.lint)
    return run


def save_run(run: LintRun, path: Path) -> None:
    path.write_text(json.dumps({"checkout": run.checkout, "commit": run.commit, "files_linted": run.files_linted,
                                "problems": run.problems, "findings": [asdict(f) for f in run.findings]},
                               indent=1) + "\n", encoding="utf-8")


def load_run(path: Path) -> LintRun:
    data = json.loads(path.read_text(encoding="utf-8"))
    return LintRun(findings=[Finding(**item) for item in data["findings"]], problems=data.get("problems", []),
                   checkout=data.get("checkout", ""), commit=data.get("commit", ""),
                   files_linted=data.get("files_linted", 0))


# --- the report ------------------------------------------------------------------

def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(header: list[str], rows: list[list[object]]) -> str:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def score_line(name: str, result: Score) -> list[object]:
    return [name, len(result.true), len(result.false), len(result.missed), len(result.debatable),
            ratio(result.precision), ratio(result.recall)]


def breakdown(findings: list[Finding], expected: list[Expected], key) -> dict[str, tuple[Score, Score]]:
    groups = sorted({key(f) for f in findings} | {key(e) for e in expected})
    out = {}
    for group in groups:
        f_in = [f for f in findings if key(f) == group]
        e_in = [e for e in expected if key(e) == group]
        out[group] = (score(f_in, e_in, serious_only=True), score(f_in, e_in, serious_only=False))
    return out


def summary(run: LintRun, cases: list[Case], labels: dict[str, CaseLabels]) -> dict:
    expected = [e for c in cases for e in labels[c.id].expected]
    notes = [n for c in cases for n in labels[c.id].must_not]
    serious = score(run.findings, expected, serious_only=True)
    every = score(run.findings, expected, serious_only=False)
    return {"serious": serious, "all": every, "expected": expected, "notes": notes,
            "per_rule": breakdown(run.findings, expected, key=lambda x: x.rule),
            "per_case": breakdown(run.findings, expected, key=lambda x: x.case)}


def render(run: LintRun, cases: list[Case], labels: dict[str, CaseLabels], title: str) -> str:
    s = summary(run, cases, labels)
    serious, every, expected = s["serious"], s["all"], s["expected"]
    out = [f"{title}: {len(cases)} cases ({sum(c.multi_file for c in cases)} multi-file), "
           f"{run.files_linted} files linted",
           f"ddpcheck: {run.checkout} at {run.commit}",
           f"labels: {sum(not e.optional for e in expected)} expected findings "
           f"({sum(not e.optional and e.severity in SERIOUS for e in expected)} errors+warnings), "
           f"{sum(e.optional for e in expected)} debatable, {len(s['notes'])} must-not notes", ""]
    header = ["scope", "true", "false", "missed", "debatable", "precision", "recall"]
    out += [table(header, [score_line("errors+warnings", serious), score_line("all rules", every)]), ""]
    rows = []
    for rule, (rule_serious, rule_all) in s["per_rule"].items():
        rows.append([rule, len(rule_all.true), len(rule_all.false), len(rule_all.missed), len(rule_all.debatable),
                     ratio(rule_all.precision), ratio(rule_all.recall),
                     f"{len(rule_serious.true)}/{len(rule_serious.false)}/{len(rule_serious.missed)}"])
    out += ["per rule (all severities; last column: errors+warnings true/false/missed)",
            table(["rule"] + header[1:] + ["e+w t/f/m"], rows) if rows else "(none)", ""]
    rows = []
    for case, (case_serious, case_all) in s["per_case"].items():
        rows.append([case, len(case_all.true), len(case_all.false), len(case_all.missed), len(case_all.debatable),
                     ratio(case_all.precision), ratio(case_all.recall),
                     f"{len(case_serious.true)}/{len(case_serious.false)}/{len(case_serious.missed)}"])
    out += ["per case (all severities; last column: errors+warnings true/false/missed)",
            table(["case"] + header[1:] + ["e+w t/f/m"], rows) if rows else "(none)", ""]
    hits = must_not_hits(every.false, s["notes"])
    out.append(f"unmatched findings ({len(every.false)}):")
    for f in sorted(every.false, key=lambda f: (f.case, f.file, f.line, f.rule)):
        note = hits.get(id(f))
        extra = f"  [must not: {note.why}]" if note else ""
        out.append(f"  {f.case}  {f.file}:{f.line}  {f.rule} {f.severity}  {f.short}{extra}")
    out.append(f"misses ({len(every.missed)}):")
    for e in sorted(every.missed, key=lambda e: (e.case, e.file, e.lines, e.rule)):
        out.append(f"  {e.case}  {e.where}  {e.rule} {e.severity}  {e.why}")
    mismatched = [(f, e) for f, e in every.true if f.severity != e.severity]
    if mismatched:
        out.append(f"matched with another severity ({len(mismatched)}):")
        for f, e in mismatched:
            out.append(f"  {f.case}  {f.file}:{f.line}  {f.rule} reported {f.severity}, labelled {e.severity}")
    if every.debatable:
        out.append(f"debatable labels found ({len(every.debatable)}):")
        for f, e in every.debatable:
            out.append(f"  {f.case}  {f.file}:{f.line}  {f.rule} {f.severity}  {e.why}")
    if run.problems:
        out.append(f"problems ({len(run.problems)}):")
        out += [f"  {p}" for p in run.problems]
    return "\n".join(out) + "\n"


def figures(run: LintRun, cases: list[Case], labels: dict[str, CaseLabels]) -> dict:
    """The headline numbers as plain data (for --json)."""
    s = summary(run, cases, labels)

    def plain(result: Score) -> dict:
        return {"true": len(result.true), "false": len(result.false), "missed": len(result.missed),
                "debatable": len(result.debatable), "precision": result.precision, "recall": result.recall}
    return {"commit": run.commit, "checkout": run.checkout, "cases": len(cases),
            "multi_file": sum(c.multi_file for c in cases), "files_linted": run.files_linted,
            "errors_warnings": plain(s["serious"]), "all_rules": plain(s["all"]),
            "per_rule": {k: {"errors_warnings": plain(a), "all_rules": plain(b)} for k, (a, b) in s["per_rule"].items()},
            "per_case": {k: {"errors_warnings": plain(a), "all_rules": plain(b)} for k, (a, b) in s["per_case"].items()},
            "problems": run.problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, required=True, help="manifest.toml of the corpus")
    parser.add_argument("--labels", type=Path, help="folder of <case>.toml label files (default: labels/ "
                                                    "next to the manifest)")
    parser.add_argument("--corpus", type=Path, help="folder holding one folder per case (needed to lint)")
    parser.add_argument("--checkout", type=Path, help="the ddpcheck checkout to run (python -m ddpcheck from it)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter with ddpcheck's dependencies (default: this one)")
    parser.add_argument("--findings", type=Path, help="score a saved run instead of linting")
    parser.add_argument("--save-findings", type=Path, help="write the run's findings here (JSON)")
    parser.add_argument("--json", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    parser.add_argument("--jobs", type=int, default=2, help="ddpcheck worker processes per case")
    parser.add_argument("--title", default="corpus")
    args = parser.parse_args(argv)
    try:
        cases = load_manifest(args.manifest)
        if args.case:
            unknown = set(args.case) - {c.id for c in cases}
            if unknown:
                parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
            cases = [c for c in cases if c.id in args.case]
        labels = load_labels(args.labels or args.manifest.parent / "labels", cases)
    except (FormatError, tomllib.TOMLDecodeError, OSError) as error:
        print(f"score.py: {error}", file=sys.stderr)
        return 2
    if args.findings:
        run = load_run(args.findings)
        wanted = {c.id for c in cases}
        run.findings = [f for f in run.findings if f.case in wanted]
    else:
        if not args.corpus or not args.checkout:
            parser.error("--corpus and --checkout are needed to lint (or --findings to score a saved run)")
        run = lint_corpus(cases, args.corpus.resolve(), args.python, args.checkout.resolve(), args.jobs)
    if args.save_findings:
        save_run(run, args.save_findings)
    print(render(run, cases, labels, args.title), end="")
    if args.json:
        args.json.write_text(json.dumps(figures(run, cases, labels), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
