"""A Jepsen-style fault harness (issue 15): real nodes, a fault proxy on every peer link, a
workload of persistent QoS 1/2 clients that move between nodes, a seeded nemesis, and a
checker over the clients' history. ``python -m bench.chaos --help``; docs in README.md here."""
