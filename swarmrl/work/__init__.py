"""The work protocol between nodes and the orchestrator: join, heartbeat, work, submit.

Each protocol is one module with its request and response models and one typed
spec (:mod:`swarmrl.p2p.protocol`: id, codecs, size limits, deadline) that both
sides serve and call through; what they sign is an EIP-712 struct
(:class:`swarmrl.eip712.Signed`).

The four share one version, :data:`WORK_PROTOCOL`: a node states it when it joins
and the orchestrator refuses another, so peers of two releases part at the join in
one sentence instead of misreading each other later.
"""

# Raise it with any change to the work protocols that a peer of the release before
# would misread or refuse (a field added, dropped or given another meaning). The join
# claim and its reply must stay readable to both sides for the refusal to arrive:
# a change to their shape takes a new join protocol id as well.
WORK_PROTOCOL = 1

# How the orchestrator's refusal of another work protocol begins: the node tells it
# from any other refusal by this, and stops instead of trying again.
VERSION_REFUSAL = "this orchestrator speaks work protocol"
