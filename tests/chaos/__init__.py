"""Fault-injection suite (Jepsen-style): real broker processes in network
namespaces, clients enqueueing unique integers with confirms, a seeded
nemesis, and a total-queue checker. See docs/RELIABILITY.md."""
