"""Server-side TLS contexts from RabbitMQ-style settings.

Where it sits: the AMQP listener (`ssl_options.*`), the management API
(`management.ssl.*`) and the metrics endpoint (`prometheus.ssl.*`) each build
their context here from the node's configuration. A missing or unreadable
certificate, key or CA file stops start-up with a `ConfigError` naming the
key. (Peer-to-peer TLS is `cluster.tls.*`, runtime/node.py.)

`verify = verify_peer` asks clients for a certificate and verifies it against
`cacertfile`; with `fail_if_no_peer_cert = true` a client without one is
refused, else it may connect without (RabbitMQ's semantics).
"""
from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from .config import ConfigError


def server_context(config: Mapping[str, Any], prefix: str) -> ssl.SSLContext:
    """The TLS context for the listener whose settings start with `prefix`
    (`ssl_options`, `management.ssl`, `prometheus.ssl`)."""
    cert = config[f"{prefix}.certfile"]
    key = config[f"{prefix}.keyfile"]
    ca = config[f"{prefix}.cacertfile"]
    verify = config[f"{prefix}.verify"] == "verify_peer"
    if not cert or not key:
        raise ConfigError(f"{prefix}.certfile and {prefix}.keyfile: both are required for a TLS "
                          "listener")
    if verify and not ca:
        raise ConfigError(f"{prefix}.cacertfile: required with {prefix}.verify = verify_peer")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{prefix}.certfile / {prefix}.keyfile: cannot load {cert} / {key}: "
                          f"{exc}") from None
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{prefix}.cacertfile: cannot load {ca}: {exc}") from None
    if verify:
        ctx.verify_mode = (ssl.CERT_REQUIRED if config[f"{prefix}.fail_if_no_peer_cert"]
                           else ssl.CERT_OPTIONAL)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


__all__ = ["server_context"]
