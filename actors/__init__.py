"""zinfer.actors: one file per actor (tokenizer, scheduler, kv, executor, sampler), each
actor's logic beside it, and the engine that starts a topology of them.

May import: models, devices (the executor and the engine's modules only), kernels, messages,
traces. Never gateway: the gateways drive the engine from above, through
zinfer.actors.engine and the messages/ wire.
"""
