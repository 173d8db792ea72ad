"""``defaults:``: what workers and links get unless they say otherwise (a backend, that
backend's own keys, network sysctls, a link shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.common.errors import TopologyError
from testbed.model.backend_options import OPTIONS
from testbed.model.fields import mapping, unknown_keys
from testbed.model.shapes import Shape, shape_from_dict
from testbed.model.sysctls import parse_sysctls

DEFAULT_KEYS = ("backend", "link", "sysctls")
"""Keys of ``defaults:`` besides the backends' own (:func:`option_keys`)."""
DEFAULT_BACKEND = "netns"


@dataclass(frozen=True)
class Defaults:
    backend: str
    options: dict[str, Any]
    """Backend keys given under ``defaults:``; each applies to the workers whose backend takes it."""
    link: Shape
    """The shape of every link direction, before the link's own keys."""
    sysctls: dict[str, str]


def option_keys() -> tuple[str, ...]:
    """Every backend's own worker keys, each once, in registry order."""
    return tuple(dict.fromkeys(k for b in OPTIONS.values() for k in b.keys))


def check_backend(value: Any, path: str) -> str:
    if not isinstance(value, str) or value not in OPTIONS:
        raise TopologyError(path, f"unknown backend {value!r}", f"choose one of: {', '.join(OPTIONS)}")
    return value


def parse_defaults(value: Any) -> Defaults:
    """``defaults:`` (absent, null or empty: none), each key checked as it is where it applies."""
    keys = option_keys()
    d = mapping({} if value is None else value, "defaults", "backend and link defaults")
    unknown_keys(d, DEFAULT_KEYS + keys, "defaults")
    backend = check_backend(d.get("backend", DEFAULT_BACKEND), "defaults.backend")
    options = {k: d[k] for k in keys if k in d}
    link = shape_from_dict({} if d.get("link") is None else d["link"], "defaults.link")
    sysctls = parse_sysctls(d.get("sysctls"), "defaults.sysctls")
    return Defaults(backend, options, link, sysctls)
