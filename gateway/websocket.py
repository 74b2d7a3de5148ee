"""Websocket chat endpoint and chat page routes (placeholder until written)."""


def routes(state):
    return []
