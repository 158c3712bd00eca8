"""The chain layer: contracts on an Ethereum L2 (anvil locally, Base Sepolia publicly).

Modules, lowest first (this package imports none of them eagerly, so the CLI
stays fast to start):

- ``errors``     the ChainError hierarchy; every message is one sentence
- ``anvil``      a local anvil subprocess, dev accounts, time travel and snapshots
- ``artifacts``  compiled ABIs and bytecode from contracts/out
- ``revert``     revert data decoded by name and arguments from the ABIs
- ``tx``         TxSender: nonces, gas, EIP-1559 fees, receipts, retries
- ``tokens``     token amounts as people write them, and in base units
- ``deploy``     deploying the protocol; the deployment file (pydantic)
- ``deploy_protocol``  `swarmrl chain deploy` with a keystore key, checked first
- ``paths``      where the local chain's state and the deployment file live
- ``recorded_work``  an epoch's recorded work: its parts, leaves and their proofs
- ``link``       Link: one deployment on one connection with the one TxSender every
                 contract handle shares; ContractHandle, the base of each handle
- ``stake_token``, ``provider_registry``, ``stake_manager``, ``compute_pool``
                 one handle per contract, every operation as a typed call, with the
                 contract's value types (Unbonding; WorkRecord, Membership, ...)
- ``contracts``  Contracts: the four handles (token, registry, stakes, pool) on one
                 link, and the chain-wide reads (the clock, an account's history)
- ``cli``        `swarmrl chain up|down|status|deploy|mint|fund`

The EIP-712 structs and the work commitment's Merkle tree are in ``swarmrl.eip712``.
"""
