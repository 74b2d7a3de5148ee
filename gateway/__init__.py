"""zinfer.gateway."""
