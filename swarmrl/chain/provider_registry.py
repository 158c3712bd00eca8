"""ProviderRegistry: providers register and take nodes, each with the node's signed
consent (EIP-712, in this registry's domain)."""

from __future__ import annotations

from typing import ClassVar

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from web3.types import TxReceipt

from swarmrl import eip712
from swarmrl.chain.link import ContractHandle, cs, topic


class ProviderRegistry(ContractHandle):
    """Who is a provider, and which provider each node belongs to."""

    name: ClassVar[str] = "ProviderRegistry"

    def domain(self) -> eip712.Domain:
        """The registry's EIP-712 domain: chain id and address of this deployment."""
        return eip712.registry_domain(self.link.deployment.chain_id, self.address)

    def register_provider(self) -> TxReceipt:
        return self._send(self.contract.functions.registerProvider())

    def is_provider(self, account: str) -> bool:
        return self._read(bool, self.contract.functions.isProvider(cs(account)))

    def provider_of(self, node: str) -> str | None:
        provider = self._call(self.contract.functions.providerOf(cs(node)))
        return None if int(provider, 16) == 0 else to_checksum_address(provider)

    def nodes_of(self, provider: str) -> list[str]:
        nodes = self._call(self.contract.functions.nodesOf(cs(provider)))
        return [to_checksum_address(n) for n in nodes]

    def consent_nonce(self, node: str) -> int:
        return self._read(int, self.contract.functions.consentNonce(cs(node)))

    def node_consent(
        self, node: LocalAccount, provider: str, *, deadline: int | None = None, ttl: int = 3600
    ) -> tuple[eip712.NodeConsent, bytes]:
        """Run by the node: its consent to `provider`, signed with the current nonce."""
        if deadline is None:
            deadline = self.link.chain_time() + ttl
        consent = eip712.NodeConsent(
            provider=cs(provider),
            node=node.address,
            nonce=self.consent_nonce(node.address),
            deadline=deadline,
        )
        return consent, eip712.sign_consent(node, consent, self.domain())

    def add_node(self, node: str, deadline: int, signature: bytes) -> TxReceipt:
        """Run by the provider, with the node's consent signature."""
        fn = self.contract.functions.addNode(cs(node), deadline, signature)
        return self._send(fn)

    def remove_node(self, node: str) -> TxReceipt:
        return self._send(self.contract.functions.removeNode(cs(node)))

    def revoke_consent(self) -> TxReceipt:
        """Run by a node: voids every consent it signed that no provider has used yet."""
        return self._send(self.contract.functions.revokeConsent())

    def consent_digest(self, consent: eip712.NodeConsent) -> bytes:
        fn = self.contract.functions.consentDigest(
            cs(consent.provider), cs(consent.node), consent.nonce, consent.deadline
        )
        return bytes(self._call(fn))

    def nodes_ever_of(self, provider: str) -> list[str]:
        """Every node `provider` ever added (its NodeAdded events), in order, removed or not:
        a removed node's recorded work is still the provider's to claim."""
        event = self.contract.events.NodeAdded()
        logs = self.link.logs({"address": self.address, "topics": [event.topic, topic(provider)]})
        nodes = [to_checksum_address(event.process_log(log)["args"]["node"]) for log in logs]
        return list(dict.fromkeys(nodes))
