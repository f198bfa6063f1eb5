"""Plain data on the wire between the test driver and the sandbox: framing and a tagged JSON codec.

Loaded by file path (never through `grpokit.sandbox`, so neither process pays for the package's
imports): by the driver, which decodes what the candidate returns, and by the sandbox harness
before it loses sight of the host filesystem.

Values: None, bool, int, float, str, list travel as JSON; the rest as one-key objects, so the driver
gets Python's own types back (a tuple stays a tuple, `(8, 13) == candidate(123)` works):
  {"t": [..]} tuple   {"s": [..]} set   {"fs": [..]} frozenset   {"d": [[k, v], ..]} dict (any keys)
  {"f": "nan"|"inf"|"-inf"} float   {"c": [re, im]} complex   {"b": "<hex>"} bytes
  {"ba": "<hex>"} bytearray   {"q": [n, d]} Fraction   {"dec": "<str>"} Decimal
  {"i": "<hex>"} an int of more than MAX_JSON_INT_BITS bits
Subclasses of these (Counter, OrderedDict, namedtuple, IntEnum, ...) are sent as the base type.
Anything else is not plain data: `encode` raises NotPlain. `decode` accepts exactly this grammar
and builds new objects of the built-in types (and Fraction/Decimal) in the decoding process.
"""

from __future__ import annotations

import json
import math
import os

MAX_DEPTH = 200
MAX_JSON_INT_BITS = 12_000
"""Larger ints travel as hex ({"i": "0x..."}): JSON writes ints in decimal, which Python refuses past
4,300 digits (and which costs quadratic time); hex is linear and has no such limit."""
HEADER = 8


class NotPlain(TypeError):
    """A value that is not plain data (a function, a generator, an instance of a user class...)."""


def encode(value, depth=0):
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    d = depth + 1
    if value is None or value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        v = int.__int__(value)
        return v if v.bit_length() <= MAX_JSON_INT_BITS else {"i": hex(v)}
    if isinstance(value, float):
        v = float.__float__(value)
        return v if math.isfinite(v) else {"f": repr(v)}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode(v, d) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [encode(v, d) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[encode(k, d), encode(v, d)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"fs": [encode(v, d) for v in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [encode(v, d) for v in set.__iter__(value)]}
    if isinstance(value, complex):
        return {"c": [encode(float(value.real), d), encode(float(value.imag), d)]}
    if isinstance(value, bytes):
        return {"b": bytes.hex(value)}
    if isinstance(value, bytearray):
        return {"ba": bytearray.hex(value)}
    cls = type(value)
    if cls.__module__ == "fractions" and cls.__name__ == "Fraction":
        return {"q": [encode(value.numerator, d), encode(value.denominator, d)]}
    if cls.__module__ in ("decimal", "_decimal", "_pydecimal") and cls.__name__ == "Decimal":
        return {"dec": str(value)}
    raise NotPlain(f"not plain data: {cls.__qualname__}")


def _int(x):
    if type(x) is not int:
        raise ValueError("expected an int")
    return x


class Refused(ValueError):
    """Well-formed, but refused by `decode(..., strict=True)` (NaN, hash collisions, a huge Decimal)."""


MAX_COLLISIONS = 64
"""Distinct elements of one set (or keys of one dict) that may share a hash with another."""
MAX_DECIMAL_EXPONENT = 10_000


def _hashed(items: list, strict: bool) -> list:
    """`items` unchanged, after checking (strict) that they do not collide in hash: n distinct items
    that share one hash cost n**2 / 2 comparisons to put in a set (ints k * (2**61 - 1) all hash
    to 0). The items of an encoded set or of a dict's keys are distinct, so equal hashes are collisions."""
    if strict and len(items) > MAX_COLLISIONS:
        hashes = [hash(v) for v in items]  # TypeError for an unhashable item: malformed
        if len(hashes) - len(set(hashes)) > MAX_COLLISIONS:
            raise Refused("elements built to collide in hash")
    return items


def decode(x, depth=0, strict=False):
    """Rebuild a value from `json.loads` output; ValueError on anything outside the grammar.
    strict (the driver reading an answer): Refused for NaN (float, complex part, Decimal), for a
    Decimal beyond 1e+-10000 and for sets/dict keys that collide in hash."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deep")
    d = depth + 1
    t = type(x)
    if x is None or t in (bool, int, str):
        return x
    if t is float:
        if strict and x != x:
            raise Refused("NaN")
        return x
    if t is list:
        return [decode(v, d, strict) for v in x]
    if t is not dict or len(x) != 1:
        raise ValueError(f"not plain data on the wire: {t.__name__}")
    ((tag, body),) = x.items()
    if tag == "f" and body in ("nan", "inf", "-inf"):
        if strict and body == "nan":
            raise Refused("NaN")
        return float(body)
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag in ("b", "ba") and type(body) is str:
        return bytes.fromhex(body) if tag == "b" else bytearray.fromhex(body)
    if tag == "dec" and type(body) is str and len(body) < 10_000:
        from decimal import Decimal

        value = Decimal(body)
        if strict and (
            value.is_nan() or (value.is_finite() and abs(value.adjusted()) > MAX_DECIMAL_EXPONENT)
        ):
            raise Refused("a NaN or huge Decimal")
        return value
    if type(body) is not list:
        raise ValueError(f"bad {tag!r} value")
    if tag == "t":
        return tuple(decode(v, d, strict) for v in body)
    if tag == "s":
        return set(_hashed([decode(v, d, strict) for v in body], strict))
    if tag == "fs":
        return frozenset(_hashed([decode(v, d, strict) for v in body], strict))
    if tag == "d":
        keys, values = [], []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("bad dict item")
            keys.append(decode(pair[0], d, strict))
            values.append(decode(pair[1], d, strict))
        return dict(zip(_hashed(keys, strict), values))
    if tag == "c" and len(body) == 2:
        re_, im = decode(body[0], d, strict), decode(body[1], d, strict)
        if type(re_) is not float or type(im) is not float:
            raise ValueError("bad complex")
        return complex(re_, im)
    if tag == "q" and len(body) == 2:
        from fractions import Fraction

        return Fraction(_int(decode(body[0], d, strict)), _int(decode(body[1], d, strict)))
    raise ValueError(f"unknown tag {tag!r}")


def dumps(obj) -> bytes:
    data = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
    return len(data).to_bytes(HEADER, "little") + data


def read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def recv(fd: int, limit: int):
    """One framed JSON message (not yet decoded with `decode`); ValueError beyond `limit` bytes."""
    n = int.from_bytes(read_exact(fd, HEADER), "little")
    if n > limit:
        raise ValueError(f"message of {n} bytes, limit {limit}")
    return json.loads(read_exact(fd, n))
