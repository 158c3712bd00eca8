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


def rpc_failure_sentence(error: BaseException) -> str | None:
    """A failure of the RPC endpoint (HTTP, JSON-RPC or web3) in one sentence without
    library URLs, or None if `error` is not one."""
    import requests
    from web3.exceptions import BadFunctionCallOutput, Web3Exception, Web3RPCError

    if isinstance(error, requests.HTTPError) and error.response is not None:
        return f"the RPC endpoint answered HTTP {error.response.status_code}; is the URL right?"
    if isinstance(error, requests.RequestException):
        return "the RPC endpoint could not be reached; is the URL right and the chain running?"
    if isinstance(error, BadFunctionCallOutput):
        return "a contract call returned nothing: does the deployment file match this chain?"
    if isinstance(error, Web3RPCError):
        response = error.rpc_response if isinstance(error.rpc_response, dict) else {}
        detail = response.get("error")
        message = detail.get("message") if isinstance(detail, dict) else None
        return f"the RPC endpoint refused the request: {str(message or 'no reason given')[:200]}"
    if isinstance(error, Web3Exception):
        return "the RPC endpoint's answer is not one swarmrl understands; is the URL right?"
    return None
