"""Chaos testing on real processes (Jepsen-style): fault proxies, seeded fault schedules, the process
group, the recorded history and the checker. ``controlplane bench chaos`` drives it; see
docs/reliability.md."""
