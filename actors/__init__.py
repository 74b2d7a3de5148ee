"""zinfer.actors."""
