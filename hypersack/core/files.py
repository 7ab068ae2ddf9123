"""Reading the files users hand us: small UTF-8 text, YAML without surprises.

Every failure is an InvalidInput that names the file and says why (missing, a directory,
binary, too large, too deeply nested, a key given twice), never a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hypersack.core.bounds import MAX_FILE_BYTES, MAX_YAML_DEPTH
from hypersack.core.errors import InvalidInput

MAX_YAML_NODES = 1_000_000


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A small UTF-8 text file, or InvalidInput that says why not (missing, a directory,
    too large, binary, unreadable)."""
    p = Path(path)
    try:
        if not p.exists():
            raise InvalidInput(f"{what} {str(p)!r} does not exist")
        if p.is_dir():
            raise InvalidInput(f"{what} {str(p)!r} is a directory, not a file")
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInput(f"{what} {str(p)!r}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InvalidInput(f"{what} {str(p)!r} is larger than {max_bytes} bytes")
    if b"\x00" in data:
        raise InvalidInput(f"{what} {str(p)!r} is a binary file, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} {str(p)!r} is not UTF-8 text (byte {exc.start})") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that rejects a key given twice instead of keeping the last silently."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            repeated = key in seen
        except TypeError:  # an unhashable key (a list or mapping as a key)
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)
# YAML 1.2's (and JSON's) floats with an exponent and no dot: `1e-5`, `1E-05`, `-2e+300`.
# YAML 1.1, which PyYAML reads, takes them for strings, and JSON writes 1e-05 for 1e-5:
# a space sent as JSON would lose its numbers. Tried after the integer rule, so `10`
# stays an int.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


# YAML 1.2 (and JSON) have no dates: `name: 2026-11-29` is the string a user means.
# YAML 1.1's timestamp rule turned it into a date, which no field takes.
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _UniqueKeyLoader.yaml_implicit_resolvers.items()}


def _check_shape(data: Any, source: str) -> None:
    """No deeper than MAX_YAML_DEPTH, no more than MAX_YAML_NODES values (aliases count
    every time they are used, so a "billion laughs" document is refused)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise InvalidInput(f"{source}: more than {MAX_YAML_NODES} values")
        if depth > MAX_YAML_DEPTH:
            raise InvalidInput(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML (or JSON) text; InvalidInput names the source and the reason."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. a timestamp out of range
        raise InvalidInput(f"{source}: not valid YAML: {exc}") from None
    _check_shape(data, source)
    return data


def load_yaml_file(path: str | Path, what: str) -> Any:
    return load_yaml(read_text_file(path, what), str(path))
