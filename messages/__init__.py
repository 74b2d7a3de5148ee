"""zinfer.messages: the protocol: every msgspec Struct that crosses a socket, grouped by
the actor that receives it, the codec, and the trio + ZeroMQ socket layer.

May import: no other zinfer folder. Only actors and gateway import it.

The wire evolves by appending: a new field goes last with a default, so a peer built before
it decodes the message and ignores the field (array_like structs drop extra trailing items),
and a message that leaves it at its default means what it meant before.
"""
