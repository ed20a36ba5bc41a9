"""The code in README.md and docs/*.md is true: every example runs and prints what the page shows.

How a page's blocks are read (``markdown_blocks``):

- a ```` ```python ```` block runs as ``train.py`` in a fresh folder, in a fresh interpreter; when a
  ```` ```text ```` block follows it (blank lines between at most), that block is its standard
  output, compared as doctest compares (a ``...`` matches any text, several lines too; the
  temporary folder's path is removed from the output first);
- ``<!-- not run: REASON -->`` right before a python block says why it cannot run here (a
  Lightning ``Trainer.fit`` that needs a model, a second process): it is only compiled;
- ``<!-- file: NAME -->`` right before a python block writes it to NAME in the page's own folder
  instead, for the shell session that follows;
- a ```` ```text ```` block whose first line starts with ``$ `` is a shell session: each command
  runs with ``bash`` in the page's folder (this environment's ``leafwatch`` and ``python`` first
  on ``PATH``), standard output and error together, and prints what follows it up to the next
  ``$ `` line; a command in it that exits non-zero (in a pipeline or an ``&&`` list too) must
  show its exit code: ``echo "exit $?"`` runs right after it, so the page prints ``exit 1``
  (``leafwatch run x.py; echo "exit $?"``), never a failure hidden behind ``> /dev/null``;
- other blocks (``bash`` set-up commands, ``toml``, diagrams) are not run; a block tagged with any
  other language fails, so that no python example escapes under another name.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import _warm
import pytest
from _requirements import require, require_module, require_pytest_plugin

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT_S = 300
MARKER = re.compile(r"^<!--\s*(not run|file):\s*(.*?)\s*-->$")


@dataclass
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    marker: tuple[str, str] | None = None  # ("not run", reason) or ("file", name)
    output: Block | None = None  # the text block right after a python block

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def is_session(self) -> bool:
        return self.language == "text" and self.code.startswith("$ ")


def markdown_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order, each with its marker and, for python, its output block."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    last_content = None  # (index of the last non-blank line outside a block, what it was)
    previous_end = -1  # the index of the closing fence of the block before
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            if lines[i].strip():
                last_content = (i, lines[i].strip())
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        assert end is not None, f"{page.relative_to(REPO)}:{i + 1}: a code block is never closed"
        block = Block(page, i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n")
        marker = MARKER.match(last_content[1]) if last_content is not None else None
        if marker:
            block.marker = (marker.group(1), marker.group(2))
        previous = blocks[-1] if blocks else None
        follows_directly = last_content is not None and last_content[0] == previous_end
        if block.language == "text" and not block.is_session and previous is not None \
                and previous.language == "python" and follows_directly:
            previous.output = block
        blocks.append(block)
        previous_end = end
        last_content = (end, "```")
        i = end + 1
    return blocks


BLOCKS = [b for page in PAGES for b in markdown_blocks(page)]
PYTHON = [b for b in BLOCKS if b.language == "python"]
RUNNABLE = [b for b in PYTHON if b.marker is None]
SESSION_PAGES = sorted({b.page for b in BLOCKS if b.is_session})


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env


#: Optional packages an example may import: without one, its example skips (locally) or fails (in CI).
OPTIONAL = ("pytorch_lightning", "lightning", "transformers", "accelerate", "peft")


def _require_what_it_needs(code: str) -> None:
    """Skip (locally) or fail (in CI) an example whose code needs what is not installed: an
    optional package, the installed ``leafwatch`` command, or the ``pytest --leafwatch`` plugin."""
    for package in OPTIONAL:
        if re.search(rf"^\s*(?:from|import)\s+{package}\b", code, flags=re.MULTILINE):
            require_module(package)
    if re.search(r"(?:^|[;&|]\s*)leafwatch\s", code, flags=re.MULTILINE):
        require(shutil.which("leafwatch", path=_env()["PATH"]) is not None,
                "the `leafwatch` command is not installed: pip install -e .")
    if "--leafwatch" in code:
        require_pytest_plugin()


def _check_output(block: Block, want: str, got: str, folder: Path) -> None:
    got = got.replace(str(folder) + os.sep, "")
    checker = doctest.OutputChecker()
    if not checker.check_output(want, got, doctest.ELLIPSIS):
        example = doctest.Example("", want)
        pytest.fail(f"{block.where}: the output differs from the page:\n"
                    + checker.output_difference(example, got, doctest.ELLIPSIS), pytrace=False)


def test_every_page_has_examples_and_each_marker_says_why() -> None:
    assert [p.name for p in PAGES[:1]] == ["README.md"] and len(PAGES) > 5
    for block in BLOCKS:
        # An example tagged `py` or `python3` would escape the checks below.
        assert block.language in ("python", "text", "bash", "toml", ""), f"{block.where}: ```{block.language}"
    for block in PYTHON:
        if block.marker is not None:
            kind, value = block.marker
            assert value, f"{block.where}: `<!-- {kind}: ... -->` needs a reason or a file name"
            assert block.output is None, f"{block.where}: shows an output but is not run, so nothing checks it"
    assert len(RUNNABLE) >= 5, "the pages lost their runnable examples"


@pytest.mark.parametrize("block", [b for b in PYTHON if b.marker is not None], ids=lambda b: b.where)
def test_python_blocks_not_run_here_still_compile(block: Block) -> None:
    compile(block.code, block.where, "exec")


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_python_block_runs_and_prints_what_the_page_shows(block: Block, tmp_path: Path) -> None:
    _require_what_it_needs(block.code)
    (tmp_path / "train.py").write_text(block.code, encoding="utf-8")
    result = _warm.run([sys.executable, "train.py"], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, f"{block.where} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "LeafwatchInternalWarning" not in result.stderr, f"{block.where}:\n{result.stderr[-3000:]}"
    if block.output is not None:
        _check_output(block, block.output.code, result.stdout, tmp_path)


@pytest.mark.parametrize("page", SESSION_PAGES, ids=lambda p: p.name)
def test_shell_sessions_print_what_the_page_shows(page: Path, tmp_path: Path) -> None:
    blocks = markdown_blocks(page)
    files = {b.marker[1]: b.code for b in blocks
             if b.language == "python" and b.marker is not None and b.marker[0] == "file"}
    for block in blocks:
        if block.is_session:
            for command in re.findall(r"^\$ (.*)$", block.code, flags=re.MULTILINE):
                _require_what_it_needs("\n".join([command, *(code for name, code in files.items() if name in command)]))
    sessions = 0
    for block in blocks:
        if block.language == "python" and block.marker is not None and block.marker[0] == "file":
            (tmp_path / block.marker[1]).write_text(block.code, encoding="utf-8")
        if not block.is_session:
            continue
        sessions += 1
        for command, want in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", block.code, flags=re.MULTILINE):
            output, unshown = run_session_command(command, tmp_path)
            assert not unshown, (f"{block.where}: `{command}`: a command exited non-zero and the session does not show "
                                 f"it (follow it with `; echo \"exit $?\"`, and show `exit N`): {unshown}\n{output[-3000:]}")
            _check_output(block, want.rstrip("\n") + "\n", output.rstrip("\n") + "\n", tmp_path)
    assert sessions


#: Run before each command of a session: every command that exits non-zero and is not followed at once by
#: `echo "exit $?"` is written to fd 9, one line each ("STATUS<TAB>COMMAND"); pipefail makes a pipeline
#: fail when one of its commands does.
SHOW_EXIT = """set -o pipefail
__docs_last=
__docs_check() {
  if [ -n "$__docs_last" ] && [ "$1" -ne 0 ] && [ "$2" != 'echo "exit $?"' ]; then
    printf '%s\\t%s\\n' "$1" "$__docs_last" >&9
  fi
  __docs_last=$2
}
trap '__docs_check $? "$BASH_COMMAND"' DEBUG
trap '__docs_check $? ""' EXIT
"""


def run_session_command(command: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """What ``command`` prints (standard output and error together), and each of its commands that
    exited non-zero without showing its exit code (``STATUS<TAB>COMMAND``)."""
    read, write = os.pipe()
    try:
        result = subprocess.run(["bash", "-c", f"{SHOW_EXIT}exec 9>&{write}\n{command}"], cwd=cwd, env=env or _env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S,
                                pass_fds=(write,))
    finally:
        os.close(write)
    with os.fdopen(read, encoding="utf-8") as unshown:
        failed = list(dict.fromkeys(unshown.read().splitlines()))  # (the exit trap may say the last one again)
    return result.stdout, failed


@pytest.mark.parametrize(("command", "output", "unshown"), [
    ('false > /dev/null 2>&1; echo ok', "ok\n", ["1\tfalse > /dev/null 2>&1"]),  # a failure hidden
    ('false; echo "exit $?"', "exit 1\n", []),  # shown
    ("false | cat", "", ["1\tcat"]),  # in a pipeline
    ("true && false && echo never", "", ["1\tfalse"]),  # in an && list, the last command of the session
    ("ls missing 2>&1 | tail -1; echo \"exit $?\"", "ls: cannot access 'missing': No such file or directory\nexit 2\n", []),
    ("true && echo ok", "ok\n", [])])
def test_a_session_command_that_exits_non_zero_must_show_its_exit_code(
        command: str, output: str, unshown: list[str], tmp_path: Path) -> None:
    assert run_session_command(command, tmp_path, dict(os.environ, LC_ALL="C")) == (output, unshown)


def test_every_file_block_is_used_by_a_session_of_its_page() -> None:
    for block in PYTHON:
        if block.marker is not None and block.marker[0] == "file":
            assert block.page in SESSION_PAGES, f"{block.where}: `{block.marker[1]}` is written for no session"


def test_the_quickstart_block_is_examples_quickstart_py() -> None:
    example = (REPO / "examples" / "quickstart.py").read_text(encoding="utf-8")
    body = example.split('"""', 2)[2].lstrip("\n")  # without the module docstring
    first = next(b for b in markdown_blocks(REPO / "README.md") if b.language == "python")
    assert first.code == body


def _transparency_commands(page: Path) -> list[str]:
    """The lines of the page's bash blocks that run the transparency suite."""
    return [line for block in markdown_blocks(page) if block.language == "bash"
            for line in block.code.splitlines() if "-m pytest tests/transparency" in line]


def test_ci_runs_exactly_the_readmes_test_command_then_the_transparency_suite() -> None:
    setup = next(b for b in markdown_blocks(REPO / "README.md") if b.language == "bash")
    commands = [line for line in setup.code.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and commands[1].endswith("-m pytest -n auto --dist loadgroup")
    (transparency,) = _transparency_commands(REPO / "README.md")
    assert transparency.endswith("-m pytest tests/transparency -n auto --dist loadgroup")
    assert 'pip install -q torch==2.13.0 -e ".[lightning,test,ecosystem]"' in transparency
    assert "tests/transparency/install.py" in transparency
    assert _transparency_commands(REPO / "docs" / "testing.md") == [transparency]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert [line for line in ci.splitlines() if "-m pytest" in line] == [commands[1], transparency]


def _without_code_blocks(page: Path) -> str:
    return re.sub(r"^```.*?^```$", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    headings = re.findall(r"^#+ (.*)$", _without_code_blocks(page), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_links_between_pages_point_at_files_and_headings_that_exist() -> None:
    links = 0
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", re.sub(r"`[^`\n]*`(?!\])", "", _without_code_blocks(page))):
            if "://" in target:
                continue
            links += 1
            path = (page.parent / target) if target else page
            assert path.exists(), f"{page.relative_to(REPO)} links to a missing {target}"
            if anchor:
                assert anchor in _anchors(path), f"{page.relative_to(REPO)} links to a missing heading {target}#{anchor}"
    assert links > 10


def test_the_module_map_names_every_module_and_only_modules_that_exist() -> None:
    """docs/architecture.md's tree lists each module, or its whole folder when none of the
    folder's modules is listed on its own; every module it names exists."""
    page = REPO / "docs" / "architecture.md"
    tree = next(b for b in markdown_blocks(page) if b.language == "" and "leafwatch/" in b.code).code
    listed = set(re.findall(r"\b(\w+\.py)\b", tree))
    folders = set(re.findall(r"(\w+)/", tree))
    package = REPO / "leafwatch"
    modules = [p.relative_to(package) for p in package.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    folder_lists_modules = {m.parts[0] for m in modules if len(m.parts) > 1 and m.name in listed}
    missing = [m.as_posix() for m in modules
               if m.name not in listed and not (len(m.parts) > 1 and m.parts[0] in folders
                                                and m.parts[0] not in folder_lists_modules)]
    assert not missing, f"{page.relative_to(REPO)} does not list {missing}"
    unknown = listed - {m.name for m in modules}
    assert not unknown, f"{page.relative_to(REPO)} lists modules that do not exist: {sorted(unknown)}"
