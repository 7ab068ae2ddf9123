"""What a trial may run and see on this node: the agent's command policy and the clean
environment a trial starts with.

- Built-in programs always run. A `command` program runs only where the operator allows
  commands (`--allow-commands`, optionally naming the executables allowed).
- The guard decides on the argument list the agent will execute, after the template's
  placeholders are filled. The executable is resolved as the trial's PATH resolves it
  (absolute directories only), compared exactly with the allowed executables (names are
  resolved the same way; no symbolic link or copy called `python` passes for the real
  one), and the trial runs that absolute path.
- Without `--allow-shell`, nothing a hyperparameter value can reach runs as code:
  - shells, and programs that run other programs or code named in their arguments
    (`env`, `timeout`, `nice`, `sudo`, `find`, `gdb`, `xargs`, ...), are refused: the
    agent sets a trial's environment, and stops it, itself;
  - Python is parsed with CPython's own option grammar (combined short options, `-W`
    and `-X` values, `--check-hash-based-pycs MODE`, `--`): `-c` and reading code from
    stdin are refused, and `-m` runs only the modules the operator lists
    (`--allow-modules`);
  - other interpreters (perl, ruby, node, Rscript, ...) must be given a script first,
    with no options before it;
  - a placeholder never stands where the interpreter reads an option, an option's
    value, its module or its script: only the program's own arguments take values.
  The lists below are what the guard knows: with any executable allowed, one it does
  not know that runs code named in its arguments is not caught (the agent warns).
- A trial's environment is the HyperSack variables the agent sets, `PATH`, `HOME`,
  the locale, `TMPDIR`, CUDA/NVIDIA/MPS variables and the names the operator passes
  (`--pass-env`, `NAME` or `PREFIX*`), nothing else of the agent's.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hypersack.core.errors import HyperSackError
from hypersack.grid.space import PLACEHOLDER

# Names every trial gets from the agent's environment, when set there.
BASE_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "LOGNAME", "TERM",
            "HYPERSACK_DATA_DIR")
BASE_PREFIXES = ("LC_", "CUDA_", "NVIDIA_")  # CUDA_ covers MPS's CUDA_MPS_*

# Shells, and programs whose arguments are code.
SHELLS = frozenset({
    "sh", "bash", "rbash", "dash", "zsh", "ksh", "ksh93", "mksh", "pdksh", "ash", "yash",
    "fish", "csh", "tcsh", "busybox", "toybox", "pwsh", "powershell", "cmd", "cmd.exe",
    "awk", "gawk", "mawk", "nawk", "busybox-awk", "sed", "gsed", "eval", "ipython",
    "ipython3", "jupyter", "expect", "tclsh", "wish", "jshell", "irb", "ghci", "bc", "dc",
    "vim", "vi", "nvim", "ex", "emacs", "ed", "less", "more", "man", "make", "gmake",
    "cmake", "osascript",
    # Database shells (sqlite3's .shell, psql's \!, mysql's system) and REPLs.
    "sqlite3", "duckdb", "psql", "mysql", "mariadb", "redis-cli", "mongo", "mongosh",
    "erl", "iex", "elixir", "gforth", "swift", "ninja", "scons", "bazel", "meson"})
# Programs that run another program, or a command, named in their arguments. Their
# grammars are not parsed: they are refused, whatever follows them.
LAUNCHERS = frozenset({
    "env", "nice", "nohup", "setsid", "stdbuf", "timeout", "time", "ionice", "taskset",
    "numactl", "chrt", "xargs", "exec", "command", "builtin", "sudo", "su", "doas",
    "runuser", "setpriv", "pkexec", "sg", "newgrp", "flock", "script", "unshare",
    "nsenter", "chroot", "strace", "ltrace", "watch", "gdb", "lldb", "valgrind", "perf",
    "find", "parallel", "ssh", "rsh", "srun", "sbatch", "salloc", "mpirun", "mpiexec",
    "torchrun", "accelerate", "deepspeed", "screen", "tmux", "dtach", "at", "batch",
    "systemd-run", "firejail", "bwrap", "proot", "fakeroot", "faketime", "catchsegv",
    "setarch", "linux32", "linux64", "prlimit", "cgexec", "chpst", "daemonize",
    "start-stop-daemon", "git", "tar", "rsync", "zip", "xterm", "ld.so", "cpulimit",
    "rlwrap", "unbuffer", "entr", "inotifywait", "tini", "dumb-init", "su-exec", "gosu",
    "chronic", "ts", "pv", "tee", "dbus-launch", "pipx", "uv", "uvx", "conda", "mamba",
    "micromamba", "poetry", "pipenv", "hatch", "pdm", "npx", "npm", "yarn", "pnpm",
    # Installers (a package's build runs its code), container runtimes, compilers
    # (`-wrapper`, plugins), and programs that run a helper named in an option.
    "pip", "pip3", "deno", "bun", "docker", "podman", "nerdctl", "ctr", "singularity",
    "apptainer", "enroot", "ch-run", "shifter", "kubectl", "systemd-nspawn", "lxc-execute",
    "cc", "c++", "gcc", "g++", "clang", "clang++", "go", "cargo", "mvn", "gradle", "ant",
    "sbt", "scp", "sftp", "wget", "sshpass", "xvfb-run", "dbus-run-session", "ssh-agent"})
# Versioned names of the same (pip3.11, gcc-12, clang++-17).
_VERSIONED = re.compile(r"^(pip|gcc|g\+\+|clang|clang\+\+|cc|c\+\+)[-0-9.]+$")
_LOADER = re.compile(r"^ld-linux.*\.so.*$|^ld64\.so.*$")
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*([-_a-z0-9.]*)$")
# Interpreters that must be given a script first, no options before it.
_SCRIPTED = re.compile(r"^(perl|ruby|node|nodejs|php|lua|luajit|Rscript|R|julia|"
                       r"java|scala|kotlin|groovy|guile|racket|sbcl|clisp|ocaml|swipl|"
                       r"octave|matlab|gnuplot)[0-9.]*$")

# CPython's options (Modules/main.c, Python/getopt.c): short options without a value,
# short options whose value is the rest of the word or the next word, long options.
_PY_FLAGS = frozenset("bBdEhiIOPqRsSuvVx?")
_PY_VALUED = frozenset("WX")
_PY_LONG_FLAGS = frozenset({"--help", "--version", "--help-env", "--help-xoptions",
                            "--help-all"})
_PY_LONG_VALUED = frozenset({"--check-hash-based-pycs"})
_PY_HASH_MODES = frozenset({"always", "never", "default"})


class CommandRefused(HyperSackError):
    """The agent's policy does not let this program run here."""


@dataclass(frozen=True)
class CommandPolicy:
    allow_commands: bool = False
    executables: frozenset[str] = field(default_factory=frozenset)  # empty: any
    allow_shell: bool = False
    modules: frozenset[str] = field(default_factory=frozenset)  # what `python -m` may run

    @classmethod
    def permissive(cls) -> CommandPolicy:
        """One's own machine (`hypersack run`): any command, shells too."""
        return cls(allow_commands=True, allow_shell=True)

    @classmethod
    def parse(cls, allow_commands: str | None, allow_shell: bool,
              allow_modules: str | None = None) -> CommandPolicy:
        """`allow_commands`: None (no commands), "*" or "" (any executable), or a comma
        list of executables (names on PATH or absolute paths; `python` is also the
        agent's own interpreter, `{python}`). `allow_modules`: a comma list of modules
        `python -m` may run (or packages, `pkg.*`)."""
        modules = frozenset(m.strip() for m in (allow_modules or "").split(",") if m.strip())
        if allow_commands is None:
            return cls(allow_shell=allow_shell, modules=modules)
        names = frozenset(n.strip() for n in allow_commands.split(",") if n.strip()) - {"*"}
        return cls(allow_commands=True, executables=names, allow_shell=allow_shell,
                   modules=modules)

    def check(self, template: str, node: str, *, argv: list[str] | None = None,
              path: str | None = None) -> list[str] | None:
        """Raise CommandRefused unless this command template may run on this node.

        `argv`: the filled argument list the agent would run; it is checked too, and
        returned with its executable resolved to the absolute path that runs. `path`:
        the trial's PATH (default: this process's)."""
        if not self.allow_commands:
            raise CommandRefused(f"agent {node} runs built-in programs only; its operator "
                                 "allows commands with --allow-commands")
        try:
            words = shlex.split(template)
        except ValueError as exc:
            raise CommandRefused(f"command: cannot split into arguments: {exc}") from None
        if not words:
            raise CommandRefused("command: empty")
        exe = words[0]
        if exe != "{python}" and PLACEHOLDER.search(exe):
            raise CommandRefused(f"command: the executable {exe!r} must be literal or "
                                 "{python}, not a placeholder")
        if argv is not None and len(argv) != len(words):
            raise CommandRefused("command: the filled arguments do not match the template")
        search = os.environ.get("PATH", os.defpath) if path is None else path
        resolved = sys.executable if exe == "{python}" else resolve(exe, search)
        if resolved is None:
            raise CommandRefused(f"command: {exe!r} is not found on this node's PATH (name "
                                 "an absolute path, or a program on PATH)")
        if self.executables and resolved not in self._allowed(search):
            shown = "python" if exe == "{python}" else repr(exe)
            raise CommandRefused(f"agent {node} allows only these executables: "
                                 f"{', '.join(sorted(self.executables))} (not {shown}, "
                                 f"which is {resolved})")
        if not self.allow_shell:
            self._grammar(exe, resolved, words, node, templated=True)
            if argv is not None:
                self._grammar(exe, resolved, argv, node, templated=False)
        return None if argv is None else [resolved, *argv[1:]]

    def _allowed(self, path: str) -> set[str]:
        """The allowed executables as absolute paths, resolved on the trial's PATH."""
        out = set()
        for name in self.executables:
            if name in ("python", "{python}"):
                out.add(sys.executable)
            found = resolve(name, path)
            if found is not None:
                out.add(found)
        return out

    def _grammar(self, exe: str, resolved: str, words: list[str], node: str,
                 templated: bool) -> None:
        names = {os.path.basename(exe), os.path.basename(resolved),
                 os.path.basename(os.path.realpath(resolved))} - {"{python}"}
        if exe == "{python}":
            names.add("python")
        ask = f"ask the operator of {node} for --allow-shell"
        for name in sorted(names):
            if name in SHELLS:
                raise CommandRefused(f"command: {name} is a shell (or runs its arguments as "
                                     f"code); a value inside it runs as code. Run the "
                                     f"program directly, or {ask}")
            if name in LAUNCHERS or _LOADER.match(name) or _VERSIONED.match(name):
                raise CommandRefused(
                    f"command: {name} runs another program or command from its arguments; "
                    f"run the program directly (the agent sets the trial's environment "
                    f"and stops it itself), or {ask}")
        if any(_PYTHON.match(n) for n in names):
            problem = python_problem(words, self.modules, templated)
            if problem:
                raise CommandRefused(f"command: python {problem}; put the code in a script "
                                     f"file, or {ask}")
            return
        scripted = sorted(n for n in names if _SCRIPTED.match(n))
        if scripted:
            first = words[1] if len(words) > 1 else ""
            if not first or first.startswith("-") or (templated and PLACEHOLDER.search(first)):
                raise CommandRefused(
                    f"command: {scripted[0]} takes a script file first, with no options "
                    f"before it (a literal path, not a placeholder: its options can run "
                    f"inline code); or {ask}")


def python_problem(words: list[str], modules: Iterable[str] = (),
                   templated: bool = True) -> str | None:
    """Why this Python command line would run code other than a literal script (or an
    allowed module), read as CPython reads its options; None if it would not.
    `templated`: the words are a template's, where a placeholder may stand only in the
    script's own arguments."""
    allowed = frozenset(modules)

    def placeholder(word: str, what: str) -> str | None:
        if templated and PLACEHOLDER.search(word):
            return f"reads {what} where the template has a placeholder ({word!r})"
        return None

    i = 1
    while i < len(words):
        word = words[i]
        bad = placeholder(word, "an option or its script")
        if bad:
            return bad
        if word == "--":
            i += 1
            break
        if word == "-":
            return "would read its code from standard input (-)"
        if word.startswith("--"):
            if word in _PY_LONG_FLAGS:
                i += 1
                continue
            if word in _PY_LONG_VALUED:
                value = words[i + 1] if i + 1 < len(words) else ""
                bad = placeholder(value, f"the value of {word}")
                if bad:
                    return bad
                if value not in _PY_HASH_MODES:
                    return f"option {word} takes always, never or default (not {value!r})"
                i += 2
                continue
            return f"option {word!r} is not one of CPython's"
        if not word.startswith("-"):
            break  # the script
        j = 1
        while j < len(word):
            letter = word[j]
            if letter == "c":
                return "with -c runs inline code"
            if letter == "m":
                module = word[j + 1:]
                if not module:
                    if i + 1 >= len(words):
                        return "-m without a module"
                    module = words[i + 1]
                    bad = placeholder(module, "the module of -m")
                    if bad:
                        return bad
                if not module_allowed(module, allowed):
                    listed = ", ".join(sorted(allowed)) or "none"
                    return (f"-m {module!r}: this agent runs only the modules its operator "
                            f"lists with --allow-modules ({listed})")
                return None  # the rest are the module's own arguments
            if letter in _PY_VALUED:
                if j + 1 == len(word):  # the value is the next word
                    value = words[i + 1] if i + 1 < len(words) else ""
                    bad = placeholder(value, f"the value of -{letter}")
                    if bad:
                        return bad
                    i += 1
                break
            if letter not in _PY_FLAGS:
                return f"option -{letter} is not one of CPython's"
            j += 1
        i += 1
    if i >= len(words):
        return "without a script would read its code from standard input"
    return placeholder(words[i], "its script")


def module_allowed(module: str, allowed: frozenset[str]) -> bool:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        return False
    return any(module == a or (a.endswith(".*") and module.startswith(a[:-1]))
               for a in allowed)


def resolve(exe: str, path: str) -> str | None:
    """The absolute path `exe` runs as: itself if absolute, else the first executable
    file of that name in PATH's absolute directories (a relative entry, `.` or empty,
    would depend on the trial's working directory). None if there is none."""
    if "/" in exe:
        return os.path.normpath(exe) if os.path.isabs(exe) and _runnable(exe) else None
    if not exe or exe in (".", ".."):
        return None
    for folder in path.split(os.pathsep):
        if not os.path.isabs(folder):
            continue
        candidate = os.path.normpath(os.path.join(folder, exe))
        if _runnable(candidate):
            return candidate
    return None


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def clean_env(environ: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The part of the agent's environment a trial may see."""
    patterns = [p for p in pass_env if p]
    out = {}
    for name, value in environ.items():
        if (name in BASE_ENV or name.startswith(BASE_PREFIXES)
                or any(fnmatch.fnmatchcase(name, p) for p in patterns)):
            out[name] = value
    return out
