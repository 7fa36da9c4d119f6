"""Pure domain values and the replicated state machine.

Nothing in this package reads a clock, does I/O, logs, or draws random numbers; it imports only the
standard library's pure modules and itself.
"""
