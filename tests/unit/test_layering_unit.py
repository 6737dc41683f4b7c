"""The layering of src/mqttmesh, read from the source with ``ast`` (issue 14: one direction).

The pure cores import no I/O (asyncio, sockets, TLS, the clock, the operating system,
randomness, threads, the server package) and open no files, and no pure module wires
another object after construction: the attributes that used to be set from outside
(``broker.mesh = ...``, ``session.on_settled = ...``, ``broker.seq = ...``) are constructor
arguments now, so assigning one of them to anything but ``self`` is refused here. The
checker itself is tested on planted violations, so that a broken checker cannot pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "mqttmesh"

# the entry points of the top level that are I/O by design: the command line, the admin
# and demo tools (processes, sockets, threads), and the configuration loader (argparse,
# the TOML file), used only by the command line and the server
IO_ENTRY_POINTS = {"__main__.py", "cli.py", "admin.py", "demo.py", "config.py"}

BANNED_IMPORTS = {"asyncio", "socket", "ssl", "time", "os", "random", "secrets", "threading"}
# attributes that were set on another object to wire it after construction (issue 14 S2-S7)
LATE_WIRING = {
    "mesh",
    "cluster",
    "session_factory",
    "persistent_factory",
    "capture",
    "archive_hook",
    "delivery_hook",
    "custody_store",
    "wall",
    "keep",
    "on_settled",
    "on_sent",
    "wall_offset",
    "seq",
}

# What a pure module may still do of the above, each named exactly (module, what, where):
# auth.py reads and writes the password file and reads the ACL file, for the admin
# command (``mqttmesh passwd``) and for the server, which calls these at start; the
# checks themselves (Auth) take no file. Moving the reading out can wait (plan finding 0.4).
ALLOWED = {
    ("auth.py", "import os", "<module>"),  # only for PasswordFile.save, checked below
    ("auth.py", "os", "PasswordFile.save"),  # os.getpid, os.chmod, os.replace: an atomic write
    ("auth.py", "open", "PasswordFile.load"),
    ("auth.py", "open", "PasswordFile.save"),
    ("auth.py", "open", "Acl.load"),
}


def pure_modules() -> list[Path]:
    top = [p for p in sorted(SRC.glob("*.py")) if p.name not in IO_ENTRY_POINTS]
    return top + sorted((SRC / "mesh").rglob("*.py")) + [SRC / "archive" / "capture.py"]


def _name(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


class _Checker(ast.NodeVisitor):
    """Collects (what, where, line) for each violation in one module."""

    def __init__(self, module: str):
        self.module = module  # "auth.py", "mesh/link/links.py"
        self.scope: list[str] = []
        self.found: list[tuple[str, str, int]] = []
        self.methods: list[set[str]] = []  # the method names of each enclosing class
        self.nested: list[set[str]] = []  # the functions defined in each enclosing function

    @property
    def where(self) -> str:
        return ".".join(self.scope) or "<module>"

    def _add(self, what: str, line: int) -> None:
        if (self.module, what, self.where) not in ALLOWED:
            self.found.append((what, self.where, line))

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.methods.append({b.name for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))})
        self._scoped(node)
        self.methods.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        inner = {n.name for n in ast.walk(node) if isinstance(n, defs) and n is not node}
        self.nested.append(inner)
        self._scoped(node)
        self.nested.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _callback(self, arg: ast.expr) -> str | None:
        """``arg`` as a function handed over to be called later: a lambda, a partial, a
        nested function, one of this class's methods; None for anything else."""
        if isinstance(arg, ast.Lambda):
            return "a lambda"
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "partial":
            return "a partial"
        if isinstance(arg, ast.Name) and any(arg.id in names for names in self.nested):
            return arg.id
        if isinstance(arg, ast.Attribute) and _is_self(arg.value) and self.methods and arg.attr in self.methods[-1]:
            return f"self.{arg.attr}"
        return None

    def _registrations(self, node: ast.Call) -> None:
        """A function handed to a method of another object (``x.after_commit(batch, fn)``):
        a registration, the other object calling back up later. Constructors (the wiring)
        and sort keys are not."""
        func = node.func
        if not isinstance(func, ast.Attribute) or _is_self(func.value):
            return
        args = list(node.args) + [k.value for k in node.keywords if k.arg != "key"]
        for arg in args:
            what = self._callback(arg)
            if what is not None:
                self._add(f"registers {what} with {ast.unparse(func)}", node.lineno)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            root = alias.name.split(".")[0]
            if root in BANNED_IMPORTS or alias.name.startswith("mqttmesh.server"):
                self._add(f"import {alias.name}", node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        server = module.startswith("mqttmesh.server") or (node.level > 0 and module.split(".")[0] == "server")
        server = server or (node.level > 0 and not module and any(a.name == "server" for a in node.names))
        if (node.level == 0 and module.split(".")[0] in BANNED_IMPORTS) or server:
            self._add(f"import {module or '.'}", node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "os":
            self._add("os", node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            self._add("open", node.lineno)
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2:
            name = node.args[1]
            target = node.args[0]
            if isinstance(name, ast.Constant) and name.value in LATE_WIRING and not _is_self(target):
                self._add(f"setattr(..., {name.value!r})", node.lineno)
        self._registrations(node)
        self.generic_visit(node)

    def _targets(self, targets: list[ast.expr], line: int) -> None:
        for target in targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                self._targets(list(target.elts), line)
            elif isinstance(target, ast.Starred):
                self._targets([target.value], line)
            elif isinstance(target, ast.Attribute) and target.attr in LATE_WIRING and not _is_self(target.value):
                self._add(f"{ast.unparse(target)} =", line)
            # (a subscript's key, ``ids[(m.origin, m.seq)] = e``, only reads)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets([node.target], node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._targets([node.target], node.lineno)
        self.generic_visit(node)


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def violations(source: str, module: str) -> list[tuple[str, str, int]]:
    checker = _Checker(module)
    checker.visit(ast.parse(source))
    return checker.found


# --------------------------------------------------------------------------- the tree


def test_the_pure_modules_are_the_ones_the_rules_name():
    names = {_name(p) for p in pure_modules()}
    for core in ("codec.py", "channel.py", "session.py", "broker.py", "flow.py", "auth.py", "store.py"):
        assert core in names
    assert {"ports.py", "assembly.py", "mesh/link/links.py", "mesh/cluster/cluster.py", "archive/capture.py"} <= names
    assert {"mesh/routing/engine.py", "mesh/routing/order.py", "mesh/cluster/replica.py"} <= names
    assert not any(n.startswith("server/") for n in names)


@pytest.mark.parametrize("path", pure_modules(), ids=_name)
def test_a_pure_module_imports_no_io_and_wires_nothing_after_construction(path):
    found = violations(path.read_text(encoding="utf-8"), _name(path))
    listed = "; ".join(f"{what} in {where} (line {line})" for what, where, line in found)
    assert found == [], f"{_name(path)}: {listed}"


def test_what_auth_may_do_with_files_is_still_all_it_does():
    # the allowance is exact: if auth.py stops opening a file somewhere, narrow ALLOWED
    checker = _Checker("(none allowed)")
    checker.visit(ast.parse((SRC / "auth.py").read_text(encoding="utf-8")))
    used = {(what, where) for what, where, _ in checker.found}
    assert used == {(what, where) for module, what, where in ALLOWED if module == "auth.py"}


# --------------------------------------------------------------------------- the checker


PLANTED = [
    ("import asyncio\n", "import asyncio"),
    ("import os.path\n", "import os.path"),
    ("from time import monotonic\n", "import time"),
    ("from random import Random\n", "import random"),
    ("import secrets, threading\n", "import secrets"),
    ("from ..server.node import Node\n", "import server.node"),
    ("from mqttmesh.server import tls\n", "import mqttmesh.server"),
    ("from .. import server\n", "import ."),
    ("def f(broker, x):\n    broker.mesh = x\n", "broker.mesh ="),
    ("def f(broker, c):\n    broker.cluster = c\n", "broker.cluster ="),
    ("def f(b, s):\n    b.session_factory = s\n", "b.session_factory ="),
    ("def f(s, h):\n    s.on_settled = h\n", "s.on_settled ="),
    ("def f(s, h):\n    s.on_sent = h\n", "s.on_sent ="),
    ("def f(b):\n    b.seq = 5\n", "b.seq ="),
    ("def f(b):\n    b.seq += 1\n", "b.seq ="),
    ("def f(b, m):\n    b.seq = m.seq = 1\n", "b.seq ="),
    ("def f(b, m):\n    m.topic, b.seq = 't', 1\n", "b.seq ="),
    ("def f(c, t):\n    c.wall = t\n", "c.wall ="),
    ("def f(d):\n    d.keep = []\n", "d.keep ="),
    ("def f(b):\n    b.wall_offset = 1.0\n", "b.wall_offset ="),
    ("def f(e, j):\n    e.custody_store = j\n", "e.custody_store ="),
    ("class A:\n    def f(self, x):\n        self.broker.mesh = x\n", "self.broker.mesh ="),
    ("def f(b, x):\n    setattr(b, 'mesh', x)\n", "setattr(..., 'mesh')"),
    ("def f(p):\n    return open(p).read()\n", "open"),
    # registrations: a function handed to another object to be called back later
    (
        "def f(b, n):\n    def send():\n        pass\n    b.after_commit(n, send)\n",
        "registers send with b.after_commit",
    ),
    ("def f(b, n, m):\n    b.after_commit(n, partial(g, m))\n", "registers a partial with b.after_commit"),
    ("def f(b):\n    b.on(lambda: 1)\n", "registers a lambda with b.on"),
    (
        "class A:\n    def g(self):\n        pass\n    def f(self):\n        self.broker.later(cb=self.g)\n",
        "registers self.g with self.broker.later",
    ),
]


@pytest.mark.parametrize("source,what", PLANTED, ids=[w for _, w in PLANTED])
def test_the_checker_finds_a_planted_violation(source, what):
    found = violations(source, "planted.py")
    assert what in [w for w, _, _ in found], found


def test_the_checker_lets_an_object_set_its_own_attributes_and_other_names():
    source = (
        "import json, struct\n"
        "from .message import Message\n"
        "class A:\n"
        "    def __init__(self, mesh, seq):\n"
        "        self.mesh = mesh\n"
        "        self.seq = seq\n"
        "        self.on_settled = None\n"
        "    def f(self, msg):\n"
        "        msg.topic = 'x'\n"
        "        self.ids[(msg.origin, msg.seq)] = msg\n"
        "        return Message('t', b'', seq=self.seq)\n"
        "    def g(self, items, b):\n"
        "        items.sort(key=lambda e: e.seq)\n"  # a sort key is called at once
        "        b.send(self.seq, self.mesh)\n"  # data, not one of its methods
        "        self.later(self.f)\n"  # its own table
        "        return Broker(self.f)\n"  # a constructor: wiring
    )
    assert violations(source, "planted.py") == []


def test_the_allowance_is_for_one_function_of_one_module():
    source = "class PasswordFile:\n    @classmethod\n    def load(cls, p):\n        return open(p)\n"
    assert violations(source, "auth.py") == []
    assert violations(source, "store.py") == [("open", "PasswordFile.load", 4)]
    elsewhere = "class Acl:\n    def save(self, p):\n        return open(p)\n"
    assert violations(elsewhere, "auth.py") == [("open", "Acl.save", 3)]


# --------------------------------------------------------------------------- mesh/ in three packages


def _imports(path: Path) -> set[str]:
    """The mqttmesh modules ``path`` imports (relative imports resolved), type-only ones too."""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mqttmesh"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("mqttmesh"):
                found.add(module)
    return found


# what a module outside mesh/ may still take from it, each named (issue 21 removed the last:
# the listener's handshake is behind the peer port, replication behind the session interface)
CORE_USES_MESH: set[tuple[str, str]] = set()


def test_routing_and_cluster_import_nothing_of_the_other_mesh_packages():
    """routing/ knows neither links nor the cluster; cluster/ knows neither routing nor links
    (it sends through the UnicastPort it is given); link/ uses routing, and the cluster as a
    type only (the Cluster it hands unicasts to)."""
    for package, banned in (("routing", ("link", "cluster")), ("cluster", ("routing", "link")), ("link", ())):
        files = sorted((SRC / "mesh" / package).glob("*.py"))
        assert files, package
        for path in files:
            for module in _imports(path):
                for other in banned:
                    assert not module.startswith(f"mqttmesh.mesh.{other}"), f"{_name(path)} imports {module}"


def test_the_core_takes_from_the_mesh_only_what_is_named():
    """The broker core (the top-level modules but the wiring) knows nothing of the mesh: not
    the peer handshake (ports.PeerPort), not replication (the Session's contract)."""
    wiring = {"assembly.py"}
    found = set()
    for path in sorted(SRC.glob("*.py")):
        if path.name in wiring or path.name in IO_ENTRY_POINTS:
            continue
        for module in _imports(path):
            if module.startswith("mqttmesh.mesh"):
                found.add((path.name, module))
    assert found <= CORE_USES_MESH, sorted(found - CORE_USES_MESH)
    assert found == CORE_USES_MESH, f"no longer used, take it off the list: {sorted(CORE_USES_MESH - found)}"
    assert not found  # nothing at all since issue 21


def test_the_import_reader_resolves_relative_imports():
    path = SRC / "mesh" / "link" / "links.py"
    got = _imports(path)
    assert "mqttmesh.mesh.routing.engine" in got and "mqttmesh.mesh.cluster.cluster" in got
    assert "mqttmesh.message" in got


def test_no_cluster_protocol_holds_the_broker():
    """The cluster's parts keep the node's sessions in its SessionTable (session_table.py) and
    publish wills through the Cluster's WillPort: none of mesh/cluster/ imports the Broker
    (its Protocols of what a Channel is, broker.ClaimingChannel, are all it takes of broker.py),
    nor takes or keeps anything called ``broker``."""
    for path in sorted((SRC / "mesh" / "cluster").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "broker":
                names = {a.name for a in node.names}
                assert names <= {"ClaimingChannel"}, f"{_name(path)} imports {sorted(names)} of broker.py"
            if isinstance(node, ast.arg):
                assert node.arg != "broker", f"{_name(path)}:{node.lineno} takes a broker"
            if isinstance(node, ast.Attribute):
                assert node.attr != "broker", f"{_name(path)}:{node.lineno} keeps a broker"


def test_the_session_contract_has_no_replication_fields():
    """session.py's Session knows nothing of replicas: no version, safe version or
    'replicated' flag; a frame that follows a step asks the session's gate (session.Gate)."""
    tree = ast.parse((SRC / "session.py").read_text())
    session = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    names = set()
    for node in ast.walk(session):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    assert "gate" in names
    assert not names & {"version", "safe_version", "replicated", "replica", "epoch"}, sorted(names)
