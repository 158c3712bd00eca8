"""libp2p plumbing that every protocol of swarmrl rides: the weight swarm
(:mod:`swarmrl.weights`) and the work protocols (:mod:`swarmrl.work`). Nothing here
knows either; neither imports the other.

Modules, lowest first:

- ``wire``      protocol ids, varint frames with limits, strict JSON messages
- ``protocol``  typed specs of request-response protocols and uploads: id, codecs,
                limits, deadline
- ``pacing``    a byte-rate cap shared by every thread that moves bytes
- ``ports``     one process per listen port, said in one sentence when it is taken
- ``identity``  the persistent libp2p key beside a node's keystore
- ``host``      one libp2p host per process in a trio thread, behind a bridge
- ``direct``    the specs served in one process, without the network (tests, benchmarks)
"""
