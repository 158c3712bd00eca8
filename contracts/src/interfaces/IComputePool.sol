// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title One training run's pool of nodes, their recorded work and rewards.
/// @notice The orchestrator (RECORDER_ROLE) records an epoch's work in one
/// transaction per part of at most MAX_LEAVES nodes, whatever the swarm's size:
/// each part stores one Merkle root (OpenZeppelin MerkleProof: keccak256,
/// sorted pairs; an odd node at the end of a level moves up unpaired) over
/// leaves `keccak256(abi.encode(leaf))`, one `WorkLeaf` per node: its address,
/// the membership its work was done under, its work units and its commitment.
/// The commitment is itself a Merkle root, over leaves `keccak256(abi.encode(digest))`
/// where `digest` is the EIP-712 digest of one `Submission` the node signed,
/// in this contract's domain (name "SwarmRL ComputePool", version "1"). The
/// pool computes the part's root from the leaves it is sent, and logs every
/// leaf (`WorkRecorded`), so anyone can rebuild the tree and its proofs from
/// the chain alone. The recorder pays the gas; the node pays nothing.
///
/// A part keeps the terms it was recorded under: its reward per unit and the
/// end of its invalidation window; a membership keeps the penalty in force at
/// its join. Parameter changes apply to later parts and joins only (a lower
/// penalty also to slashes at once), so paid work is final, a window never
/// reopens, and what a provider bonded is what it can lose.
///
/// Rewards are reserved from funded tokens when work is recorded, so they can
/// never exceed what was funded, and are paid, per leaf and with its proof, only
/// once the invalidation window has passed. Stake backs every membership rather
/// than every record: while a node is joined, and after it leaves until the
/// windows of all work recorded before it left have closed, its provider's
/// stake manager keeps the membership's penalty of active stake from being
/// unbonded (`bondOf`). A leaf counts only if its membership was live when the part
/// was recorded (`joinedAt <= recordedAt < leftAt`); any other is never paid
/// and never slashed, and anyone may return its reward to the budget
/// (`release`). A slashed membership bonds nothing more and is paid nothing more.
///
/// Within the window, validators (VALIDATOR_ROLE, `quorum` of those holding
/// the role when the quorum is reached) can invalidate a leaf, dropping its
/// reward, or slash the provider of its membership with evidence checked here:
/// a submission the node signed and its proof of inclusion in the leaf's
/// commitment. A membership is slashed once, which ends it and forfeits every
/// reward recorded under it and not yet paid; a signed submission is evidence
/// for one penalty at most. Slashed stake goes to the stake manager's
/// treasury, fixed at its deployment, never to a validator. What lets a new
/// party slash, or slash more, or moves who is paid, applies only after a delay
/// in which stakers can leave and everyone can see it coming: granting or
/// revoking the recorder or validator role after deployment, a new
/// invalidation window or reward per unit, a lower quorum, a higher penalty.
interface IComputePool {
    /// @dev EIP-712 type: Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)
    struct Submission {
        bytes32 runId;
        address node;
        uint64 step;
        bytes32 rolloutDigest;
    }

    /// @notice One node's work in one epoch: a leaf of a part's root.
    struct WorkLeaf {
        address node;
        // The node's membership its work was done under (`membershipOf`).
        uint32 membership;
        uint128 units;
        // Merkle root over the node's signed submissions of the epoch.
        bytes32 commitment;
    }

    /// @notice A leaf named with the part it was recorded in and its proof against the part's root.
    struct LeafRef {
        uint64 epoch;
        uint32 part;
        WorkLeaf leaf;
        bytes32[] proof;
    }

    /// @notice One recorded part of an epoch, with the terms it was recorded under.
    struct PartRecord {
        bytes32 root;
        uint128 units;
        uint32 nodes;
        uint64 recordedAt;
        // End of the invalidation window: slashable before, claimable from then.
        uint64 unlocksAt;
        uint128 rewardPerUnit;
    }

    /// @notice A node's stay in the pool with one provider: from `joinedAt` until
    /// `leftAt` (0 while it stays), the first second whose parts it no longer
    /// backs: the second of its leave, or the next one if a part was recorded
    /// earlier in that second (the leave came after it, and bonds its window);
    /// `slashed` once evidence ended it. `penalty`: the pool's penalty at the
    /// join, which the membership bonds and a slash takes (the current one if lower).
    struct Membership {
        address provider;
        uint64 joinedAt;
        uint64 leftAt;
        bool slashed;
        uint128 penalty;
    }

    /// @notice What became of a leaf.
    enum Settlement {
        Open,
        Claimed,
        Invalidated,
        Released
    }

    /// @notice The adjustable numbers of a pool (token amounts in wei, times in seconds).
    struct PoolParams {
        uint256 invalidationWindow;
        uint256 rewardPerUnit;
        uint256 slashPenalty;
        uint256 quorum;
    }

    event NodeJoined(address indexed node, address indexed provider, uint32 membership);
    event NodeLeft(address indexed node);
    event NodeEjected(address indexed node, address indexed by);
    event RewardsFunded(address indexed from, uint256 amount);
    /// @notice One leaf of part `part` of `epoch`, in the part's leaf order.
    event WorkRecorded(
        uint64 indexed epoch,
        address indexed node,
        uint32 indexed part,
        uint32 membership,
        uint128 units,
        bytes32 commitment
    );
    /// @notice Part `part` of `epoch` is recorded: its root over `nodes` leaves, reserving `reward`.
    event PartRecorded(
        uint64 indexed epoch,
        uint32 indexed part,
        bytes32 root,
        uint256 nodes,
        uint256 units,
        uint256 reward,
        uint256 unlocksAt
    );
    event InvalidationVoted(uint64 indexed epoch, address indexed node, address indexed validator, uint256 votes);
    event WorkInvalidated(uint64 indexed epoch, address indexed node, uint32 part);
    event SlashVoted(
        uint64 indexed epoch, address indexed node, bytes32 indexed digest, address validator, uint256 votes
    );
    event NodeSlashed(
        uint64 indexed epoch, address indexed node, address indexed provider, bytes32 digest, uint256 amount
    );
    event RewardClaimed(uint64 indexed epoch, address indexed node, address indexed provider, uint256 amount);
    /// @notice A leaf that can never be paid gave its reward back to the budget.
    event RewardReleased(uint64 indexed epoch, address indexed node, uint32 part, uint256 amount);
    /// @notice A new quorum, counted from `effectiveAt` (later than now for a lower one).
    event QuorumChanged(uint256 oldQuorum, uint256 newQuorum, uint256 effectiveAt);
    /// @notice A new reward per unit, for parts recorded from `effectiveAt` on.
    event RewardPerUnitChanged(uint256 oldAmount, uint256 newAmount, uint256 effectiveAt);
    /// @notice A new penalty, for nodes joining from `effectiveAt` on (later than now for a higher one).
    event SlashPenaltyChanged(uint256 oldAmount, uint256 newAmount, uint256 effectiveAt);
    /// @notice `validator` holds VALIDATOR_ROLE; its votes count from `slashVotesAt` (now).
    event ValidatorAppointed(address indexed validator, uint256 slashVotesAt);
    /// @notice A new invalidation window, for parts recorded from `effectiveAt` on.
    event InvalidationWindowChanged(uint256 oldWindow, uint256 newWindow, uint256 effectiveAt);
    /// @notice Granting (`grant`) or revoking `role` for `account` can be applied from `effectiveAt` on.
    event RoleChangeScheduled(bytes32 indexed role, address indexed account, bool grant, uint256 effectiveAt);

    /// @notice `caller` is neither `node`'s provider (of record) nor, where allowed, the node.
    error NotNodeProvider(address node, address caller);
    /// @notice `node` has no provider in the registry.
    error NodeNotRegistered(address node);
    /// @notice `provider`'s active stake does not cover `minStakePerNode` for each
    /// of its nodes, or the penalties its memberships bond.
    error StakeTooLow(address provider);
    /// @notice `node` is already in the pool with its current provider.
    error AlreadyJoined(address node);
    /// @notice `node` is not in the pool.
    error NotJoined(address node);
    /// @notice An amount of zero was given where tokens or units must be positive.
    error ZeroAmount();
    /// @notice A part holds 1 to MAX_LEAVES leaves with strictly ascending node addresses; `index` breaks that.
    error BadLeaves(uint256 index);
    /// @notice Part `part` of `epoch` is recorded already; a record is never overwritten.
    error PartAlreadyRecorded(uint64 epoch, uint32 part);
    /// @notice No part `part` of `epoch` is recorded.
    error NoWork(uint64 epoch, uint32 part);
    /// @notice The leaf and proof do not lead to the part's root.
    error NotInRecord(uint64 epoch, uint32 part, address node);
    /// @notice The reward budget holds `available`, less than the `needed` reward.
    error InsufficientRewards(uint256 available, uint256 needed);
    /// @notice The invalidation window of part `part` of `epoch` has ended.
    error WindowClosed(uint64 epoch, uint32 part);
    /// @notice Part `part` of `epoch` is still in its window, which ends at `unlocksAt`.
    error WindowOpen(uint64 epoch, uint32 part, uint256 unlocksAt);
    /// @notice `node`'s leaf in part `part` of `epoch` was claimed, invalidated or released already.
    error AlreadySettled(uint64 epoch, uint32 part, address node);
    /// @notice The leaf's membership was not live when its part was recorded (or
    /// does not exist): it is never paid nor slashed.
    error NotBacked(address node, uint32 membership);
    /// @notice The leaf's membership can still be paid, so its reward cannot be released.
    error StillPayable(address node, uint32 membership);
    /// @notice `validator` has already cast this vote in its current term.
    error AlreadyVoted(address validator);
    /// @notice The submission names run `runId`, not this pool's.
    error WrongRun(bytes32 runId);
    /// @notice The signature is malformed or not by the submission's node.
    error BadSignature();
    /// @notice The submission is not the leaf's node's, or not a leaf of its commitment.
    error NotInCommitment();
    /// @notice `node`'s membership `membership` was slashed already: evidence proves
    /// only that the node signed a submission, not which one was bad, and the
    /// membership bonds one penalty, so one is the most a quorum can impose.
    error AlreadySlashed(address node, uint32 membership);
    /// @notice The signed submission with this digest was already evidence for a penalty.
    error EvidenceUsed(bytes32 digest);
    /// @notice `quorum` must lie in [1, `validators`], the number of validators.
    error BadQuorum(uint256 quorum, uint256 validators);
    /// @notice `window` lies outside [`min`, `max`]: at least a minute, at most the
    /// stake manager's unbonding period.
    error WindowOutOfRange(uint256 window, uint256 min, uint256 max);
    /// @notice `penalty` is above `max`, the stake manager's minimum stake per node.
    error PenaltyTooHigh(uint256 penalty, uint256 max);
    /// @notice `role` (RECORDER_ROLE or VALIDATOR_ROLE) changes only after the
    /// delay: `scheduleRoleChange`, then `applyRoleChange`.
    error RoleChangeDelayed(bytes32 role);
    /// @notice `role` is not one whose changes are scheduled; grant or revoke it directly.
    error RoleNotDelayed(bytes32 role);
    /// @notice No change of `role` for `account` is due: none is scheduled
    /// (`effectiveAt` 0), or it applies from `effectiveAt`.
    error RoleChangeNotDue(bytes32 role, address account, uint256 effectiveAt);

    function RECORDER_ROLE() external view returns (bytes32);
    function VALIDATOR_ROLE() external view returns (bytes32);
    function runId() external view returns (bytes32);

    /// @notice The caller, provider of `node`, adds it to this run under a new
    /// membership. The provider's active stake must cover all of its registered
    /// nodes and the penalties its memberships bond.
    function joinPool(address node) external;

    /// @notice The node or its provider takes the node out of this run; the
    /// penalty stays bonded until the windows of the work recorded before have closed.
    function leavePool(address node) external;

    /// @notice An admin removes a node from this run; its recorded work stays claimable.
    function eject(address node) external;

    /// @notice Adds `amount` tokens (approved beforehand) to the reward budget.
    function fund(uint256 amount) external;

    /// @notice Records part `part` of `epoch`: the root over `leaves` (strictly
    /// ascending nodes, 1 to MAX_LEAVES), reserving the reward of their units. A
    /// node belongs in one part of an epoch: the recorder's rule (as its units are),
    /// not checked here, since that would cost a storage write per node.
    function recordWork(uint64 epoch, uint32 part, WorkLeaf[] calldata leaves) external;

    /// @notice A validator's vote to drop a leaf; at `quorum` votes, within the
    /// window, its reward returns to the budget.
    function invalidate(LeafRef calldata ref) external;

    /// @notice A validator's vote to slash the provider of `ref`'s membership by
    /// the membership's penalty, with the node's signed submission and its Merkle proof
    /// against the leaf's commitment as evidence. At `quorum` votes the leaf is
    /// invalidated, the membership ended and its provider slashed.
    function slash(LeafRef calldata ref, Submission calldata sub, bytes calldata signature, bytes32[] calldata proof)
        external;

    /// @notice Pays the caller the rewards of `refs`, leaves of memberships it was
    /// the provider of, whose windows have passed without invalidation or slash.
    function claim(LeafRef[] calldata refs) external returns (uint256 amount);

    /// @notice Returns to the budget the reward of a leaf that can never be paid:
    /// its membership was not live at recording, or was slashed. Anyone may call.
    function release(LeafRef calldata ref) external;

    /// @return The penalties of `provider`'s memberships the stake manager keeps bonded.
    function bondOf(address provider) external view returns (uint256);
    function recordOf(uint64 epoch, uint32 part) external view returns (PartRecord memory);
    function settlementOf(uint64 epoch, uint32 part, address node) external view returns (Settlement);
    /// @return index The node's latest membership (0 and an empty one if it never joined).
    function membershipOf(address node) external view returns (uint32 index, Membership memory membership);
    /// @return indexes The latest membership of each of `nodes`, as `membershipOf`
    /// says, in one call: what the recorder reads of a thousand nodes before an epoch.
    function membershipsOf(address[] calldata nodes)
        external
        view
        returns (uint32[] memory indexes, Membership[] memory memberships);
    /// @return The root a part with `leaves` has, as `recordWork` computes it.
    function rootOf(WorkLeaf[] calldata leaves) external pure returns (bytes32);
    function isJoined(address node) external view returns (bool);
    function availableRewards() external view returns (uint256);
    function reservedRewards() external view returns (uint256);
    /// @return The window of parts recorded now.
    function invalidationWindow() external view returns (uint256);
    /// @return window A window waiting to apply, and from when (zeros if none).
    function pendingInvalidationWindow() external view returns (uint256 window, uint256 effectiveAt);
    /// @return The validator votes that invalidate or slash now.
    function quorum() external view returns (uint256);
    /// @return quorum A lower quorum waiting to apply, and from when (zeros if none).
    function pendingQuorum() external view returns (uint256 quorum, uint256 effectiveAt);
    function validatorCount() external view returns (uint256);
    /// @return The reward per unit of parts recorded now.
    function rewardPerUnit() external view returns (uint256);
    /// @return amount A reward per unit waiting to apply, and from when (zeros if none).
    function pendingRewardPerUnit() external view returns (uint256 amount, uint256 effectiveAt);
    /// @return The penalty a node joining now bonds (and the most any slash takes now).
    function slashPenalty() external view returns (uint256);
    /// @return amount A higher penalty waiting to apply, and from when (zeros if none).
    function pendingSlashPenalty() external view returns (uint256 amount, uint256 effectiveAt);
    /// @return When `validator`'s current term began (its slash votes count from then).
    function slashVotesAt(address validator) external view returns (uint256);
    /// @return grant Whether the change of `role` for `account` scheduled is a
    /// grant (else a revocation), and when it is due (0: none is scheduled).
    function pendingRoleChange(bytes32 role, address account) external view returns (bool grant, uint256 effectiveAt);

    /// @return The EIP-712 digest a node signs for `sub`.
    function submissionDigest(Submission calldata sub) external view returns (bytes32);

    /// @notice Sets the votes needed, within [1, validatorCount]; a lower quorum
    /// applies only after the slash-change delay.
    function setQuorum(uint256 quorum) external;
    /// @notice Sets the reward per unit of work recorded once the delay has passed.
    function setRewardPerUnit(uint256 amount) external;
    /// @notice Sets the penalty of memberships joined from now on, at most the
    /// minimum stake per node; a higher penalty applies only after the
    /// slash-change delay, a lower one also to every slash from now on.
    function setSlashPenalty(uint256 amount) external;
    /// @notice Sets the window of work recorded once the delay has passed,
    /// within [1 minute, unbonding period].
    function setInvalidationWindow(uint256 window) external;
    /// @notice Schedules granting (`grant`) or revoking RECORDER_ROLE or
    /// VALIDATOR_ROLE for `account`, which anyone can apply once the delay has passed.
    function scheduleRoleChange(bytes32 role, address account, bool grant) external;
    /// @notice Applies the scheduled change of `role` for `account` once it is due.
    function applyRoleChange(bytes32 role, address account) external;
}
