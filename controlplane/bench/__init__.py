"""Benchmarks that run real processes and write machine-readable results (``controlplane bench ...``).

``raft``: commit latency, throughput and failover of the coordinators' replicated decisions, with
bare pysyncobj measured in the same run as the floor (``controlplane/bench/raft.py``,
``docs/benchmarks-raft.md``).
"""
