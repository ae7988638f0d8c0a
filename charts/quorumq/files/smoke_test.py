"""quorumq smoke test (`helm test`): publish one confirmed persistent message
to a fresh quorum queue, consume it, ack it, delete the queue.

Runs with the broker image's Python (only pamqp, the frame codec, is needed).
Environment: QQ_HOST, QQ_PORT (5672), QQ_USER, QQ_PASSWORD, QQ_TIMEOUT (60).
Exit 0 on success; otherwise 1 with the reason on stderr.
"""
import os
import socket
import sys
import time
import uuid

from pamqp import body as pbody
from pamqp import commands as c
from pamqp import frame, header


class Conn:
    def __init__(self, host, port, timeout):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def send(self, value, channel=0):
        self.sock.sendall(frame.marshal(value, channel))

    def recv(self):
        while True:
            if self.buf:
                try:
                    used, _ch, value = frame.unmarshal(self.buf)
                except Exception:  # an incomplete frame: read more
                    used = 0
                if used:
                    self.buf = self.buf[used:]
                    if isinstance(value, (c.Connection.Close, c.Channel.Close)):
                        raise RuntimeError(f"broker closed: {value.reply_code} {value.reply_text}")
                    return value
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("connection closed by the broker")
            self.buf += data

    def expect(self, kind):
        while True:
            value = self.recv()
            if isinstance(value, kind):
                return value
            if isinstance(value, c.Connection.Start) or isinstance(value, c.Connection.Tune):
                raise RuntimeError(f"unexpected {value.name}")


def main():
    host = os.environ.get("QQ_HOST", "127.0.0.1")
    port = int(os.environ.get("QQ_PORT", "5672"))
    user, password = os.environ.get("QQ_USER", "guest"), os.environ.get("QQ_PASSWORD", "guest")
    timeout = float(os.environ.get("QQ_TIMEOUT", "60"))
    queue = f"helm-test-{uuid.uuid4().hex[:8]}"
    payload = f"quorumq smoke test {time.time()}".encode()
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = Conn(host, port, timeout)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot connect to {host}:{port}: {exc}") from None
            time.sleep(1)
    conn.sock.sendall(header.ProtocolHeader().marshal())
    conn.expect(c.Connection.Start)
    conn.send(c.Connection.StartOk(client_properties={"product": "quorumq-smoke-test"},
                                   mechanism="PLAIN", response=f"\0{user}\0{password}",
                                   locale="en_US"))
    tune = conn.expect(c.Connection.Tune)
    conn.send(c.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                  heartbeat=0))
    conn.send(c.Connection.Open(virtual_host="/"))
    conn.expect(c.Connection.OpenOk)
    conn.send(c.Channel.Open(), 1)
    conn.expect(c.Channel.OpenOk)
    conn.send(c.Confirm.Select(), 1)
    conn.expect(c.Confirm.SelectOk)
    conn.send(c.Queue.Declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"}), 1)
    conn.expect(c.Queue.DeclareOk)
    conn.send(c.Basic.Publish(exchange="", routing_key=queue), 1)
    conn.send(header.ContentHeader(0, len(payload), c.Basic.Properties(delivery_mode=2)), 1)
    conn.send(pbody.ContentBody(payload), 1)
    ack = conn.recv()
    if not isinstance(ack, c.Basic.Ack):
        raise RuntimeError(f"publish not confirmed: {ack!r}")
    print(f"published to {queue}: confirmed", flush=True)
    conn.send(c.Basic.Qos(prefetch_count=1), 1)
    conn.expect(c.Basic.QosOk)
    conn.send(c.Basic.Consume(queue=queue, consumer_tag="smoke"), 1)
    conn.expect(c.Basic.ConsumeOk)
    deliver = conn.expect(c.Basic.Deliver)
    conn.expect(header.ContentHeader)
    got = b""
    while len(got) < len(payload):
        got += conn.expect(pbody.ContentBody).value
    if got != payload:
        raise RuntimeError(f"consumed {got!r}, published {payload!r}")
    conn.send(c.Basic.Ack(delivery_tag=deliver.delivery_tag), 1)
    conn.send(c.Basic.Cancel(consumer_tag="smoke"), 1)
    conn.expect(c.Basic.CancelOk)
    conn.send(c.Queue.Delete(queue=queue), 1)
    conn.expect(c.Queue.DeleteOk)
    conn.send(c.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    conn.expect(c.Connection.CloseOk)
    print(f"consumed and acknowledged from {queue}: ok", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # the reason is the test's output
        print(f"smoke test failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
