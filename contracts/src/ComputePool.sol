// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

import {IComputePool} from "./interfaces/IComputePool.sol";
import {IProviderRegistry} from "./interfaces/IProviderRegistry.sol";
import {IStakeManager} from "./interfaces/IStakeManager.sol";

/// @title One training run's pool of nodes, their recorded work and rewards.
/// @notice See IComputePool. A StakeManager creates pools (its `createPool`,
/// through its PoolFactory) and lets only those lock and slash stake.
/// The provider a node had when its work was recorded is the one that claims
/// the reward and is slashed for it, even if the node later leaves the pool or
/// the registry.
///
/// A vote counts only while its validator holds the role in the term it voted
/// in: revoking (or renouncing) the role voids the validator's pending votes,
/// also if it is granted again later.
///
/// No operator can profit from a slash, nor make slashing easier or costlier
/// before stakers can leave. Slashed stake goes to the stake manager's
/// treasury, fixed when the manager was deployed. The validators, quorum and
/// penalty a pool is created with apply at once: a provider accepts them by
/// joining. Later changes that let a new party slash or take more wait
/// SLASH_CHANGE_DELAY: the slash votes of a validator appointed after
/// deployment (also one revoked and appointed again), a lower quorum, a higher
/// penalty. The delay is a constant longer than the longest invalidation
/// window plus the longest unbonding period (each at most the stake manager's
/// MAX_UNBONDING_PERIOD, 30 days), so shortening the unbonding period or the
/// window first shortens nothing. A provider that leaves the pool within a day
/// of the change sees the windows of all its records close, and its stake
/// unbonded and withdrawable, before the change applies; one that leaves
/// within 31 days has no record left that the change could judge. Changes the
/// other way (a new validator's invalidation votes, a higher quorum, a lower
/// penalty, revoking a validator) apply at once: none takes stake, and an
/// invalidation only returns a reward to this pool's budget, which pays
/// providers alone. A recorder needs no delay either: recording slashes
/// nothing without the validators' votes.
contract ComputePool is IComputePool, AccessControl, EIP712, ReentrancyGuard {
    using SafeERC20 for IERC20;

    /// @inheritdoc IComputePool
    bytes32 public constant RECORDER_ROLE = keccak256("RECORDER_ROLE");
    /// @inheritdoc IComputePool
    bytes32 public constant VALIDATOR_ROLE = keccak256("VALIDATOR_ROLE");
    /// @notice keccak256("Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)")
    bytes32 public constant SUBMISSION_TYPEHASH =
        keccak256("Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)");
    /// @notice The shortest invalidation window.
    uint256 public constant MIN_INVALIDATION_WINDOW = 1 minutes;
    /// @notice How long a change that makes slashing easier or costlier waits
    /// before it applies: 30 days of the longest window, 30 of the longest
    /// unbonding period and a day to react (see the contract's notice).
    uint256 public constant SLASH_CHANGE_DELAY = 61 days;

    /// @inheritdoc IComputePool
    bytes32 public immutable runId;
    /// @notice The reward token (the stake token).
    IERC20 public immutable token;
    /// @notice The provider registry.
    IProviderRegistry public immutable registry;
    /// @notice The stake manager that created this pool, which locks and slashes for it.
    IStakeManager public immutable stakeManager;

    /// @inheritdoc IComputePool
    uint256 public invalidationWindow;
    /// @inheritdoc IComputePool
    uint256 public rewardPerUnit;
    /// @inheritdoc IComputePool
    uint256 public validatorCount;

    /// @inheritdoc IComputePool
    uint256 public availableRewards;
    /// @inheritdoc IComputePool
    uint256 public reservedRewards;
    /// @notice Every token ever added by `fund`.
    uint256 public totalFunded;
    /// @notice Every token ever paid by `claim`.
    uint256 public totalPaid;

    mapping(address node => address provider) private _joined;
    mapping(uint64 epoch => mapping(address node => WorkRecord)) private _work;
    /// @dev Bumped on every grant of VALIDATOR_ROLE, so a vote names the term it was cast in.
    mapping(address validator => uint256) private _term;
    /// @dev One ballot per (epoch, node) for invalidation and per (epoch, node, digest) for slashing.
    mapping(bytes32 ballot => address[]) private _voters;
    mapping(bytes32 ballot => mapping(address validator => uint256 term)) private _votedIn;
    mapping(bytes32 digest => bool) private _evidenceUsed;

    /// @dev A setting whose change in one direction waits: `next` applies from `nextAt` (0: none waits).
    struct Delayed {
        uint256 value;
        uint256 next;
        uint256 nextAt;
    }

    Delayed private _quorum;
    Delayed private _slashPenalty;
    /// @dev When each validator's slash votes start to count, in its current term.
    mapping(address validator => uint256) private _slashVotesAt;

    /// @dev Deployed by the stake manager's PoolFactory. Token and registry are
    /// the stake manager's; its unbonding period and minimum stake bound `params`.
    /// @param stakeManager_ The stake manager that slashes for this pool.
    /// @param runId_ The run this pool pays for; bound into every Submission.
    /// @param admin Receives DEFAULT_ADMIN_ROLE (setters, eject, granting roles).
    /// @param params Window, reward per unit, penalty and quorum; checked as by their setters.
    /// @param recorders Receive RECORDER_ROLE.
    /// @param validators Receive VALIDATOR_ROLE.
    constructor(
        IStakeManager stakeManager_,
        bytes32 runId_,
        address admin,
        PoolParams memory params,
        address[] memory recorders,
        address[] memory validators
    ) EIP712("SwarmRL ComputePool", "1") {
        stakeManager = stakeManager_;
        runId = runId_;
        token = stakeManager_.token();
        registry = stakeManager_.registry();
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        for (uint256 i; i < recorders.length; ++i) {
            _grantRole(RECORDER_ROLE, recorders[i]);
        }
        for (uint256 i; i < validators.length; ++i) {
            _grantRole(VALIDATOR_ROLE, validators[i]);
        }
        _setInvalidationWindow(params.invalidationWindow);
        _setRewardPerUnit(params.rewardPerUnit);
        _setSlashPenalty(params.slashPenalty);
        _setQuorum(params.quorum);
    }

    // ---- membership ----

    /// @inheritdoc IComputePool
    /// @dev Reverts NodeNotRegistered, NotNodeProvider (caller is not the
    /// node's provider), AlreadyJoined, StakeTooLow. A membership left by a
    /// provider who has since removed the node from the registry is stale: the
    /// node's new provider replaces it (NodeLeft, then NodeJoined), so a former
    /// provider cannot keep a node out of the run.
    function joinPool(address node) external {
        address provider = registry.providerOf(node);
        if (provider == address(0)) revert NodeNotRegistered(node);
        if (provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        address current = _joined[node];
        if (current == provider) revert AlreadyJoined(node);
        if (current != address(0)) emit NodeLeft(node);
        _requireStakeCoversNodes(provider);
        _joined[node] = provider;
        emit NodeJoined(node, provider);
    }

    /// @inheritdoc IComputePool
    /// @dev Reverts NotJoined, NotNodeProvider unless the caller is the node
    /// or the provider it joined with.
    function leavePool(address node) external {
        address provider = _joined[node];
        if (provider == address(0)) revert NotJoined(node);
        if (msg.sender != node && msg.sender != provider) revert NotNodeProvider(node, msg.sender);
        delete _joined[node];
        emit NodeLeft(node);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts NotJoined.
    function eject(address node) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (_joined[node] == address(0)) revert NotJoined(node);
        delete _joined[node];
        emit NodeEjected(node, msg.sender);
    }

    // ---- rewards ----

    /// @inheritdoc IComputePool
    /// @dev Anyone may fund. Reverts ZeroAmount.
    function fund(uint256 amount) external nonReentrant {
        if (amount == 0) revert ZeroAmount();
        availableRewards += amount;
        totalFunded += amount;
        emit RewardsFunded(msg.sender, amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only RECORDER_ROLE. Reserves `units * rewardPerUnit` from the
    /// budget and locks `slashPenalty` of the provider's stake until the window
    /// ends. Reverts ZeroAmount (no units), NotJoined, NodeNotRegistered (the
    /// node is no longer its join-time provider's in the registry),
    /// WorkAlreadyRecorded, StakeTooLow (the provider's stake no longer covers
    /// its nodes), InsufficientRewards, and the stake manager's FreeStakeTooLow.
    function submitWork(uint64 epoch, address node, uint128 units, bytes32 commitment)
        external
        onlyRole(RECORDER_ROLE)
    {
        if (units == 0) revert ZeroAmount();
        address provider = _joined[node];
        if (provider == address(0)) revert NotJoined(node);
        // A node its provider removed from the registry no longer has stake bound to it.
        if (registry.providerOf(node) != provider) revert NodeNotRegistered(node);
        WorkRecord storage rec = _work[epoch][node];
        if (rec.units != 0) revert WorkAlreadyRecorded(epoch, node);
        _requireStakeCoversNodes(provider);
        uint256 reward = uint256(units) * rewardPerUnit;
        uint256 available = availableRewards;
        if (available < reward) revert InsufficientRewards(available, reward);

        uint256 windowEnd = block.timestamp + invalidationWindow;
        uint256 penalty = slashPenalty();
        availableRewards = available - reward;
        reservedRewards += reward;
        rec.units = units;
        rec.recordedAt = SafeCast.toUint64(block.timestamp);
        rec.unlocksAt = SafeCast.toUint64(windowEnd);
        rec.provider = provider;
        rec.commitment = commitment;
        rec.reward = reward;
        rec.penalty = penalty;
        emit WorkSubmitted(epoch, node, units, commitment, reward, windowEnd);
        stakeManager.lock(provider, penalty, windowEnd);
    }

    /// @inheritdoc IComputePool
    /// @dev Only VALIDATOR_ROLE. Reverts NoWork, AlreadyInvalidated,
    /// WindowClosed, AlreadyVoted (one vote per validator term, epoch and node).
    function invalidate(uint64 epoch, address node) external onlyRole(VALIDATOR_ROLE) {
        WorkRecord storage rec = _work[epoch][node];
        if (rec.units == 0) revert NoWork(epoch, node);
        if (rec.invalidated) revert AlreadyInvalidated(epoch, node);
        if (block.timestamp >= rec.unlocksAt) revert WindowClosed(epoch, node);

        uint256 votes = _vote(keccak256(abi.encode(epoch, node)));
        emit InvalidationVoted(epoch, node, msg.sender, votes);
        if (votes >= quorum()) _invalidate(rec, epoch, node);
    }

    /// @inheritdoc IComputePool
    /// @dev Only VALIDATOR_ROLE, within the window. Reverts NoWork (no record
    /// for `sub.node` at `epoch`), WindowClosed, WrongRun, BadSignature (not
    /// signed by `sub.node`), NotInCommitment, AlreadySlashed (this epoch of
    /// the node was slashed already), EvidenceUsed (this submission already
    /// slashed, in any epoch), AlreadyVoted, SlashVoteTooEarly (a validator
    /// appointed after deployment, before SLASH_CHANGE_DELAY has passed). Votes
    /// count per (epoch, node, digest). Slashed stake goes to the stake
    /// manager's treasury; the caller gets nothing.
    function slash(uint64 epoch, Submission calldata sub, bytes calldata signature, bytes32[] calldata proof)
        external
        onlyRole(VALIDATOR_ROLE)
        nonReentrant
    {
        uint256 votesAt = _slashVotesAt[msg.sender];
        if (block.timestamp < votesAt) revert SlashVoteTooEarly(msg.sender, votesAt);
        address node = sub.node;
        WorkRecord storage rec = _work[epoch][node];
        bytes32 digest = _checkEvidence(epoch, rec, sub, signature, proof);
        if (rec.slashed) revert AlreadySlashed(epoch, node);
        if (_evidenceUsed[digest]) revert EvidenceUsed(digest);

        uint256 votes = _vote(keccak256(abi.encode(epoch, node, digest)));
        emit SlashVoted(epoch, node, digest, msg.sender, votes);
        if (votes < quorum()) return;

        rec.slashed = true;
        _evidenceUsed[digest] = true;
        if (!rec.invalidated) _invalidate(rec, epoch, node);
        if (_joined[node] != address(0)) {
            delete _joined[node];
            emit NodeEjected(node, msg.sender);
        }
        address provider = rec.provider;
        uint256 amount = stakeManager.slash(provider, rec.penalty, digest);
        emit NodeSlashed(epoch, node, provider, digest, amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Reverts NoWork, NotNodeProvider (caller is not the provider
    /// recorded with the epoch), AlreadyInvalidated, AlreadyClaimed,
    /// WindowOpen. Pays the caller the sum in one transfer.
    function claim(address node, uint64[] calldata epochs) external nonReentrant returns (uint256 amount) {
        uint256 n = epochs.length;
        for (uint256 i; i < n; ++i) {
            uint64 epoch = epochs[i];
            WorkRecord storage rec = _work[epoch][node];
            if (rec.units == 0) revert NoWork(epoch, node);
            if (rec.provider != msg.sender) revert NotNodeProvider(node, msg.sender);
            if (rec.invalidated) revert AlreadyInvalidated(epoch, node);
            if (rec.claimed) revert AlreadyClaimed(epoch, node);
            if (block.timestamp < rec.unlocksAt) revert WindowOpen(epoch, node, rec.unlocksAt);
            rec.claimed = true;
            amount += rec.reward;
            emit RewardClaimed(epoch, node, msg.sender, rec.reward);
        }
        if (amount == 0) return 0;
        reservedRewards -= amount;
        totalPaid += amount;
        token.safeTransfer(msg.sender, amount);
    }

    // ---- views ----

    /// @inheritdoc IComputePool
    function workOf(uint64 epoch, address node) external view returns (WorkRecord memory) {
        return _work[epoch][node];
    }

    /// @inheritdoc IComputePool
    function isJoined(address node) external view returns (bool) {
        return _joined[node] != address(0);
    }

    /// @notice The provider `node` joined with, or zero if not joined.
    function joinedProviderOf(address node) external view returns (address) {
        return _joined[node];
    }

    /// @notice Invalidation votes for `node`'s work at `epoch` that count now.
    function invalidationVotes(uint64 epoch, address node) external view returns (uint256) {
        return _countVotes(keccak256(abi.encode(epoch, node)));
    }

    /// @notice Slash votes with the evidence (epoch, node, digest) that count
    /// now, and whether `node`'s work at `epoch` has been slashed (by any evidence).
    function slashVotes(uint64 epoch, address node, bytes32 digest)
        external
        view
        returns (uint256 votes, bool slashed)
    {
        return (_countVotes(keccak256(abi.encode(epoch, node, digest))), _work[epoch][node].slashed);
    }

    /// @inheritdoc IComputePool
    function quorum() public view returns (uint256) {
        return _current(_quorum);
    }

    /// @inheritdoc IComputePool
    function pendingQuorum() external view returns (uint256 quorum_, uint256 effectiveAt) {
        return _pending(_quorum);
    }

    /// @inheritdoc IComputePool
    function slashPenalty() public view returns (uint256) {
        return _current(_slashPenalty);
    }

    /// @inheritdoc IComputePool
    function pendingSlashPenalty() external view returns (uint256 amount, uint256 effectiveAt) {
        return _pending(_slashPenalty);
    }

    /// @inheritdoc IComputePool
    function slashVotesAt(address validator) external view returns (uint256) {
        return _slashVotesAt[validator];
    }

    /// @notice Whether the signed submission with `digest` was evidence for a penalty already.
    function evidenceUsed(bytes32 digest) external view returns (bool) {
        return _evidenceUsed[digest];
    }

    /// @notice When `node`'s work at `epoch` can be claimed (0 if none recorded).
    function unlocksAt(uint64 epoch, address node) external view returns (uint256) {
        return _work[epoch][node].unlocksAt;
    }

    /// @inheritdoc IComputePool
    function submissionDigest(Submission calldata sub) external view returns (bytes32) {
        return _submissionDigest(sub);
    }

    /// @notice The EIP-712 domain separator (chain id and this contract bound in).
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ---- admin ----

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts BadQuorum. A higher (or equal)
    /// quorum applies at once and cancels a lower one still waiting; a lower
    /// one applies SLASH_CHANGE_DELAY from now.
    function setQuorum(uint256 quorum_) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setQuorum(quorum_);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE.
    function setRewardPerUnit(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setRewardPerUnit(amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts PenaltyTooHigh. A lower (or equal)
    /// penalty applies at once and cancels a higher one still waiting; a higher
    /// one applies to work recorded from SLASH_CHANGE_DELAY from now on.
    function setSlashPenalty(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setSlashPenalty(amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts WindowOutOfRange.
    function setInvalidationWindow(uint256 window) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setInvalidationWindow(window);
    }

    // ---- internals ----

    /// @dev Counts validators and starts a new term on every grant of
    /// VALIDATOR_ROLE, whose slash votes count at once only within the deployment.
    function _grantRole(bytes32 role, address account) internal override returns (bool granted) {
        granted = super._grantRole(role, account);
        if (granted && role == VALIDATOR_ROLE) {
            ++validatorCount;
            ++_term[account];
            uint256 votesAt = _deploying() ? block.timestamp : block.timestamp + SLASH_CHANGE_DELAY;
            _slashVotesAt[account] = votesAt;
            emit ValidatorAppointed(account, votesAt);
        }
    }

    /// @dev Reverts BadQuorum if fewer validators than the quorum would remain:
    /// lower the quorum or grant a replacement first.
    function _revokeRole(bytes32 role, address account) internal override returns (bool revoked) {
        revoked = super._revokeRole(role, account);
        if (revoked && role == VALIDATOR_ROLE) {
            uint256 left = --validatorCount;
            uint256 q = quorum();
            if (left < q) revert BadQuorum(q, left);
        }
    }

    /// @dev Casts the caller's vote on `ballot` and returns the votes that count.
    function _vote(bytes32 ballot) private returns (uint256) {
        uint256 term = _term[msg.sender];
        uint256 votedIn = _votedIn[ballot][msg.sender];
        if (votedIn == term) revert AlreadyVoted(msg.sender);
        if (votedIn == 0) _voters[ballot].push(msg.sender);
        _votedIn[ballot][msg.sender] = term;
        return _countVotes(ballot);
    }

    /// @dev Votes on `ballot` whose validator still holds the role in the term it voted in.
    function _countVotes(bytes32 ballot) private view returns (uint256 votes) {
        address[] storage voters = _voters[ballot];
        uint256 n = voters.length;
        for (uint256 i; i < n; ++i) {
            address v = voters[i];
            if (hasRole(VALIDATOR_ROLE, v) && _votedIn[ballot][v] == _term[v]) ++votes;
        }
    }

    function _invalidate(WorkRecord storage rec, uint64 epoch, address node) private {
        rec.invalidated = true;
        uint256 reward = rec.reward;
        reservedRewards -= reward;
        availableRewards += reward;
        emit WorkInvalidated(epoch, node);
    }

    function _requireStakeCoversNodes(address provider) private view {
        if (!stakeManager.coversNodes(provider, registry.nodesOf(provider).length)) revert StakeTooLow(provider);
    }

    function _setQuorum(uint256 quorum_) private {
        uint256 validators = validatorCount;
        if (quorum_ == 0 || quorum_ > validators) revert BadQuorum(quorum_, validators);
        (uint256 old, uint256 effectiveAt) = _set(_quorum, quorum_, quorum_ >= quorum());
        emit QuorumChanged(old, quorum_, effectiveAt);
    }

    function _setRewardPerUnit(uint256 amount) private {
        emit RewardPerUnitChanged(rewardPerUnit, amount);
        rewardPerUnit = amount;
    }

    function _setSlashPenalty(uint256 amount) private {
        uint256 max = stakeManager.minStakePerNode();
        if (amount > max) revert PenaltyTooHigh(amount, max);
        (uint256 old, uint256 effectiveAt) = _set(_slashPenalty, amount, amount <= slashPenalty());
        emit SlashPenaltyChanged(old, amount, effectiveAt);
    }

    /// @dev Whether this runs inside the constructor (no code is deployed yet):
    /// what the deployment sets is the terms providers join under, and applies at once.
    function _deploying() private view returns (bool) {
        return address(this).code.length == 0;
    }

    /// @dev The setting's value now: its waiting value once that applies.
    function _current(Delayed storage d) private view returns (uint256) {
        uint256 nextAt = d.nextAt;
        return nextAt != 0 && block.timestamp >= nextAt ? d.next : d.value;
    }

    /// @dev The value waiting to apply and from when, or zeros if none waits.
    function _pending(Delayed storage d) private view returns (uint256 value, uint256 effectiveAt) {
        if (d.nextAt > block.timestamp) return (d.next, d.nextAt);
    }

    /// @dev Sets `d` to `value` at once if `atOnce` (or while deploying), else from
    /// SLASH_CHANGE_DELAY on; a new setting replaces one still waiting.
    function _set(Delayed storage d, uint256 value, bool atOnce) private returns (uint256 old, uint256 effectiveAt) {
        old = _current(d);
        if (atOnce || _deploying()) {
            (d.value, d.next, d.nextAt) = (value, 0, 0);
            return (old, block.timestamp);
        }
        effectiveAt = block.timestamp + SLASH_CHANGE_DELAY;
        (d.value, d.next, d.nextAt) = (old, value, effectiveAt);
    }

    function _setInvalidationWindow(uint256 window) private {
        uint256 max = stakeManager.unbondingPeriod();
        if (window < MIN_INVALIDATION_WINDOW || window > max) {
            revert WindowOutOfRange(window, MIN_INVALIDATION_WINDOW, max);
        }
        emit InvalidationWindowChanged(invalidationWindow, window);
        invalidationWindow = window;
    }

    /// @dev The evidence checks of `slash`; returns the submission's digest.
    function _checkEvidence(
        uint64 epoch,
        WorkRecord storage rec,
        Submission calldata sub,
        bytes calldata signature,
        bytes32[] calldata proof
    ) private view returns (bytes32 digest) {
        if (rec.units == 0) revert NoWork(epoch, sub.node);
        if (block.timestamp >= rec.unlocksAt) revert WindowClosed(epoch, sub.node);
        if (sub.runId != runId) revert WrongRun(sub.runId);
        digest = _submissionDigest(sub);
        (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecoverCalldata(digest, signature);
        if (err != ECDSA.RecoverError.NoError || signer != sub.node) revert BadSignature();
        if (!MerkleProof.verifyCalldata(proof, rec.commitment, keccak256(abi.encode(digest)))) {
            revert NotInCommitment();
        }
    }

    function _submissionDigest(Submission calldata sub) private view returns (bytes32) {
        return
            _hashTypedDataV4(
                keccak256(abi.encode(SUBMISSION_TYPEHASH, sub.runId, sub.node, sub.step, sub.rolloutDigest))
            );
    }
}
