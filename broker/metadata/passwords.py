"""Password hashing as RabbitMQ's internal auth backend does it.

Where it sits: the caller (CLI, management API, config loader) hashes a
password with a salt it generated (`hash_password`) and proposes `AddUser` /
`ChangePassword` carrying only the hash; the AMQP login path calls
`check_password` through `permissions.authenticate`. Pure: hashlib, base64 and
hmac do no I/O, and the salt is an argument.

Format (rabbit_password_hashing_sha256 and friends):
``base64(salt(4 bytes) + H(salt + utf8(password)))``.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable

from .errors import InvalidCommand

SALT_BYTES = 4

_HASHES: dict[str, Callable[[bytes], bytes]] = {
    "rabbit_password_hashing_sha256": lambda b: hashlib.sha256(b).digest(),
    "rabbit_password_hashing_sha512": lambda b: hashlib.sha512(b).digest(),
    "rabbit_password_hashing_md5": lambda b: hashlib.md5(b).digest(),
}
HASHING_ALGORITHMS: frozenset[str] = frozenset(_HASHES)


def hash_password(
    password: str, salt: bytes, algorithm: str = "rabbit_password_hashing_sha256"
) -> str:
    """Hash `password` with a 4-byte `salt` (the caller draws it from its RNG)."""
    if len(salt) != SALT_BYTES:
        raise InvalidCommand(f"salt must be {SALT_BYTES} bytes, got {len(salt)}")
    digest = _hasher(algorithm)(salt + password.encode("utf-8"))
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(
    stored: str, password: str, algorithm: str = "rabbit_password_hashing_sha256"
) -> bool:
    """True when `password` hashes to `stored`. An empty or malformed stored hash
    never matches (RabbitMQ: users without a password cannot log in with one)."""
    if not stored:
        return False
    try:
        raw = base64.b64decode(stored.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return False
    if len(raw) <= SALT_BYTES:
        return False
    salt, digest = raw[:SALT_BYTES], raw[SALT_BYTES:]
    candidate = _hasher(algorithm)(salt + password.encode("utf-8"))
    return hmac.compare_digest(candidate, digest)


def _hasher(algorithm: str) -> Callable[[bytes], bytes]:
    try:
        return _HASHES[algorithm]
    except KeyError:
        raise InvalidCommand(f"unknown password hashing algorithm {algorithm!r}") from None
