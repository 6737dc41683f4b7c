"""Node configuration: one schema gives the TOML keys, the command-line flags and the docs.

Every option can be set in the TOML file and overridden by its flag. A value
that does not fit names the key (and, from TOML, the file) and the problem.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from typing import Any

from .auth import ConfigError
from .options import OPTIONS, Option

__all__ = ["Option", "OPTIONS", "Config", "load_config", "add_flags", "reference_markdown"]


_NODE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")
_BY_NAME = {o.name: o for o in OPTIONS}


class Config:
    """Resolved settings: ``cfg.port``, ``cfg.limits.max_inflight`` style access via ``get``."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def get(self, name: str) -> Any:
        return self._values[name]

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def _coerce(option: Option, value: Any, where: str) -> Any:
    t = option.type
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}{option.name}: expected true or false, got {value!r}")
    if t is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{where}{option.name}: expected an integer, got {value!r}")
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{where}{option.name}: expected an integer, got {value!r}") from None
    elif t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{where}{option.name}: expected a number, got {value!r}")
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where}{option.name}: expected a number, got {value!r}") from None
    elif t is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}{option.name}: expected a string, got {value!r}")
    elif t is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}{option.name}: expected a list of strings, got {value!r}")
    if option.name == "node_id" and value and not _NODE_ID.match(value):
        raise ConfigError(
            f"{where}{option.name}: {value!r} must be 1-64 letters, digits, '.', '_', ':' "
            f"or '-' (it appears in topic names and on the wire)"
        )
    if isinstance(value, float) and value != value:
        raise ConfigError(f"{where}{option.name}: NaN is not a number this option can take")
    if option.choices is not None and value not in option.choices:
        raise ConfigError(f"{where}{option.name}: {value!r} is not one of {', '.join(map(str, option.choices))}")
    if option.minimum is not None and value < option.minimum:
        raise ConfigError(f"{where}{option.name}: {value} is below the minimum {_num(option.minimum)}")
    if option.maximum is not None and value > option.maximum:
        raise ConfigError(f"{where}{option.name}: {value} is above the maximum {_num(option.maximum)}")
    return value


def _num(limit: float) -> str:
    return str(int(limit)) if float(limit).is_integer() else str(limit)


def _flatten_toml(data: dict, path: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    sections = {o.section for o in OPTIONS if o.section}
    for key, value in data.items():
        if isinstance(value, dict) and key in sections:
            for sub, subvalue in value.items():
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    for name in flat:
        if name not in _BY_NAME:
            base = name.rsplit(".", 1)[-1]
            candidates = [repr(o.name) for o in OPTIONS if o.key == base]
            hint = f" (did you mean {' or '.join(candidates)}?)" if candidates else ""
            raise ConfigError(f"{path}: unknown key {name!r}{hint}")
    return flat


def read_first_line(setting: str, path: str) -> str:
    """The first line of the file a setting names (a secret, a token), stripped; a
    ConfigError naming the setting if it cannot be read or the line is empty."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = fh.readline().strip()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path} ({exc.strerror})") from None
    if not value:
        raise ConfigError(f"{setting}: {path} has nothing on its first line")
    return value


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file, then ``overrides`` (flags), each checked."""
    values = {o.name: o.default for o in OPTIONS}
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        for name, value in _flatten_toml(data, path).items():
            values[name] = _coerce(_BY_NAME[name], value, f"{path}: ")
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        option = _BY_NAME.get(name)
        if option is None:
            raise ConfigError(f"unknown option {name!r}")
        values[name] = _coerce(option, value, f"{option.flag}: ")
    return Config(values)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    for option in OPTIONS:
        kwargs: dict[str, Any] = {"dest": option.dest, "default": None, "help": option.help}
        if option.type is bool:
            kwargs["metavar"] = "true|false"
        elif option.choices:
            kwargs["choices"] = option.choices
        elif option.type is list:
            kwargs["action"] = "append"
        parser.add_argument(option.flag, **kwargs)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {o.name: getattr(args, o.dest, None) for o in OPTIONS}


def reference_markdown() -> str:
    """The configuration reference, generated from OPTIONS (docs/operations.md embeds it)."""
    lines = ["| key (TOML) | flag | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        default = o.default if o.default not in ("", []) else "(empty)"
        if isinstance(default, bool):
            default = str(default).lower()
        extra = f" One of: {', '.join(str(c) for c in o.choices)}." if o.choices else ""
        lines.append(f"| `{o.name}` | `{o.flag}` | `{default}` | {o.help}.{extra} |")
    return "\n".join(lines) + "\n"
