// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";

import {IProviderRegistry} from "./interfaces/IProviderRegistry.sol";

/// @title Providers (stake owners) and the nodes they run.
/// @notice Anyone can register as a provider. A node belongs to at most one
/// provider at a time and joins only with its own EIP-712 consent; its nonce
/// increases on every accepted consent, so no consent can be used twice.
/// The registry holds no tokens and has no admin.
contract ProviderRegistry is IProviderRegistry, EIP712 {
    using EnumerableSet for EnumerableSet.AddressSet;

    /// @notice keccak256("NodeConsent(address provider,address node,uint256 nonce,uint256 deadline)")
    bytes32 public constant NODE_CONSENT_TYPEHASH =
        keccak256("NodeConsent(address provider,address node,uint256 nonce,uint256 deadline)");

    mapping(address provider => bool) private _isProvider;
    mapping(address node => address provider) private _providerOf;
    mapping(address node => uint256) private _nonces;
    mapping(address provider => EnumerableSet.AddressSet) private _nodes;

    constructor() EIP712("SwarmRL ProviderRegistry", "1") {}

    /// @inheritdoc IProviderRegistry
    function registerProvider() external {
        if (_isProvider[msg.sender]) revert AlreadyRegistered(msg.sender);
        _isProvider[msg.sender] = true;
        emit ProviderRegistered(msg.sender);
    }

    /// @inheritdoc IProviderRegistry
    /// @dev Reverts NotRegistered if the caller is no provider, ZeroAddress for
    /// the zero node, ConsentExpired after `deadline`, NodeTaken if the node
    /// has a provider, BadConsent unless `signature` is a valid, non-malleable
    /// signature by `node` over its current consent digest.
    function addNode(address node, uint256 deadline, bytes calldata signature) external {
        if (!_isProvider[msg.sender]) revert NotRegistered(msg.sender);
        if (node == address(0)) revert ZeroAddress();
        if (deadline < block.timestamp) revert ConsentExpired(deadline);
        address current = _providerOf[node];
        if (current != address(0)) revert NodeTaken(node, current);

        uint256 nonce = _nonces[node];
        bytes32 digest = _consentDigest(msg.sender, node, nonce, deadline);
        (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecoverCalldata(digest, signature);
        if (err != ECDSA.RecoverError.NoError || signer != node) revert BadConsent(node);

        _nonces[node] = nonce + 1;
        _providerOf[node] = msg.sender;
        _nodes[msg.sender].add(node);
        emit NodeAdded(msg.sender, node);
    }

    /// @inheritdoc IProviderRegistry
    /// @dev Reverts NotYourNode unless the caller is the node's provider.
    function removeNode(address node) external {
        if (_providerOf[node] != msg.sender) revert NotYourNode(node, msg.sender);
        delete _providerOf[node];
        _nodes[msg.sender].remove(node);
        emit NodeRemoved(msg.sender, node);
    }

    /// @inheritdoc IProviderRegistry
    /// @dev Bumps the caller's nonce, which every consent it signed names.
    function revokeConsent() external {
        uint256 nonce = ++_nonces[msg.sender];
        emit ConsentRevoked(msg.sender, nonce);
    }

    /// @inheritdoc IProviderRegistry
    function isProvider(address provider) external view returns (bool) {
        return _isProvider[provider];
    }

    /// @inheritdoc IProviderRegistry
    function providerOf(address node) external view returns (address) {
        return _providerOf[node];
    }

    /// @inheritdoc IProviderRegistry
    function nodesOf(address provider) external view returns (address[] memory) {
        return _nodes[provider].values();
    }

    /// @inheritdoc IProviderRegistry
    function nodeCountOf(address provider) external view returns (uint256) {
        return _nodes[provider].length();
    }

    /// @inheritdoc IProviderRegistry
    function consentNonce(address node) external view returns (uint256) {
        return _nonces[node];
    }

    /// @inheritdoc IProviderRegistry
    function consentDigest(address provider, address node, uint256 nonce, uint256 deadline)
        external
        view
        returns (bytes32)
    {
        return _consentDigest(provider, node, nonce, deadline);
    }

    /// @notice The EIP-712 domain separator (chain id and this contract bound in).
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    function _consentDigest(address provider, address node, uint256 nonce, uint256 deadline)
        private
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(keccak256(abi.encode(NODE_CONSENT_TYPEHASH, provider, node, nonce, deadline)));
    }
}
