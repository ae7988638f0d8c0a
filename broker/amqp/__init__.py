"""Sans-I/O AMQP 0-9-1: codec and connection/channel state machines."""
