"""Command-line interfaces: ``controlplane`` (operators) and ``tenantctl`` (platform teams)."""
