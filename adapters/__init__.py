"""Per-cluster adapters: the side that acts on Kubernetes and the inference engines.

Each adapter enforces fencing (it persists the highest epoch it has seen and rejects lower ones),
applies commands idempotently by request id, and streams observations back. The simulator's
in-process adapter is ``controlplane.sim.cluster.SimFleet``. ``service.py`` holds the fencing guard
and the gRPC service; ``vllm.py``, ``triton.py``, ``deepspeed_mii.py`` and ``gpu.py`` are the engine
and NVML drivers, each tested against a protocol-faithful fake in ``tests/fakes``. The Kubernetes
backend and the observation stream are still to come.
"""
