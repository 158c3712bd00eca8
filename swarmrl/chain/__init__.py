"""The chain layer: contracts on an Ethereum L2 (anvil locally, Base Sepolia publicly).

Modules, lowest first (this package imports none of them eagerly, so the CLI
stays fast to start):

- ``errors``     the ChainError hierarchy; every message is one sentence
- ``anvil``      a local anvil subprocess, dev accounts, time travel and snapshots
- ``artifacts``  compiled ABIs and bytecode from contracts/out
- ``revert``     revert data decoded by name and arguments from the ABIs
- ``tx``         TxSender: nonces, gas, EIP-1559 fees, receipts, retries
- ``eip712``     NodeConsent, Submission and Permit digests and signatures; the
                 work-commitment Merkle tree (OpenZeppelin MerkleProof)
- ``deploy``     deploying the protocol; the deployment file (pydantic)
- ``paths``      where the local chain's state and the deployment file live
- ``contracts``  Contracts: every contract operation as a typed call
- ``cli``        `swarmrl chain up|down|status|deploy|mint|fund`
"""
