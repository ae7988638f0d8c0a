"""A kopf plugin for tests: log in to the stand-in API at $QQ_TEST_KUBE_URL.

(kopf's default login reads the kubeconfig through the kubernetes client,
which fixes the kubeconfig path when it is first imported; a login handler
is kopf's documented way to point an operator at another API server.)
"""
from __future__ import annotations

import os
from typing import Any

import kopf


@kopf.on.login()
def login_to_stand_in_api(**_: Any) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=os.environ["QQ_TEST_KUBE_URL"], insecure=True,
                               default_namespace="messaging")
