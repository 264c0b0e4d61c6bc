"""The core both halves share, importing nothing above it: the error tree, the message values
and the envelope, the receipt wire format, the outbox states with their one transition table and
the one compare-and-set helper, the outbox row type, the schema and its DDL, and small helpers
(clock, URLs, identifiers, engines, batching).

Layers (docs/architecture.md): cli > consumer half | producer half | reconciler > transports >
core. `import consumer_kit.core` loads neither half.
"""
