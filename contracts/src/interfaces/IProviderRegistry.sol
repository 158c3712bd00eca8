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

    error AlreadyRegistered(address provider);
    error NotRegistered(address provider);
    error NodeTaken(address node, address provider);
    error NotYourNode(address node, address caller);
    error ConsentExpired(uint256 deadline);
    error BadConsent(address node);
    error ZeroAddress();

    /// @notice Registers the caller as a provider.
    function registerProvider() external;

    /// @notice Adds `node` to the caller's nodes, with the node's consent.
    function addNode(address node, uint256 deadline, bytes calldata signature) external;

    /// @notice Removes one of the caller's nodes.
    function removeNode(address node) external;

    function isProvider(address provider) external view returns (bool);

    /// @return The provider of `node`, or the zero address.
    function providerOf(address node) external view returns (address);

    function nodesOf(address provider) external view returns (address[] memory);

    /// @return The nonce the node's next consent must carry.
    function consentNonce(address node) external view returns (uint256);

    /// @return The EIP-712 digest a node signs to consent.
    function consentDigest(address provider, address node, uint256 nonce, uint256 deadline)
        external
        view
        returns (bytes32);
}
