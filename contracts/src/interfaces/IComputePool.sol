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
/// Rewards are reserved from funded tokens when work is recorded, so they can
/// never exceed what was funded, and unlock only once the invalidation window
/// has passed. Within the window, validators (VALIDATOR_ROLE, `quorum` of them
/// must agree) can invalidate a node's epoch, dropping its reward, or slash the
/// node's provider with evidence checked here: a submission the node signed
/// and its proof of inclusion in that epoch's commitment. Slashed stake goes
/// to the stake manager's treasury, never to a validator.
interface IComputePool {
    /// @dev EIP-712 type: Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)
    struct Submission {
        bytes32 runId;
        address node;
        uint64 step;
        bytes32 rolloutDigest;
    }

    struct WorkRecord {
        uint128 units;
        uint64 recordedAt;
        bool invalidated;
        bool claimed;
        bytes32 commitment;
        uint256 reward;
    }

    event NodeJoined(address indexed node, address indexed provider);
    event NodeLeft(address indexed node);
    event NodeEjected(address indexed node, address indexed by);
    event RewardsFunded(address indexed from, uint256 amount);
    event WorkSubmitted(uint64 indexed epoch, address indexed node, uint128 units, bytes32 commitment, uint256 reward);
    event InvalidationVoted(uint64 indexed epoch, address indexed node, address indexed validator, uint256 votes);
    event WorkInvalidated(uint64 indexed epoch, address indexed node);
    event SlashVoted(
        uint64 indexed epoch, address indexed node, bytes32 indexed digest, address validator, uint256 votes
    );
    event NodeSlashed(
        uint64 indexed epoch, address indexed node, address indexed provider, bytes32 digest, uint256 amount
    );
    event RewardClaimed(uint64 indexed epoch, address indexed node, address indexed provider, uint256 amount);
    event QuorumChanged(uint256 quorum);
    event RewardPerUnitChanged(uint256 amount);
    event SlashPenaltyChanged(uint256 amount);
    event InvalidationWindowChanged(uint256 window);

    error NotNodeProvider(address node, address caller);
    error NodeNotRegistered(address node);
    error StakeTooLow(address provider);
    error AlreadyJoined(address node);
    error NotJoined(address node);
    error ZeroAmount();
    error WorkAlreadyRecorded(uint64 epoch, address node);
    error NoWork(uint64 epoch, address node);
    error InsufficientRewards(uint256 available, uint256 needed);
    error WindowClosed(uint64 epoch, address node);
    error WindowOpen(uint64 epoch, address node, uint256 unlocksAt);
    error AlreadyInvalidated(uint64 epoch, address node);
    error AlreadyClaimed(uint64 epoch, address node);
    error AlreadyVoted(address validator);
    error WrongRun(bytes32 runId);
    error WrongNode(address expected, address got);
    error BadSignature();
    error NotInCommitment();
    error BadQuorum(uint256 quorum);

    function RECORDER_ROLE() external view returns (bytes32);
    function VALIDATOR_ROLE() external view returns (bytes32);
    function runId() external view returns (bytes32);

    /// @notice The caller, provider of `node`, adds it to this run. The
    /// provider's active stake must cover all of its registered nodes.
    function joinPool(address node) external;

    /// @notice The node or its provider takes the node out of this run.
    function leavePool(address node) external;

    /// @notice An admin removes a node from this run.
    function eject(address node) external;

    /// @notice Adds `amount` tokens (approved beforehand) to the reward budget.
    function fund(uint256 amount) external;

    /// @notice Records `units` of work by a joined node for `epoch`.
    function submitWork(uint64 epoch, address node, uint128 units, bytes32 commitment) external;

    /// @notice A validator's vote to drop a node's epoch; at `quorum` votes,
    /// within the window, the reward returns to the budget.
    function invalidate(uint64 epoch, address node) external;

    /// @notice A validator's vote to slash `sub.node`'s provider by
    /// `slashPenalty`, with the node's signed submission and its Merkle proof
    /// against the epoch's commitment as evidence. At `quorum` votes the epoch
    /// is invalidated, the provider slashed and the node ejected.
    function slash(uint64 epoch, Submission calldata sub, bytes calldata signature, bytes32[] calldata proof) external;

    /// @notice Pays the caller, provider of `node`, the rewards of `epochs`
    /// whose window has passed without invalidation.
    function claim(address node, uint64[] calldata epochs) external returns (uint256 amount);

    function workOf(uint64 epoch, address node) external view returns (WorkRecord memory);
    function isJoined(address node) external view returns (bool);
    function availableRewards() external view returns (uint256);
    function reservedRewards() external view returns (uint256);
    function invalidationWindow() external view returns (uint256);
    function quorum() external view returns (uint256);
    function rewardPerUnit() external view returns (uint256);
    function slashPenalty() external view returns (uint256);

    /// @return The EIP-712 digest a node signs for `sub`.
    function submissionDigest(Submission calldata sub) external view returns (bytes32);

    function setQuorum(uint256 quorum) external;
    function setRewardPerUnit(uint256 amount) external;
    function setSlashPenalty(uint256 amount) external;
    function setInvalidationWindow(uint256 window) external;
}
