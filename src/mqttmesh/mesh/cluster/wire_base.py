"""The base of the cluster's messages (mesh/cluster/cluster_wire.py): ``Wire``, the class of
every kind, and ``_Flat``, for the kinds whose body is their plain fields under their names.

Pure. A module of its own so that the registry's messages (mesh/cluster/registry_wire.py)
and the others (mesh/cluster/cluster_wire.py) share one base without importing each other.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from typing import Any, ClassVar, Self

from .cluster_values import _bool, _int, _key, _str

__all__ = ["Wire"]


class Wire:
    """A cluster message: ``KIND`` names it on the wire."""

    __slots__ = ()
    KIND: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        raise NotImplementedError

    def encode(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    def aged(self, ms: int) -> Self:
        """As it stands after ``ms`` milliseconds on the way (routing/wire.py ``age``): the
        remaining lives it carries (Message Expiry, Session Expiry) less that. Most carry none."""
        return self


class _Flat(Wire):
    """A message whose fields are strings, integers and booleans, under their own names in
    field order on the wire (the JSON of before, key for key); a field with a default is
    left out at its default, and read as it when absent."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.default is MISSING or value != f.default:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        values = []
        for f in fields(cls):  # type: ignore[arg-type]
            raw = _key(obj, f.name, w) if f.default is MISSING else obj.get(f.name, f.default)
            values.append(_READ[str(f.type)](raw, w, f.name))
        return cls(*values)


_READ = {"str": _str, "int": _int, "bool": _bool}
