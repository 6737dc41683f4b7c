"""The field types of MQTT packets (section 1.5 of both standards), read and written.

Pure: a reader over the bytes of one packet body, and the writers of the same types. It
leaves to its caller which fields a packet has and what they mean (codec.py for 3.1.1,
codec5.py and properties.py for 5.0). Every overrun is a malformed packet.
"""

from __future__ import annotations

import struct

from .packets import MalformedPacket, _decode_utf8

__all__ = ["Reader", "utf8", "binary", "varint", "u16", "u32", "U16", "U32"]

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")

# the largest value a Variable Byte Integer holds (four bytes of seven bits)
VARINT_MAX = 268_435_455


class Reader:
    """Reads the fields of one packet body, from ``pos`` to ``end`` of ``buf``."""

    __slots__ = ("buf", "pos", "end", "name")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int, end: int, name: str):
        self.buf, self.pos, self.end, self.name = buf, pos, end, name

    def _short(self) -> MalformedPacket:
        return MalformedPacket("MQTT-4.8.0-1", f"{self.name} is truncated")

    def u8(self) -> int:
        if self.pos >= self.end:
            raise self._short()
        value: int = self.buf[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        if self.pos + 2 > self.end:
            raise self._short()
        value: int = (self.buf[self.pos] << 8) | self.buf[self.pos + 1]
        self.pos += 2
        return value

    def u32(self) -> int:
        if self.pos + 4 > self.end:
            raise self._short()
        value: int = U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def varint(self, what: str) -> int:
        """A Variable Byte Integer in its shortest form [MQTT-1.5.5-1] (MQTT 5.0)."""
        value, shift, start = 0, 0, self.pos
        while True:
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift == 28:
                raise MalformedPacket("MQTT-1.5.5-1", f"{self.name}: {what} is longer than four bytes")
        if self.pos - start > 1 and byte == 0:
            raise MalformedPacket("MQTT-1.5.5-1", f"{self.name}: {what} is not in its shortest form")
        return value

    def binary(self) -> bytes:
        length = self.u16()
        if self.pos + length > self.end:
            raise MalformedPacket("MQTT-4.8.0-1", f"{self.name}: field length {length} overruns the packet")
        value = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return value

    def string(self, what: str) -> str:
        return _decode_utf8(self.binary(), what)

    def rest(self) -> bytes:
        value = bytes(self.buf[self.pos : self.end])
        self.pos = self.end
        return value

    @property
    def remaining(self) -> int:
        return self.end - self.pos


def utf8(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"a string of {len(raw)} bytes does not fit an MQTT string (65,535 at most)")
    return U16.pack(len(raw)) + raw


def binary(raw: bytes) -> bytes:
    if len(raw) > 0xFFFF:
        raise ValueError(f"{len(raw)} bytes do not fit an MQTT binary field (65,535 at most)")
    return U16.pack(len(raw)) + raw


def varint(value: int) -> bytes:
    """The shortest Variable Byte Integer for ``value`` (0 to 268,435,455)."""
    if value < 128:
        if value < 0:
            raise ValueError(f"{value} is negative")
        return bytes((value,))
    if value > VARINT_MAX:
        raise ValueError(f"{value} is too large for a Variable Byte Integer")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def u16(value: int) -> bytes:
    return U16.pack(value)


def u32(value: int) -> bytes:
    return U32.pack(value)
