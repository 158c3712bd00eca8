"""The swarm: libp2p peers and peer-to-peer weight broadcast.

Modules, lowest first:

- ``wire``      protocol ids, varint frames with limits, strict JSON messages
- ``records``   EIP-712 records peers sign: PeerRecord (peer id <-> account) and
                Announcement (a checkpoint's manifest hash, signed by the origin)
- ``identity``  the persistent libp2p key beside a node's keystore
- ``host``      one libp2p host per process in a trio thread, behind a bridge
- ``messages``  topics, protocol ids and the control messages
- ``store``     versions on disk: verified shards, resume, keep-N and budget
- ``datapath``  shard bytes over plain TCP (sendfile out, recv_into in)
- ``fetch``     the peer book and the multi-peer download scheduler
- ``swarm``     SwarmNode: origin and node in one class
- ``cli``       `swarmrl weights serve|pull`
"""
