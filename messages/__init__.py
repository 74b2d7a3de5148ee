"""zinfer.messages."""
