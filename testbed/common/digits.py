"""Whole numbers read from input (environment variables, command lines, answers of other
programs and hosts): ASCII digits only, of a bounded length.

``str.isdigit`` is no test for ``int``: it is true of superscripts (``'²'``), which ``int``
refuses with a ValueError, and of digits of other scripts (``'٣'``), which ``int`` reads
as ``3``, so a value could pass for another; ``int`` also refuses more than 4300 digits,
and fewer can still make a number no caller means. :func:`ascii_int` is the one parser of
such values; a file of ``/proc`` (a pid's folder name) is the kernel's and may keep
``isdigit``.
"""

from __future__ import annotations

from typing import TypeGuard

MAX_DIGITS = 18
"""Digits :func:`ascii_int` reads by default: every such number is below 2**63."""


def is_ascii_int(text: object, max_digits: int = MAX_DIGITS) -> TypeGuard[str]:
    """``text`` is a str of 1 to ``max_digits`` ASCII digits (no sign, space or ``_``)."""
    return isinstance(text, str) and 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


def ascii_int(text: object, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a whole number when it is 1 to ``max_digits`` ASCII digits; else None
    (the caller says what it expected, naming the value)."""
    return int(text) if is_ascii_int(text, max_digits) else None
