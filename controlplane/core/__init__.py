"""Pure decisions over domain values. Every function takes ``now_ms``; every result carries a reason.

Nothing here reads a clock, does I/O, logs or draws global randomness (an injected, seeded
``random.Random`` where jitter is needed). Imports: the standard library and ``controlplane.domain``.
"""
