"""The asyncio I/O shell: node driver loop, effect interpreter, AMQP server
protocol, peer transport, timers, flow control. Nothing imports this package."""
