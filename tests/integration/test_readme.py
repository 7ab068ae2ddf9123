"""The README's cluster recipe, run as written on a fresh server: its own code block,
with the machine's paths and ports put in (a temporary directory, free ports on
loopback), a fake 4-GPU inventory for the agent, and --allow-root-trials in place of
--run-as where the test runs as root (this machine's Python is not readable by others)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hypersack.testing.cluster import free_port
from tests.conftest import ROOT


def recipe() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On a cluster"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    lines, current = [], ""
    for line in block.splitlines():
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_cluster_recipe_works_on_a_fresh_server(tmp_path: Path) -> None:
    port = free_port()
    while True:  # the agent port is the next one
        try:
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            port = free_port()
    agent_extra = "--backend fake --inventory 4xA100-80GB@88"
    if os.geteuid() == 0:
        agent_extra += " --allow-root-trials"
    subs = [("/etc/hypersack/certs", str(tmp_path / "certs")),
            ("/shared/hypersack.db", str(tmp_path / "db" / "hypersack.db")),
            ("/scratch/hypersack", str(tmp_path / "work")),
            ("head:50051", f"127.0.0.1:{port}"), ("head:50052", f"127.0.0.1:{port + 1}"),
            ("0.0.0.0:50051", f"0.0.0.0:{port}"), ("--user-map '*=*'", agent_extra)]
    script = ["set -euo pipefail", f"cd {ROOT}", "trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    commands = recipe()
    assert any(c.startswith("hypersack-server") for c in commands)
    for command in commands:
        for old, new in subs:
            command = command.replace(old, new)
        if command.startswith(("hypersack-server", "hypersack-agent")):
            name = command.split()[0]
            script.append(f"{command} > {tmp_path / name}.log 2>&1 &")
            if name == "hypersack-server":
                script.append(
                    f"for i in $(seq 300); do hypersack whoami --server 127.0.0.1:{port} "
                    f"--tls-ca {tmp_path / 'certs' / 'ca.crt'} >/dev/null 2>&1 && break; "
                    "sleep 0.2; done")
        else:
            script.append(command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSACK_")}
    env.update(HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", COLUMNS="200")
    done = subprocess.run(["bash", "-c", "\n".join(script)], env=env, capture_output=True,
                          text=True, timeout=280)
    logs = "".join((tmp_path / f"{n}.log").read_text()[-1500:]
                   for n in ("hypersack-server", "hypersack-agent")
                   if (tmp_path / f"{n}.log").exists())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs
    assert "sp1-1: COMPLETED, completed 96" in done.stdout
    assert re.search(r"gpu01\s.*connected", done.stdout)
    rows = [line for line in done.stdout.splitlines() if line.startswith("sp1-1-t")]
    assert len(rows) >= 96  # the CSV of results (and the status table)
