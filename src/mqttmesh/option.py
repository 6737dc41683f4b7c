"""One option of the node: its section and key, type, default, limits and help text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Option"]


@dataclass(frozen=True)
class Option:
    section: str  # "" for top level
    key: str
    type: type  # int, float, bool, str, list
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    flag_name: str | None = None  # when the key alone would be ambiguous as a flag

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}" if self.section else self.key

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.key.replace("_", "-")

    @property
    def dest(self) -> str:
        return self.name.replace(".", "__")
