// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title One training run's pool of nodes, their recorded work and rewards.
/// @notice The orchestrator (RECORDER_ROLE) records each node's work per epoch
/// as work units plus a commitment: the Merkle root (OpenZeppelin MerkleProof:
/// keccak256, sorted pairs) over leaves `keccak256(abi.encode(digest))`, where
/// `digest` is the EIP-712 digest of one `Submission` the node signed, in this
/// contract's domain (name "SwarmRL ComputePool", version "1"). The recorder
/// pays the gas; the node pays nothing.
///
/// A record keeps the terms it was made under: its reward, its slash penalty
/// and the end of its invalidation window. Parameter changes apply to later
/// records only, so paid work is final and a window never reopens.
///
/// Rewards are reserved from funded tokens when work is recorded, so they can
/// never exceed what was funded, and unlock only once the invalidation window
/// has passed. Recording locks the penalty in the provider's stake for the
/// same window. Within the window, validators (VALIDATOR_ROLE, `quorum` of
/// those holding the role when the quorum is reached) can invalidate a node's
/// epoch, dropping its reward, or slash the node's provider with evidence
/// checked here: a submission the node signed and its proof of inclusion in
/// that epoch's commitment. A signed submission is evidence for one penalty at
/// most. Slashed stake goes to the stake manager's treasury, fixed at its
/// deployment, never to a validator. What lets a new party slash, or slash
/// more, applies only after a delay in which stakers can leave: the slash
/// votes of a validator appointed after deployment, a lower quorum, a higher
/// penalty.
interface IComputePool {
    /// @dev EIP-712 type: Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)
    struct Submission {
        bytes32 runId;
        address node;
        uint64 step;
        bytes32 rolloutDigest;
    }

    /// @notice One node's work in one epoch, with the terms it was recorded under.
    struct WorkRecord {
        uint128 units;
        uint64 recordedAt;
        // End of the invalidation window: slashable before, claimable from then.
        uint64 unlocksAt;
        // The node's provider at recording: it claims and is slashed.
        address provider;
        bool invalidated;
        bool claimed;
        bool slashed;
        bytes32 commitment;
        uint256 reward;
        uint256 penalty;
    }

    /// @notice The adjustable numbers of a pool (token amounts in wei, times in seconds).
    struct PoolParams {
        uint256 invalidationWindow;
        uint256 rewardPerUnit;
        uint256 slashPenalty;
        uint256 quorum;
    }

    event NodeJoined(address indexed node, address indexed provider);
    event NodeLeft(address indexed node);
    event NodeEjected(address indexed node, address indexed by);
    event RewardsFunded(address indexed from, uint256 amount);
    event WorkSubmitted(
        uint64 indexed epoch, address indexed node, uint128 units, bytes32 commitment, uint256 reward, uint256 unlocksAt
    );
    event InvalidationVoted(uint64 indexed epoch, address indexed node, address indexed validator, uint256 votes);
    event WorkInvalidated(uint64 indexed epoch, address indexed node);
    event SlashVoted(
        uint64 indexed epoch, address indexed node, bytes32 indexed digest, address validator, uint256 votes
    );
    event NodeSlashed(
        uint64 indexed epoch, address indexed node, address indexed provider, bytes32 digest, uint256 amount
    );
    event RewardClaimed(uint64 indexed epoch, address indexed node, address indexed provider, uint256 amount);
    /// @notice A new quorum, counted from `effectiveAt` (later than now for a lower one).
    event QuorumChanged(uint256 oldQuorum, uint256 newQuorum, uint256 effectiveAt);
    event RewardPerUnitChanged(uint256 oldAmount, uint256 newAmount);
    /// @notice A new penalty, for work recorded from `effectiveAt` on (later than now for a higher one).
    event SlashPenaltyChanged(uint256 oldAmount, uint256 newAmount, uint256 effectiveAt);
    /// @notice `validator` holds VALIDATOR_ROLE; its slash votes count from `slashVotesAt`.
    event ValidatorAppointed(address indexed validator, uint256 slashVotesAt);
    event InvalidationWindowChanged(uint256 oldWindow, uint256 newWindow);

    /// @notice `caller` is neither `node`'s provider (of record) nor, where allowed, the node.
    error NotNodeProvider(address node, address caller);
    /// @notice `node` has no provider in the registry, or not the one it joined with.
    error NodeNotRegistered(address node);
    /// @notice `provider`'s active stake does not cover `minStakePerNode` for each of its nodes.
    error StakeTooLow(address provider);
    /// @notice `node` is already in the pool with its current provider.
    error AlreadyJoined(address node);
    /// @notice `node` is not in the pool.
    error NotJoined(address node);
    /// @notice An amount of zero was given where tokens or units must be positive.
    error ZeroAmount();
    /// @notice `node`'s work at `epoch` is recorded already; a record is never overwritten.
    error WorkAlreadyRecorded(uint64 epoch, address node);
    /// @notice No work of `node` is recorded at `epoch`.
    error NoWork(uint64 epoch, address node);
    /// @notice The reward budget holds `available`, less than the `needed` reward.
    error InsufficientRewards(uint256 available, uint256 needed);
    /// @notice The invalidation window of `node`'s work at `epoch` has ended.
    error WindowClosed(uint64 epoch, address node);
    /// @notice `node`'s work at `epoch` is still in its window, which ends at `unlocksAt`.
    error WindowOpen(uint64 epoch, address node, uint256 unlocksAt);
    /// @notice `node`'s work at `epoch` was invalidated, so it can be neither claimed nor invalidated again.
    error AlreadyInvalidated(uint64 epoch, address node);
    /// @notice `node`'s work at `epoch` was claimed already.
    error AlreadyClaimed(uint64 epoch, address node);
    /// @notice `validator` has already cast this vote in its current term.
    error AlreadyVoted(address validator);
    /// @notice The submission names run `runId`, not this pool's.
    error WrongRun(bytes32 runId);
    /// @notice The signature is malformed or not by the submission's node.
    error BadSignature();
    /// @notice The submission is not a leaf of the epoch's commitment.
    error NotInCommitment();
    /// @notice `node`'s work at `epoch` was already slashed. Evidence proves only
    /// that the node signed a submission, not which submission was bad, so one
    /// penalty per epoch is the most a quorum can impose.
    error AlreadySlashed(uint64 epoch, address node);
    /// @notice The signed submission with this digest was already evidence for a penalty.
    error EvidenceUsed(bytes32 digest);
    /// @notice `quorum` must lie in [1, `validators`], the number of validators.
    error BadQuorum(uint256 quorum, uint256 validators);
    /// @notice `window` lies outside [`min`, `max`]: at least a minute, at most the
    /// stake manager's unbonding period.
    error WindowOutOfRange(uint256 window, uint256 min, uint256 max);
    /// @notice `penalty` is above `max`, the stake manager's minimum stake per node.
    error PenaltyTooHigh(uint256 penalty, uint256 max);
    /// @notice `validator` was appointed after deployment: its slash votes count
    /// from `slashVotesAt`, so that stakers can leave before it can slash.
    error SlashVoteTooEarly(address validator, uint256 slashVotesAt);

    function RECORDER_ROLE() external view returns (bytes32);
    function VALIDATOR_ROLE() external view returns (bytes32);
    function runId() external view returns (bytes32);

    /// @notice The caller, provider of `node`, adds it to this run. The
    /// provider's active stake must cover all of its registered nodes.
    function joinPool(address node) external;

    /// @notice The node or its provider takes the node out of this run.
    function leavePool(address node) external;

    /// @notice An admin removes a node from this run; its recorded work stays claimable.
    function eject(address node) external;

    /// @notice Adds `amount` tokens (approved beforehand) to the reward budget.
    function fund(uint256 amount) external;

    /// @notice Records `units` of work by a joined node for `epoch`, locking the
    /// slash penalty in its provider's stake until the window ends.
    function submitWork(uint64 epoch, address node, uint128 units, bytes32 commitment) external;

    /// @notice A validator's vote to drop a node's epoch; at `quorum` votes,
    /// within the window, the reward returns to the budget.
    function invalidate(uint64 epoch, address node) external;

    /// @notice A validator's vote to slash `sub.node`'s provider by the record's
    /// penalty, with the node's signed submission and its Merkle proof against
    /// the epoch's commitment as evidence. At `quorum` votes the epoch is
    /// invalidated, the provider slashed and the node ejected.
    function slash(uint64 epoch, Submission calldata sub, bytes calldata signature, bytes32[] calldata proof) external;

    /// @notice Pays the caller, provider of `node`, the rewards of `epochs`
    /// whose window has passed without invalidation.
    function claim(address node, uint64[] calldata epochs) external returns (uint256 amount);

    function workOf(uint64 epoch, address node) external view returns (WorkRecord memory);
    function isJoined(address node) external view returns (bool);
    function availableRewards() external view returns (uint256);
    function reservedRewards() external view returns (uint256);
    function invalidationWindow() external view returns (uint256);
    /// @return The validator votes that invalidate or slash now.
    function quorum() external view returns (uint256);
    /// @return quorum A lower quorum waiting to apply, and from when (zeros if none).
    function pendingQuorum() external view returns (uint256 quorum, uint256 effectiveAt);
    function validatorCount() external view returns (uint256);
    function rewardPerUnit() external view returns (uint256);
    /// @return The penalty of work recorded now.
    function slashPenalty() external view returns (uint256);
    /// @return amount A higher penalty waiting to apply, and from when (zeros if none).
    function pendingSlashPenalty() external view returns (uint256 amount, uint256 effectiveAt);
    /// @return When `validator`'s slash votes count from, in its current term.
    function slashVotesAt(address validator) external view returns (uint256);

    /// @return The EIP-712 digest a node signs for `sub`.
    function submissionDigest(Submission calldata sub) external view returns (bytes32);

    /// @notice Sets the votes needed, within [1, validatorCount]; a lower quorum
    /// applies only after the slash-change delay.
    function setQuorum(uint256 quorum) external;
    /// @notice Sets the reward per unit of work recorded from now on.
    function setRewardPerUnit(uint256 amount) external;
    /// @notice Sets the penalty of work recorded from now on, at most the minimum
    /// stake per node; a higher penalty applies only after the slash-change delay.
    function setSlashPenalty(uint256 amount) external;
    /// @notice Sets the window of work recorded from now on, within [1 minute, unbonding period].
    function setInvalidationWindow(uint256 window) external;
}
