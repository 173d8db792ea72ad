"""Reading a topology file: where it is (a path, or the name of a shipped topology) and its
YAML, read strictly (a duplicate key is an error, not a silent overwrite). What the
document says is checked by :func:`testbed.model.topology.load_topology_dict`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.common.errors import TopologyError
from testbed.common.files import InputError, read_text

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "topologies"
"""The topologies shipped inside the package (``topologies/`` in a checkout links here)."""


def shipped() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def read_topology_file(path: str | Path) -> tuple[Any, str]:
    """The parsed YAML document of a topology file and the path it was read from; a bare
    name (``three_switch``) that is no file here is one of the shipped topologies."""
    p = Path(path)
    if not p.exists() and p.name == str(path) and (SHIPPED_DIR / f"{p.name}.yaml").is_file():
        p = SHIPPED_DIR / f"{p.name}.yaml"
    try:
        text = read_text(p, "topology", "topology file")
    except InputError as e:
        raise TopologyError("", e.message, e.hint) from None
    except FileNotFoundError:
        raise TopologyError("", f"topology file '{path}' does not exist",
                            f"give the path of a YAML file, or a shipped topology: {', '.join(shipped())}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise TopologyError("", f"cannot read topology file '{path}': {e}") from None
    return _parse_yaml(text, path), str(p)


MAX_VALUES = 1_000_000
"""Values a topology document may hold once its YAML aliases are expanded: a few aliases of
aliases (a "billion laughs") would otherwise make every later pass, and an error message
that shows the value, as large as the expansion."""
MAX_DIGITS = 100
"""Digits of a YAML integer: Python refuses to read more than 4300, and no field needs 100."""


def _parse_yaml(text: str, path: str | Path) -> Any:
    try:
        doc = yaml.load(text, Loader=_StrictLoader)
    except RecursionError:
        raise TopologyError("", f"'{path}' nests too deeply", "a topology is a few levels of mappings and "
                            "lists") from None
    except _DuplicateKey as e:
        raise TopologyError("", f"'{path}': duplicate key '{e.key}' at line {e.line} (first at line {e.first})",
                            "YAML keeps only the last of duplicate keys; remove or rename one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TopologyError("", f"'{path}' is not valid YAML{where}: {getattr(e, 'problem', e)}",
                            "check indentation and quoting") from None
    if _expanded_size(doc, MAX_VALUES) > MAX_VALUES:
        raise TopologyError("", f"'{path}' holds more than {MAX_VALUES:,} values once its YAML aliases are "
                            "expanded", "write the document out, or use defaults: for what repeats")
    return doc


def _expanded_size(doc: Any, budget: int) -> int:
    """How many values ``doc`` holds, an alias counted each time it is used; stops counting
    past ``budget`` (without recursion: a deep document cannot exhaust the stack)."""
    seen, todo = 0, [doc]
    while todo and seen <= budget:
        v = todo.pop()
        seen += 1
        if isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return seen


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, line: int, first: int):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last) and
    integers of more than ``MAX_DIGITS`` digits."""

    def construct_yaml_int(self, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_DIGITS:
            raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits} digits (at most "
                                                    f"{MAX_DIGITS})", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: construct_mapping names it
                continue
            if first is not None:
                raise _DuplicateKey(str(key), key_node.start_mark.line + 1, first)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
