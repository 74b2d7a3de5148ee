"""zinfer.models."""
