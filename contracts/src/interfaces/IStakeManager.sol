// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";

import {IComputePool} from "./IComputePool.sol";
import {IProviderRegistry} from "./IProviderRegistry.sol";

/// @title Provider stake: deposit, unbond, withdraw, bonds and slashing.
/// @notice Stake leaves a provider in two ways only: its own withdrawal of
/// unbonded stake, and a slash by a compute pool this manager created, which
/// the pool performs only on a quorum of its validators with evidence signed
/// by the provider's node. The admin can neither slash nor add a slasher, and
/// the treasury that receives slashed stake is fixed when the manager is deployed.
///
/// Each membership of a provider's node in a pool bonds the pool's penalty of
/// the provider's active stake, from the join until the windows of the work
/// recorded before it left have closed (the pool's `bondOf`); active stake
/// cannot be unbonded below what the pools bond, so every record that can
/// still be slashed is backed. Unbonding stake stays slashable until it is withdrawn.
///
/// Invariant: the token balance of this contract equals the sum of all active
/// and unbonding stake.
interface IStakeManager {
    /// @notice Stake requested out of active stake, withdrawable from `releaseTime`.
    struct Unbonding {
        uint256 amount;
        uint256 releaseTime;
    }

    event Staked(address indexed provider, uint256 amount);
    event UnbondRequested(address indexed provider, uint256 amount, uint256 releaseTime);
    event Withdrawn(address indexed provider, uint256 amount);
    event Slashed(
        address indexed provider, uint256 amount, bytes32 indexed reason, address treasury, address indexed pool
    );
    event PoolCreated(address indexed pool, bytes32 indexed runId, address admin);
    event MinStakePerNodeChanged(uint256 oldAmount, uint256 newAmount);
    /// @notice A new unbonding period; a longer one applies to requests made from `effectiveAt` on.
    event UnbondingPeriodChanged(uint256 oldPeriod, uint256 newPeriod, uint256 effectiveAt);

    /// @notice `account` is not a registered provider, so it cannot stake.
    error NotProvider(address account);
    /// @notice An amount of zero was given where tokens must move.
    error ZeroAmount();
    /// @notice The provider has `available` active stake, less than the `requested` amount.
    error InsufficientStake(uint256 available, uint256 requested);
    /// @notice Unbonding would leave `remaining` active stake, less than the `required`
    /// `minStakePerNode` for each of the provider's registered nodes.
    error StakeBacksNodes(uint256 remaining, uint256 required);
    /// @notice Unbonding would leave `remaining` active stake, less than the
    /// `bonded` penalties of memberships whose work can still be slashed.
    error StakeBacksWork(uint256 remaining, uint256 bonded);
    /// @notice No unbonding entry has reached its release time.
    error NothingToWithdraw();
    /// @notice Only a compute pool created by this manager may slash; `caller` is none.
    error NotPool(address caller);
    /// @notice The manager already has `MAX_POOLS` pools.
    error TooManyPools();
    /// @notice `period` lies outside [`min`, `max`]: at least every pool's invalidation
    /// window, also one waiting to apply (and one minute), at most 30 days.
    error UnbondingPeriodOutOfRange(uint256 period, uint256 min, uint256 max);
    /// @notice `amount` is below `penalty`, the largest slash penalty of a pool: a node's
    /// minimum stake must cover one penalty.
    error MinStakeBelowPenalty(uint256 amount, uint256 penalty);

    /// @notice Deposits `amount` tokens (approved beforehand) as the caller's stake.
    function stake(uint256 amount) external;

    /// @notice Deposits with an ERC-2612 permit instead of a prior approval.
    function stakeWithPermit(uint256 amount, uint256 deadline, uint8 v, bytes32 r, bytes32 s) external;

    /// @notice Moves `amount` of active stake into unbonding. The active stake left
    /// must still cover `minStakePerNode` for every registered node and what the pools bond.
    function requestUnbond(uint256 amount) external;

    /// @notice Pays out every unbonding entry whose release time has passed.
    function withdraw() external returns (uint256 amount);

    /// @notice Called by a pool on a quorum's slash: takes up to `amount` from the
    /// provider, active stake first, then unbonding entries, newest first.
    function slash(address provider, uint256 amount, bytes32 reason) external returns (uint256 slashed);

    /// @notice Creates the compute pool of one training run, bound to this manager.
    function createPool(
        bytes32 runId,
        address admin,
        IComputePool.PoolParams calldata params,
        address[] calldata recorders,
        address[] calldata validators
    ) external returns (address pool);

    /// @notice The stake token, which pools also pay rewards in.
    function token() external view returns (IERC20);
    /// @notice The registry that says who is a provider and how many nodes each runs.
    function registry() external view returns (IProviderRegistry);

    function stakeOf(address provider) external view returns (uint256 active);
    function unbondingOf(address provider) external view returns (uint256 total, uint256 withdrawable);
    /// @return The provider's active stake its memberships bond, summed over the pools.
    function bondedOf(address provider) external view returns (uint256);
    function totalStaked() external view returns (uint256);
    function minStakePerNode() external view returns (uint256);
    /// @return The period that applies to an unbond requested now.
    function unbondingPeriod() external view returns (uint256);
    /// @return The receiver of slashed stake, fixed at deployment; zero: it is burnt.
    function treasury() external view returns (address);
    function isPool(address pool) external view returns (bool);
    function pools() external view returns (address[] memory);

    /// @return Whether `provider`'s active stake covers `nodeCount` nodes.
    function coversNodes(address provider, uint256 nodeCount) external view returns (bool);

    function setMinStakePerNode(uint256 amount) external;
    function setUnbondingPeriod(uint256 period) external;
}
