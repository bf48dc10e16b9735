"""Transports: the sockets. ZeroMQ DEALER connections and fabric's stream transport on the
client side, the stream listener on the node side. The messages they carry are encoded and
decoded by the pure :mod:`fabric.protocol`; nothing here knows what a queue is."""
