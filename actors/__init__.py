"""zinfer.actors: one file per actor, named <role>_actor.py (front_door, scheduler, kv,
executor, sampler), each actor's logic beside it in a file named for that logic (sampling,
scheduler_core, scheduler_policy, kv_allocator, prompt_encoding, constraints, ...), and the
engine that starts a topology of them.

May import: models, devices (the executors, the target's and a draft model's, and the engine's
modules only), kernels, messages,
traces. Never gateway: the gateways drive the engine from above, through
zinfer.actors.engine and the messages/ wire.
"""
