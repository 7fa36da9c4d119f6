"""Adapter tests against protocol-faithful fakes."""
