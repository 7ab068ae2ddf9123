"""What a trial may run and see on this node: the agent's command policy and the clean
environment a trial starts with.

- Built-in programs always run. A `command` program runs only where the operator allows
  commands (`--allow-commands`, optionally naming the executables allowed).
- A template whose executable is a shell, or that hands inline code to an interpreter
  (`python -c`, `perl -e`, `node --eval`), is refused unless the operator also allows
  shells (`--allow-shell`): a hyperparameter value inside a shell string or inline
  code is code. The executable must be literal or `{python}`, never another placeholder.
- A trial's environment is the HyperSack variables the agent sets, `PATH`, `HOME`,
  the locale, `TMPDIR`, CUDA/NVIDIA/MPS variables and the names the operator passes
  (`--pass-env`, `NAME` or `PREFIX*`), nothing else of the agent's.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hypersack.core.errors import HyperSackError
from hypersack.grid.space import PLACEHOLDER

# Names every trial gets from the agent's environment, when set there.
BASE_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "LOGNAME", "TERM",
            "HYPERSACK_DATA_DIR")
BASE_PREFIXES = ("LC_", "CUDA_", "NVIDIA_")  # CUDA_ covers MPS's CUDA_MPS_*

# Shells, and programs whose first argument is itself code.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh",
                    "busybox", "pwsh", "powershell", "cmd", "cmd.exe", "awk", "gawk", "mawk",
                    "nawk", "sed", "eval"})
# Programs that run another program named in their arguments: the check looks past them.
WRAPPERS = frozenset({"env", "nice", "nohup", "setsid", "stdbuf", "timeout", "time", "ionice",
                      "taskset", "numactl", "chrt", "xargs", "exec", "command", "sudo", "su"})
INLINE_CODE = frozenset({"-c", "-e", "-E", "--eval", "--command", "--exec", "-p", "--print"})
_INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|"
                          r"deno|bun|php[0-9.]*|lua[0-9.]*|Rscript|R|julia|osascript)$")
_PYTHON_INLINE = re.compile(r"^-[A-Za-z]*c")  # -c, -uc, -Bc'code'
_TAKES_VALUE = frozenset({"-W", "-X", "-Q", "-I", "-M", "-r"})  # their value is no option


class CommandRefused(HyperSackError):
    """The agent's policy does not let this program run here."""


@dataclass(frozen=True)
class CommandPolicy:
    allow_commands: bool = False
    executables: frozenset[str] = field(default_factory=frozenset)  # empty: any
    allow_shell: bool = False

    @classmethod
    def permissive(cls) -> CommandPolicy:
        """One's own machine (`hypersack run`): any command, shells too."""
        return cls(allow_commands=True, allow_shell=True)

    @classmethod
    def parse(cls, allow_commands: str | None, allow_shell: bool) -> CommandPolicy:
        """`allow_commands`: None (no commands), "*" or "" (any executable), or a comma
        list of executables (names or absolute paths)."""
        if allow_commands is None:
            return cls(allow_shell=allow_shell)
        names = frozenset(n.strip() for n in allow_commands.split(",") if n.strip()) - {"*"}
        return cls(allow_commands=True, executables=names, allow_shell=allow_shell)

    def check(self, template: str, node: str) -> None:
        """Raise CommandRefused unless this command template may run on this node."""
        if not self.allow_commands:
            raise CommandRefused(f"agent {node} runs built-in programs only; its operator "
                                 "allows commands with --allow-commands")
        try:
            argv = shlex.split(template)
        except ValueError as exc:
            raise CommandRefused(f"command: cannot split into arguments: {exc}") from None
        if not argv:
            raise CommandRefused("command: empty")
        exe, rest = _executable(argv)
        if exe is None:
            raise CommandRefused("command: no executable after its wrappers")
        if exe != "{python}" and PLACEHOLDER.search(exe):
            raise CommandRefused(f"command: the executable {exe!r} must be literal or "
                                 "{python}, not a placeholder")
        name = "python" if exe == "{python}" else os.path.basename(exe)
        if self.executables and not {exe, name} & self.executables:
            shown = "python" if exe == "{python}" else repr(exe)
            raise CommandRefused(f"agent {node} allows only these executables: "
                                 f"{', '.join(sorted(self.executables))} (not {shown})")
        if self.allow_shell:
            return
        if name in SHELLS:
            raise CommandRefused(f"command: {name} is a shell (or runs its arguments as "
                                 f"code); a value inside a shell string runs as code. Run "
                                 f"the program directly, or ask the operator of {node} for "
                                 "--allow-shell")
        if _INTERPRETER.match(name) and _inline_code(name, rest):
            raise CommandRefused(f"command: inline code for {name} (-c/-e); a value inside it "
                                 f"runs as code. Put the code in a file, or ask the operator "
                                 f"of {node} for --allow-shell")


def _inline_code(name: str, args: list[str]) -> bool:
    """Whether the interpreter's own options (up to its script or `-m`) pass code."""
    python = name.startswith(("python", "pypy"))
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--", "-m"):
        a = args[i]
        if (a in INLINE_CODE or (python and _PYTHON_INLINE.match(a))
                or a.startswith("--eval=") or (name.startswith("php") and a == "-r")):
            return True
        i += 2 if a in _TAKES_VALUE else 1
    return False


def _executable(argv: list[str]) -> tuple[str | None, list[str]]:
    """The program a command really runs, past wrappers like `env A=1` or `timeout 60`."""
    i = 0
    while i < len(argv):
        word = argv[i]
        base = os.path.basename(word)
        if base in WRAPPERS:
            i += 1
            # The wrapper's own options and arguments (VAR=x, -n 5, 60, ...).
            while i < len(argv) and (argv[i].startswith("-") or "=" in argv[i]
                                     or argv[i].replace(".", "", 1).isdigit()):
                i += 1
            continue
        return word, argv[i + 1:]
    return None, []


def clean_env(environ: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The part of the agent's environment a trial may see."""
    patterns = [p for p in pass_env if p]
    out = {}
    for name, value in environ.items():
        if (name in BASE_ENV or name.startswith(BASE_PREFIXES)
                or any(fnmatch.fnmatchcase(name, p) for p in patterns)):
            out[name] = value
    return out
