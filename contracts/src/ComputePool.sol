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
/// @notice See IComputePool. The provider a node had when it joined is the one
/// recorded with each epoch of its work: that provider claims the epoch's
/// reward and is the one slashed for it, even if the node later leaves the
/// pool or the registry. The invalidation window of a record is measured
/// with the current `invalidationWindow`, so an admin change applies to
/// records not yet claimed as well. The pool needs SLASHER_ROLE on the stake
/// manager to slash.
contract ComputePool is IComputePool, AccessControl, EIP712, ReentrancyGuard {
    using SafeERC20 for IERC20;

    /// @inheritdoc IComputePool
    bytes32 public constant RECORDER_ROLE = keccak256("RECORDER_ROLE");
    /// @inheritdoc IComputePool
    bytes32 public constant VALIDATOR_ROLE = keccak256("VALIDATOR_ROLE");
    /// @notice keccak256("Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)")
    bytes32 public constant SUBMISSION_TYPEHASH =
        keccak256("Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)");

    /// @notice `node`'s work at `epoch` was already slashed. Evidence proves only
    /// that the node signed a submission, not which submission was bad, so one
    /// penalty per epoch is the most a quorum can impose: otherwise every other
    /// submission in the same commitment could be used to slash again.
    error AlreadySlashed(uint64 epoch, address node);

    /// @inheritdoc IComputePool
    bytes32 public immutable runId;
    /// @notice The reward token (the stake token).
    IERC20 public immutable token;
    /// @notice The provider registry.
    IProviderRegistry public immutable registry;
    /// @notice The stake manager slashed through.
    IStakeManager public immutable stakeManager;

    /// @inheritdoc IComputePool
    uint256 public invalidationWindow;
    /// @inheritdoc IComputePool
    uint256 public rewardPerUnit;
    /// @inheritdoc IComputePool
    uint256 public slashPenalty;
    /// @inheritdoc IComputePool
    uint256 public quorum;

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
    mapping(uint64 epoch => mapping(address node => address provider)) private _workProvider;
    mapping(uint64 epoch => mapping(address node => uint256)) private _invalidationVotes;
    mapping(uint64 epoch => mapping(address node => mapping(address validator => bool))) private _invalidationVoted;
    mapping(bytes32 evidence => uint256) private _slashVotes;
    mapping(bytes32 evidence => mapping(address validator => bool)) private _slashVoted;
    mapping(uint64 epoch => mapping(address node => bool)) private _slashed;

    /// @param runId_ The run this pool pays for; bound into every Submission.
    /// @param token_ The reward token.
    /// @param registry_ The provider registry.
    /// @param stakeManager_ The stake manager (must grant this pool SLASHER_ROLE).
    /// @param admin Receives DEFAULT_ADMIN_ROLE (setters, eject, granting roles).
    /// @param invalidationWindow_ Seconds after recording during which work can be invalidated or slashed.
    /// @param rewardPerUnit_ Tokens per work unit.
    /// @param slashPenalty_ Tokens slashed from a provider per slash.
    /// @param quorum_ Validator votes needed to invalidate or slash (>= 1).
    constructor(
        bytes32 runId_,
        IERC20 token_,
        IProviderRegistry registry_,
        IStakeManager stakeManager_,
        address admin,
        uint256 invalidationWindow_,
        uint256 rewardPerUnit_,
        uint256 slashPenalty_,
        uint256 quorum_
    ) EIP712("SwarmRL ComputePool", "1") {
        if (quorum_ == 0) revert BadQuorum(quorum_);
        runId = runId_;
        token = token_;
        registry = registry_;
        stakeManager = stakeManager_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        invalidationWindow = invalidationWindow_;
        rewardPerUnit = rewardPerUnit_;
        slashPenalty = slashPenalty_;
        quorum = quorum_;
        emit InvalidationWindowChanged(invalidationWindow_);
        emit RewardPerUnitChanged(rewardPerUnit_);
        emit SlashPenaltyChanged(slashPenalty_);
        emit QuorumChanged(quorum_);
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
        if (!stakeManager.coversNodes(provider, registry.nodesOf(provider).length)) revert StakeTooLow(provider);
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
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts NotJoined. Recorded work stays claimable.
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
    /// budget. Reverts ZeroAmount (no units), NotJoined, NodeNotRegistered
    /// (the node is no longer its join-time provider's in the registry),
    /// WorkAlreadyRecorded, InsufficientRewards.
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
        uint256 reward = uint256(units) * rewardPerUnit;
        uint256 available = availableRewards;
        if (available < reward) revert InsufficientRewards(available, reward);

        availableRewards = available - reward;
        reservedRewards += reward;
        rec.units = units;
        rec.recordedAt = SafeCast.toUint64(block.timestamp);
        rec.commitment = commitment;
        rec.reward = reward;
        _workProvider[epoch][node] = provider;
        emit WorkSubmitted(epoch, node, units, commitment, reward);
    }

    /// @inheritdoc IComputePool
    /// @dev Only VALIDATOR_ROLE. Reverts NoWork, AlreadyInvalidated,
    /// WindowClosed, AlreadyVoted (one vote per validator per epoch and node).
    function invalidate(uint64 epoch, address node) external onlyRole(VALIDATOR_ROLE) {
        WorkRecord storage rec = _work[epoch][node];
        if (rec.units == 0) revert NoWork(epoch, node);
        if (rec.invalidated) revert AlreadyInvalidated(epoch, node);
        if (block.timestamp >= _windowEnd(rec)) revert WindowClosed(epoch, node);
        if (_invalidationVoted[epoch][node][msg.sender]) revert AlreadyVoted(msg.sender);

        _invalidationVoted[epoch][node][msg.sender] = true;
        uint256 votes = ++_invalidationVotes[epoch][node];
        emit InvalidationVoted(epoch, node, msg.sender, votes);
        if (votes >= quorum) _invalidate(rec, epoch, node);
    }

    /// @inheritdoc IComputePool
    /// @dev Only VALIDATOR_ROLE, within the window. Reverts NoWork (no record
    /// for `sub.node` at `epoch`), WindowClosed, WrongRun, BadSignature (not
    /// signed by `sub.node`), NotInCommitment, AlreadySlashed (this epoch of
    /// the node was slashed already), AlreadyVoted. Votes count per (epoch,
    /// node, digest).
    /// Slashed stake goes to the stake manager's treasury; the caller gets nothing.
    function slash(uint64 epoch, Submission calldata sub, bytes calldata signature, bytes32[] calldata proof)
        external
        onlyRole(VALIDATOR_ROLE)
        nonReentrant
    {
        address node = sub.node;
        WorkRecord storage rec = _work[epoch][node];
        bytes32 digest = _checkEvidence(epoch, rec, sub, signature, proof);
        bytes32 evidence = keccak256(abi.encode(epoch, node, digest));
        if (_slashed[epoch][node]) revert AlreadySlashed(epoch, node);
        if (_slashVoted[evidence][msg.sender]) revert AlreadyVoted(msg.sender);

        _slashVoted[evidence][msg.sender] = true;
        uint256 votes = ++_slashVotes[evidence];
        emit SlashVoted(epoch, node, digest, msg.sender, votes);
        if (votes < quorum) return;

        _slashed[epoch][node] = true;
        if (!rec.invalidated) _invalidate(rec, epoch, node);
        if (_joined[node] != address(0)) {
            delete _joined[node];
            emit NodeEjected(node, msg.sender);
        }
        address provider = _workProvider[epoch][node];
        uint256 amount = stakeManager.slash(provider, slashPenalty, digest);
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
            if (_workProvider[epoch][node] != msg.sender) revert NotNodeProvider(node, msg.sender);
            if (rec.invalidated) revert AlreadyInvalidated(epoch, node);
            if (rec.claimed) revert AlreadyClaimed(epoch, node);
            uint256 opensAt = _windowEnd(rec);
            if (block.timestamp < opensAt) revert WindowOpen(epoch, node, opensAt);
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

    /// @notice The provider recorded with `node`'s work at `epoch` (who claims and is slashed), or zero.
    function workProviderOf(uint64 epoch, address node) external view returns (address) {
        return _workProvider[epoch][node];
    }

    /// @inheritdoc IComputePool
    function isJoined(address node) external view returns (bool) {
        return _joined[node] != address(0);
    }

    /// @notice The provider `node` joined with, or zero if not joined.
    function joinedProviderOf(address node) external view returns (address) {
        return _joined[node];
    }

    /// @notice Invalidation votes cast for `node`'s work at `epoch`.
    function invalidationVotes(uint64 epoch, address node) external view returns (uint256) {
        return _invalidationVotes[epoch][node];
    }

    /// @notice Slash votes cast with the evidence (epoch, node, digest), and
    /// whether `node`'s work at `epoch` has been slashed (by any evidence).
    function slashVotes(uint64 epoch, address node, bytes32 digest)
        external
        view
        returns (uint256 votes, bool slashed)
    {
        bytes32 evidence = keccak256(abi.encode(epoch, node, digest));
        return (_slashVotes[evidence], _slashed[epoch][node]);
    }

    /// @notice When `node`'s work at `epoch` can be claimed (0 if none recorded).
    function unlocksAt(uint64 epoch, address node) external view returns (uint256) {
        WorkRecord storage rec = _work[epoch][node];
        return rec.units == 0 ? 0 : _windowEnd(rec);
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
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts BadQuorum for 0.
    function setQuorum(uint256 quorum_) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (quorum_ == 0) revert BadQuorum(quorum_);
        quorum = quorum_;
        emit QuorumChanged(quorum_);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Applies to work recorded afterwards.
    function setRewardPerUnit(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        rewardPerUnit = amount;
        emit RewardPerUnitChanged(amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE.
    function setSlashPenalty(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        slashPenalty = amount;
        emit SlashPenaltyChanged(amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Applies to every unclaimed record.
    function setInvalidationWindow(uint256 window) external onlyRole(DEFAULT_ADMIN_ROLE) {
        invalidationWindow = window;
        emit InvalidationWindowChanged(window);
    }

    // ---- internals ----

    function _invalidate(WorkRecord storage rec, uint64 epoch, address node) private {
        rec.invalidated = true;
        uint256 reward = rec.reward;
        reservedRewards -= reward;
        availableRewards += reward;
        emit WorkInvalidated(epoch, node);
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
        if (block.timestamp >= _windowEnd(rec)) revert WindowClosed(epoch, sub.node);
        if (sub.runId != runId) revert WrongRun(sub.runId);
        digest = _submissionDigest(sub);
        (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecoverCalldata(digest, signature);
        if (err != ECDSA.RecoverError.NoError || signer != sub.node) revert BadSignature();
        if (!MerkleProof.verifyCalldata(proof, rec.commitment, keccak256(abi.encode(digest)))) {
            revert NotInCommitment();
        }
    }

    function _windowEnd(WorkRecord storage rec) private view returns (uint256) {
        return uint256(rec.recordedAt) + invalidationWindow;
    }

    function _submissionDigest(Submission calldata sub) private view returns (bytes32) {
        return
            _hashTypedDataV4(
                keccak256(abi.encode(SUBMISSION_TYPEHASH, sub.runId, sub.node, sub.step, sub.rolloutDigest))
            );
    }
}
