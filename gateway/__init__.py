"""zinfer.gateway: how the world gets in: the `zinfer` command, the OpenAI-compatible HTTP
API, the websocket chat, the ZeroMQ client and stdio embedding.

May import: actors (zinfer.actors.engine only: open_engine, EngineConfig, Engine), models,
devices, kernels, messages, traces. Nothing imports the gateway.
"""
