"""Connection-level behaviour against a real broker process, compared with
RabbitMQ 3.10 on the same scenario where feasible.

Both brokers boot with the same definitions (`conftest.definitions_document`):
`defs_broker` is ours, `rabbitmq_defs` is RabbitMQ. Scenarios speak raw AMQP
(`Wire`, built on pamqp's frame codec) so reply codes, texts and the exact
bytes on the socket are visible; pika checks what a client library makes of
them. Where the two brokers differ on purpose the test says why.

`Wire` is also used by test_auth.py, test_hostile.py and test_clients.py.
"""
from __future__ import annotations

import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pytest
from pamqp import commands as C
from pamqp import encode as pencode
from pamqp import frame as pframe
from pamqp import heartbeat as phb
from pamqp.common import FieldTable
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError

from .broker_proc import BrokerProcess

HEADER = b"AMQP\x00\x00\x09\x01"
_HDR = struct.Struct(">BHI")
FRAME_END = b"\xce"
CLIENT_CAPS = {"authentication_failure_close": True, "consumer_cancel_notify": True,
               "connection.blocked": True, "basic.nack": True, "publisher_confirms": True}


class Closed(Exception):
    """The server closed the socket."""


class Wire:
    """A raw AMQP 0-9-1 client socket: send frames, read frames with a deadline."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.timeout = timeout

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    # -- output
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: Any) -> None:
        self.send(pframe.marshal(method, channel))

    @staticmethod
    def raw_frame(ftype: int, channel: int, payload: bytes) -> bytes:
        return _HDR.pack(ftype, channel, len(payload)) + payload + FRAME_END

    @staticmethod
    def publish_frames(routing_key: str, body: bytes, channel: int = 1, exchange: str = "",
                       declared_size: int | None = None, frame_max: int = 131072) -> bytes:
        """basic.publish + content header (no properties) + body frames."""
        ex, rk = exchange.encode(), routing_key.encode()
        m = struct.pack(">HHH", 60, 40, 0) + bytes([len(ex)]) + ex + bytes([len(rk)]) + rk + b"\x00"
        size = len(body) if declared_size is None else declared_size
        h = struct.pack(">HHQH", 60, 0, size, 0)
        out = Wire.raw_frame(1, channel, m) + Wire.raw_frame(2, channel, h)
        step = frame_max - 8
        return out + b"".join(Wire.raw_frame(3, channel, body[i:i + step])
                              for i in range(0, len(body), step))

    # -- input
    def _recv(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no data from the server")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            raise TimeoutError("no data from the server") from None
        except ConnectionResetError:
            data = b""
        if not data:
            raise Closed("the server closed the connection")
        self.buf += data

    def frame(self, timeout: float | None = None) -> tuple[int, int, bytes]:
        """(type, channel, payload) of the next frame."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self.buf) >= 7:
                ftype, ch, size = _HDR.unpack_from(self.buf, 0)
                if len(self.buf) >= 8 + size:
                    payload = bytes(self.buf[7:7 + size])
                    assert self.buf[7 + size] == 0xCE, "bad frame end from the server"
                    del self.buf[:8 + size]
                    return ftype, ch, payload
            self._recv(deadline)

    def read(self, timeout: float | None = None) -> tuple[int, Any]:
        """(channel, decoded frame), heartbeats skipped."""
        while True:
            ftype, ch, payload = self.frame(timeout)
            _, chan, value = pframe.unmarshal(self.raw_frame(ftype, ch, payload))
            if not isinstance(value, phb.Heartbeat):
                return chan, value

    def expect(self, cls: type, timeout: float | None = None) -> Any:
        ch, value = self.read(timeout)
        if not isinstance(value, cls):
            raise AssertionError(f"expected {cls.__name__}, got {describe(value)} on channel {ch}")
        return value

    def close_reply(self, timeout: float | None = None) -> tuple[int, str, int, int, int]:
        """The next connection.close or channel.close as (channel, code, text, class, method)."""
        ch, m = self.read(timeout)
        if not isinstance(m, C.Connection.Close | C.Channel.Close):
            raise AssertionError(f"expected a close, got {describe(m)}")
        return ch, m.reply_code, m.reply_text, m.class_id, m.method_id

    def drain_until_closed(self, timeout: float = 5.0) -> bytes:
        """Everything the server sends until it closes the socket."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._recv(deadline)
            except Closed:
                out = bytes(self.buf)
                self.buf.clear()
                return out

    # -- handshake
    def start(self, header: bytes = HEADER) -> Any:
        self.send(header)
        return self.expect(C.Connection.Start)

    def login(self, user: str = "guest", password: str = "guest", mechanism: str = "PLAIN",
              caps: dict[str, Any] | None = None) -> None:
        if mechanism == "AMQPLAIN":
            table = pencode.field_table(FieldTable({"LOGIN": user, "PASSWORD": password}))[4:]
            response = table.decode("latin-1")  # pamqp re-encodes str as UTF-8: keep it ASCII
        else:
            response = f"\0{user}\0{password}"
        props = {"product": "e2e-wire", "capabilities": CLIENT_CAPS if caps is None else caps}
        self.send_method(0, C.Connection.StartOk(client_properties=props, mechanism=mechanism,
                                                  response=response, locale="en_US"))

    def tune_open(self, vhost: str = "/", heartbeat: int = 0, channel_max: int | None = None,
                  frame_max: int | None = None) -> Any:
        tune = self.expect(C.Connection.Tune)
        self.send_method(0, C.Connection.TuneOk(
            channel_max=tune.channel_max if channel_max is None else channel_max,
            frame_max=tune.frame_max if frame_max is None else frame_max, heartbeat=heartbeat))
        self.send_method(0, C.Connection.Open(virtual_host=vhost))
        return tune

    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                  mechanism: str = "PLAIN", heartbeat: int = 0, channel_max: int | None = None,
                  frame_max: int | None = None) -> Any:
        self.start()
        self.login(user, password, mechanism)
        tune = self.tune_open(vhost, heartbeat, channel_max, frame_max)
        self.expect(C.Connection.OpenOk)
        return tune

    def open_channel(self, n: int = 1) -> None:
        self.send_method(n, C.Channel.Open())
        self.expect(C.Channel.OpenOk)


def describe(value: Any) -> str:
    if isinstance(value, C.Connection.Close | C.Channel.Close):
        return f"{value.name}({value.reply_code}, {value.reply_text!r})"
    return getattr(value, "name", repr(value))


def both(defs_broker: BrokerProcess, rabbitmq_defs: int, scenario: Any) -> tuple[Any, Any]:
    """Run `scenario(port)` on our broker and on RabbitMQ, concurrently (RabbitMQ
    waits up to 3 s before closing after some errors): (ours, theirs)."""
    with ThreadPoolExecutor(2) as pool:
        ours = pool.submit(scenario, defs_broker.port)
        theirs = pool.submit(scenario, rabbitmq_defs)
        return ours.result(), theirs.result()


def opened(port: int, **kw: Any) -> Wire:
    w = Wire(port)
    w.handshake(**kw)
    return w


# ---------------------------------------------------------------- protocol header
@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x08\x00",          # AMQP 0-8
    b"AMQP\x01\x01\x00\x0a",          # AMQP 1.0 style
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_wrong_protocol_header_gets_ours_back_then_close(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                                         header: bytes) -> None:
    def scenario(port: int) -> bytes:
        with Wire(port) as w:
            w.send(header)
            return w.drain_until_closed()

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == HEADER


# ---------------------------------------------------------------- server properties
def test_server_properties_advertise_rabbitmq_capabilities(defs_broker: BrokerProcess,
                                                           rabbitmq_defs: int) -> None:
    def scenario(port: int) -> tuple[dict[str, Any], set[str], str, tuple[int, int]]:
        with Wire(port) as w:
            start = w.start()
            props = start.server_properties
            return (dict(props["capabilities"]), set(start.mechanisms.split()), start.locales,
                    (start.version_major, start.version_minor))

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    caps, mechanisms, locales, version = ours
    assert caps["connection.blocked"] is True
    assert caps["authentication_failure_close"] is True
    # RabbitMQ also advertises direct_reply_to (amq.rabbitmq.reply-to), which
    # this broker does not implement, so it does not claim it.
    rabbit_caps = {k: v for k, v in theirs[0].items() if k != "direct_reply_to"}
    assert caps == rabbit_caps
    assert mechanisms == theirs[1] == {"PLAIN", "AMQPLAIN"}
    assert locales == theirs[2] == "en_US"
    assert version == theirs[3] == (0, 9)


def test_pika_sees_connection_blocked_capability(defs_broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", defs_broker.port))
    try:
        caps = conn._impl.server_capabilities
        assert caps["connection.blocked"] is True
        assert caps["publisher_confirms"] is True and caps["basic.nack"] is True
    finally:
        conn.close()


# ---------------------------------------------------------------- logins
@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
@pytest.mark.parametrize("user,password,vhost", [
    ("guest", "guest", "/"),
    ("bob", "bobpw", "v2"),        # password_hash (sha256) from definitions
    ("carol", "carolpw", "v2"),    # sha512 hashing_algorithm from definitions
])
def test_login_mechanisms(defs_broker: BrokerProcess, rabbitmq_defs: int, mechanism: str, user: str,
                          password: str, vhost: str) -> None:
    def scenario(port: int) -> str:
        with Wire(port) as w:
            w.handshake(user, password, vhost, mechanism=mechanism)
            w.open_channel(1)
            w.send_method(1, C.Queue.Declare(queue="", exclusive=True))
            return type(w.expect(C.Queue.DeclareOk)).__name__

    assert both(defs_broker, rabbitmq_defs, scenario) == ("DeclareOk", "DeclareOk")


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
@pytest.mark.parametrize("user,password", [("guest", "wrong"), ("nobody", "guest"), ("bob", "")])
def test_wrong_credentials_refused_like_rabbitmq(defs_broker: BrokerProcess, rabbitmq_defs: int,
                                                 mechanism: str, user: str, password: str) -> None:
    def scenario(port: int) -> tuple[Any, ...]:
        with Wire(port) as w:
            w.start()
            w.login(user, password, mechanism)
            reply = w.close_reply()
            w.send_method(0, C.Connection.CloseOk())
            return reply + (w.drain_until_closed(),)

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == (0, 403, f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                                      f"{mechanism}. For details see the broker logfile.", 0, 0, b"")


def test_pika_wrong_password_raises_authentication_error(defs_broker: BrokerProcess) -> None:
    params = pika.ConnectionParameters("127.0.0.1", defs_broker.port,
                                       credentials=pika.PlainCredentials("guest", "nope"))
    with pytest.raises(ProbableAuthenticationError, match="403.*ACCESS_REFUSED"):
        pika.BlockingConnection(params)


# ---------------------------------------------------------------- vhosts
@pytest.mark.parametrize("user,password,vhost,text", [
    ("guest", "guest", "nosuch", "NOT_ALLOWED - vhost nosuch not found"),
    ("alice", "alicepw", "v2", "NOT_ALLOWED - access to vhost 'v2' refused for user 'alice'"),
    ("carol", "carolpw", "/", "NOT_ALLOWED - access to vhost '/' refused for user 'carol'"),
])
def test_vhost_not_found_or_refused_530(defs_broker: BrokerProcess, rabbitmq_defs: int, user: str,
                                        password: str, vhost: str, text: str) -> None:
    def scenario(port: int) -> tuple[Any, ...]:
        with Wire(port) as w:
            w.start()
            w.login(user, password)
            w.tune_open(vhost)
            return w.close_reply()

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == (0, 530, text, 10, 40)


def test_pika_missing_vhost_raises_access_denied(defs_broker: BrokerProcess) -> None:
    params = pika.ConnectionParameters("127.0.0.1", defs_broker.port, virtual_host="nosuch")
    with pytest.raises(ProbableAccessDeniedError, match="530.*vhost nosuch not found"):
        pika.BlockingConnection(params)


# ---------------------------------------------------------------- tuning
def test_tune_proposes_rabbitmq_defaults(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    def scenario(port: int) -> tuple[int, int, int]:
        with Wire(port) as w:
            tune = w.handshake()
            return tune.channel_max, tune.frame_max, tune.heartbeat

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == (2047, 131072, 60)


def test_handshake_errors_close_the_socket_silently(defs_broker: BrokerProcess,
                                                   rabbitmq_defs: int) -> None:
    """Errors before connection.open close the socket without a reply (RabbitMQ
    waits 3 s first, we do not): a login refused to a client without the
    authentication_failure_close capability, an unknown mechanism, and a
    tune-ok raising frame_max/channel_max above the server's (0 = no limit
    counts as higher; a client may only lower them)."""
    def login_no_cap(w: Wire) -> None:
        w.login("guest", "wrong", caps={})

    def mechanism(w: Wire) -> None:
        w.login(mechanism="EXTERNAL")

    def tune(**kw: int) -> Any:
        def go(w: Wire) -> None:
            w.login()
            w.tune_open(**kw)
        return go

    cases = {"login refused, no capability": login_no_cap, "unknown mechanism": mechanism,
             **{f"tune-ok {k}={v}": tune(**{k: v}) for k, v in [
                 ("frame_max", 131073), ("frame_max", 0), ("frame_max", 4095),
                 ("channel_max", 2048), ("channel_max", 0)]}}

    def scenario(port: int, step: Any) -> bytes:
        with Wire(port) as w:
            w.start()
            step(w)
            return w.drain_until_closed()

    with ThreadPoolExecutor(len(cases) * 2) as pool:
        futures = {(name, who): pool.submit(scenario, port, step) for name, step in cases.items()
                   for who, port in (("ours", defs_broker.port), ("rabbitmq", rabbitmq_defs))}
        results = {key: f.result() for key, f in futures.items()}
    assert results == {key: b"" for key in futures}


def test_channel_max_plus_one_is_refused(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    """With channel_max = 3 negotiated, the 4th channel is refused with
    RabbitMQ's 530 (any channel number, it counts open channels)."""
    def scenario(port: int) -> tuple[Any, ...]:
        with opened(port, channel_max=3) as w:
            for n in (1, 2, 900):
                w.open_channel(n)
            w.send_method(4, C.Channel.Open())
            return w.close_reply()[:3]

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    # RabbitMQ sends class/method 0,0 here; our amqp core sends 20,10
    # (channel.open), so only code and text are compared.
    assert ours == theirs == (0, 530, "NOT_ALLOWED - number of channels opened (3) has reached the "
                                      "negotiated channel_max (3)")


def test_negotiated_frame_max_splits_deliveries(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    """frame_max 4096 negotiated: a 10 000-byte message comes back in body
    frames of at most 4088 bytes of payload, and the same bytes."""
    body = bytes(range(256)) * 39 + b"0123456789ABCDEF"

    def scenario(port: int) -> list[int]:
        with opened(port, frame_max=4096) as w:
            w.open_channel()
            w.send_method(1, C.Queue.Declare(queue="", exclusive=True))
            q = w.expect(C.Queue.DeclareOk).queue
            w.send(Wire.publish_frames(q, body, frame_max=4096))
            w.send_method(1, C.Basic.Get(queue=q, no_ack=True))
            w.expect(C.Basic.GetOk)
            sizes, got = [], b""
            ftype, _, payload = w.frame()
            assert ftype == 2
            while len(got) < len(body):
                ftype, _, payload = w.frame()
                assert ftype == 3
                sizes.append(len(payload))
                got += payload
            assert got == body
            return sizes

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == [4088, 4088, 10000 - 2 * 4088]


# ---------------------------------------------------------------- heartbeats
def test_heartbeats_both_ways(defs_broker: BrokerProcess, rabbitmq_defs: int) -> None:
    """heartbeat = 1 s: the server heartbeats an idle client; a client that
    keeps sending heartbeats stays connected; one that goes silent is dropped
    after about 2 intervals (RabbitMQ: after 2-3 s)."""
    def scenario(port: int) -> tuple[bool, bool]:
        with opened(port, heartbeat=1) as w:
            t0 = time.monotonic()
            beats = 0
            while time.monotonic() - t0 < 3.0:      # keep-alive phase
                w.send(Wire.raw_frame(8, 0, b""))
                try:
                    ftype, ch, payload = w.frame(timeout=0.4)
                except TimeoutError:
                    continue
                assert (ftype, ch, payload) == (8, 0, b""), "only heartbeats expected when idle"
                beats += 1
            silent_since = time.monotonic()          # silent phase: send nothing
            with pytest.raises(Closed):
                while True:
                    ftype, _, _ = w.frame(timeout=6.0)
                    assert ftype == 8
            dropped_after = time.monotonic() - silent_since
            return beats >= 3, 1.5 <= dropped_after <= 3.5

    ours, theirs = both(defs_broker, rabbitmq_defs, scenario)
    assert ours == theirs == (True, True)


def test_heartbeat_zero_means_no_heartbeats(defs_broker: BrokerProcess) -> None:
    with opened(defs_broker.port, heartbeat=0) as w:
        with pytest.raises(TimeoutError):
            w.frame(timeout=1.5)
        w.open_channel()  # still alive after 1.5 s of silence
