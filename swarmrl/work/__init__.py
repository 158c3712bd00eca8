"""The work protocol between nodes and the orchestrator: join, heartbeat, work, submit.

Each protocol is one module with its id, request and response models, size
limits and deadline; :mod:`swarmrl.work.signed` holds what they sign.
"""
