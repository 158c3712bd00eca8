"""Every failure of the chain layer is a `ChainError` whose message is one sentence.

Callers (the CLI, the orchestrator's recorder, the node's wallet) catch
`ChainError` once and show `str(e)`; the subclasses let them react to the few
cases that need a different action (retry later, fix the configuration).
"""

from __future__ import annotations

from typing import Any


class ChainError(Exception):
    """A chain operation failed; ``str(e)`` is one sentence for the user."""


class ChainConfigError(ChainError, ValueError):
    """Missing tools or artifacts, a malformed deployment file, a chain id mismatch."""


class RpcUnavailableError(ChainError):
    """The RPC endpoint did not answer, even after retries."""


class TxTimeoutError(ChainError):
    """A transaction was sent but no receipt arrived in time; it may still be mined."""


class NonceError(ChainError):
    """The node kept rejecting our nonce, even after resynchronising it."""


class RevertedError(ChainError):
    """A call or transaction reverted; the reason is decoded from the contracts' ABIs.

    ``contract`` is the contract the call went to, ``error`` the decoded error
    name ("InsufficientStake", "Error" for a require string, "Panic"), and
    ``args`` its arguments by name.
    """

    def __init__(
        self,
        message: str,
        *,
        contract: str | None = None,
        error: str | None = None,
        args: dict[str, Any] | None = None,
        data: bytes = b"",
    ) -> None:
        super().__init__(message)
        self.contract = contract
        self.error = error
        self.args_by_name = dict(args or {})
        self.data = data
