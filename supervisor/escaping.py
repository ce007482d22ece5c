"""Text made safe for the line-based places it goes: SSE ``data:`` lines, log lines, a terminal.

orjson writes U+2028, U+2029 and the C1 controls (U+0080–U+009F, NEL among them) raw. Common line
splitters (Python's ``str.splitlines``, so httpx's ``iter_lines``; JavaScript's line terminators) end a
line at U+2028, U+2029 and NEL, so crew text holding them could forge SSE fields or log lines; C1 controls
are escape sequences to some terminals. Written as ``\\uXXXX`` escapes they are the same JSON value.
"""

from __future__ import annotations

import re

# In UTF-8, C2 and E2 are only ever lead bytes, so these sequences are exactly the characters, never the
# tail of another one. Valid UTF-8 is all orjson writes, and all the journal holds.
_UNSAFE = re.compile(rb"\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]")


def json_line(encoded: bytes) -> bytes:
    """``encoded`` (JSON as orjson writes it) with U+2028, U+2029 and U+0080–U+009F escaped as ``\\uXXXX``."""
    return _UNSAFE.sub(_escape, encoded)


def _escape(match: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % ord(match.group().decode())


# Bidirectional controls reorder what a terminal shows ("rtl\u202egnp.exe" reads as "...exe.png"), and
# U+2028/U+2029 end a line for some readers: written out wherever the controls are.
_INVISIBLE = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
CONTROLS = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")  # C0, DEL, C1: what drives a terminal
CONTROLS_BUT_LAYOUT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")  # keeping tab and newline
LINE_BREAKERS = CONTROLS  # a log line: the same, so that no reader splits it nor any terminal reorders it


def visible(value: object, layout: bool = False) -> str:
    """``value`` as text with every control character written out (``\\x1b``, ``\\u009b``, ``\\u202e``); with
    ``layout``, tabs and newlines of multi-line text (chunks, an output) stay as they are."""
    return (CONTROLS_BUT_LAYOUT if layout else CONTROLS).sub(_written_out, str(value))


def one_line(value: object) -> str:
    """``visible``, the layout characters too: a log line that no reader splits."""
    return LINE_BREAKERS.sub(_written_out, str(value))


# A client chooses its ids, and one can pass for another: "tіdes" with a Cyrillic і, a fullwidth "ｔides", a
# zero-width space inside, an "é" made of "e" and a combining accent. Where a person reads an id to pick a job (the
# CLI; the console does the same in page.js), every character but printable ASCII is written out, and so are the
# backslash, so that what is shown reads back as exactly one id (``typed_id``), and the space, which no reader
# counts ("tides " for "tides").
_NOT_PLAIN = re.compile(r"[^\x21-\x5b\x5d-\x7e]")
_WRITTEN = re.compile(r"\\(?:\\|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def ident(value: object) -> str:
    """An id as the CLI shows it: printable ASCII as it is, anything else written out (``\\u0456``, ``\\\\``)."""
    return _NOT_PLAIN.sub(_written_out, str(value))


def typed_id(text: str) -> str:
    """The id ``ident`` showed as ``text``: what an operator pastes back into a command."""
    return _WRITTEN.sub(_read_back, text)


def _read_back(match: re.Match[str]) -> str:
    written = match.group()
    if written == "\\\\":
        return "\\"
    code = int(written[2:], 16)
    return written if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF else chr(code)  # no character: kept as typed


def _written_out(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x5C:
        return "\\\\"
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
