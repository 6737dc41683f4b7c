"""Routing: the link-state database, shortest paths, interest, the data plane, custody,
ordered delivery and the binary formats (the routing engine, pure)."""
