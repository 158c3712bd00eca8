"""The swarm: libp2p peers and peer-to-peer weight broadcast.

Modules, lowest first:

- ``wire``      protocol ids, varint frames with limits, strict JSON messages
- ``protocol``  typed specs of request-response protocols and uploads: id, codecs,
                limits, deadline (the work protocols, swarmrl.work, use them too)
- ``records``   EIP-712 records peers sign: PeerRecord (peer id <-> account) and
                Announcement (a checkpoint's manifest hash, signed by the origin)
- ``identity``  the persistent libp2p key beside a node's keystore
- ``host``      one libp2p host per process in a trio thread, behind a bridge
- ``messages``  the gossip: topics, adverts and their bounds
- ``manifest``, ``have``, ``dialback``  the swarm's protocols, a spec each
- ``store``     versions on disk: verified shards, resume, keep-N and budget
- ``datapath``  shard bytes over plain TCP (sendfile out, recv_into in)
- ``fetch``     the peer book and the multi-peer download scheduler
- ``swarm``     the weight swarm: SwarmNode wires its origin (publishing), fetcher
                (following and downloading) and advertiser (adverts, serving) to a host
- ``cli``       `swarmrl weights serve|pull`
"""
