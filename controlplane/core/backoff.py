"""Exponential backoff with jitter from an injected, seeded rng.

CONTRACT: def backoff_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random) -> int
    # "equal jitter": d = min(cap, base * 2**attempt); return d//2 + rng.randint(0, d - d//2)
"""
