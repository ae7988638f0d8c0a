"""quorumq's Kubernetes operator (kopf).

The folder is `operator/` but the import name is `quorumq_operator`: the
standard library owns `operator`.
"""
API_GROUP = "quorumq.dev"
API_VERSION = "v1alpha1"
