"""What one message costs the pure code of two nodes, counted (docs/design.md 3.6).

    .venv/bin/python bench/hop_cost.py [--tree TREE] [--qos 0|1] [--messages N] [--top K]

Four publishers on node b send 64-byte messages in batches of 200 to one subscriber on node
a (the two in-memory nodes of tests/unit/test_links_unit.py: no sockets, no clock), which
acknowledges its QoS 1 messages; the end-to-end acknowledgements go back to b's custody.
Prints the Python bytecodes executed per message, in all and per function of
``src/mqttmesh`` (the K largest): a count, not a timing, so two commits compare exactly
(``--tree`` is a checkout's root, e.g. ``git worktree add /tmp/old COMMIT``).

``--run N`` only runs N messages after the warm-up and prints nothing: for an instruction
count under valgrind, as the difference of two lengths (so the set-up cancels out):

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        .venv/bin/python bench/hop_cost.py --run 2000      # then --run 10000; (b - a) / 8000
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

BATCH = 50  # messages per publisher per round (4 publishers: 200 a round)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--qos", type=int, default=1, choices=(0, 1))
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--run", type=int, default=0, metavar="N")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    sys.path[:0] = [os.path.join(tree, "src"), os.path.join(tree, "tests"), os.path.join(tree, "tests", "unit")]
    import test_links_unit as two  # (from the tree asked for)

    from support import mqttraw
    from support.frames import ack, split_frames

    a, b, pair = two.two_nodes()
    sub = a.net.subscriber("sub", ("t/#", 1))
    pair.pump(0.1)
    pubs = [b.net.connect(f"pub{i}") for i in range(4)]
    qos = args.qos
    reads = [
        b"".join(mqttraw.publish(f"t/{i}", b"x" * 64, qos, pid=k + 1) for k in range(BATCH)) for i in range(len(pubs))
    ]
    clock = [0.2]

    def rounds(n: int) -> None:
        for _ in range(n // (BATCH * len(pubs))):
            clock[0] += 0.001
            now = clock[0]
            for i, pub in enumerate(pubs):
                pub.receive_data(reads[i], now)
                pub.data_to_send()
            b.links.flush(now)
            fwd = [s for s in pair.out.sent if s[0] == "fwd"]
            pair.out.sent = [s for s in pair.out.sent if s[0] != "fwd"]
            for kind, payload, *_ in fwd:
                a.links.receive(pair.inb, kind, payload, now)
            while True:  # the subscriber reads all and acknowledges what needs it
                data = sub.data_to_send()
                if not data or not qos:
                    break
                sub.receive_data(b"".join(ack(0x40, p.packet_id) for p in split_frames(data) if p.qos), now)
            a.links.flush(now)
            e2e = [s for s in pair.inb.sent if s[0] == "e2e"]
            pair.inb.sent = [s for s in pair.inb.sent if s[0] != "e2e"]
            for kind, payload, *_ in e2e:
                b.links.receive(pair.out, kind, payload, now)

    rounds(2000)  # warm-up: routes computed, caches filled
    if args.run:
        rounds(args.run)
        return
    src = os.path.join(tree, "src", "mqttmesh") + os.sep
    counts: Counter[str] = Counter()

    def tracer(frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(src):
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        key = f"{code.co_filename[len(src) :]}:{code.co_qualname}"

        def opcodes(frame, event, arg):
            if event == "opcode":
                counts[key] += 1
            return opcodes

        return opcodes

    n = args.messages
    sys.settrace(tracer)
    rounds(n)
    sys.settrace(None)
    print(f"{tree} QoS {qos}: {sum(counts.values()) / n:.1f} bytecodes per message, in src/mqttmesh")
    for key, c in counts.most_common(args.top):
        print(f"{c / n:8.1f}  {key}")


if __name__ == "__main__":
    main()
