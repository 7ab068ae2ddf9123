"""The README and docs/ stay true: every search space they show is accepted as written
(whole spaces as they are; fragments on a small space), and every link inside the
repository reaches a file and, with an anchor, a heading of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypersack.core.errors import InvalidInput
from hypersack.core.files import load_yaml
from hypersack.grid.space import parse_space
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASE = {"name": "doc", "models": ["resnet18"], "hyperparameters": {"batch_size": [64]}}
FRAGMENT_KEYS = {"hyperparameters", "search", "pruner", "settings", "program"}


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def spaces() -> list[tuple[str, dict]]:
    out = []
    for page in PAGES:
        for i, block in enumerate(blocks(page, "yaml")):
            for j, doc in enumerate(_documents(block)):
                if isinstance(doc, dict) and set(doc) & FRAGMENT_KEYS:
                    out.append((f"{page.name}:{i}:{j}", doc))
    return out


def _documents(block: str) -> list[dict]:
    """A block is one space, or lines that are each a fragment (`pruner: {...}` one
    after another shows alternatives), or one fragment over several lines."""
    try:
        whole = load_yaml(block, "block")
    except InvalidInput:  # the same key on several lines: alternatives
        whole = None
    if isinstance(whole, dict) and "name" in whole:
        return [whole]
    tops = [line for line in block.splitlines() if line and not line.startswith((" ", "#"))]
    try:
        each = [load_yaml(line, "line") for line in tops]
    except InvalidInput:
        return [whole]
    if each and all(isinstance(d, dict) and None not in d.values() for d in each):
        return each
    return [whole]


@pytest.mark.parametrize("where, doc", spaces(), ids=[w for w, _ in spaces()])
def test_every_space_the_docs_show_is_accepted(where: str, doc: dict) -> None:
    data = dict(doc) if "name" in doc else {**BASE, **doc, "hyperparameters": {
        **BASE["hyperparameters"], **doc.get("hyperparameters", {})}}
    program = data.get("program")
    if isinstance(program, dict) and "command" in program:
        program["command"] = program["command"].replace("{space_dir}", "/tmp")
        if "name" not in doc:  # a command program of its own: no zoo models
            data.pop("models")
            data["hyperparameters"] = {"lr": [0.1], **data["hyperparameters"]}
    if "pruner" in doc:
        data["settings"] = {"epochs": 27, **data.get("settings", {})}
    parse_space(data)


def test_the_docs_show_spaces() -> None:
    assert len(spaces()) >= 10


def test_every_link_inside_the_repository_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
                continue
            if frag and dest.suffix == ".md":
                headings = {anchor(h) for h in re.findall(r"(?m)^#+ (.+)$",
                                                          dest.read_text())}
                if frag not in headings:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
