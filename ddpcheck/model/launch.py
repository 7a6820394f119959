"""How a script is launched, from its own evidence: the commands its project
documents for it.

A launcher decides what a script receives. torchrun passes no rank argument
(it sets LOCAL_RANK); `python -m torch.distributed.launch` passes
`--local-rank=N` since torch 2.0 (`--local_rank=N` before), nothing with
`--use-env`; the `deepspeed` launcher passes `--local_rank=N`; `accelerate
launch`, SLURM's `srun`, `mpirun` and submitit pass none. How many processes
run (`--nproc_per_node=1`, `deepspeed --num_gpus 1`) decides whether the
ranks can race at all, and a batch size divided by the GPU count in a launch
shell script is already per GPU when the script reads it.

Evidence, in the order a reader would look:
- the script's own comments and docstrings (`# torchrun --nproc_per_node=8 train.py`);
- shell scripts and documents of its project (`*.sh`, `*.md`, `*.rst`,
  `*.txt`, `*.slurm`, `*.sbatch`, `*.yaml`) with a command line naming it:
  the path written there, resolved from the document's folder or one above
  it (`bash_script/run.sh` runs `../train.py` or `train.py` from the example's
  folder; the top README names `examples/seg/train.py`; a shell script may
  keep it in a variable it sets, `SCRIPT=train.py` ... `torchrun $SCRIPT`),
  must be the script;
- a Python file next to it that imports it and submits it with submitit.

The project is searched from the configured root, else from the nearest
folder above the script holding `.git`, a packaging file or a license, else
from the folder the run was started in when the script lies inside it. An
absent piece of evidence is "unknown", never "one process" or "torchrun".
"""

from __future__ import annotations

import os
import re
import io
import tokenize
from dataclasses import dataclass, field

from ddpcheck.model.memo import query

# launcher kinds
TORCHRUN = "torchrun"
TORCH_LAUNCH = "torch.distributed.launch"
DEEPSPEED = "deepspeed"
ACCELERATE = "accelerate launch"
SLURM = "srun"
MPI = "mpirun"
SUBMITIT = "submitit"
PYTHON = "python"

_DOC_SUFFIXES = (".sh", ".bash", ".md", ".rst", ".txt", ".slurm", ".sbatch", ".yaml", ".yml", ".job")
_SKIP_DIRS = {".git", ".hg", "node_modules", "__pycache__", "site-packages", "dist-packages", ".tox", ".venv",
              "venv", "build", "dist", ".ddpcheck_cache"}
_ROOT_MARKERS = (".git", ".hg", "setup.py", "pyproject.toml", "setup.cfg", "LICENSE", "LICENSE.txt",
                 "LICENSE.md", "COPYING")
MAX_DOC_BYTES = 400_000
MAX_DOC_FILES = 5_000
MAX_UP = 8

_SCRIPT_TOKEN = re.compile(r"^[\w.\-/${}()~]*\.py$")
_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)=(\S*)")
_VAR = re.compile(r"^\$\{?([A-Za-z_]\w*)\}?$")
_INT = re.compile(r"^\d+$")


@dataclass(frozen=True)
class LaunchCommand:
    """One documented way the script is started."""

    launcher: str                      # one of the kinds above
    where: str                         # `run_finetune.sh:47`, `README.md:165`, `train.py:3`
    text: str                          # the command as written (continuations joined)
    processes: int | None = None       # processes in all, when the command says (1 for a plain `python x.py`)
    use_env: bool = False              # torch.distributed.launch --use-env: no rank argument
    script_args: tuple[tuple[str, str], ...] = ()   # (option, value as written) passed to the script
    divided: frozenset[str] = frozenset()           # options whose value the shell computes with a division
    count_in_variable: bool = False    # the process count is a shell variable (`--nproc_per_node=$NGPUS`)

    @property
    def sets_local_rank_env(self) -> bool:
        """The launcher starts each process with LOCAL_RANK set and passes no rank argument."""
        return self.launcher in (TORCHRUN, ACCELERATE) or (self.launcher == TORCH_LAUNCH and self.use_env)

    @property
    def rank_argument(self) -> str | None:
        """The option the launcher passes the local rank in, if any."""
        if self.launcher == TORCH_LAUNCH and not self.use_env:
            return "--local-rank"      # torch >= 2.0 (`--local_rank` before)
        if self.launcher == DEEPSPEED:
            return "--local_rank"
        return None


@dataclass
class _Doc:
    path: str
    commands: list[tuple[str, LaunchCommand]] = field(default_factory=list)   # (script token, command)


def _within(folder: str, root: str) -> bool:
    return folder == root or folder.startswith(root.rstrip(os.sep) + os.sep)


def search_root(script_path: str, configured: str | None, invoked_from: str | None = None) -> str:
    """Where the script's project begins: the configured root, else the
    nearest folder above it with a `.git`, a packaging file or a license,
    else the folder the run was started from when the script lies in it
    (`ddpcheck lint .` at the top of a project without markers), else the
    script's own folder."""
    folder = os.path.dirname(os.path.abspath(script_path))
    if configured:
        root = os.path.abspath(configured)
        if _within(folder, root):
            return root
    here = folder
    for _ in range(MAX_UP):
        if any(os.path.exists(os.path.join(here, m)) for m in _ROOT_MARKERS):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if invoked_from:
        start = os.path.abspath(invoked_from)
        if _within(folder, start) and os.path.dirname(start) != start:   # never the file system's root
            return start
    return folder


# -- reading commands from text --------------------------------------------------------

def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined, with the first line's number."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.rstrip()
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += line
        out.append((start, buf))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _shell_values(text: str) -> dict[str, str]:
    """`NAME=value` assignments of a shell script (the last one wins)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = _ASSIGN.match(line)
        if m:
            values[m.group(1)] = m.group(2).strip("'\"")
    return values


def _resolve_int(value: str, shell: dict[str, str], seen: frozenset[str] = frozenset()) -> int | None:
    """The integer a shell value is, through any number of `$VAR`s (`seen`:
    the variables on the way; `A=$B`, `B=$A` is no integer)."""
    value = value.strip("'\"")
    if _INT.match(value):
        return int(value)
    m = _VAR.match(value)
    if m and m.group(1) not in seen and m.group(1) in shell:
        return _resolve_int(shell[m.group(1)], shell, seen | {m.group(1)})
    return None


def _is_division(value: str, shell: dict[str, str], seen: frozenset[str] = frozenset()) -> bool:
    """The value is computed with a division in the shell (`$((TOTAL / NGPU))`),
    through any number of `$VAR`s."""
    value = value.strip("'\"")
    if "$((" in value or "$[" in value or "expr " in value:
        return "/" in value
    m = _VAR.match(value)
    if m and m.group(1) not in seen and m.group(1) in shell:
        return _is_division(shell[m.group(1)], shell, seen | {m.group(1)})
    return False


_SHELL_ASSIGN = re.compile(r"^[A-Za-z_]\w*=")


def _tokens(line: str) -> list[str]:
    """Words of a command line; `run_cmd="deepspeed` (a command kept in a
    shell variable) and `CUDA_VISIBLE_DEVICES=0` keep only their value."""
    line = line.lstrip().lstrip("#>$ ")
    out = []
    for word in line.split():
        if _SHELL_ASSIGN.match(word):
            word = word.split("=", 1)[1]
        out.append(word.strip("'\"`;,()"))
    return out


def _option(tokens: list[str], names: tuple[str, ...]) -> str | None:
    """The value of an option given as `--name N` or `--name=N`."""
    for i, t in enumerate(tokens):
        for name in names:
            if t == name and i + 1 < len(tokens):
                return tokens[i + 1]
            if t.startswith(name + "="):
                return t[len(name) + 1:]
    return None


def _launcher_of(before: list[str]) -> str | None:
    joined = " ".join(before)
    if re.search(r"(^|[\s/])torchrun$|(^|[\s/])torchrun\s", joined) or "torch.distributed.run" in joined:
        return TORCHRUN
    if "torch.distributed.launch" in joined:
        return TORCH_LAUNCH
    if re.search(r"(^|[\s/])deepspeed(\s|$)", joined):
        return DEEPSPEED
    if re.search(r"(^|[\s/])accelerate\s+launch(\s|$)", joined):
        return ACCELERATE
    if re.search(r"(^|[\s/])colossalai\s+run(\s|$)", joined):
        return TORCHRUN   # colossalai's launcher runs torchrun
    if re.search(r"(^|[\s/])srun(\s|$)", joined):
        return SLURM
    if re.search(r"(^|[\s/])(mpirun|mpiexec)(\s|$)", joined):
        return MPI
    if re.search(r"(^|[\s/])python[\d.]*(\s|$)", joined) and " -m " not in f" {joined} ":
        return PYTHON
    return None


def _processes(launcher: str, tokens: list[str], shell: dict[str, str]) -> int | None:
    def n(*names: str) -> int | None:
        value = _option(tokens, names)
        return _resolve_int(value, shell) if value is not None else None

    if launcher in (TORCHRUN, TORCH_LAUNCH):
        per_node = n("--nproc_per_node", "--nproc-per-node")
        nodes = n("--nnodes")
        if per_node is None:
            return None
        return per_node * (nodes or 1) if nodes != 0 else None
    if launcher == DEEPSPEED:
        gpus = n("--num_gpus", "--num-gpus")
        nodes = n("--num_nodes", "--num-nodes")
        include = _option(tokens, ("--include", "-i"))
        if gpus is None and include is not None and ":" in include and "@" not in include:
            gpus = len(include.split(":", 1)[1].split(","))
        return gpus * (nodes or 1) if gpus is not None else None
    if launcher == ACCELERATE:
        return n("--num_processes", "--num-processes")
    if launcher == SLURM:
        return n("--ntasks", "-n")
    if launcher == MPI:
        return n("-np", "-n")
    if launcher == PYTHON:
        return 1
    return None


_COUNT_OPTIONS = ("--nproc_per_node", "--nproc-per-node", "--nnodes", "--num_gpus", "--num-gpus", "--num_nodes",
                  "--num-nodes", "--num_processes", "--num-processes", "--ntasks", "-n", "-np")


def _count_in_variable(tokens: list[str]) -> bool:
    """The command's process count is read from a shell variable
    (`--nproc_per_node=$NGPUS`): a knob its user sets, whatever the script
    assigns it by default."""
    values = (_option(tokens, (name,)) for name in _COUNT_OPTIONS)
    return any(value is not None and "$" in value for value in values)


def _command_text(line: str) -> str:
    """The command as written, without a shell variable it is kept in
    (`run_cmd="deepspeed ...`) or a prompt."""
    text = " ".join(line.split()).lstrip("#>$ ")
    m = re.match(r"^[A-Za-z_]\w*=[\"']", text)
    return text[m.end():].rstrip("\"'") if m else text


_VAR_REF = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


def _expand(token: str, shell: dict[str, str], seen: frozenset[str] = frozenset()) -> str:
    """`token` with the shell variables the script sets replaced by their
    values, through any number of `$VAR`s (`SCRIPT=train.py` ... `torchrun
    $SCRIPT`); a variable it does not set stays as written."""
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name in seen or name not in shell:
            return m.group(0)
        return _expand(shell[name], shell, seen | {name})
    return _VAR_REF.sub(value, token)


def _script_token(token: str, shell: dict[str, str]) -> str | None:
    """The `.py` path a command-line token names, as written or through the
    shell variables that hold it; None for any other token."""
    if not token.endswith(".py") and "$" in token and shell:
        token = _expand(token, shell)
    return token if token.endswith(".py") and _SCRIPT_TOKEN.match(token) else None


def commands_in_text(text: str, where: str, shell: dict[str, str] | None = None
                     ) -> list[tuple[str, LaunchCommand]]:
    """(script token, command) for each command line of `text` that runs a
    `.py` file through a launcher or Python (written out, or kept in a shell
    variable of the script: `torchrun ... $SCRIPT`)."""
    found = []
    if shell is None:
        shell = _shell_values(text) if where.endswith((".sh", ".bash", ".slurm", ".sbatch", ".job")) else {}
    shell_file = where.endswith((".sh", ".bash", ".slurm", ".sbatch", ".job"))
    scripts_in_variables = any(v.endswith(".py") for v in shell.values())
    for number, line in _logical_lines(text):
        if ".py" not in line and not (scripts_in_variables and "$" in line) \
                or (shell_file and line.lstrip().startswith("#")):
            continue   # a commented-out command of a shell script is not how it runs
        tokens = _tokens(line)
        for i, written in enumerate(tokens):
            # a variable is read only where no path is written before it: in
            # `launch $(dirname "$0")/train.py $CONFIG` the script is the path
            # written, and `$CONFIG` may hold a `.py` config
            token = _script_token(written, shell if not any(t.endswith(".py") for t in tokens[:i]) else {})
            if token is None:
                continue
            launcher = _launcher_of(tokens[:i])
            if launcher is None:
                continue
            before, after = tokens[:i], tokens[i + 1:]
            script_args, divided = [], set()
            for j, t in enumerate(after):
                if t.startswith("--"):
                    name, eq, value = t.partition("=")
                    if not eq:
                        value = after[j + 1] if j + 1 < len(after) and not after[j + 1].startswith("--") else ""
                    script_args.append((name, value))
                    if value and _is_division(value, shell):
                        divided.add(name)
            env_only = "--use_env" in before or "--use-env" in before
            found.append((token, LaunchCommand(
                launcher=launcher, where=f"{where}:{number}", text=_command_text(line),
                processes=_processes(launcher, before, shell), use_env=env_only,
                script_args=tuple(script_args), divided=frozenset(divided),
                count_in_variable=_count_in_variable(before))))
            break
    return found


# -- the project's documents -----------------------------------------------------------

def _documents(root: str) -> list[_Doc]:
    docs: list[_Doc] = []
    count = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith(_DOC_SUFFIXES) and name not in ("Makefile", "README"):
                continue
            count += 1
            if count > MAX_DOC_FILES:
                return docs
            path = os.path.join(folder, name)
            try:
                if os.path.getsize(path) > MAX_DOC_BYTES:
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            if ".py" not in text:
                continue
            commands = commands_in_text(text, os.path.relpath(path, root))
            if commands:
                docs.append(_Doc(path, commands))
    return docs


def _names_script(token: str, doc_folder: str, root: str, script: str) -> bool:
    """The path written in a document names `script`: resolved from the
    document's folder or a folder above it, up to the root."""
    token = token.replace("\\", "/")
    parts = [p for p in token.split("/") if p and p != "."]
    while parts and "$" in parts[0] or parts and parts[0] == "~":
        parts = parts[1:]   # `${SCRIPT_DIR}/train.py`, `$HOME/x/train.py`: the literal tail
    if not parts or any("$" in p for p in parts):
        return False
    rel = os.path.join(*parts)
    here = doc_folder
    while True:
        if os.path.normpath(os.path.join(here, rel)) == script:
            return True
        if here == root or len(here) <= len(root):
            return False
        here = os.path.dirname(here)


_SUBMITIT_IMPORT = re.compile(r"^\s*(?:import\s+{name}\b|from\s+{name}\s+import\b)", re.M)


class LaunchDocs:
    """The documented launch commands of one project (one search root),
    read once per lint run."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._docs: list[_Doc] | None = None
        self._submitit: dict[str, list[tuple[str, str]]] = {}

    def submitit_files(self, folder: str) -> list[tuple[str, str]]:
        found = self._submitit.get(folder)
        if found is None:
            found = self._submitit[folder] = _submitit_files(folder)
        return found

    def docs(self) -> list[_Doc]:
        if self._docs is None:
            self._docs = _documents(self.root)
        return self._docs

    def commands_for(self, script: str) -> list[LaunchCommand]:
        script = os.path.abspath(script)
        base = os.path.basename(script)
        found = []
        for doc in self.docs():
            folder = os.path.dirname(doc.path)
            for token, command in doc.commands:
                if token.rsplit("/", 1)[-1] == base and _names_script(token, folder, self.root, script):
                    found.append(command)
        return found


def _submitit_files(folder: str) -> list[tuple[str, str]]:
    """(name, text) of the Python files of `folder` that use submitit."""
    found = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return found
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".py"):
            continue
        try:
            if os.path.getsize(path) > MAX_DOC_BYTES:
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        if "submitit" in text:
            found.append((name, text))
    return found


def submitit_launchers(script: str, docs: "LaunchDocs | None" = None) -> list[LaunchCommand]:
    """Python files next to the script that import it and use submitit."""
    folder = os.path.dirname(os.path.abspath(script))
    stem = os.path.splitext(os.path.basename(script))[0]
    pattern = re.compile(_SUBMITIT_IMPORT.pattern.format(name=re.escape(stem)), re.M)
    files = docs.submitit_files(folder) if docs is not None else _submitit_files(folder)
    return [LaunchCommand(launcher=SUBMITIT, where=name, text=f"{name} (submitit)")
            for name, text in files if name != os.path.basename(script) and pattern.search(text)]


_LAUNCH_WORDS = ("torchrun", "torch.distributed", "deepspeed", "accelerate", "srun", "mpirun", "python")
_LAUNCH_LINE = r"(torchrun|torch\.distributed\.(launch|run)|deepspeed|accelerate\s+launch|srun|mpirun|python[\d.]*)[^\n]*{name}"


def commands_in_script(text: str, file_name: str) -> list[LaunchCommand]:
    """Commands naming this file in its own comments and strings (a usage
    docstring, `# torchrun --nproc_per_node=8 train.py`)."""
    if file_name not in text or not any(w in text for w in _LAUNCH_WORDS):
        return []
    if not re.search(_LAUNCH_LINE.format(name=re.escape(file_name)), text):
        return []   # no line names a launcher and this file: nothing to tokenize
    found = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    for tok in tokens:
        if tok.type not in (tokenize.COMMENT, tokenize.STRING) or file_name not in tok.string:
            continue
        for token, command in commands_in_text(tok.string, file_name, shell={}):
            if token.rsplit("/", 1)[-1] == file_name:
                inner = int(command.where.rsplit(":", 1)[1])   # the line within the comment or string
                found.append(LaunchCommand(
                    launcher=command.launcher, where=f"{file_name}:{tok.start[0] + inner - 1}", text=command.text,
                    processes=command.processes, use_env=command.use_env, script_args=command.script_args,
                    divided=command.divided, count_in_variable=command.count_in_variable))
    return found


def _commands_for_file(model, path: str, text: str, reader: str) -> list[LaunchCommand]:
    found = commands_in_script(text, os.path.basename(path))
    project = model.project
    if project is not None and os.path.isfile(path):
        root = search_root(path, model.settings.root, model.settings.invoked_from)
        docs = project.launch_docs.get(root)
        if docs is None:
            docs = project.launch_docs[root] = LaunchDocs(root)
        from_docs = docs.commands_for(path)
        for command in from_docs:
            project.depends_on(reader, os.path.join(root, command.where.rsplit(":", 1)[0]))
        found += from_docs
        found += submitit_launchers(path, docs)
    return found


@query(on_cycle=())
def launch_commands(model) -> tuple[LaunchCommand, ...]:
    """Every documented way `model`'s script is started (see the module's
    docstring); () when nothing says."""
    path = os.path.abspath(model.path)
    return tuple(_commands_for_file(model, path, model.text, path))


def through_launchers(commands: "tuple[LaunchCommand, ...]") -> tuple[LaunchCommand, ...]:
    """The commands that start the script through a launcher (torchrun,
    deepspeed, srun, ...). A plain `python train.py` is the one-GPU run a
    script is moving away from: it says neither how many processes its
    multi-GPU run starts nor how their ranks reach them."""
    return tuple(c for c in commands if c.launcher != PYTHON)


@dataclass(frozen=True)
class OptionUser:
    """A script that imports a module of command-line options."""

    name: str                                 # its file name
    path: str                                 # its absolute path
    text: str = field(repr=False)
    commands: tuple[LaunchCommand, ...]
    uses_deepspeed: bool
    reads_env: bool                           # it reads LOCAL_RANK itself


@query(on_cycle=())
def option_module_users(model) -> tuple[OptionUser, ...]:
    """The Python files next to `model`'s module (or one folder up) that
    import it (`from options import get_args`, `import arguments`)."""
    path = os.path.abspath(model.path)
    stem = os.path.splitext(os.path.basename(path))[0]
    pattern = re.compile(rf"^\s*(?:from\s+[\w.]*\b{re.escape(stem)}\s+import\b|import\s+[\w.]*\b{re.escape(stem)}\b)",
                         re.M)
    folder = os.path.dirname(path)
    users = []
    for where in (folder, os.path.dirname(folder)):
        try:
            names = sorted(os.listdir(where))
        except OSError:
            continue
        for name in names:
            other = os.path.join(where, name)
            if not name.endswith(".py") or other == path:
                continue
            try:
                if os.path.getsize(other) > MAX_DOC_BYTES:
                    continue
                with open(other, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            if not pattern.search(text):
                continue
            if model.project is not None:
                model.project.depends_on(path, other)
            users.append(OptionUser(
                name=name, path=other, text=text, commands=tuple(_commands_for_file(model, other, text, path)),
                uses_deepspeed=bool(re.search(r"^\s*(import|from)\s+deepspeed\b", text, re.M)),
                reads_env="LOCAL_RANK" in text))
    return tuple(users)


__all__ = ["LaunchCommand", "LaunchDocs", "commands_in_text", "commands_in_script", "search_root", "launch_commands", "through_launchers",
           "submitit_launchers", "option_module_users", "OptionUser", "TORCHRUN", "TORCH_LAUNCH", "DEEPSPEED", "ACCELERATE", "SLURM", "MPI",
           "SUBMITIT", "PYTHON"]
