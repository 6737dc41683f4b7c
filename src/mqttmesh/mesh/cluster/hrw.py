"""Rendezvous (highest random weight) hashing: which nodes own a key.

Pure. Every node that sees the same set of live nodes picks the same owners
for a key, with no coordination; when a node leaves, only the keys it owned
move, each to the next node in its own ranking.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["rank", "owners"]


def _weight(key: str, node: str) -> bytes:
    return hashlib.blake2b(f"{key}\x00{node}".encode(), digest_size=8).digest()


def rank(key: str, nodes: Iterable[str]) -> list[str]:
    """All ``nodes``, best owner of ``key`` first."""
    return sorted(nodes, key=lambda n: (_weight(key, n), n), reverse=True)


def owners(key: str, nodes: Iterable[str], count: int) -> list[str]:
    return rank(key, nodes)[:count]
