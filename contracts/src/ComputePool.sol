// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Hashes} from "@openzeppelin/contracts/utils/cryptography/Hashes.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

import {DelayedSettings} from "./DelayedSettings.sol";
import {ValidatorBallots} from "./ValidatorBallots.sol";
import {IComputePool} from "./interfaces/IComputePool.sol";
import {IProviderRegistry} from "./interfaces/IProviderRegistry.sol";
import {IStakeManager} from "./interfaces/IStakeManager.sol";

/// @title One training run's pool of nodes, their recorded work and rewards.
/// @notice See IComputePool. A StakeManager creates pools (its `createPool`,
/// through its PoolFactory) and lets only those bond and slash stake.
/// The provider of the membership a leaf names is the one that claims its
/// reward and is slashed for it, even if the node later leaves the pool or the
/// registry.
///
/// An epoch costs the recorder one transaction per MAX_LEAVES nodes: calldata
/// and a log per leaf, a hash per tree node, and a fixed number of storage
/// writes. Per-leaf state (settled, votes) is written only by the rare
/// transactions that need it: a claim (paid by its provider), a vote.
///
/// Validators vote in ValidatorBallots (inherited): a vote counts only while
/// its validator holds the role in the term it voted in, so revoking (or
/// renouncing) the role voids the validator's pending votes, also if it is
/// granted again later.
///
/// No operator can profit from a slash, nor make slashing easier or costlier
/// before stakers can leave, nor move the pool's budget to itself before
/// providers and funders can see it coming. Slashed stake goes to the stake
/// manager's treasury, fixed when the manager was deployed. The recorders,
/// validators, window, reward, quorum and penalty a pool is created with apply
/// at once: a provider accepts them by joining. Later changes wait
/// SLASH_CHANGE_DELAY (the DelayedSettings this contract inherits) if they let
/// a new party slash or take more, or move who is paid: granting or revoking
/// RECORDER_ROLE or VALIDATOR_ROLE (scheduled with `scheduleRoleChange`, done
/// by anyone with `applyRoleChange` once due), any new invalidation window or
/// reward per unit, a lower quorum, a higher penalty. Otherwise an admin could
/// make itself recorder, revoke the validators and shorten the window at once,
/// record the whole budget to a node of its own and claim it a minute later.
/// The delay is a constant longer than the longest invalidation window plus
/// the longest unbonding period (each at most the stake manager's
/// MAX_UNBONDING_PERIOD, 30 days), so shortening the unbonding period or the
/// window first shortens nothing. A provider that leaves the pool within a day
/// of the change sees the windows of all its records close, and its stake
/// unbonded and withdrawable, before the change applies; one that leaves
/// within 31 days has no record left that the change could judge. Changes
/// that apply at once (a higher quorum, a lower penalty, a validator or
/// recorder renouncing its own role) take no stake and pay no one.
contract ComputePool is IComputePool, AccessControl, EIP712, ReentrancyGuard, DelayedSettings, ValidatorBallots {
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
    /// @notice How long a delayed change waits before it applies (one that
    /// makes slashing easier or costlier, or moves who is paid): 30 days of the
    /// longest window, 30 of the longest unbonding period and a day to react
    /// (see the contract's notice).
    uint256 public constant SLASH_CHANGE_DELAY = 61 days;
    /// @notice The most leaves in one part: about 7M gas to record (a log and 128
    /// bytes of calldata per leaf), inside a block and EIP-7825's 16.8M cap per transaction.
    uint256 public constant MAX_LEAVES = 1024;

    /// @inheritdoc IComputePool
    bytes32 public immutable runId;
    /// @notice The reward token (the stake token).
    IERC20 public immutable token;
    /// @notice The provider registry.
    IProviderRegistry public immutable registry;
    /// @notice The stake manager that created this pool, which bonds and slashes for it.
    IStakeManager public immutable stakeManager;

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
    /// @notice The latest end of a window of any part recorded so far: a node
    /// leaving now has no record that stays slashable past it.
    uint64 public latestUnlock;
    /// @dev When the latest part was recorded: a leave in that second comes after it.
    uint64 private _lastRecordedAt;

    /// @dev The penalties a provider's memberships bond: those joined, and those
    /// that left while a window was open, until `leavingUntil` (merged: the latest end).
    struct Bond {
        uint128 joined;
        uint128 leaving;
        uint64 leavingUntil;
    }

    mapping(address node => uint32) private _memberships;
    mapping(address node => mapping(uint32 index => Membership)) private _membership;
    mapping(address provider => Bond) private _bonds;
    mapping(uint64 epoch => mapping(uint32 part => PartRecord)) private _records;
    mapping(bytes32 leafKey => Settlement) private _settled;
    /// @dev Ballots (ValidatorBallots) are one per leaf for invalidation and
    /// one per (node, membership, digest) for slashing.
    mapping(bytes32 digest => bool) private _evidenceUsed;

    Delayed private _quorum;
    Delayed private _slashPenalty;
    Delayed private _invalidationWindow;
    Delayed private _rewardPerUnit;
    /// @dev A scheduled grant (GRANT) or revocation (REVOKE) of a delayed role, per account.
    mapping(bytes32 role => mapping(address account => Delayed)) private _roleChanges;
    /// @dev When each validator's current term began (its slash votes count from then).
    mapping(address validator => uint256) private _slashVotesAt;

    uint256 private constant GRANT = 1;
    uint256 private constant REVOKE = 2;

    /// @dev Deployed by the stake manager's PoolFactory. Token and registry are
    /// the stake manager's; its unbonding period and minimum stake bound `params`.
    /// @param stakeManager_ The stake manager that slashes for this pool.
    /// @param runId_ The run this pool pays for; bound into every Submission.
    /// @param admin Receives DEFAULT_ADMIN_ROLE (setters, eject, role changes).
    /// @param params Window, reward per unit, penalty and quorum; checked as by their setters.
    /// @param recorders Receive RECORDER_ROLE, at once.
    /// @param validators Receive VALIDATOR_ROLE, at once (their slash votes count at once too).
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
    /// provider cannot keep a node out of the run; the former provider's bond
    /// lasts as after any leave.
    function joinPool(address node) external {
        address provider = registry.providerOf(node);
        if (provider == address(0)) revert NodeNotRegistered(node);
        if (provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        uint32 index = _memberships[node];
        Membership storage current = _membership[node][index];
        if (index != 0 && current.leftAt == 0) {
            if (current.provider == provider) revert AlreadyJoined(node);
            _leave(current, true);
            emit NodeLeft(node);
        }
        index += 1;
        _memberships[node] = index;
        uint256 penalty = slashPenalty();
        _membership[node][index] = Membership({
            provider: provider,
            joinedAt: SafeCast.toUint64(block.timestamp),
            leftAt: 0,
            slashed: false,
            penalty: SafeCast.toUint128(penalty)
        });
        _bonds[provider].joined += SafeCast.toUint128(penalty);
        if (
            !stakeManager.coversNodes(provider, registry.nodeCountOf(provider))
                || stakeManager.stakeOf(provider) < stakeManager.bondedOf(provider)
        ) revert StakeTooLow(provider);
        emit NodeJoined(node, provider, index);
    }

    /// @inheritdoc IComputePool
    /// @dev Reverts NotJoined, NotNodeProvider unless the caller is the node
    /// or the provider it joined with.
    function leavePool(address node) external {
        Membership storage m = _current(node);
        if (msg.sender != node && msg.sender != m.provider) revert NotNodeProvider(node, msg.sender);
        _leave(m, true);
        emit NodeLeft(node);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts NotJoined.
    function eject(address node) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _leave(_current(node), true);
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
    /// @dev Only RECORDER_ROLE. Reverts BadLeaves, ZeroAmount (a leaf without
    /// units), PartAlreadyRecorded, InsufficientRewards. Whether each leaf's
    /// membership is live is not checked here (that would cost a storage read
    /// per node): a leaf whose membership was not live is never paid nor
    /// slashed, and its reward can be released.
    function recordWork(uint64 epoch, uint32 part, WorkLeaf[] calldata leaves) external onlyRole(RECORDER_ROLE) {
        uint256 n = leaves.length;
        if (n == 0 || n > MAX_LEAVES) revert BadLeaves(n);
        PartRecord storage rec = _records[epoch][part];
        if (rec.recordedAt != 0) revert PartAlreadyRecorded(epoch, part);
        bytes32[] memory level = new bytes32[](n);
        uint256 units;
        address previous;
        for (uint256 i; i < n; ++i) {
            WorkLeaf calldata leaf = leaves[i];
            // Ascending nodes: one leaf per node in a part, and one canonical order.
            if (leaf.node <= previous) revert BadLeaves(i);
            if (leaf.units == 0) revert ZeroAmount();
            previous = leaf.node;
            units += leaf.units;
            level[i] = _leafHash(leaf);
            emit WorkRecorded(epoch, leaf.node, part, leaf.membership, leaf.units, leaf.commitment);
        }
        uint256 perUnit = rewardPerUnit();
        uint256 reward = units * perUnit;
        uint256 available = availableRewards;
        if (available < reward) revert InsufficientRewards(available, reward);
        availableRewards = available - reward;
        reservedRewards += reward;

        uint64 unlocks = SafeCast.toUint64(block.timestamp + invalidationWindow());
        rec.root = _root(level);
        rec.units = SafeCast.toUint128(units);
        rec.nodes = uint32(n);
        rec.recordedAt = SafeCast.toUint64(block.timestamp);
        rec.unlocksAt = unlocks;
        rec.rewardPerUnit = SafeCast.toUint128(perUnit);
        if (unlocks > latestUnlock) latestUnlock = unlocks;
        _lastRecordedAt = rec.recordedAt;
        emit PartRecorded(epoch, part, rec.root, n, units, reward, unlocks);
    }

    /// @inheritdoc IComputePool
    /// @dev Only VALIDATOR_ROLE. Reverts NoWork, NotInRecord, WindowClosed,
    /// AlreadySettled, AlreadyVoted (one vote per validator term and leaf).
    function invalidate(LeafRef calldata ref) external onlyRole(VALIDATOR_ROLE) {
        PartRecord storage rec = _proven(ref);
        if (block.timestamp >= rec.unlocksAt) revert WindowClosed(ref.epoch, ref.part);
        bytes32 key = _leafKey(ref);
        if (_settled[key] != Settlement.Open) revert AlreadySettled(ref.epoch, ref.part, ref.leaf.node);

        uint256 votes = _castVote(key);
        emit InvalidationVoted(ref.epoch, ref.leaf.node, msg.sender, votes);
        if (votes >= quorum()) _settle(key, rec, ref, Settlement.Invalidated);
    }

    /// @inheritdoc IComputePool
    /// @dev Only VALIDATOR_ROLE, within the window. Reverts NoWork, NotInRecord,
    /// WindowClosed, NotBacked, WrongRun, BadSignature (not signed by the
    /// leaf's node), NotInCommitment, AlreadySlashed (the membership was
    /// slashed already), EvidenceUsed (this submission already slashed),
    /// AlreadyVoted. Votes count per (node, membership, digest). The penalty
    /// is the one the membership bonded at its join, or the current one if
    /// lower. A membership slashed after it left stops bonding its penalty at
    /// once. Slashed stake goes to the stake manager's treasury; the caller
    /// gets nothing.
    function slash(LeafRef calldata ref, Submission calldata sub, bytes calldata signature, bytes32[] calldata proof)
        external
        onlyRole(VALIDATOR_ROLE)
        nonReentrant
    {
        PartRecord storage rec = _proven(ref);
        if (block.timestamp >= rec.unlocksAt) revert WindowClosed(ref.epoch, ref.part);
        address node = ref.leaf.node;
        Membership storage m = _backing(ref, rec);
        bytes32 digest = _checkEvidence(ref.leaf, sub, signature, proof);
        if (m.slashed) revert AlreadySlashed(node, ref.leaf.membership);
        if (_evidenceUsed[digest]) revert EvidenceUsed(digest);

        uint256 votes = _castVote(keccak256(abi.encode(node, ref.leaf.membership, digest)));
        emit SlashVoted(ref.epoch, node, digest, msg.sender, votes);
        if (votes < quorum()) return;

        _punish(ref, rec, m, digest);
    }

    /// @inheritdoc IComputePool
    /// @dev Reverts NoWork, NotInRecord, WindowOpen, AlreadySlashed (the
    /// leaf's membership was slashed: it forfeited every reward recorded under
    /// it, backed or not), NotBacked, NotNodeProvider (the caller was not the
    /// membership's provider), AlreadySettled. Pays the caller the sum in one transfer.
    function claim(LeafRef[] calldata refs) external nonReentrant returns (uint256 amount) {
        uint256 n = refs.length;
        for (uint256 i; i < n; ++i) {
            LeafRef calldata ref = refs[i];
            PartRecord storage rec = _proven(ref);
            if (block.timestamp < rec.unlocksAt) revert WindowOpen(ref.epoch, ref.part, rec.unlocksAt);
            Membership storage m = _membership[ref.leaf.node][ref.leaf.membership];
            if (m.slashed) revert AlreadySlashed(ref.leaf.node, ref.leaf.membership);
            if (!_backs(m, rec)) revert NotBacked(ref.leaf.node, ref.leaf.membership);
            if (m.provider != msg.sender) revert NotNodeProvider(ref.leaf.node, msg.sender);
            bytes32 key = _leafKey(ref);
            if (_settled[key] != Settlement.Open) revert AlreadySettled(ref.epoch, ref.part, ref.leaf.node);
            _settled[key] = Settlement.Claimed;
            uint256 reward = uint256(ref.leaf.units) * rec.rewardPerUnit;
            amount += reward;
            emit RewardClaimed(ref.epoch, ref.leaf.node, msg.sender, reward);
        }
        if (amount == 0) return 0;
        reservedRewards -= amount;
        totalPaid += amount;
        token.safeTransfer(msg.sender, amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Reverts NoWork, NotInRecord, AlreadySettled, StillPayable.
    function release(LeafRef calldata ref) external {
        PartRecord storage rec = _proven(ref);
        bytes32 key = _leafKey(ref);
        if (_settled[key] != Settlement.Open) revert AlreadySettled(ref.epoch, ref.part, ref.leaf.node);
        Membership storage m = _membership[ref.leaf.node][ref.leaf.membership];
        if (_backs(m, rec) && !m.slashed) revert StillPayable(ref.leaf.node, ref.leaf.membership);
        _settle(key, rec, ref, Settlement.Released);
    }

    // ---- views ----

    /// @inheritdoc IComputePool
    function isJoined(address node) external view returns (bool) {
        uint32 index = _memberships[node];
        return index != 0 && _membership[node][index].leftAt == 0;
    }

    /// @notice The provider `node` is joined with, or zero if not joined.
    function joinedProviderOf(address node) external view returns (address) {
        Membership storage m = _membership[node][_memberships[node]];
        return m.leftAt == 0 ? m.provider : address(0);
    }

    /// @inheritdoc IComputePool
    function membershipOf(address node) external view returns (uint32 index, Membership memory membership) {
        index = _memberships[node];
        membership = _membership[node][index];
    }

    /// @inheritdoc IComputePool
    function membershipsOf(address[] calldata nodes)
        external
        view
        returns (uint32[] memory indexes, Membership[] memory memberships)
    {
        uint256 n = nodes.length;
        indexes = new uint32[](n);
        memberships = new Membership[](n);
        for (uint256 i; i < n; ++i) {
            uint32 index = _memberships[nodes[i]];
            indexes[i] = index;
            memberships[i] = _membership[nodes[i]][index];
        }
    }

    /// @notice `node`'s membership number `index` (1 is its first; empty if none).
    function membershipAt(address node, uint32 index) external view returns (Membership memory) {
        return _membership[node][index];
    }

    /// @inheritdoc IComputePool
    function bondOf(address provider) external view returns (uint256 bonded) {
        Bond storage b = _bonds[provider];
        bonded = b.joined;
        if (block.timestamp < b.leavingUntil) bonded += b.leaving;
    }

    /// @notice What `provider`'s joined memberships bond, and those that left
    /// with a window open, until `until`.
    function bondsOf(address provider) external view returns (uint256 joined, uint256 leaving, uint256 until) {
        Bond storage b = _bonds[provider];
        return (b.joined, b.leaving, b.leavingUntil);
    }

    /// @inheritdoc IComputePool
    function recordOf(uint64 epoch, uint32 part) external view returns (PartRecord memory) {
        return _records[epoch][part];
    }

    /// @inheritdoc IComputePool
    function settlementOf(uint64 epoch, uint32 part, address node) external view returns (Settlement) {
        return _settled[keccak256(abi.encode(epoch, part, node))];
    }

    /// @inheritdoc IComputePool
    function rootOf(WorkLeaf[] calldata leaves) external pure returns (bytes32) {
        uint256 n = leaves.length;
        if (n == 0) revert BadLeaves(0);
        bytes32[] memory level = new bytes32[](n);
        for (uint256 i; i < n; ++i) {
            level[i] = _leafHash(leaves[i]);
        }
        return _root(level);
    }

    /// @notice Invalidation votes for `node`'s leaf in part `part` of `epoch` that count now.
    function invalidationVotes(uint64 epoch, uint32 part, address node) external view returns (uint256) {
        return _tally(keccak256(abi.encode(epoch, part, node)));
    }

    /// @notice Slash votes with the evidence (node, membership, digest) that
    /// count now, and whether the membership has been slashed (by any evidence).
    function slashVotes(address node, uint32 membershipIndex, bytes32 digest)
        external
        view
        returns (uint256 votes, bool slashed)
    {
        return
            (_tally(keccak256(abi.encode(node, membershipIndex, digest))), _membership[node][membershipIndex].slashed);
    }

    /// @inheritdoc IComputePool
    function quorum() public view returns (uint256) {
        return _valueOf(_quorum);
    }

    /// @inheritdoc IComputePool
    function pendingQuorum() external view returns (uint256 quorum_, uint256 effectiveAt) {
        return _pendingOf(_quorum);
    }

    /// @inheritdoc IComputePool
    function slashPenalty() public view returns (uint256) {
        return _valueOf(_slashPenalty);
    }

    /// @inheritdoc IComputePool
    function pendingSlashPenalty() external view returns (uint256 amount, uint256 effectiveAt) {
        return _pendingOf(_slashPenalty);
    }

    /// @inheritdoc IComputePool
    function invalidationWindow() public view returns (uint256) {
        return _valueOf(_invalidationWindow);
    }

    /// @inheritdoc IComputePool
    function pendingInvalidationWindow() external view returns (uint256 window, uint256 effectiveAt) {
        return _pendingOf(_invalidationWindow);
    }

    /// @inheritdoc IComputePool
    function rewardPerUnit() public view returns (uint256) {
        return _valueOf(_rewardPerUnit);
    }

    /// @inheritdoc IComputePool
    function pendingRewardPerUnit() external view returns (uint256 amount, uint256 effectiveAt) {
        return _pendingOf(_rewardPerUnit);
    }

    /// @inheritdoc IComputePool
    function pendingRoleChange(bytes32 role, address account) external view returns (bool grant, uint256 effectiveAt) {
        Delayed storage d = _roleChanges[role][account];
        return (d.next == GRANT, d.nextAt);
    }

    /// @inheritdoc IComputePool
    function slashVotesAt(address validator) external view returns (uint256) {
        return _slashVotesAt[validator];
    }

    /// @notice Whether the signed submission with `digest` was evidence for a penalty already.
    function evidenceUsed(bytes32 digest) external view returns (bool) {
        return _evidenceUsed[digest];
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
    /// @dev Only DEFAULT_ADMIN_ROLE. Applies to parts recorded from
    /// SLASH_CHANGE_DELAY from now on, and replaces a reward still waiting.
    function setRewardPerUnit(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setRewardPerUnit(amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts PenaltyTooHigh. A lower (or equal)
    /// penalty applies at once and cancels a higher one still waiting; a higher
    /// one applies to nodes joining from SLASH_CHANGE_DELAY from now on.
    function setSlashPenalty(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setSlashPenalty(amount);
    }

    /// @inheritdoc IComputePool
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts WindowOutOfRange (checked against
    /// the unbonding period now; the stake manager then keeps its period at
    /// least as long as the waiting window). Applies to parts recorded from
    /// SLASH_CHANGE_DELAY from now on, and replaces a window still waiting.
    function setInvalidationWindow(uint256 window) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _setInvalidationWindow(window);
    }

    /// @inheritdoc IComputePool
    /// @dev Only the role's admin (DEFAULT_ADMIN_ROLE). Reverts RoleNotDelayed
    /// for roles other than RECORDER_ROLE and VALIDATOR_ROLE (use `grantRole`
    /// and `revokeRole` for those). Replaces a change of the same role and
    /// account still waiting; whether the account holds the role is checked
    /// only when the change is applied.
    function scheduleRoleChange(bytes32 role, address account, bool grant) external onlyRole(getRoleAdmin(role)) {
        if (!_isDelayedRole(role)) revert RoleNotDelayed(role);
        uint256 effectiveAt = _scheduleAction(_roleChanges[role][account], grant ? GRANT : REVOKE);
        emit RoleChangeScheduled(role, account, grant, effectiveAt);
    }

    /// @inheritdoc IComputePool
    /// @dev Anyone may apply a change that is due. Reverts RoleChangeNotDue
    /// (none scheduled, or not yet due), BadQuorum (a revocation that would
    /// leave fewer validators than the quorum). Granting a role the account
    /// holds, or revoking one it does not, changes nothing.
    function applyRoleChange(bytes32 role, address account) external {
        (uint256 action, uint256 effectiveAt) = _takeDue(_roleChanges[role][account]);
        if (action == 0) revert RoleChangeNotDue(role, account, effectiveAt);
        if (action == GRANT) _grantRole(role, account);
        else _revokeRole(role, account);
    }

    /// @notice Grants `role` to `account`; only the role's admin.
    /// @dev Reverts RoleChangeDelayed for RECORDER_ROLE and VALIDATOR_ROLE
    /// after deployment: schedule those with `scheduleRoleChange`.
    function grantRole(bytes32 role, address account) public override {
        if (_isDelayedRole(role)) revert RoleChangeDelayed(role);
        super.grantRole(role, account);
    }

    /// @notice Revokes `role` from `account`; only the role's admin.
    /// @dev Reverts RoleChangeDelayed for RECORDER_ROLE and VALIDATOR_ROLE
    /// after deployment: schedule those with `scheduleRoleChange`. An account
    /// may still renounce its own role at once (`renounceRole`).
    function revokeRole(bytes32 role, address account) public override {
        if (_isDelayedRole(role)) revert RoleChangeDelayed(role);
        super.revokeRole(role, account);
    }

    // ---- internals ----

    /// @dev Counts validators and starts a new ballot term on every grant of
    /// VALIDATOR_ROLE; a grant after deployment has waited SLASH_CHANGE_DELAY
    /// already (`applyRoleChange`), so the validator's votes count at once.
    function _grantRole(bytes32 role, address account) internal override returns (bool granted) {
        granted = super._grantRole(role, account);
        if (granted && role == VALIDATOR_ROLE) {
            ++validatorCount;
            _newTerm(account);
            _slashVotesAt[account] = block.timestamp;
            emit ValidatorAppointed(account, block.timestamp);
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

    /// @dev Casts the caller's vote on `ballot` and returns the votes that
    /// count; reverts AlreadyVoted if it voted there in this term.
    function _castVote(bytes32 ballot) private returns (uint256 votes) {
        bool cast;
        (cast, votes) = _cast(ballot, msg.sender);
        if (!cast) revert AlreadyVoted(msg.sender);
    }

    /// @dev A ballot's voters are the current validators.
    function _isVoter(address account) internal view override returns (bool) {
        return hasRole(VALIDATOR_ROLE, account);
    }

    /// @dev SLASH_CHANGE_DELAY is the delay of every delayed setting.
    function _settingDelay() internal pure override returns (uint256) {
        return SLASH_CHANGE_DELAY;
    }

    /// @dev Whether changes of `role` wait (after deployment): those that move who is paid.
    function _isDelayedRole(bytes32 role) private view returns (bool) {
        return (role == RECORDER_ROLE || role == VALIDATOR_ROLE) && !_deploying();
    }

    /// @dev The node's live membership; reverts NotJoined.
    function _current(address node) private view returns (Membership storage m) {
        uint32 index = _memberships[node];
        m = _membership[node][index];
        if (index == 0 || m.leftAt != 0) revert NotJoined(node);
    }

    /// @dev Ends a live membership. `bonded`: its penalty stays bonded until the
    /// windows of every part recorded so far have closed (a slashed one owes
    /// nothing more). A leave in the second of a part recorded before it comes
    /// after that second's parts: `leftAt` is the next second, so it backs
    /// them (and any later part of the same second, whose window ends with
    /// theirs, within what the leave bonds).
    function _leave(Membership storage m, bool bonded) private {
        uint256 leftAt = _lastRecordedAt == block.timestamp ? block.timestamp + 1 : block.timestamp;
        m.leftAt = SafeCast.toUint64(leftAt);
        Bond storage b = _bonds[m.provider];
        uint128 penalty = m.penalty;
        b.joined -= penalty;
        uint64 until = latestUnlock;
        if (!bonded || until <= block.timestamp) return;
        if (block.timestamp >= b.leavingUntil) b.leaving = 0;
        b.leaving += penalty;
        if (until > b.leavingUntil) b.leavingUntil = until;
    }

    /// @dev The part `ref` names, after checking the leaf's proof against its root.
    function _proven(LeafRef calldata ref) private view returns (PartRecord storage rec) {
        rec = _records[ref.epoch][ref.part];
        if (rec.recordedAt == 0) revert NoWork(ref.epoch, ref.part);
        if (!MerkleProof.verifyCalldata(ref.proof, rec.root, _leafHash(ref.leaf))) {
            revert NotInRecord(ref.epoch, ref.part, ref.leaf.node);
        }
    }

    /// @dev The leaf's membership; reverts NotBacked unless it was live when the part was recorded.
    function _backing(LeafRef calldata ref, PartRecord storage rec) private view returns (Membership storage m) {
        m = _membership[ref.leaf.node][ref.leaf.membership];
        if (!_backs(m, rec)) revert NotBacked(ref.leaf.node, ref.leaf.membership);
    }

    /// @dev Whether `m` existed and had not left when `rec` was recorded. A leave
    /// in a second without an earlier record counts as before that second's
    /// records: a leave bonds only the windows open when it lands, so a record
    /// after it in the same second would be slashable with nothing bonded for
    /// it, and a slash takes active stake first, another node's. A leave after
    /// a record of its second has `leftAt` one second later (`_leave`): it backs
    /// that second's records, which its bond covers.
    function _backs(Membership storage m, PartRecord storage rec) private view returns (bool) {
        uint64 at = rec.recordedAt;
        return m.provider != address(0) && m.joinedAt <= at && (m.leftAt == 0 || m.leftAt > at);
    }

    /// @dev A slash's quorum is reached: the membership ends, slashed, the leaf is
    /// invalidated and the provider loses the penalty the membership bonded (the
    /// current one if lower).
    function _punish(LeafRef calldata ref, PartRecord storage rec, Membership storage m, bytes32 digest) private {
        m.slashed = true;
        _evidenceUsed[digest] = true;
        bytes32 key = _leafKey(ref);
        if (_settled[key] == Settlement.Open) _settle(key, rec, ref, Settlement.Invalidated);
        // A slashed membership forfeits what it has not been paid, so nothing of it stays bonded.
        if (m.leftAt == 0) {
            _leave(m, false);
            emit NodeEjected(ref.leaf.node, msg.sender);
        } else {
            // It left with a window open (it is slashable now), so its penalty is in
            // the provider's leaving bond, which no leave since can have reset.
            Bond storage b = _bonds[m.provider];
            if (block.timestamp < b.leavingUntil) b.leaving -= m.penalty;
        }
        uint256 penalty = m.penalty;
        uint256 current = slashPenalty();
        if (current < penalty) penalty = current;
        address provider = m.provider;
        uint256 amount = stakeManager.slash(provider, penalty, digest);
        emit NodeSlashed(ref.epoch, ref.leaf.node, provider, digest, amount);
    }

    /// @dev Settles an open leaf other than by a claim: its reward returns to the budget.
    function _settle(bytes32 key, PartRecord storage rec, LeafRef calldata ref, Settlement how) private {
        _settled[key] = how;
        uint256 reward = uint256(ref.leaf.units) * rec.rewardPerUnit;
        reservedRewards -= reward;
        availableRewards += reward;
        if (how == Settlement.Invalidated) emit WorkInvalidated(ref.epoch, ref.leaf.node, ref.part);
        else emit RewardReleased(ref.epoch, ref.leaf.node, ref.part, reward);
    }

    function _leafKey(LeafRef calldata ref) private pure returns (bytes32) {
        return keccak256(abi.encode(ref.epoch, ref.part, ref.leaf.node));
    }

    function _leafHash(WorkLeaf calldata leaf) private pure returns (bytes32) {
        return keccak256(abi.encode(leaf.node, leaf.membership, leaf.units, leaf.commitment));
    }

    /// @dev The Merkle root over `level` (overwritten): sorted pairs, an odd node moves up unpaired.
    function _root(bytes32[] memory level) private pure returns (bytes32) {
        uint256 n = level.length;
        while (n > 1) {
            uint256 half = n / 2;
            for (uint256 i; i < half; ++i) {
                level[i] = Hashes.commutativeKeccak256(level[2 * i], level[2 * i + 1]);
            }
            if (n % 2 == 1) level[half] = level[n - 1];
            n = half + n % 2;
        }
        return level[0];
    }

    function _setQuorum(uint256 quorum_) private {
        uint256 validators = validatorCount;
        if (quorum_ == 0 || quorum_ > validators) revert BadQuorum(quorum_, validators);
        (uint256 old, uint256 effectiveAt) = _schedule(_quorum, quorum_, quorum_ >= quorum());
        emit QuorumChanged(old, quorum_, effectiveAt);
    }

    function _setRewardPerUnit(uint256 amount) private {
        (uint256 old, uint256 effectiveAt) = _schedule(_rewardPerUnit, amount, false);
        emit RewardPerUnitChanged(old, amount, effectiveAt);
    }

    function _setSlashPenalty(uint256 amount) private {
        uint256 max = stakeManager.minStakePerNode();
        if (amount > max) revert PenaltyTooHigh(amount, max);
        (uint256 old, uint256 effectiveAt) = _schedule(_slashPenalty, amount, amount <= slashPenalty());
        emit SlashPenaltyChanged(old, amount, effectiveAt);
    }

    function _setInvalidationWindow(uint256 window) private {
        uint256 max = stakeManager.unbondingPeriod();
        if (window < MIN_INVALIDATION_WINDOW || window > max) {
            revert WindowOutOfRange(window, MIN_INVALIDATION_WINDOW, max);
        }
        (uint256 old, uint256 effectiveAt) = _schedule(_invalidationWindow, window, false);
        emit InvalidationWindowChanged(old, window, effectiveAt);
    }

    /// @dev The evidence checks of `slash`; returns the submission's digest.
    function _checkEvidence(
        WorkLeaf calldata leaf,
        Submission calldata sub,
        bytes calldata signature,
        bytes32[] calldata proof
    ) private view returns (bytes32 digest) {
        if (sub.runId != runId) revert WrongRun(sub.runId);
        if (sub.node != leaf.node) revert NotInCommitment();
        digest = _submissionDigest(sub);
        (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecoverCalldata(digest, signature);
        if (err != ECDSA.RecoverError.NoError || signer != sub.node) revert BadSignature();
        if (!MerkleProof.verifyCalldata(proof, leaf.commitment, keccak256(abi.encode(digest)))) {
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
