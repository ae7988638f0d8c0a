"""The OpenAPI 3.0 document of the management API, served at `/api/openapi.json`.

Where it sits: built from data next to the handlers in `api` (which serves it)
and checked against the running API by schemathesis in tests/mgmt. Keep the
two in step: every route in `api.ROUTES` has an operation here (a test
checks it).
"""
from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

JSON = "application/json"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _list_of(name: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(name)}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_ANY_OBJ = {"type": "object", "additionalProperties": True}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error", "reason"],
              "properties": {"error": _STR, "reason": _STR}},
    "Status": {"type": "object", "required": ["status"],
               "properties": {"status": {"type": "string", "enum": ["ok", "failed"]},
                              "reason": _STR}, "additionalProperties": True},
    "Overview": {"type": "object",
                 "required": ["management_version", "node", "object_totals", "queue_totals"],
                 "properties": {"management_version": _STR, "rabbitmq_version": _STR,
                                "product_name": _STR, "cluster_name": _STR, "node": _STR,
                                "object_totals": _ANY_OBJ, "queue_totals": _ANY_OBJ,
                                "message_stats": {"$ref": "#/components/schemas/MessageStats"},
                                "listeners": {"type": "array", "items": _ANY_OBJ}}},
    "Node": {"type": "object", "required": ["name", "running", "type"],
             "properties": {"name": _STR, "running": _BOOL, "type": _STR,
                            "partitions": {"type": "array", "items": _STR},
                            "being_drained": _BOOL, "metadata_leader": _BOOL,
                            "quorum_queue_members": _INT, "quorum_queue_leaders": _INT,
                            "mem_alarm": _BOOL, "disk_free_alarm": _BOOL,
                            "mem_used": {"type": "integer", "nullable": True},
                            "mem_limit": {"type": "integer", "nullable": True},
                            "disk_free": {"type": "integer", "nullable": True},
                            "disk_free_limit": {"type": "integer", "nullable": True},
                            "wal_bytes": {"type": "integer", "nullable": True},
                            "segment_files": {"type": "integer", "nullable": True},
                            "segment_bytes": {"type": "integer", "nullable": True},
                            "snapshot_bytes": {"type": "integer", "nullable": True}}},
    "MemberStorage": {"type": "object",
                      "required": ["node", "segment_files", "segment_bytes", "snapshot_bytes"],
                      "properties": {"node": _STR, "segment_files": _INT, "segment_bytes": _INT,
                                     "snapshot_bytes": _INT}},
    "StorageManifest": {
        "type": "object",
        "required": ["node", "data_dir", "generated_at_ms", "wal", "groups", "deleting",
                     "cluster_groups", "total_bytes", "free_bytes"],
        "properties": {
            "node": _STR, "data_dir": _STR, "generated_at_ms": _INT,
            "total_bytes": {"type": "integer", "nullable": True},
            "free_bytes": {"type": "integer", "nullable": True},
            "wal": {"type": "array", "items": {
                "type": "object", "required": ["file", "seq", "bytes"],
                "properties": {"file": _STR, "seq": _INT, "bytes": _INT}}},
            "deleting": {"type": "array", "items": {
                "type": "object", "required": ["dir", "bytes"],
                "properties": {"dir": _STR, "bytes": _INT}}},
            "cluster_groups": {"type": "array", "items": {
                "type": "object", "required": ["group_id", "vhost", "queue", "members"],
                "properties": {"group_id": _STR, "vhost": _STR, "queue": _STR,
                               "members": {"type": "array", "items": _STR},
                               "leader": {"type": "string", "nullable": True}}}},
            "groups": {"type": "array", "items": {
                "type": "object",
                "required": ["group_id", "dir", "segments", "snapshot_index",
                             "smallest_live_index", "live_messages"],
                "properties": {
                    "group_id": _STR, "dir": _STR,
                    "vhost": {"type": "string", "nullable": True},
                    "queue": {"type": "string", "nullable": True},
                    "corrupt": {"type": "string", "nullable": True},
                    "snapshot_index": {"type": "integer", "nullable": True},
                    "snapshot_term": {"type": "integer", "nullable": True},
                    "snapshot_bytes": _INT,
                    "live_messages": {"type": "integer", "nullable": True},
                    "live_log_entries": {"type": "integer", "nullable": True},
                    "smallest_live_index": {"type": "integer", "nullable": True},
                    "oldest_live_timestamp_ms": {"type": "integer", "nullable": True},
                    "oldest_live_holder": {"type": "string", "nullable": True},
                    "unreadable_segments": {"type": "array", "items": _ANY_OBJ},
                    "segments": {"type": "array", "items": {
                        "type": "object",
                        "required": ["file", "seq", "first_index", "last_index", "entries",
                                     "bytes", "live_entries"],
                        "properties": {
                            "file": _STR, "seq": _INT, "first_index": _INT, "last_index": _INT,
                            "entries": _INT, "max_entries": _INT, "reset": _BOOL,
                            "bytes": _INT, "data_bytes": _INT,
                            "log_first": {"type": "integer", "nullable": True},
                            "log_last": {"type": "integer", "nullable": True},
                            "live_entries": {"type": "integer", "nullable": True}}}}}}}}},
    "Vhost": {"type": "object", "required": ["name"],
              "properties": {"name": _STR, "description": _STR,
                             "tags": {"type": "array", "items": _STR},
                             "default_queue_type": _STR, "tracing": _BOOL,
                             "metadata": _ANY_OBJ, "cluster_state": _ANY_OBJ}},
    "User": {"type": "object", "required": ["name", "tags"],
             "properties": {"name": _STR, "password_hash": _STR, "hashing_algorithm": _STR,
                            "tags": {"type": "array", "items": _STR}, "limits": _ANY_OBJ}},
    "VhostLimits": {"type": "object", "required": ["vhost", "value"],
                    "properties": {"vhost": _STR, "value": {
                        "type": "object", "additionalProperties": _INT,
                        "description": "max-connections, max-queues (negative: no limit)"}}},
    "UserLimits": {"type": "object", "required": ["user", "value"],
                   "properties": {"user": _STR, "value": {
                       "type": "object", "additionalProperties": _INT,
                       "description": "max-connections, max-channels (negative: no limit)"}}},
    "LimitValue": {"type": "object", "additionalProperties": False, "required": ["value"],
                   "properties": {"value": {
                       "type": "integer", "description": "negative: no limit; 0: none allowed"}}},
    "Permission": {"type": "object", "required": ["user", "vhost", "configure", "write", "read"],
                   "properties": {"user": _STR, "vhost": _STR, "configure": _STR,
                                  "write": _STR, "read": _STR}},
    "Exchange": {"type": "object", "required": ["name", "vhost", "type"],
                 "properties": {"name": _STR, "vhost": _STR, "type": _STR, "durable": _BOOL,
                                "auto_delete": _BOOL, "internal": _BOOL,
                                "arguments": _ANY_OBJ}},
    "Binding": {"type": "object", "required": ["source", "vhost", "destination",
                                               "destination_type", "routing_key"],
                "properties": {"source": _STR, "vhost": _STR, "destination": _STR,
                               "destination_type": {"type": "string",
                                                    "enum": ["queue", "exchange"]},
                               "routing_key": _STR, "arguments": _ANY_OBJ,
                               "properties_key": _STR}},
    "Queue": {"type": "object",
              "required": ["name", "vhost", "type", "durable", "arguments", "members",
                           "online", "messages", "messages_ready",
                           "messages_unacknowledged", "consumers"],
              "properties": {
                  "name": _STR, "vhost": _STR,
                  "type": {"type": "string", "enum": ["quorum", "classic"]},
                  "durable": _BOOL, "auto_delete": _BOOL, "exclusive": _BOOL,
                  "arguments": _ANY_OBJ,
                  "node": {"type": "string", "nullable": True},
                  "leader": {"type": "string", "nullable": True},
                  "members": {"type": "array", "items": _STR},
                  "online": {"type": "array", "items": _STR},
                  "state": _STR,
                  "policy": {"type": "string", "nullable": True},
                  "operator_policy": {"type": "string", "nullable": True},
                  "effective_policy_definition": _ANY_OBJ,
                  "messages": _INT, "messages_ready": _INT, "messages_unacknowledged": _INT,
                  "consumers": _INT, "message_bytes_ready": _INT,
                  "message_bytes_unacknowledged": _INT, "counts_known": _BOOL,
                  "messages_dlx": _INT, "message_bytes_dlx": _INT,
                  "message_stats": {"$ref": "#/components/schemas/MessageStats"},
                  "delivery_limit": {"type": "integer", "nullable": True}}},
    "QueueDeclaration": {
        "type": "object", "additionalProperties": False,
        "properties": {"durable": _BOOL, "auto_delete": _BOOL, "arguments": _ANY_OBJ,
                       "node": _STR, "type": {"type": "string", "enum": ["quorum", "classic"]}}},
    "Policy": {"type": "object", "required": ["vhost", "name", "pattern", "apply-to",
                                              "definition", "priority"],
               "properties": {"vhost": _STR, "name": _STR, "pattern": _STR, "apply-to": _STR,
                              "definition": _ANY_OBJ, "priority": _INT}},
    "PolicyDefinition": {
        "type": "object", "additionalProperties": False, "required": ["pattern", "definition"],
        "properties": {"pattern": _STR, "definition": _ANY_OBJ, "priority": _INT,
                       "apply-to": {"type": "string",
                                    "enum": ["all", "queues", "exchanges", "classic_queues",
                                             "quorum_queues", "streams"]}}},
    "MemberStatus": {"type": "object", "required": ["node"],
                     "properties": {"node": _STR, "raft_state": _STR, "term": _INT,
                                    "commit_index": _INT, "last_applied": _INT,
                                    "match_index": {"type": "integer", "nullable": True}},
                     "additionalProperties": True},
    "OperationResult": {"type": "object", "additionalProperties": True},
    "AddMember": {"type": "object", "additionalProperties": False, "required": ["node"],
                  "properties": {"node": _STR}},
    "Grow": {"type": "object", "additionalProperties": False, "required": ["node"],
             "properties": {"node": _STR, "strategy": {"type": "string", "enum": ["all", "even"]},
                            "vhost_pattern": _STR, "queue_pattern": _STR}},
    "Shrink": {"type": "object", "additionalProperties": False, "required": ["node"],
               "properties": {"node": _STR, "errors_only": _BOOL}},
    "Rebalance": {"type": "object", "additionalProperties": False,
                  "properties": {"vhost_pattern": _STR, "queue_pattern": _STR}},
    "MessageStats": {
        "type": "object", "additionalProperties": True,
        "required": ["publish", "deliver_get", "ack", "redeliver", "publish_details",
                     "deliver_get_details", "ack_details", "redeliver_details"],
        "properties": {**{f: _INT for f in ("publish", "confirm", "return_unroutable", "deliver",
                                            "deliver_no_ack", "get", "get_no_ack", "ack",
                                            "redeliver", "deliver_get")},
                       **{f"{f}_details": {"type": "object", "required": ["rate"],
                                           "properties": {"rate": {"type": "number"}}}
                          for f in ("publish", "deliver_get", "ack", "redeliver")}}},
    "ConnectionDetails": {"type": "object", "required": ["name", "peer_host", "peer_port"],
                          "properties": {"name": _STR, "peer_host": _STR, "peer_port": _INT}},
    "Connection": {
        "type": "object", "additionalProperties": True,
        "required": ["name", "node", "vhost", "user", "state", "channels", "protocol",
                     "peer_host", "peer_port", "host", "port", "connected_at",
                     "client_properties"],
        "properties": {"name": _STR, "node": _STR, "vhost": _STR, "user": _STR, "state": _STR,
                       "type": _STR, "channels": _INT, "protocol": _STR, "auth_mechanism": _STR,
                       "ssl": _BOOL, "peer_host": _STR, "peer_port": _INT, "host": _STR,
                       "port": _INT, "connected_at": _INT, "channel_max": _INT,
                       "frame_max": _INT, "timeout": _INT, "user_who_performed_action": _STR,
                       "client_properties": _ANY_OBJ}},
    "Channel": {
        "type": "object", "additionalProperties": True,
        "required": ["name", "number", "node", "vhost", "user", "connection_details", "state",
                     "consumer_count", "messages_unacknowledged", "prefetch_count",
                     "message_stats"],
        "properties": {"name": _STR, "number": _INT, "node": _STR, "vhost": _STR, "user": _STR,
                       "user_who_performed_action": _STR,
                       "connection_details": {"$ref": "#/components/schemas/ConnectionDetails"},
                       "state": _STR, "consumer_count": _INT, "messages_unacknowledged": _INT,
                       "messages_unconfirmed": _INT, "messages_uncommitted": _INT,
                       "acks_uncommitted": _INT, "prefetch_count": _INT,
                       "global_prefetch_count": _INT, "confirm": _BOOL, "transactional": _BOOL,
                       "message_stats": {"$ref": "#/components/schemas/MessageStats"}}},
    "Consumer": {
        "type": "object", "additionalProperties": True,
        "required": ["consumer_tag", "queue", "channel_details", "ack_required", "exclusive",
                     "prefetch_count", "active", "arguments"],
        "properties": {"consumer_tag": _STR,
                       "queue": {"type": "object", "required": ["name", "vhost"],
                                 "properties": {"name": _STR, "vhost": _STR}},
                       "channel_details": _ANY_OBJ, "ack_required": _BOOL, "exclusive": _BOOL,
                       "prefetch_count": _INT, "active": _BOOL, "activity_status": _STR,
                       "consumer_timeout": _INT, "arguments": _ANY_OBJ}},
    "GetMessages": {
        "type": "object", "additionalProperties": False,
        "required": ["count", "ackmode", "encoding"],
        "properties": {"count": {"oneOf": [{"type": "integer", "minimum": 0},
                                           {"type": "string", "pattern": "^[0-9]+$"}]},
                       "ackmode": {"type": "string", "enum": ["ack_requeue_true",
                                                              "ack_requeue_false",
                                                              "reject_requeue_true",
                                                              "reject_requeue_false"]},
                       "encoding": {"type": "string", "enum": ["auto", "base64"]},
                       "truncate": {"oneOf": [{"type": "integer", "minimum": 0},
                                              {"type": "string", "pattern": "^[0-9]+$"}]},
                       "requeue": _BOOL, "vhost": _STR, "name": _STR}},
    "GotMessage": {
        "type": "object",
        "required": ["payload_bytes", "redelivered", "exchange", "routing_key", "message_count",
                     "properties", "payload", "payload_encoding"],
        "properties": {"payload_bytes": _INT, "redelivered": _BOOL, "exchange": _STR,
                       "routing_key": _STR, "message_count": _INT, "properties": _ANY_OBJ,
                       "payload": _STR,
                       "payload_encoding": {"type": "string", "enum": ["string", "base64"]}}},
    "PublishMessage": {
        "type": "object", "additionalProperties": False,
        "required": ["properties", "routing_key", "payload", "payload_encoding"],
        "properties": {"properties": _ANY_OBJ, "routing_key": _STR, "payload": _STR,
                       "payload_encoding": {"type": "string", "enum": ["string", "base64"]},
                       "vhost": _STR, "name": _STR, "headers": _ANY_OBJ, "props": _ANY_OBJ,
                       "delivery_mode": {"oneOf": [_STR, _INT]}}},
    "Routed": {"type": "object", "required": ["routed"], "properties": {"routed": _BOOL}},
    "Empty": {"type": "object", "additionalProperties": False, "properties": {}},
    "DrainOptions": {
        "type": "object", "additionalProperties": False,
        "properties": {"desired_replicas": {
            "type": "integer", "minimum": 0,
            "description": "a StatefulSet scale-down: pods with ordinals at or above this are "
                           "leaving too and receive no member (cluster.discovery = statefulset "
                           "only; a 400 otherwise)"}}},
    "VhostDefinition": {
        "type": "object", "additionalProperties": False,
        "properties": {"description": _STR, "tracing": _BOOL,
                       "tags": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
                       "default_queue_type": {"type": "string", "enum": ["classic", "quorum"]}}},
    "UserDefinition": {
        "type": "object", "additionalProperties": False,
        "properties": {"password": _STR, "password_hash": _STR, "hashing_algorithm": _STR,
                       "tags": {"oneOf": [_STR, {"type": "array", "items": _STR}]}}},
    "PermissionDefinition": {
        "type": "object", "additionalProperties": False, "required": ["configure", "write", "read"],
        "properties": {"configure": _STR, "write": _STR, "read": _STR}},
}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query_bool(name: str, doc: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": "boolean"},
            "description": doc}


def _json(schema: dict[str, Any], doc: str) -> dict[str, Any]:
    return {"description": doc, "content": {JSON: {"schema": schema}}}


_ERR = _json(_ref("Error"), "refused: {error, reason}")
_NO_CONTENT = {"description": "done"}
_PROGRESS = _query_bool("progress", "stream NDJSON progress lines, then a result line")


def _op(summary: str, ok: dict[str, dict[str, Any]], params: tuple[str, ...] = (),
        query: list[dict[str, Any]] | None = None, body: str | None = None,
        public: bool = False, tag: str = "api") -> dict[str, Any]:
    responses: dict[str, Any] = dict(ok)
    for code in ("400", "404", "405", "409", "501"):
        responses.setdefault(code, _ERR)
    if not public:
        responses.setdefault("401", _ERR)
        responses.setdefault("403", _ERR)
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "responses": responses,
                          "parameters": [_path_param(p) for p in params] + (query or [])}
    if body is not None:
        op["requestBody"] = {"required": body not in ("Empty", "DrainOptions", "Rebalance", "QueueDeclaration",
                                                      "VhostDefinition", "UserDefinition"),
                             "content": {JSON: {"schema": _ref(body)}}}
    if public:
        op["security"] = []
    return op


def _long(summary: str, body: str, params: tuple[str, ...] = ()) -> dict[str, Any]:
    ok = {"200": {"description": "per-queue results (NDJSON lines with ?progress=true)",
                  "content": {JSON: {"schema": _list_of("OperationResult")},
                              "application/x-ndjson": {"schema": {"type": "string"}}}}}
    return _op(summary, ok, params, [_PROGRESS], body, tag="quorum queues")


VQ = ("vhost", "name")
POLICY_PATHS: dict[str, Any] = {}
for _kind, _doc in (("policies", "policy"), ("operator-policies", "operator policy")):
    POLICY_PATHS[f"/api/{_kind}"] = {"get": _op(f"every {_doc}", {"200": _json(_list_of("Policy"), "list")})}
    POLICY_PATHS[f"/api/{_kind}/{{vhost}}"] = {
        "get": _op(f"{_doc}s in a vhost", {"200": _json(_list_of("Policy"), "list")}, ("vhost",))}
    POLICY_PATHS[f"/api/{_kind}/{{vhost}}/{{name}}"] = {
        "get": _op(f"one {_doc}", {"200": _json(_ref("Policy"), "the policy")}, VQ),
        "put": _op(f"set a {_doc} (applied live to matching queues)",
                   {"201": _NO_CONTENT, "204": _NO_CONTENT}, VQ, body="PolicyDefinition"),
        "delete": _op(f"clear a {_doc}", {"204": _NO_CONTENT}, VQ),
    }

PATHS: dict[str, Any] = {
    "/api/overview": {"get": _op("cluster overview", {"200": _json(_ref("Overview"), "overview")})},
    "/api/whoami": {"get": _op("the authenticated user and its tags", {"200": _json(
        {"type": "object", "required": ["name", "tags"],
         "properties": {"name": _STR, "tags": {"type": "array", "items": _STR}}}, "the user")})},
    "/api/nodes": {"get": _op("cluster nodes", {"200": _json(_list_of("Node"), "list")})},
    "/api/nodes/{node}": {
        "get": _op("one node", {"200": _json(_ref("Node"), "node")}, ("node",)),
        "delete": _op("remove a drained node from the cluster (metadata leader only; others "
                      "answer 409 naming the leader)", {"204": _NO_CONTENT, "503": _ERR}, ("node",))},
    "/api/nodes/{node}/hand-off-leaders": {"post": _long(
        "move a node's quorum-queue leaderships (and its own metadata leadership) to other "
        "online members", "Empty", ("node",))},
    "/api/nodes/{node}/storage": {"get": _op(
        "storage manifest of this node: WAL and segment files, index ranges, live entries "
        "(for the Spark audit; each node serves its own, another node's name is a 501)",
        {"200": _json(_ref("StorageManifest"), "manifest")}, ("node",))},
    "/api/nodes/{node}/drain": {"post": _long(
        "move every quorum-queue member and leadership off a node", "DrainOptions", ("node",))},
    "/api/vhosts": {"get": _op("vhosts", {"200": _json(_list_of("Vhost"), "list")})},
    "/api/vhosts/{vhost}": {
        "get": _op("one vhost", {"200": _json(_ref("Vhost"), "vhost")}, ("vhost",)),
        "put": _op("create or update a vhost", {"201": _NO_CONTENT, "204": _NO_CONTENT},
                   ("vhost",), body="VhostDefinition"),
        "delete": _op("delete a vhost and everything in it", {"204": _NO_CONTENT}, ("vhost",)),
    },
    "/api/users": {"get": _op("users", {"200": _json(_list_of("User"), "list")})},
    "/api/users/{user}": {
        "get": _op("one user", {"200": _json(_ref("User"), "user")}, ("user",)),
        "put": _op("create or update a user", {"201": _NO_CONTENT, "204": _NO_CONTENT},
                   ("user",), body="UserDefinition"),
        "delete": _op("delete a user", {"204": _NO_CONTENT}, ("user",)),
    },
    "/api/permissions": {"get": _op("permissions", {"200": _json(_list_of("Permission"), "list")})},
    "/api/permissions/{vhost}/{user}": {
        "get": _op("a user's permissions in a vhost", {"200": _json(_ref("Permission"), "it")},
                   ("vhost", "user")),
        "put": _op("set a user's permissions in a vhost", {"201": _NO_CONTENT, "204": _NO_CONTENT},
                   ("vhost", "user"), body="PermissionDefinition"),
        "delete": _op("clear a user's permissions in a vhost", {"204": _NO_CONTENT},
                      ("vhost", "user")),
    },
    "/api/vhost-limits": {"get": _op("limits of every vhost that has some",
                                     {"200": _json(_list_of("VhostLimits"), "list")})},
    "/api/vhost-limits/{vhost}": {"get": _op(
        "a vhost's limits (an empty list: none)", {"200": _json(_list_of("VhostLimits"), "list")},
        ("vhost",))},
    "/api/vhost-limits/{vhost}/{name}": {
        "put": _op("set a vhost limit: name max-connections (cluster-wide, refused at "
                   "connection.open with 530) or max-queues (refused at queue.declare with 406)",
                   {"204": _NO_CONTENT}, VQ, body="LimitValue"),
        "delete": _op("clear a vhost limit (204 whether or not it was set)",
                      {"204": _NO_CONTENT}, VQ)},
    "/api/user-limits": {"get": _op("limits of every user that has some",
                                    {"200": _json(_list_of("UserLimits"), "list")})},
    "/api/user-limits/{user}": {"get": _op(
        "a user's limits (an empty list: none)", {"200": _json(_list_of("UserLimits"), "list")},
        ("user",))},
    "/api/user-limits/{user}/{name}": {
        "put": _op("set a user limit: name max-connections or max-channels (cluster-wide, "
                   "refused with 530)", {"204": _NO_CONTENT}, ("user", "name"), body="LimitValue"),
        "delete": _op("clear a user limit (204 whether or not it was set)",
                      {"204": _NO_CONTENT}, ("user", "name"))},
    "/api/exchanges": {"get": _op("exchanges", {"200": _json(_list_of("Exchange"), "list")})},
    "/api/exchanges/{vhost}": {"get": _op("exchanges in a vhost",
                                          {"200": _json(_list_of("Exchange"), "list")}, ("vhost",))},
    "/api/exchanges/{vhost}/{name}/publish": {"post": _op(
        "publish one message through an exchange; answered once every routed queue enqueued it",
        {"200": _json(_ref("Routed"), "whether any queue took it"), "503": _ERR}, VQ,
        body="PublishMessage")},
    "/api/connections": {"get": _op("this node's AMQP connections",
                                    {"200": _json(_list_of("Connection"), "list")})},
    "/api/connections/{name}": {
        "get": _op("one connection", {"200": _json(_ref("Connection"), "connection")}, ("name",)),
        "delete": _op("close a connection (320 CONNECTION_FORCED; reason from X-Reason)",
                      {"204": _NO_CONTENT}, ("name",))},
    "/api/connections/{name}/channels": {"get": _op(
        "a connection's channels", {"200": _json(_list_of("Channel"), "list")}, ("name",))},
    "/api/channels": {"get": _op("this node's channels, with message_stats",
                                 {"200": _json(_list_of("Channel"), "list")})},
    "/api/vhosts/{vhost}/connections": {"get": _op(
        "this node's connections in a vhost", {"200": _json(_list_of("Connection"), "list")},
        ("vhost",))},
    "/api/vhosts/{vhost}/channels": {"get": _op(
        "this node's channels in a vhost", {"200": _json(_list_of("Channel"), "list")},
        ("vhost",))},
    "/api/channels/{name}": {"get": _op("one channel", {"200": _json(_ref("Channel"), "channel")},
                                        ("name",))},
    "/api/consumers": {"get": _op("this node's consumers",
                                  {"200": _json(_list_of("Consumer"), "list")})},
    "/api/consumers/{vhost}": {"get": _op("consumers in a vhost",
                                          {"200": _json(_list_of("Consumer"), "list")},
                                          ("vhost",))},
    "/api/bindings": {"get": _op("bindings", {"200": _json(_list_of("Binding"), "list")})},
    "/api/bindings/{vhost}": {"get": _op("bindings in a vhost",
                                         {"200": _json(_list_of("Binding"), "list")}, ("vhost",))},
    "/api/queues": {"get": _op("queues", {"200": _json(_list_of("Queue"), "list")})},
    "/api/queues/{vhost}": {"get": _op("queues in a vhost",
                                       {"200": _json(_list_of("Queue"), "list")}, ("vhost",))},
    "/api/queues/{vhost}/{name}": {
        "get": _op("one queue: type, members, leader, online members, counts, effective policy",
                   {"200": _json(_ref("Queue"), "queue")}, VQ),
        "put": _op("declare a queue", {"201": _NO_CONTENT, "204": _NO_CONTENT}, VQ,
                   body="QueueDeclaration"),
        "delete": _op("delete a queue", {"204": _NO_CONTENT}, VQ, query=[
            _query_bool("if-empty", "refuse (400) when the queue holds messages"),
            _query_bool("if-unused", "refuse (400) when the queue has consumers")]),
    },
    "/api/queues/{vhost}/{name}/contents": {"delete": _op("purge a queue", {"204": _NO_CONTENT},
                                                          VQ, query=None)},
    "/api/queues/{vhost}/{name}/get": {"post": _op(
        "get messages (then ack, requeue or reject them, per ackmode)",
        {"200": _json(_list_of("GotMessage"), "the messages"), "503": _ERR}, VQ,
        body="GetMessages")},
    "/api/queues/{vhost}/{name}/quorum-status": {"get": _op(
        "Raft status of every member", {"200": _json(_list_of("MemberStatus"), "members")}, VQ,
        tag="quorum queues")},
    "/api/queues/{vhost}/{name}/storage": {"get": _op(
        "segment files and bytes and snapshot bytes of every reachable member",
        {"200": _json(_list_of("MemberStorage"), "members' storage")}, VQ, tag="quorum queues")},
    "/api/queues/{vhost}/{name}/members": {"post": _op(
        "add a member on a node", {"204": _NO_CONTENT}, VQ, body="AddMember",
        tag="quorum queues")},
    "/api/queues/{vhost}/{name}/leader": {"post": _op(
        "move the queue's leadership to the member on a node", {"204": _NO_CONTENT}, VQ,
        body="AddMember", tag="quorum queues")},
    "/api/queues/{vhost}/{name}/members/{node}": {"delete": _op(
        "remove the member on a node (refused when it would lose quorum, unless forced)",
        {"204": _NO_CONTENT}, ("vhost", "name", "node"),
        query=[_query_bool("force", "remove even when the remaining members lack quorum")],
        tag="quorum queues")},
    "/api/quorum-queues/grow": {"post": _long("add members on a node to matching queues", "Grow")},
    "/api/quorum-queues/shrink": {"post": _long("remove members on a node", "Shrink")},
    "/api/quorum-queues/rebalance": {"post": _long("spread leaders evenly", "Rebalance")},
    **POLICY_PATHS,
    "/api/health/checks/alarms": {"get": _op(
        "503 when a resource alarm is in effect",
        {"200": _json(_ref("Status"), "ok"), "503": _json(_ref("Status"), "alarms")})},
    "/api/health/checks/local-alarms": {"get": _op(
        "503 when a resource alarm is in effect on this node",
        {"200": _json(_ref("Status"), "ok"), "503": _json(_ref("Status"), "alarms")})},
    "/api/health/checks/node-is-quorum-critical": {"get": _op(
        "503 when stopping the node would leave a quorum queue without quorum",
        {"200": _json(_ref("Status"), "ok"), "503": _json(_ref("Status"), "critical queues")},
        query=[{"name": "node", "in": "query", "required": False, "schema": {"type": "string"},
                "description": "the node to check (default: this one)"}])},
    "/api/health/checks/raft-groups": {"get": _op(
        "503 when a Raft group (queue member or metadata) on this node is stopped",
        {"200": _json(_ref("Status"), "ok"), "503": _json(_ref("Status"), "stopped groups")})},
    "/api/health/live": {"get": _op("liveness probe", {"200": _json(_ref("Status"), "alive")},
                                    public=True, tag="probes")},
    "/api/health/ready": {"get": _op(
        "readiness probe", {"200": _json(_ref("Status"), "ready"),
                            "503": _json(_ref("Status"), "not ready")}, public=True, tag="probes")},
    "/api/openapi.json": {"get": _op("this document", {"200": _json(_ANY_OBJ, "OpenAPI 3.0")},
                                     public=True, tag="probes")},
}


def operation_id(method: str, path: str) -> str:
    """A stable id: the method and the path's literal segments, camel-cased
    (``DELETE /api/vhosts/{vhost}`` -> ``deleteVhosts``; parameters as ``By<Name>``)."""
    parts = []
    for seg in path.split("/")[2:]:
        if seg.startswith("{"):
            parts.append("By" + seg[1:-1].capitalize())
        else:
            parts.append("".join(w.capitalize() for w in seg.replace("-", "_").split("_")))
    return method.lower() + "".join(parts).replace(".", "")


for _path, _ops in PATHS.items():
    for _method, _spec in _ops.items():
        _spec["operationId"] = operation_id(_method, _path)


@lru_cache(maxsize=1)
def _document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "quorumq management API", "version": "1.0.0",
                 "description": "RabbitMQ management API paths and shapes where they exist, "
                                "plus quorum-queue membership operations."},
        "paths": PATHS,
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
        "security": [{"basic": []}],
    }


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may mutate it)."""
    return copy.deepcopy(_document())
