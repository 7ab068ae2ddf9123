"""The command guard: an allow-list decided on the argv that really runs. Every template
of the attacks reported against the deny-list guard is refused, for the right reason, and
a fuzzer over templates and values runs what the guard accepts and checks that no value
ever reached a shell or ran as inline code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypersack.agent.guard import CommandPolicy, CommandRefused, python_problem
from hypersack.agent.launcher import argv_for
from hypersack.grid.space import Program
from hypersack.testing.guard_fuzz import CODE, fuzz, stub_path


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    return stub_path(tmp_path)


ANY = CommandPolicy.parse("*", allow_shell=False)

# The five templates that ran code from values on live agents, with their values, and
# the allow-list they ran under.
LIVE = [
    ("env -u /opt/bin/train /bin/bash -c {code}", {"code": "id"}, "/opt/bin/train",
     "allows only these executables"),
    ("{python} {flag} {code}", {"flag": "-c", "code": CODE}, "*",
     "placeholder"),
    ("{python} -I -c {code}", {"code": CODE}, "*", "with -c runs inline code"),
    ("{python} -m timeit -n 1 {code}", {"code": CODE}, "*", "--allow-modules"),
    ("timeout -s KILL 60 bash -c {code}", {"code": "id"}, "*", "timeout runs another"),
]
# And the ones the old guard let through offline.
OFFLINE = [
    ('env -S "bash -c id" python', "env runs another"),
    ("python --check-hash-based-pycs always -c x", "with -c runs inline code"),
    ("perl -ne 'print {x}'", "perl takes a script file first"),
    ("rbash -c {x}", "rbash is a shell"),
    ("find . -exec sh -c {x} ;", "find runs another"),
    ("sudo -u root python t.py", "sudo runs another"),
    ("flock /tmp/l bash -c {x}", "flock runs another"),
    ("script -qc {x} /dev/null", "script runs another"),
    ("unshare -r bash -c {x}", "unshare runs another"),
    ("strace -o /dev/null bash -c {x}", "strace runs another"),
    ("watch -n 1 {x}", "watch runs another"),
    ("gdb -batch -ex {x}", "gdb runs another"),
    ("ipython -c {x}", "ipython is a shell"),
    ("python3.11-dbg -c {x}", "with -c runs inline code"),
    ("{python} -bBc {x}", "with -c runs inline code"),
    ("{python} -Wignore -uc {x}", "with -c runs inline code"),
    ("{python} -X dev -m {x}", "placeholder"),
    ("{python} -W {x} t.py", "placeholder"),
    ("{python} - {x}", "standard input"),
    ("{python} {x}", "placeholder"),
    ("{python} -- {x}", "placeholder"),
    ("{python} -E", "standard input"),
    ("nice -n 5 python t.py", "nice runs another"),
    ("xargs -a f python", "xargs runs another"),
    ("awk 'BEGIN{{system(\"id\")}}'", "awk is a shell"),
    ("node -e {x}", "node takes a script file first"),
]


@pytest.mark.parametrize("template,values,allowed,reason", LIVE)
def test_the_live_escapes_are_refused(bin_dir: Path, template: str, values: dict[str, str],
                                      allowed: str, reason: str) -> None:
    policy = CommandPolicy.parse(allowed, allow_shell=False)
    argv = argv_for(Program(command=template), values)
    with pytest.raises(CommandRefused, match=reason):
        policy.check(template, "n1", argv=argv, path=str(bin_dir))


@pytest.mark.parametrize("template,reason", OFFLINE)
def test_the_offline_escapes_are_refused(bin_dir: Path, template: str, reason: str) -> None:
    with pytest.raises(CommandRefused, match=reason):
        ANY.check(template, "n1", path=str(bin_dir))
    # --allow-shell is the operator's explicit way to run them.
    CommandPolicy.parse("*", allow_shell=True).check(template, "n1", path=str(bin_dir))


# Programs past the reported ones that run code or another program named in their
# arguments (with `--allow-commands` alone: any executable).
MORE = [
    ("sqlite3 -cmd {x} db", "sqlite3 is a shell"),  # {x} = ".shell id"
    ("psql -c {x}", "psql is a shell"),
    ("duckdb -c {x}", "duckdb is a shell"),
    ("pip install {x}", "pip runs another"),  # a package's build runs its code
    ("pip3.11 install {x}", "pip3.11 runs another"),
    ("deno eval {x}", "deno runs another"),  # was taken as a script called 'eval'
    ("bun x {x}", "bun runs another"),
    ("singularity exec img.sif {x}", "singularity runs another"),
    ("apptainer exec img.sif {x}", "apptainer runs another"),
    ("docker run --rm img {x}", "docker runs another"),
    ("gcc -wrapper {x} t.c", "gcc runs another"),
    ("clang-17 -fplugin={x} t.c", "clang-17 runs another"),
    ("wget --use-askpass={x} http://h/", "wget runs another"),
    ("scp -S {x} a h:b", "scp runs another"),
    ("go run {x}", "go runs another"),
]


@pytest.mark.parametrize("template,reason", MORE)
def test_more_programs_that_run_code_from_arguments_are_refused(
        tmp_path: Path, template: str, reason: str) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    name = template.split()[0]
    (folder / name).write_text("#!/bin/sh\n")
    (folder / name).chmod(0o755)
    with pytest.raises(CommandRefused, match=reason):
        ANY.check(template, "n1", path=str(folder))
    CommandPolicy.parse("*", allow_shell=True).check(template, "n1", path=str(folder))


def test_a_copy_called_python_is_not_the_allowed_python(bin_dir: Path, tmp_path: Path) -> None:
    only = CommandPolicy.parse("python,train", allow_shell=False)
    only.check("{python} t.py --lr {lr}", "n1", path=str(bin_dir))
    only.check("python t.py", "n1", path=str(bin_dir))  # python as PATH resolves it
    argv = only.check("train --lr {lr}", "n1", argv=["train", "--lr", "0.1"],
                      path=str(bin_dir))
    assert argv == [str(bin_dir / "train"), "--lr", "0.1"]  # what runs is the checked path
    other = tmp_path / "evil"
    other.mkdir()
    (other / "python").symlink_to(sys.executable)
    (other / "train").write_text("#!/bin/sh\n")
    (other / "train").chmod(0o755)
    for exe in (other / "python", other / "train"):
        with pytest.raises(CommandRefused, match="allows only these executables"):
            only.check(f"{exe} t.py", "n1", path=str(bin_dir))
    # Relative PATH entries (the trial's own folder) resolve nothing.
    with pytest.raises(CommandRefused, match="not found on this node's PATH"):
        ANY.check("train x", "n1", path=f".:{other}/../evil-nothing")
    with pytest.raises(CommandRefused, match="not found"):
        ANY.check("./train x", "n1", path=str(bin_dir))


@pytest.mark.parametrize("template", [
    "{python} train.py --lr {lr} -c {lr}", "{python} -u -W ignore -X dev train.py {lr}",
    "{python} -uBX dev train.py {lr}", "{python} -Wignore::DeprecationWarning t.py {lr}",
    "{python} --check-hash-based-pycs never -- t.py -c {lr}", "{python} -I -S -E t.py {lr}",
    "{python} -m trainer.main --lr {lr} -c {lr}", "{python} -mtrainer {lr}",
    "perl train.pl -e {lr}", "node train.js --eval {lr}", "train --lr {lr} -c {lr}",
])
def test_direct_programs_run(bin_dir: Path, template: str) -> None:
    policy = CommandPolicy.parse("*", allow_shell=False, allow_modules="trainer.*,trainer")
    policy.check(template, "n1", path=str(bin_dir))


def test_modules_run_only_when_listed() -> None:
    assert python_problem(["python", "-m", "pkg.train", "-c", "x"], ["pkg.*"]) is None
    assert "--allow-modules" in (python_problem(["python", "-m", "pkg"], ["pkg.*"]) or "")
    assert "--allow-modules" in (python_problem(["python", "-mtimeit", "x"], ["pkg"]) or "")
    assert "--allow-modules" in (python_problem(["python", "-m", "a;b"], ["a;b"]) or "")


def test_commands_are_off_by_default() -> None:
    with pytest.raises(CommandRefused, match="runs built-in programs only"):
        CommandPolicy().check("{python} t.py", "n1")


def test_the_fuzzer_finds_no_value_that_runs_as_code(bin_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tried, accepted, ran = fuzz(int(os.environ.get("HYPERSACK_FUZZ_SEED", "35")), 600, work,
                                bin_dir)
    print(f"guard fuzzer: {tried} tried, {accepted} accepted and run, none reached code")
    assert tried == 600 and ran == accepted and accepted >= 30  # it did run programs
    # And the same oracle catches an escape: with --allow-shell, values do run as code.
    shell = CommandPolicy.parse("*", allow_shell=True)
    argv = shell.check("{python} -c {code}", "n1", argv=["python", "-c", CODE],
                       path=str(bin_dir))
    assert argv is not None
    subprocess.run(argv, cwd=work, env={"PATH": str(bin_dir)}, check=True)
    assert (work / "PWNED").exists()


@pytest.mark.parametrize(("allow", "warned"), [([], True), (["python"], False)])
def test_an_agent_that_allows_any_executable_says_what_the_guard_cannot_catch(
        tmp_path: Path, allow: list[str], warned: bool) -> None:
    argv = [sys.executable, "-m", "hypersack.agent.app", "--server", "127.0.0.1:9",
            "--workdir", str(tmp_path / "w"), "--allow-commands", *allow]
    if os.geteuid() == 0:
        argv.append("--allow-root-trials")
    agent = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        assert agent.stderr is not None
        for line in agent.stderr:  # up to its first attempt to reach the (absent) server
            seen.append(line)
            if "reconnecting" in line:
                break
    finally:
        agent.kill()
        agent.wait(30)
    said = [x for x in seen if "--allow-commands without names" in x]
    assert bool(said) == warned, seen
    if warned:
        assert "name the executables" in said[0]
