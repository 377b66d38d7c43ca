"""UTF-8 JSON handed to jq.py's input_text without a decode: the sandbox's one workaround in a third-party API.

jq.py takes a program's input text as a str (``Program.input_text``) and hands libjq its UTF-8 encoding. The
sandbox child already holds its input as UTF-8 (the body slot): decoding it into a str only for jq.py to encode it
back is two passes over a producer-sized body, a cost bench/rules.py's 1 MiB-envelope figures show (bench/README.md
has them). jq.py has no public bytes input, so :func:`as_text` wraps the bytes in :class:`Utf8Text`, an empty str
whose ``encode()`` answers with them.

The behaviour this relies on: input_text asks its argument for its UTF-8 through ``encode()``.
:data:`BYTES_INPUT` checks it once at import, and tests/routing/test_sandbox.py checks it on the installed jq.py.
Were a release of jq.py to read the str another way, BYTES_INPUT is False and :func:`as_text` decodes (the public
path): slower, never wrong. Standard library and jq only: the sandbox child loads this module by path.
"""

from __future__ import annotations

from typing import Final

import jq


class Utf8Text(str):
    """UTF-8 bytes standing in for the str jq.py encodes: an empty str whose ``encode()`` returns the bytes."""

    data: bytes

    def __new__(cls, data: bytes) -> Utf8Text:
        """Carry ``data``; the str itself is empty."""
        self = super().__new__(cls)
        self.data = data
        return self

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        """The bytes carried, whatever is asked: they are UTF-8 already."""
        return self.data


def _jq_reads_through_encode() -> bool:
    try:
        return bool(jq.compile(".[1]").input_text(Utf8Text(b'[0,"\xc3\xa9"]')).first() == "\u00e9")
    except Exception:  # a jq.py that reads the str itself sees no input at all
        return False


BYTES_INPUT: Final = _jq_reads_through_encode()
"""Whether the installed jq.py reads input_text's argument through ``encode()``."""


def as_text(data: bytes) -> str:
    """UTF-8 JSON as the str input_text takes: the bytes themselves when BYTES_INPUT, else decoded.

    Decoding replaces what is not UTF-8 with U+FFFD, as libjq does reading the bytes, so both paths read alike.
    """
    return Utf8Text(data) if BYTES_INPUT else data.decode("utf-8", "replace")
