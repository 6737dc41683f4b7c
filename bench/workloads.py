"""The workloads: who publishes on which topic, who subscribes to what, how fast.

A workload is a topology (publishers, subscribers, which subscriber receives
which publisher) plus pacing and flow-control windows. Publisher i connects to
``target.pub_endpoint(i)`` and subscriber j to ``target.sub_endpoint(j)``, so
the same workloads run unchanged against a mesh whose publishers and
subscribers sit on different nodes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    topology: str  # "fanin", "fanout" or "p2p"
    n_pubs: int
    n_subs: int
    qos_levels: tuple[int, ...]
    rate: float | None = None  # total msgs/s over all publishers; None: as fast as the broker takes them
    # QoS 1/2: unacknowledged PUBLISHes a publisher keeps in flight, like a real client
    inflight: int = 500
    # End-to-end window, every QoS: a publisher stays at most this many messages ahead of the
    # slowest of its subscribers (shared-memory counters, see loadgen). Without it a publisher
    # outruns the subscribers and the run measures how a broker buffers or drops, not how fast
    # it delivers; with it every broker is measured at the rate it can sustain.
    # Measured here: 200 to 4000 gives the same msgs/s within the noise, only the queueing latency
    # of the unpaced runs grows with it.
    e2e_window: int = 500
    pub_procs: int = 2  # the generator is easily the bottleneck: spread it over processes
    sub_procs: int = 1
    description: str = ""
    # clients connect with CleanSession=0: in a mesh their sessions are replicated, and every
    # QoS 2 step waits for the session's other nodes to confirm it (issue 15)
    persistent: bool = False
    # every broker runs with its own default limits (as a user starts it), not the large
    # ones the other workloads give it: what a broker does with more than it can deliver
    # (issue 20) depends on exactly those limits
    broker_defaults: bool = False
    skip_brokers: tuple[str, ...] = ()  # brokers this workload means nothing for

    def pub_topic(self, i: int) -> str:
        if self.topology == "fanout":
            return "bench/fanout"
        return f"bench/{self.topology}/{i}"

    def sub_filter(self, j: int) -> str:
        if self.topology == "fanin":
            return "bench/#"
        if self.topology == "fanout":
            return "bench/fanout"
        return f"bench/p2p/{j}"

    def receivers(self, i: int) -> list[int]:
        """The subscribers that must receive every message of publisher i."""
        if self.topology == "fanin":
            return [0]
        if self.topology == "fanout":
            return list(range(self.n_subs))
        return [i]

    def senders(self, j: int) -> list[int]:
        """The publishers whose messages subscriber j must receive."""
        return [i for i in range(self.n_pubs) if j in self.receivers(i)]

    @property
    def paced(self) -> bool:
        return self.rate is not None


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "fanin",
            "fanin",
            4,
            1,
            (0, 1, 2),
            inflight=500,
            e2e_window=500,
            pub_procs=2,
            sub_procs=1,
            description="4 publishers -> 1 subscriber on bench/#",
        ),
        Workload(
            "saturation",
            "fanin",
            4,
            1,
            (0, 1, 2),
            inflight=500,
            e2e_window=0,  # publishers send as fast as the broker reads them
            pub_procs=2,
            sub_procs=1,
            description="4 publishers -> 1 subscriber on bench/#, as fast as the broker reads, "
            "every broker at its default limits: delivered msgs/s and the fraction delivered",
            broker_defaults=True,
            skip_brokers=("amqtt", "mesh2"),
        ),
        Workload(
            "fanout",
            "fanout",
            1,
            50,
            (0, 1, 2),
            inflight=500,
            e2e_window=500,
            pub_procs=1,
            sub_procs=2,
            description="1 publisher -> 50 subscribers of one topic",
        ),
        Workload(
            "p2p",
            "p2p",
            50,
            50,
            (0, 1, 2),
            inflight=100,
            e2e_window=100,
            pub_procs=2,
            sub_procs=2,
            description="50 publishers -> 50 subscribers, one topic per pair",
        ),
        Workload(
            "p2p-persistent",
            "p2p",
            50,
            50,
            (1, 2),
            inflight=100,
            e2e_window=100,
            pub_procs=2,
            sub_procs=2,
            description="p2p with persistent sessions (CleanSession=0) for every client",
            persistent=True,
        ),
        Workload(
            "latency",
            "fanin",
            4,
            1,
            (0, 1, 2),  # (QoS 2 across nodes at 10,000 msgs/s: issue 15's p99 target)
            rate=10_000.0,
            inflight=500,
            e2e_window=500,
            pub_procs=2,
            sub_procs=1,
            description="4 publishers -> 1 subscriber on bench/#, paced at 10,000 msgs/s total",
        ),
    ]
}
