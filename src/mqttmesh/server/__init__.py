"""The I/O layer: asyncio listeners, connections, timers and storage threads."""
