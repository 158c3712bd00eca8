// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title Provider stake: deposit, unbond, withdraw, and slashing.
/// @notice Stake in unbonding stays slashable until the unbonding period has
/// passed; only then can it be withdrawn. Slashed tokens go to the treasury,
/// or are burnt when the treasury is the zero address, and never to the
/// caller. Invariant: the token balance of this contract equals the sum of all
/// active and unbonding stake.
interface IStakeManager {
    event Staked(address indexed provider, uint256 amount);
    event UnbondRequested(address indexed provider, uint256 amount, uint256 releaseTime);
    event Withdrawn(address indexed provider, uint256 amount);
    event Slashed(address indexed provider, uint256 amount, bytes32 indexed reason, address treasury);
    event MinStakePerNodeChanged(uint256 amount);
    event UnbondingPeriodChanged(uint256 period);
    event TreasuryChanged(address treasury);

    error NotProvider(address account);
    error ZeroAmount();
    error InsufficientStake(uint256 available, uint256 requested);
    error StakeBacksNodes(uint256 remaining, uint256 required);
    error NothingToWithdraw();

    /// @notice Role allowed to slash (granted to compute pools).
    function SLASHER_ROLE() external view returns (bytes32);

    /// @notice Deposits `amount` tokens (approved beforehand) as the caller's stake.
    function stake(uint256 amount) external;

    /// @notice Deposits with an ERC-2612 permit instead of a prior approval.
    function stakeWithPermit(uint256 amount, uint256 deadline, uint8 v, bytes32 r, bytes32 s) external;

    /// @notice Moves `amount` of active stake into unbonding. The active stake
    /// left must still cover `minStakePerNode` for every registered node.
    function requestUnbond(uint256 amount) external;

    /// @notice Pays out every unbonding entry whose release time has passed.
    function withdraw() external returns (uint256 amount);

    /// @notice Slashes up to `amount` from the provider: active stake first,
    /// then unbonding entries, newest first. Returns what was slashed.
    function slash(address provider, uint256 amount, bytes32 reason) external returns (uint256 slashed);

    function stakeOf(address provider) external view returns (uint256 active);
    function unbondingOf(address provider) external view returns (uint256 total, uint256 withdrawable);
    function totalStaked() external view returns (uint256);
    function minStakePerNode() external view returns (uint256);
    function unbondingPeriod() external view returns (uint256);
    function treasury() external view returns (address);

    /// @return Whether `provider`'s active stake covers `nodeCount` nodes.
    function coversNodes(address provider, uint256 nodeCount) external view returns (bool);

    function setMinStakePerNode(uint256 amount) external;
    function setUnbondingPeriod(uint256 period) external;
    function setTreasury(address treasury) external;
}
