"""quorumq broker: a Raft-replicated quorum-queue message broker speaking AMQP 0-9-1.

Layering (see docs/ARCHITECTURE.md): pure cores (`raft`, `queue`, `metadata`,
`amqp`) never touch sockets, files, clocks, randomness or asyncio; `storage` is
the only package touching files; `runtime` and `mgmt` are the I/O shell.
Nothing imports `runtime`.
"""

# Before any other broker module: the compiled (mypyc) or the pure Python path
# for this process (broker/compiled.py).
from broker import compiled as _compiled

_compiled.activate()
