"""The shell examples of README.md and the book (docs/src/**/*.md) run as written.

Which fenced blocks run is decided by their fence's info string, so that nothing is skipped
silently:

- ```sh: every command (a trailing backslash continues a line, `#` starts a comment) must be an
  `allocview ...` command; each runs and must exit 0.
- ```console: lines starting with `$ ` are commands, run the same way; every other non-empty
  line below a command (but `...`) must appear in that command's output, spaces collapsed.
- ```sh,ignore (or ```console,ignore): shown, not run (interactive explorers, `gui`, a GPU, the
  network, `../shared` data, long benchmarks, commands other than allocview); each such block
  is reported as a skipped test with its file and line.
- A shell fence without one of those info strings (bash, shell, zsh, none), or a block of any
  other kind that holds an `allocview` command line, fails `test_shell_blocks_are_marked`.

The commands run with the binary ALLOCVIEW_BIN names (else the workspace's debug build) as
`allocview` on the PATH, through bash, in a scratch folder of their own per block where every
top-level entry of the checkout (sample-traces/, scripts/, loaders/, ...) is linked under its
own name, so the examples' relative paths read the repository and their outputs stay in the
scratch folder. The test fails if it finds no command to run at all.
"""

import os
import pathlib
import re
import subprocess
from dataclasses import dataclass, field

import pytest

from conftest import REPO, allocview_bin

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs" / "src").rglob("*.md"))]
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`]*?)\s*$")
RUN = {"sh", "console"}
IGNORED = {"sh,ignore", "sh ignore", "console,ignore", "console ignore"}
SHELL_LANGUAGES = {"", "bash", "shell", "zsh", "shell-session", "shellsession", "sh-session"}
COMMAND_LINE = re.compile(r"^\s*(\$\s+)?allocview(\s|$)")
TIMEOUT_S = 300


@dataclass
class Command:
    text: str
    expected: list = field(default_factory=list)


@dataclass
class Block:
    path: pathlib.Path
    line: int
    info: str
    body: list

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks_of(path: pathlib.Path) -> list:
    found, current = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        m = FENCE.match(line)
        if current is None:
            if m:
                current = (m.group(2), number, m.group(3).strip().lower(), [])
            continue
        fence, start, info, body = current
        if m and m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence) and not m.group(3):
            found.append(Block(path, start, info, body))
            current = None
        else:
            body.append(line)
    return found


def joined(lines: list) -> list:
    """Lines with backslash continuations joined."""
    out, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def commands_of(block: Block) -> list:
    commands = []
    if block.info == "sh":
        for line in joined(block.body):
            if line.strip() and not line.strip().startswith("#"):
                commands.append(Command(line.strip()))
    elif block.info == "console":
        for line in joined(block.body):
            if line.startswith("$ "):
                commands.append(Command(line[2:].strip()))
            elif commands and line.strip() and line.strip() != "...":
                commands[-1].expected.append(line)
    return commands


ALL_BLOCKS = [b for path in DOC_FILES for b in blocks_of(path)]
RUNNABLE = [b for b in ALL_BLOCKS if b.info in RUN]
SHOWN = [b for b in ALL_BLOCKS if b.info in IGNORED]


def squash(text: str) -> str:
    return " ".join(text.split())


def scratch_folder(tmp_path: pathlib.Path) -> dict:
    """Links the checkout's top-level entries into tmp_path; returns the environment to run in."""
    for entry in REPO.iterdir():
        if entry.name.startswith(".") or entry.name == "target":
            continue
        (tmp_path / entry.name).symlink_to(entry)
    bin_dir = tmp_path.parent / f"{tmp_path.name}-bin"
    bin_dir.mkdir()
    (bin_dir / "allocview").symlink_to(os.path.abspath(allocview_bin()))
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_docs_have_runnable_commands():
    count = sum(len(commands_of(b)) for b in RUNNABLE)
    assert count > 0, "no runnable allocview command in README.md or docs/src: the test ran nothing"


def test_shell_blocks_are_marked():
    unmarked = []
    for b in ALL_BLOCKS:
        if b.info in RUN or b.info in IGNORED:
            continue
        holds_command = any(COMMAND_LINE.match(line) for line in b.body)
        if b.info in SHELL_LANGUAGES or holds_command:
            unmarked.append(f"{b.where} (```{b.info})")
    assert not unmarked, (
        "shell blocks must be ```sh (runs), ```console (runs, output checked) or ```sh,ignore "
        "(shown only): " + ", ".join(unmarked))


def test_runnable_blocks_hold_only_allocview_commands():
    others = [f"{b.where}: {c.text}" for b in RUNNABLE for c in commands_of(b)
              if not COMMAND_LINE.match(c.text)]
    assert not others, ("a ```sh or ```console block may only run allocview; mark the block "
                        "sh,ignore: " + "; ".join(others))


@pytest.mark.parametrize("block", SHOWN, ids=[b.where for b in SHOWN])
def test_shown_only(block):
    pytest.skip(f"```{block.info}: shown in the docs, not run in CI")


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_example_runs(block, tmp_path):
    commands = commands_of(block)
    assert commands, f"{block.where}: a ```{block.info} block without a command"
    env = scratch_folder(tmp_path)
    for command in commands:
        if not COMMAND_LINE.match(command.text):
            pytest.fail(f"{block.where}: not an allocview command: {command.text}")
        try:
            done = subprocess.run(["bash", "-c", command.text], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.where}: `{command.text}` ran longer than {TIMEOUT_S} s")
        output = done.stdout + done.stderr
        assert done.returncode == 0, (
            f"{block.where}: `{command.text}` exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
        have = squash(output)
        for line in command.expected:
            assert squash(line) in have, (
                f"{block.where}: `{command.text}` did not print {line.strip()!r}\n"
                f"output:\n{output[-3000:]}")
