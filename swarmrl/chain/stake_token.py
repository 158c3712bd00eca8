"""StakeToken, the protocol's ERC-20 (with ERC-2612 permits): balances, allowances,
transfers and minting."""

from __future__ import annotations

from typing import ClassVar

from web3.types import TxReceipt

from swarmrl.chain.link import AccessControlled, cs


class StakeToken(AccessControlled):
    """The stake token; minting needs its MINTER_ROLE."""

    name: ClassVar[str] = "StakeToken"

    def balance_of(self, account: str) -> int:
        return self._read(int, self.contract.functions.balanceOf(cs(account)))

    def allowance(self, owner: str, spender: str) -> int:
        return self._read(int, self.contract.functions.allowance(cs(owner), cs(spender)))

    def approve(self, spender: str, amount: int) -> TxReceipt:
        return self._send(self.contract.functions.approve(cs(spender), amount))

    def transfer(self, to: str, amount: int) -> TxReceipt:
        return self._send(self.contract.functions.transfer(cs(to), amount))

    def mint(self, to: str, amount: int) -> TxReceipt:
        """Mints tokens (needs MINTER_ROLE on the token)."""
        return self._send(self.contract.functions.mint(cs(to), amount))

    def ensure_allowance(self, spender: str, amount: int) -> None:
        """Approves `spender` for `amount` unless the account's allowance covers it."""
        if self.allowance(self.link.address, spender) < amount:
            self.approve(spender, amount)
