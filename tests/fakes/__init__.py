"""Protocol-faithful fakes of the real systems the adapters talk to (see shared/design/CONTRACTS.md)."""
