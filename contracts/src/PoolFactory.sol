// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ComputePool} from "./ComputePool.sol";
import {IComputePool} from "./interfaces/IComputePool.sol";
import {IPoolFactory} from "./interfaces/IPoolFactory.sol";
import {IStakeManager} from "./interfaces/IStakeManager.sol";

/// @title Deploys compute pools for stake managers.
/// @notice A separate contract only because a StakeManager carrying
/// ComputePool's creation code would exceed the 24 KiB code size limit
/// (EIP-170). The caller becomes the new pool's stake manager. A StakeManager
/// lets only the pools it created through its own factory bond and slash, so
/// anyone may call this: a pool created directly is trusted by no stake manager.
contract PoolFactory is IPoolFactory {
    /// @notice Deploys a pool whose stake manager is the caller; see ComputePool's constructor.
    function createPool(
        bytes32 runId,
        address admin,
        IComputePool.PoolParams calldata params,
        address[] calldata recorders,
        address[] calldata validators
    ) external returns (address) {
        return address(new ComputePool(IStakeManager(msg.sender), runId, admin, params, recorders, validators));
    }
}
