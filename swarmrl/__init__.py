"""swarmrl: decentralized reinforcement learning of language models.

The core library that the volunteer node (`client`) and the coordinator
(`orchestrator`) share. Its native kernels are reached only through
`swarmrl.toploc`, `swarmrl.shards` and `swarmrl.delta`.
"""

__version__ = "0.1.0"
