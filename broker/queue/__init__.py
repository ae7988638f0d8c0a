"""The quorum-queue state machine (rabbit_fifo semantics), pure."""
