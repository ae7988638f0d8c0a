"""Users, password hashing, login, loopback-only users and permission checks."""
from __future__ import annotations

import pytest

from broker.metadata import (
    AddUser,
    AddVhost,
    ChangePassword,
    ClearPermissions,
    DeleteUser,
    InvalidCommand,
    MetadataError,
    PermissionsChanged,
    Resource,
    SetPermissions,
    SetTopicPermissions,
    SetUserTags,
    UserDeleted,
    authenticate,
    check,
    check_loopback,
    check_password,
    check_topic,
    check_vhost_access,
    hash_password,
    is_loopback,
)
from broker.metadata.commands import ClearTopicPermissions

from .helpers import Driver

LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)


def test_hash_matches_rabbitmq_documented_vectors() -> None:
    # From RabbitMQ's passwords guide: salt 908DC60A, password test12, SHA-256.
    assert hash_password("test12", bytes.fromhex("908DC60A")) == "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
    # The legacy MD5 scheme: salt CAD5089B, password simon.
    assert hash_password("simon", bytes.fromhex("CAD5089B"), "rabbit_password_hashing_md5") == "ytUIm8s3AnKsXQjptplKFytfVxI="
    assert check_password("kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR", "test12")
    assert not check_password("kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR", "test13")


@pytest.mark.parametrize("stored", ["", "!!!notbase64", "AAAA", "kI3G"])
def test_malformed_hashes_never_match(stored: str) -> None:
    assert not check_password(stored, "")
    assert not check_password(stored, "test12")


def test_hash_rejects_bad_input() -> None:
    with pytest.raises(InvalidCommand):
        hash_password("x", b"abc")
    with pytest.raises(InvalidCommand):
        hash_password("x", b"abcd", "rabbit_password_hashing_foo")


def test_sha512_roundtrip_and_salt_matters() -> None:
    h1 = hash_password("pw", b"\x00\x00\x00\x01", "rabbit_password_hashing_sha512")
    h2 = hash_password("pw", b"\x00\x00\x00\x02", "rabbit_password_hashing_sha512")
    assert h1 != h2
    assert check_password(h1, "pw", "rabbit_password_hashing_sha512")
    assert not check_password(h1, "pw")  # wrong algorithm


@pytest.fixture
def d() -> Driver:
    drv = Driver()
    drv.ok(AddVhost("v2"))
    drv.ok(AddUser("u", hash_password("pw", b"salt")))
    # the permissions used in the RabbitMQ probe: configure '', write 'x', read 'q'
    drv.ok(SetPermissions("u", "/", "", "x", "q"))
    return drv


LOGIN = [
    ("guest", "guest", "127.0.0.1", None),
    ("guest", "guest", "::1", None),
    ("guest", "guest", "::ffff:127.0.0.1", None),
    ("guest", "guest", "10.0.0.5", LOGIN_REFUSED),  # loopback-only user
    ("guest", "wrong", "127.0.0.1", LOGIN_REFUSED),
    ("u", "bad", "127.0.0.1", LOGIN_REFUSED),
    ("nouser", "x", "127.0.0.1", LOGIN_REFUSED),
    ("u", "pw", "10.0.0.5", None),
]


@pytest.mark.parametrize("user,password,peer,refusal", LOGIN)
def test_authenticate(d: Driver, user: str, password: str, peer: str, refusal: str | None) -> None:
    got = authenticate(d.state, user, password, peer)
    if refusal is None:
        assert not isinstance(got, MetadataError) and got.name == user
    else:
        assert isinstance(got, MetadataError) and (got.code, got.reply_text) == (403, refusal)


def test_loopback_users_configurable(d: Driver) -> None:
    assert not isinstance(authenticate(d.state, "guest", "guest", "10.0.0.5", loopback_users=()), MetadataError)
    assert isinstance(authenticate(d.state, "u", "pw", "10.0.0.5", loopback_users=("u",)), MetadataError)
    assert check_loopback("x", "192.168.1.1", ["x"]) is not None
    assert check_loopback("x", "127.1.2.3", ["x"]) is None
    assert [is_loopback(a) for a in ("127.0.0.1", "[::1]", "localhost", "10.1.1.1", "garbage")] == [
        True, True, True, False, False]


def test_guest_can_be_removed(d: Driver) -> None:
    d.ok(DeleteUser("guest"))
    assert UserDeleted("guest") in d.effects
    assert ("guest", "/") not in d.state.permissions
    assert isinstance(authenticate(d.state, "guest", "guest", "127.0.0.1"), MetadataError)
    assert d.err(DeleteUser("guest")).reply_text == "NOT_FOUND - no user 'guest'"


def test_change_password_and_tags(d: Driver) -> None:
    d.ok(ChangePassword("u", hash_password("new", b"abcd")))
    assert isinstance(authenticate(d.state, "u", "pw", "127.0.0.1"), MetadataError)
    assert not isinstance(authenticate(d.state, "u", "new", "127.0.0.1"), MetadataError)
    d.ok(SetUserTags("u", ("monitoring",)))
    assert d.state.users["u"].tags == ("monitoring",)
    assert d.state.users["u"].password_hash == hash_password("new", b"abcd")
    assert d.err(ChangePassword("u", "h", "md4")).code == 406
    assert d.err(SetUserTags("nope", ())).code == 404


VHOST = [
    ("u", "v2", 530, "NOT_ALLOWED - access to vhost 'v2' refused for user 'u'"),
    ("u", "nov", 530, "NOT_ALLOWED - vhost nov not found"),
    ("u", "/", None, None),
    ("guest", "/", None, None),
]


@pytest.mark.parametrize("user,vhost,code,text", VHOST)
def test_vhost_access(d: Driver, user: str, vhost: str, code: int | None, text: str | None) -> None:
    err = check_vhost_access(d.state, user, vhost)
    assert (err.code, err.reply_text) == (code, text) if err else code is None
    if err:
        assert err.hard


# (kind, resource, allowed) for user u with configure '', write 'x', read 'q'
CHECKS = [
    ("configure", Resource.queue("zq"), False),  # verified text below
    ("configure", Resource.exchange("zx"), False),
    ("configure", Resource.queue(""), True),  # '' is ^$: only the empty name
    ("write", Resource.exchange(""), False),  # default exchange is amq.default
    ("write", Resource.exchange("amq.direct"), False),
    ("write", Resource.exchange("box"), True),  # unanchored search, as RabbitMQ
    ("read", Resource.queue("aqa"), True),  # verified: 'q' grants read on 'aqa'
    ("read", Resource.queue("abc"), False),
    ("write", Resource.queue("aqa"), False),  # verified text below
]


@pytest.mark.parametrize("kind,resource,allowed", CHECKS)
def test_permission_patterns(d: Driver, kind: str, resource: Resource, allowed: bool) -> None:
    err = check(d.state, "u", "/", kind, resource)  # type: ignore[arg-type]
    assert (err is None) == allowed


VERIFIED_403 = [
    ("configure", Resource.queue("zq"), "ACCESS_REFUSED - access to queue 'zq' in vhost '/' refused for user 'u'"),
    ("configure", Resource.exchange("zx"), "ACCESS_REFUSED - access to exchange 'zx' in vhost '/' refused for user 'u'"),
    ("write", Resource.exchange(""), "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'u'"),
    ("write", Resource.exchange("amq.direct"), "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'u'"),
    ("write", Resource.queue("aqa"), "ACCESS_REFUSED - access to queue 'aqa' in vhost '/' refused for user 'u'"),
]


@pytest.mark.parametrize("kind,resource,text", VERIFIED_403)
def test_permission_texts(d: Driver, kind: str, resource: Resource, text: str) -> None:
    err = check(d.state, "u", "/", kind, resource)  # type: ignore[arg-type]
    assert err is not None and (err.code, err.reply_text) == (403, text)


def test_permissions_lifecycle(d: Driver) -> None:
    assert check(d.state, "u", "v2", "read", Resource.queue("q")) is not None  # no entry
    d.ok(SetPermissions("u", "v2", "^cfg-.*$", ".*", ".*"))
    assert d.effects == [PermissionsChanged("u", "v2")]
    assert check(d.state, "u", "v2", "configure", Resource.queue("cfg-1")) is None
    assert check(d.state, "u", "v2", "configure", Resource.queue("x-cfg-1")) is not None
    d.ok(ClearPermissions("u", "v2"))
    assert check_vhost_access(d.state, "u", "v2") is not None
    assert d.err(SetPermissions("u", "v2", "(", ".*", ".*")).code == 406
    assert d.err(SetPermissions("nope", "v2", ".*", ".*", ".*")).reply_text == "NOT_FOUND - no user 'nope'"
    assert d.err(SetPermissions("u", "v9", ".*", ".*", ".*")).reply_text == "NOT_FOUND - no vhost 'v9'"


def test_topic_permissions(d: Driver) -> None:
    assert check_topic(d.state, "u", "/", "write", "amq.topic", "any.key") is None  # none set
    d.ok(SetTopicPermissions("u", "/", "amq.topic", "^{username}\\.", "^pub\\."))
    assert check_topic(d.state, "u", "/", "write", "amq.topic", "u.orders") is None
    err = check_topic(d.state, "u", "/", "write", "amq.topic", "other.orders")
    assert err is not None and err.reply_text == (
        "ACCESS_REFUSED - write access to topic 'other.orders' in exchange 'amq.topic' "
        "in vhost '/' refused for user 'u'")
    assert check_topic(d.state, "u", "/", "read", "amq.topic", "pub.x") is None
    d.ok(ClearTopicPermissions("u", "/", "amq.topic"))
    assert check_topic(d.state, "u", "/", "write", "amq.topic", "other.orders") is None
