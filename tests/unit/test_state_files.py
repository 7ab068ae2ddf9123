"""One server per database whatever path names it, and bad state files refused with one
line: a damaged database names the file and how to recover it; an empty one starts a new
cluster only when asked (--init)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.errors import InvalidInput
from hypersack.server.app import main as server_main
from hypersack.store.sqlite import DatabaseLock, SqliteStore
from hypersack.testing.core import prof


@pytest.mark.parametrize("how", ["symlink", "hardlink", "relative", "dots"])
def test_the_lock_is_on_the_database_file_itself(tmp_path: Path, how: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "a" / "s.db"
    first = DatabaseLock(db)
    other: Path
    if how == "symlink":
        other = tmp_path / "link.db"
        other.symlink_to(db)
    elif how == "hardlink":
        other = tmp_path / "hard.db"
        os.link(db, other)
    elif how == "relative":
        monkeypatch.chdir(tmp_path / "a")
        other = Path("s.db")
    else:
        other = tmp_path / "a" / ".." / "a" / "s.db"
    try:
        with pytest.raises(InvalidInput, match=r"in use by (hypersack-server pid|another)"):
            DatabaseLock(other)
    finally:
        first.release()
    DatabaseLock(other).release()  # free again


def test_a_second_server_through_a_symlink_is_refused(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "s.db"
    link = tmp_path / "link.db"
    link.symlink_to(db)
    SqliteStore(db).close()
    held = DatabaseLock(db)
    try:
        assert server_main(["--listen", "127.0.0.1:0", "--db", str(link)]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in use by hypersack-server pid" in err[0], err


def test_a_damaged_database_says_how_to_recover_it(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db)
    for bs in range(1, 400):  # several pages of rows
        store.put_profile(prof("resnet18", bs))
    store.close()
    size = db.stat().st_size
    page = 4096
    assert size > 6 * page
    with open(db, "r+b") as f:  # a zeroed page in the middle of the table
        f.seek(3 * page)
        f.write(b"\0" * page)
    assert server_main(["--listen", "127.0.0.1:0", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(db) in err[0] and ".recover" in err[0], err
    assert "Traceback" not in err[0]


def test_an_empty_database_starts_a_new_cluster_only_with_init(tmp_path: Path,
                                                               capsys: Any) -> None:
    db = tmp_path / "s.db"
    db.write_bytes(b"")
    assert server_main(["--listen", "127.0.0.1:0", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty (0 bytes)" in err[0] and "--init" in err[0], err
    assert db.stat().st_size == 0  # untouched
    from hypersack.server.app import HyperSackServer, ServerSettings

    server = HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=db, init=True))
    server.start()
    server.stop(0)
    assert db.stat().st_size > 0
