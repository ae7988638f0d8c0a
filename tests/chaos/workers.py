"""Client workers and the history they write.

Each worker is a thread with its own seeded RNG, connected to one node at a
time (chosen at random); on any error it drops the connection and connects to
another random node. Roles:

- publisher: enqueues unique integers (persistent, publisher confirms), one
  at a time: invoke, then ok (basic.ack) or info (nack, error, or no confirm
  within `confirm_timeout` s: unknown outcome, never "failed").
- consumer: basic.consume with a small prefetch, records every delivery,
  acks it. Reconnects elsewhere after `idle_reconnect` s without deliveries
  (its node may be cut off from the leader).
- getter: basic.get + ack in a loop.
"""
from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .amqp import AmqpError, Client


class History:
    """Append-only, thread-safe list of events with times relative to t0."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def add(self, **fields: Any) -> dict[str, Any]:
        with self._lock:
            e = {"t": self.now(), **fields}
            self.events.append(e)
            return e

    def write(self, path: Path) -> None:
        with self._lock, path.open("w") as f:
            for e in self.events:
                f.write(json.dumps(e, default=str) + "\n")


class Values:
    """Unique integers to enqueue."""

    def __init__(self) -> None:
        self._it = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            return next(self._it)


class Worker(threading.Thread):
    def __init__(self, wid: int, role: str, endpoints: list[tuple[str, int]], queue: str,
                 history: History, values: Values, seed: int, stop: threading.Event,
                 rate: float = 20.0, prefetch: int = 5, confirm_timeout: float = 5.0,
                 idle_reconnect: float = 5.0, queue_kind: str = "main") -> None:
        super().__init__(name=f"chaos-w{wid}", daemon=True)
        self.wid, self.role = wid, role
        self.endpoints = endpoints
        self.queue, self.queue_kind = queue, queue_kind
        self.history, self.values = history, values
        self.rng = random.Random(f"{seed}/worker/{wid}")
        self.stop_event = stop
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.prefetch = prefetch
        self.confirm_timeout = confirm_timeout
        self.idle_reconnect = idle_reconnect
        self.client: Client | None = None
        self.node = -1
        self.errors: Counter[str] = Counter()
        self.crashed: BaseException | None = None

    @property
    def process(self) -> str:
        return f"w{self.wid}"

    def _connect(self) -> bool:
        self.node = self.rng.randrange(len(self.endpoints))
        host, port = self.endpoints[self.node]
        try:
            c = Client(host, port, timeout=self.confirm_timeout)
            if self.role == "publisher":
                c.confirm_select()
            elif self.role == "consumer":
                c.consume(self.queue, self.prefetch)
        except (AmqpError, TimeoutError, OSError) as exc:
            self.errors[type(exc).__name__] += 1
            return False
        self.client = c
        return True

    def _drop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported by the runner
            self.crashed = exc
        finally:
            self._drop()

    def _loop(self) -> None:
        last_delivery = time.monotonic()
        while not self.stop_event.is_set():
            if self.client is None:
                if not self._connect():
                    self.stop_event.wait(0.2)  # back off before the next node
                    continue
                last_delivery = time.monotonic()
            c = self.client
            assert c is not None
            try:
                if self.role == "publisher":
                    self._publish(c)
                    if self.interval:
                        self.stop_event.wait(self.interval)
                elif self.role == "consumer":
                    d = c.next_delivery(0.5)
                    if d is None:
                        if time.monotonic() - last_delivery > self.idle_reconnect:
                            self._drop()
                        continue
                    last_delivery = time.monotonic()
                    self._dequeued(d.body, d.redelivered)
                    c.ack(d.tag)
                    if self.interval:
                        self.stop_event.wait(self.interval)
                else:
                    d = c.get(self.queue)
                    if d is None:
                        self.stop_event.wait(max(self.interval, 0.05))
                        continue
                    self._dequeued(d.body, d.redelivered)
                    c.ack(d.tag)
                    if self.interval:
                        self.stop_event.wait(self.interval)
            except (AmqpError, TimeoutError, OSError) as exc:
                self.errors[type(exc).__name__] += 1
                self._drop()

    def _publish(self, c: Client) -> None:
        v = self.values.next()
        self.history.add(process=self.process, type="invoke", f="enqueue", value=v, node=self.node)
        try:
            acked = c.publish(self.queue, str(v).encode(), self.confirm_timeout)
        except TimeoutError:
            self.history.add(process=self.process, type="info", f="enqueue", value=v,
                             node=self.node, error="timeout")
            raise
        except (AmqpError, OSError) as exc:
            self.history.add(process=self.process, type="info", f="enqueue", value=v,
                             node=self.node, error=str(exc)[:200])
            raise
        if acked:
            self.history.add(process=self.process, type="ok", f="enqueue", value=v, node=self.node)
        else:
            self.history.add(process=self.process, type="info", f="enqueue", value=v,
                             node=self.node, error="nack")

    def _dequeued(self, body: bytes, redelivered: bool) -> None:
        try:
            v: Any = int(body)
        except ValueError:
            v = body.decode(errors="replace")
        self.history.add(process=self.process, type="ok", f="dequeue", value=v, node=self.node,
                         queue=self.queue_kind, redelivered=redelivered)

