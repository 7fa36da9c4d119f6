"""Per-cluster adapters: the side that acts on Kubernetes and the inference engines.

Each adapter enforces fencing (it persists the highest epoch it has seen and rejects lower ones),
applies commands idempotently by request id, and streams observations back. The simulator's
in-process adapter is ``controlplane.sim.cluster.SimFleet``; the Kubernetes, vLLM, Triton,
DeepSpeed-MII and NVML drivers arrive with their own issue.
"""
