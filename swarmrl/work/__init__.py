"""The work protocol between nodes and the orchestrator: join, heartbeat, work, submit.

Each protocol is one module with its id, request and response models, size
limits and deadline; what they sign is an EIP-712 struct (:class:`swarmrl.chain.eip712.Signed`).
"""
