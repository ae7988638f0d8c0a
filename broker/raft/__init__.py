"""Sans-I/O Raft (etcd-raft shape). See docs/ARCHITECTURE.md."""
