"""The work protocol between nodes and the orchestrator: join, heartbeat, work, submit.

Each protocol is one module with its request and response models and one typed
spec (:mod:`swarmrl.p2p.protocol`: id, codecs, size limits, deadline) that both
sides serve and call through; what they sign is an EIP-712 struct
(:class:`swarmrl.chain.eip712.Signed`).
"""
