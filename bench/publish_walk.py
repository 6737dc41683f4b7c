"""The walk of one QoS 1 PUBLISH through the pure code, counted (docs/design.md 1.4).

    .venv/bin/python bench/publish_walk.py [TREE] [journal]

From the publisher's bytes on node b to the subscriber's frame on node a, then the
end-to-end acknowledgement back to b's custody, with the two nodes of
tests/unit/test_links_unit.py (b dials a; no sockets). Every call into ``src/mqttmesh`` is
listed with its depth; a *climb* is a call from a module into one on a higher layer (the
mesh above the core, the core in the order farm-studio draws it): a call through a port,
or a callback. ``journal``: the subscriber's session is persistent and its node has a store,
so the delivery waits for the commit. TREE (default: this checkout) is a checkout's root, so
that an older commit can be counted the same way (``git worktree add /tmp/old COMMIT``).
"""

import os
import sys

tree = (
    os.path.abspath(sys.argv[1])
    if len(sys.argv) > 1 and sys.argv[1] != "journal"
    else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
sys.path[:0] = [os.path.join(tree, "src"), os.path.join(tree, "tests"), os.path.join(tree, "tests", "unit")]
import test_links_unit as T  # noqa: E402

from support import mqttraw  # noqa: E402

SRC = os.path.join(tree, "src", "mqttmesh") + os.sep

LINK = {"links", "gateway", "client", "hello", "peerauth"}
CLUSTER = {
    "cluster",
    "cluster_values",
    "cluster_wire",
    "registry_wire",
    "wire_base",
    "claimant",
    "confirm",
    "handover",
    "holders",
    "hrw",
    "membership",
    "registry",
    "replica",
    "replication",
    "retained",
}
CORE = [
    "assembly",
    "channel",
    "channel_publish",
    "channel_subscribe",
    "channel_held",
    "channel_peer",
    "broker",
    "store",
    "session_table",
    "session",
    "session_durable",
    "flow",
    "ports",
    "message",
    "codec",
    "topics",
    "auth",
    "packets",
]


def floor(mod):
    """The layer of a module, higher is above (the mesh above the core; the core as
    farm-studio draws it)."""
    if mod == "-":
        return 0
    name = os.path.basename(mod)[:-3]
    if name in LINK:
        return 100
    if name in CLUSTER:
        return 90
    if mod.startswith("mesh"):
        return 80  # routing
    return 50 - CORE.index(name) if name in CORE else 0


JOURNAL = "journal" in sys.argv[1:]
if JOURNAL:
    from mqttmesh.store import Journal  # noqa: E402

    a, b, pair = T.two_nodes(journal=Journal())
    sub = a.net.connect("sub", clean=False)
    sub.receive_data(mqttraw.subscribe(1, ("t/#", 1)), 0.0)
    T.commit(a)
    sub.data_to_send()
else:
    a, b, pair = T.two_nodes()
    sub = a.net.subscriber("sub", ("t/#", 1))
pair.pump(0.1)
pub = b.net.connect("pub")
calls = []
depth = [0]


def prof(frame, event, arg):
    if event == "call":
        f = frame.f_code.co_filename
        if f.startswith(SRC):
            caller = frame.f_back.f_code.co_filename if frame.f_back else ""
            calls.append(
                (
                    depth[0],
                    f[len(SRC) :],
                    frame.f_code.co_qualname,
                    caller[len(SRC) :] if caller.startswith(SRC) else "-",
                )
            )
        depth[0] += 1
    elif event == "return":
        depth[0] -= 1


frame = mqttraw.publish("t/1", b"x", 1, pid=1)
sys.setprofile(prof)
pub.receive_data(frame, 0.2)
b.links.flush(0.2)
sys.setprofile(None)
out_b = list(calls)
fwd = [s for s in pair.out.sent if s[0] == "fwd"]
pair.out.sent = [s for s in pair.out.sent if s[0] != "fwd"]
calls.clear()
depth[0] = 0
sys.setprofile(prof)
a.links.receive(pair.inb, "fwd", fwd[0][1], 0.2)
if JOURNAL:
    T.commit(a)  # the store committed what the delivery queued (each tree's own way)
sub.data_to_send()
sys.setprofile(None)
in_a = list(calls)
calls.clear()
depth[0] = 0
sys.setprofile(prof)
a.links.flush(0.2)
e2e = [s for s in pair.inb.sent if s[0] == "e2e"]
pair.inb.sent = []
for kind, payload, _ in e2e:
    b.links.receive(pair.out, kind, payload, 0.3)
sys.setprofile(None)
ack = list(calls)
skip = ("__init__", "<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")


def show(name, cs):
    n = climbs = 0
    print(f"== {name}")
    for d, mod, fn, caller in cs:
        up = floor(mod) > floor(caller) and caller != "-"
        n += 1
        climbs += up
        print(f"{'  ' * min(d, 20)}{mod}:{fn}{'   <-- UP from ' + caller if up else ''}")
    print(f"-- {n} calls, {climbs} climbs")
    return n, climbs


r = [
    show("publisher's node b: PUBLISH in, envelope out", out_b),
    show("subscriber's node a: envelope in, PUBLISH out", in_a),
    show("end-to-end ack back to b's custody", ack),
]
print(
    "TOTAL to the subscriber:",
    r[0][0] + r[1][0],
    "calls,",
    r[0][1] + r[1][1],
    "climbs; with the ack:",
    sum(x[0] for x in r),
    "calls,",
    sum(x[1] for x in r),
    "climbs",
)
