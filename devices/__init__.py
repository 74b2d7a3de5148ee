"""zinfer.devices."""
