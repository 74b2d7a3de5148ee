"""OpenAI-compatible HTTP routes (placeholder until written)."""


def routes(state):
    return []
