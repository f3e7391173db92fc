"""JSON written byte for byte as Go's ``encoding/json`` writes it.

The real toxiproxy marshals Go structs: fields come out in declaration
order, map keys sorted, no whitespace, ``<``, ``>``, ``&``, U+2028 and
U+2029 escaped as ``\\u003c`` and so on, other non-ASCII text raw UTF-8, and
numbers typed by their Go field: integers as integers, floating point in
the shortest form that reads back as the same value of the field's width
(``float32`` for a toxic's ``toxicity``): ``1``, ``0.5``, ``0.1`` (not
``1.0`` or ``0.10000000149011612``). Clients that compare answers as text,
or parse ``1`` as an integer, see the same bytes from the embedded server.

Python values map as: ``dict`` -> object in the dict's order (pass
``sorted`` items for a Go map), ``list`` -> array, ``None`` -> ``null``,
``int`` -> integer, ``float`` -> ``float64``, :class:`Float32` -> ``float32``.
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Decimal

__all__ = ["Float32", "dumps", "float32"]


class Float32(float):
    """A float that is encoded as a Go ``float32`` (already rounded to one)."""


def float32(value: float) -> Float32:
    """Round ``value`` to the nearest ``float32``, as Go's decoder stores it.

    Raises ``OverflowError`` when it is out of ``float32`` range (Go's
    decoder rejects such a number too).
    """
    (rounded,) = struct.unpack("<f", struct.pack("<f", value))
    return Float32(rounded)


def _shortest_digits(value: float, bits: int) -> Decimal:
    """The shortest decimal that rounds back to ``value`` at ``bits`` width."""
    if bits == 64:
        return Decimal(repr(value))
    for precision in range(1, 10):  # 9 significant digits always suffice for float32
        text = f"{value:.{precision}g}"
        if struct.unpack("<f", struct.pack("<f", float(text)))[0] == value:
            return Decimal(text)
    return Decimal(repr(value))  # pragma: no cover - unreachable for a float32 value


def format_float(value: float, bits: int) -> str:
    """``value`` as Go's ``encoding/json`` writes a float of ``bits`` (32 or 64) width."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value}")
    digits = _shortest_digits(value, bits)
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        sign, numerals, exponent = digits.as_tuple()
        assert isinstance(exponent, int)
        text = "".join(map(str, numerals)).rstrip("0") or "0"
        power = exponent + len(numerals) - 1
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        # strconv writes at least two exponent digits; encoding/json trims e-07 to e-7.
        exp = f"{'-' if power < 0 else '+'}{abs(power):02d}"
        if exp.startswith("-0"):
            exp = "-" + exp[2:]
        return f"{'-' if sign else ''}{mantissa}e{exp}"
    text = format(digits, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


#: Text that needs no escaping: printable ASCII other than ``"``, ``\\``, ``<``, ``>``, ``&``.
_PLAIN = re.compile(r'[ !#-%\'-;=?-\[\]-~]*')


def _string(text: str) -> str:
    if _PLAIN.fullmatch(text):
        return f'"{text}"'
    out = ['"']
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        elif "\ud800" <= ch <= "\udfff":  # lone surrogate: Go writes U+FFFD
            out.append("\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _encode(value: object, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, Float32):
        out.append(format_float(value, 32))
    elif isinstance(value, float):
        out.append(format_float(value, 64))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(_string(str(key)))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as Go JSON")


def dumps(value: object) -> bytes:
    """``value`` encoded as ``json.Marshal`` would encode the equivalent Go value."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")
