"""Cluster metadata state machine (vhosts, users, exchanges, bindings, queues, policies), pure."""
