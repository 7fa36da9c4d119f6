"""The discrete-event simulator: replays request traces through simulated clusters in virtual time,
driving the same ``core`` decisions and ``runtime`` control loop as production."""
