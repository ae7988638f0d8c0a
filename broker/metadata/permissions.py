"""Authentication and authorisation against the metadata state.

Where it sits: the AMQP connection state machine / runtime calls
`authenticate` on connection.start-ok, `check_vhost_access` on
connection.open and `check` before every operation (configure for declare/
delete, write for publish/bind-to-queue, read for consume/get/bind-from-
exchange, as RabbitMQ maps them). Reads only; never mutates the state.

Regex semantics are RabbitMQ's (rabbit_auth_backend_internal): the pattern is
*searched* in the resource name (Erlang re:run, unanchored, so use ``^...$``
to anchor), and the empty pattern means ``^$``, which matches no named
resource. The default exchange is checked under the name ``amq.default``.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from .errors import ACCESS_REFUSED, NOT_ALLOWED, MetadataError
from .passwords import check_password
from .state import MetadataState, UserRecord
from .types import PermissionKind, UserName, VhostName

DEFAULT_LOOPBACK_USERS: tuple[str, ...] = ("guest",)
LOGIN_REFUSED = "Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."


@dataclass(frozen=True, slots=True)
class Resource:
    kind: Literal["queue", "exchange", "topic"]
    name: str

    @staticmethod
    def queue(name: str) -> Resource:
        return Resource("queue", name)

    @staticmethod
    def exchange(name: str) -> Resource:
        return Resource("exchange", name or "amq.default")


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern if pattern else "^$")


def pattern_allows(pattern: str, name: str) -> bool:
    """RabbitMQ's permission regex test (unanchored search; '' matches nothing)."""
    try:
        return _compile(pattern).search(name) is not None
    except re.error:
        return False  # an invalid pattern grants nothing


def is_loopback(peer_address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    addr = peer_address.strip("[]")
    if "%" in addr:
        addr = addr.split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr == "localhost"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def login_refused(mechanism: str = "PLAIN") -> MetadataError:
    return MetadataError(ACCESS_REFUSED, LOGIN_REFUSED.format(mechanism=mechanism))


def check_loopback(
    user: str, peer_address: str, loopback_users: Iterable[str] = DEFAULT_LOOPBACK_USERS,
    mechanism: str = "PLAIN",
) -> MetadataError | None:
    """Users listed in `loopback_users` may only connect from a loopback address."""
    if user in loopback_users and not is_loopback(peer_address):
        return login_refused(mechanism)
    return None


def authenticate(
    state: MetadataState,
    username: str,
    password: str,
    peer_address: str,
    loopback_users: Iterable[str] = DEFAULT_LOOPBACK_USERS,
    mechanism: str = "PLAIN",
) -> UserRecord | MetadataError:
    """The user, or RabbitMQ's uniform 403 login refusal (which does not say
    whether the user, the password or the peer address was wrong)."""
    user = state.users.get(UserName(username))
    if user is None or not check_password(user.password_hash, password, user.hashing_algorithm):
        return login_refused(mechanism)
    err = check_loopback(username, peer_address, loopback_users, mechanism)
    if err:
        return err
    return user


def check_vhost_access(state: MetadataState, user: str, vhost: str) -> MetadataError | None:
    if vhost not in state.vhosts:
        return MetadataError(NOT_ALLOWED, f"vhost {vhost} not found")
    if (user, vhost) not in state.permissions:
        return MetadataError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}'")
    return None


def check(
    state: MetadataState,
    user: str,
    vhost: str,
    kind: PermissionKind,
    resource: Resource,
) -> MetadataError | None:
    """None when `user` may `kind` (configure/write/read) `resource` in `vhost`."""
    perm = state.permissions.get((UserName(user), VhostName(vhost)))
    if perm is not None:
        pattern = {"configure": perm.configure, "write": perm.write, "read": perm.read}[kind]
        if pattern_allows(pattern, resource.name):
            return None
    return MetadataError(
        ACCESS_REFUSED,
        f"access to {resource.kind} '{resource.name}' in vhost '{vhost}' refused for user '{user}'",
    )


def check_topic(
    state: MetadataState,
    user: str,
    vhost: str,
    kind: Literal["write", "read"],
    exchange: str,
    routing_key: str,
) -> MetadataError | None:
    """Topic authorisation (topic exchanges only): allowed when no topic
    permission is set for the exchange; ``{username}``/``{vhost}`` expand."""
    tp = state.topic_permissions.get((UserName(user), VhostName(vhost), exchange))  # type: ignore[arg-type]
    if tp is None:
        return None
    pattern = (tp.write if kind == "write" else tp.read)
    pattern = pattern.replace("{username}", re.escape(user)).replace("{vhost}", re.escape(vhost))
    if pattern_allows(pattern, routing_key):
        return None
    return MetadataError(
        ACCESS_REFUSED,
        f"{kind} access to topic '{routing_key}' in exchange '{exchange}' in vhost "
        f"'{vhost}' refused for user '{user}'",
    )
