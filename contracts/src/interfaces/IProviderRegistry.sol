// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title Providers (stake owners) and the nodes they run.
/// @notice A node joins a provider only with its own consent: an EIP-712
/// signature by the node key over `NodeConsent(provider, node, nonce, deadline)`
/// in this contract's domain (name "SwarmRL ProviderRegistry", version "1").
/// The node's nonce increases on every use, so a consent cannot be replayed
/// after the node was removed, nor on another chain or deployment.
interface IProviderRegistry {
    event ProviderRegistered(address indexed provider);
    event NodeAdded(address indexed provider, address indexed node);
    event NodeRemoved(address indexed provider, address indexed node);
    /// @notice `node` voided every consent it signed; its next consent must carry `nonce`.
    event ConsentRevoked(address indexed node, uint256 nonce);

    /// @notice `provider` is registered already.
    error AlreadyRegistered(address provider);
    /// @notice `provider` is not a registered provider.
    error NotRegistered(address provider);
    /// @notice `node` belongs to `provider` already; that provider must remove it first.
    error NodeTaken(address node, address provider);
    /// @notice `node` is not `caller`'s node.
    error NotYourNode(address node, address caller);
    /// @notice The consent's `deadline` has passed.
    error ConsentExpired(uint256 deadline);
    /// @notice The signature is not `node`'s consent with its current nonce (used, revoked or forged).
    error BadConsent(address node);
    /// @notice The zero address cannot be a node.
    error ZeroAddress();

    /// @notice Registers the caller as a provider.
    function registerProvider() external;

    /// @notice Adds `node` to the caller's nodes, with the node's consent.
    function addNode(address node, uint256 deadline, bytes calldata signature) external;

    /// @notice Removes one of the caller's nodes.
    function removeNode(address node) external;

    /// @notice Run by a node: voids every consent it has signed and not yet seen used.
    function revokeConsent() external;

    function isProvider(address provider) external view returns (bool);

    /// @return The provider of `node`, or the zero address.
    function providerOf(address node) external view returns (address);

    function nodesOf(address provider) external view returns (address[] memory);

    /// @return How many nodes `provider` has: `nodesOf(provider).length`, at a constant cost.
    function nodeCountOf(address provider) external view returns (uint256);

    /// @return The nonce the node's next consent must carry.
    function consentNonce(address node) external view returns (uint256);

    /// @return The EIP-712 digest a node signs to consent.
    function consentDigest(address provider, address node, uint256 nonce, uint256 deadline)
        external
        view
        returns (bytes32);
}
