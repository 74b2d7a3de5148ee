"""zinfer.traces."""
