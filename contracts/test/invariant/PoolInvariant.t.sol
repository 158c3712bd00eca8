// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ComputePool} from "../../src/ComputePool.sol";
import {IComputePool} from "../../src/interfaces/IComputePool.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {StakeManager} from "../../src/StakeManager.sol";
import {StakeToken} from "../../src/StakeToken.sol";
import {TestBase} from "../utils/TestBase.sol";
import {MerkleBuilder, ProtocolFixture} from "../utils/Fixtures.sol";

/// @notice Plays every party of a run in random order: funders, the recorder
/// (also a colluding one that reuses a signed leaf in several epochs),
/// validators voting to invalidate and slash, an admin changing every
/// parameter and granting and revoking validators, also one that appoints
/// itself recorder and validator, lowers the quorum and slashes honest signed
/// work, and providers trying to dodge their stake (remove the node, unbond,
/// withdraw, re-add it, top up, rejoin) and claiming. It keeps a ghost of what
/// each party is owed, and of when each change that eases slashing applies,
/// and flags every action whose outcome breaks a promise of the protocol.
contract PoolHandler is TestBase {
    StakeToken token;
    ComputePool public pool;
    StakeManager manager;
    ProviderRegistry registry;
    address admin;
    uint256[2] nodePks;
    address[2] public nodes;
    address[2] public providers;
    address[3] validators;

    struct Rec {
        uint64 epoch;
        uint256 node;
        uint64 step; // the step of the one signed submission committed
    }

    Rec[] public recs;
    /// @dev Epochs from here on are used by no record yet.
    uint64 nextEpoch = 1000;
    uint256 public ghostFunded;
    uint256 public ghostPaid;
    uint256 public ghostSlashed;

    /// @dev Action counter: a vote counts if cast after the validator's last grant.
    uint256 seq = 1;
    mapping(address validator => uint256) lastGrant;
    /// @dev The ghost's own account of when each validator's slash votes count
    /// (zero for those of the deployment), of the quorum and penalty now, and
    /// of a change of either waiting to apply.
    mapping(address validator => uint256) ghostVotesAt;
    uint256 ghostQuorum;
    uint256 ghostQuorumNext;
    uint256 ghostQuorumAt;
    uint256 ghostPenalty;
    uint256 ghostPenaltyNext;
    uint256 ghostPenaltyAt;
    /// @dev Accounts given a role after deployment; no slashed token may reach one.
    address[] public addedLater;
    mapping(address => bool) isAddedLater;
    mapping(bytes32 ballot => mapping(address validator => uint256)) votedAt;
    mapping(bytes32 digest => uint256) slashesWith;

    uint256 public executionsWithoutQuorum;
    uint256 public evidenceReused;
    uint256 public shortSlashes;
    uint256 public validClaimsRefused;
    uint256 public badClaims;
    uint256 public slashes;
    uint256 public dodges;
    uint256 public earlySlashVotes;
    uint256 public wrongPenalties;
    uint256 public adminSlashes;

    constructor(
        StakeToken token_,
        ComputePool pool_,
        StakeManager manager_,
        ProviderRegistry registry_,
        address admin_,
        uint256[2] memory pks,
        address[2] memory ps,
        address[3] memory vs
    ) {
        (token, pool, manager, registry, admin) = (token_, pool_, manager_, registry_, admin_);
        nodePks = pks;
        nodes = [vm.addr(pks[0]), vm.addr(pks[1])];
        providers = ps;
        validators = vs;
        (ghostQuorum, ghostPenalty) = (pool_.quorum(), pool_.slashPenalty());
        // The test grants these two roles right after deploying this handler.
        _noteGrant(address(this), false);
        _noteGrant(vs[2], true);
    }

    modifier step() {
        ++seq;
        _;
    }

    function _noteGrant(address account, bool validatorRole) internal {
        if (!isAddedLater[account]) {
            isAddedLater[account] = true;
            addedLater.push(account);
        }
        if (validatorRole) {
            lastGrant[account] = seq;
            ghostVotesAt[account] = block.timestamp + pool.SLASH_CHANGE_DELAY();
        }
    }

    function _grant(bytes32 role, address account) internal {
        vm.prank(admin);
        pool.grantRole(role, account);
        _noteGrant(account, role == pool.VALIDATOR_ROLE());
    }

    function _ghostQuorum() internal view returns (uint256) {
        return ghostQuorumAt != 0 && block.timestamp >= ghostQuorumAt ? ghostQuorumNext : ghostQuorum;
    }

    function _ghostPenalty() internal view returns (uint256) {
        return ghostPenaltyAt != 0 && block.timestamp >= ghostPenaltyAt ? ghostPenaltyNext : ghostPenalty;
    }

    function _setQuorum(uint256 q) internal {
        uint256 now_ = _ghostQuorum();
        vm.prank(admin);
        pool.setQuorum(q);
        if (q >= now_) (ghostQuorum, ghostQuorumAt) = (q, 0);
        else (ghostQuorum, ghostQuorumNext, ghostQuorumAt) = (now_, q, block.timestamp + pool.SLASH_CHANGE_DELAY());
    }

    function _sub(uint256 i, uint64 s) internal view returns (IComputePool.Submission memory) {
        return IComputePool.Submission(pool.runId(), nodes[i], s, keccak256(abi.encode("rollout", i, s)));
    }

    function _mintTo(address to, uint256 amount) internal {
        vm.prank(admin);
        token.mint(to, amount);
    }

    // ---- funders and the recorder ----

    function fund(uint256 amount) external step {
        amount = bound(amount, 1, 1e24);
        _mintTo(address(this), amount);
        token.approve(address(pool), amount);
        pool.fund(amount);
        ghostFunded += amount;
    }

    /// @notice Records one epoch of a node; a third of the time the commitment
    /// is a signed leaf the node already had committed in another epoch.
    function submitWork(uint256 epochSeed, uint256 nodeSeed, uint256 units, uint256 reuse) external step {
        uint64 epoch = uint64(bound(epochSeed, 0, 15));
        uint256 i = nodeSeed % 2;
        uint64 s = uint64(epoch) + 100;
        if (reuse % 3 == 0 && recs.length != 0) {
            Rec memory earlier = recs[reuse % recs.length];
            if (earlier.node == i) s = earlier.step;
        }
        bytes32 leaf = MerkleBuilder.leaf(pool.submissionDigest(_sub(i, s)));
        pool.submitWork(epoch, nodes[i], uint128(bound(units, 1, 1e3)), leaf);
        recs.push(Rec(epoch, i, s));
        if (pool.workOf(epoch, nodes[i]).penalty != _ghostPenalty()) ++wrongPenalties;
    }

    // ---- validators ----

    function _record(uint256 seed) internal view returns (Rec memory r, IComputePool.WorkRecord memory w) {
        r = recs[seed % recs.length];
        w = pool.workOf(r.epoch, nodes[r.node]);
    }

    /// @dev Votes of validators (the admin among them) holding the role in the
    /// term they voted in, as the ghost saw them.
    function _liveVotes(bytes32 ballot) internal view returns (uint256 n) {
        for (uint256 k; k < 4; ++k) {
            address v = k < 3 ? validators[k] : admin;
            if (pool.hasRole(pool.VALIDATOR_ROLE(), v) && votedAt[ballot][v] > lastGrant[v]) ++n;
        }
    }

    function invalidate(uint256 recSeed, uint256 validatorSeed) external step {
        if (recs.length == 0) return;
        (Rec memory r, IComputePool.WorkRecord memory before) = _record(recSeed);
        address v = validators[validatorSeed % 3];
        bytes32 ballot = keccak256(abi.encode(r.epoch, nodes[r.node]));
        vm.prank(v);
        pool.invalidate(r.epoch, nodes[r.node]);
        votedAt[ballot][v] = seq;
        if (!before.invalidated && pool.workOf(r.epoch, nodes[r.node]).invalidated) {
            if (_liveVotes(ballot) < _ghostQuorum()) ++executionsWithoutQuorum;
        }
    }

    function slash(uint256 recSeed, uint256 validatorSeed) external step {
        if (recs.length == 0) return;
        _voteSlash(recs[recSeed % recs.length], validators[validatorSeed % 3]);
    }

    /// @notice The colluding recorder: one signed leaf committed in two fresh
    /// epochs, then every current validator votes to slash with it in both.
    function colludeWithOneLeaf(uint256 nodeSeed) external step {
        uint256 i = nodeSeed % 2;
        uint64 e = nextEpoch;
        nextEpoch += 2;
        bytes32 leaf = MerkleBuilder.leaf(pool.submissionDigest(_sub(i, e)));
        pool.submitWork(e, nodes[i], 1, leaf);
        recs.push(Rec(e, i, e));
        pool.submitWork(e + 1, nodes[i], 1, leaf);
        recs.push(Rec(e + 1, i, e));
        for (uint256 k; k < 6; ++k) {
            address v = validators[k % 3];
            if (pool.hasRole(pool.VALIDATOR_ROLE(), v)) _voteSlash(recs[recs.length - 2 + k / 3], v);
        }
    }

    /// @dev One slash vote by `v` with the record's signed submission, and the
    /// ghost's verdict on what it executed.
    function _voteSlash(Rec memory r, address v) internal {
        IComputePool.WorkRecord memory before = pool.workOf(r.epoch, nodes[r.node]);
        IComputePool.Submission memory sub = _sub(r.node, r.step);
        bytes32 digest = pool.submissionDigest(sub);
        bytes32 ballot = keccak256(abi.encode(r.epoch, nodes[r.node], digest));
        uint256 treasuryBefore = token.balanceOf(manager.treasury());
        vm.prank(v);
        try pool.slash(r.epoch, sub, signDigest(nodePks[r.node], digest), new bytes32[](0)) {
            votedAt[ballot][v] = seq;
        } catch {
            return;
        }
        if (block.timestamp < ghostVotesAt[v]) ++earlySlashVotes;
        if (before.slashed || !pool.workOf(r.epoch, nodes[r.node]).slashed) return;
        ++slashes;
        if (v == admin) ++adminSlashes;
        if (_liveVotes(ballot) < _ghostQuorum()) ++executionsWithoutQuorum;
        if (++slashesWith[digest] > 1) ++evidenceReused;
        uint256 taken = token.balanceOf(manager.treasury()) - treasuryBefore;
        if (taken != before.penalty) ++shortSlashes;
        ghostSlashed += taken;
    }

    // ---- the admin ----

    function grantValidator(uint256 seed) external step {
        address v = validators[seed % 3];
        bytes32 role = pool.VALIDATOR_ROLE();
        if (pool.hasRole(role, v)) return;
        _grant(role, v);
    }

    /// @notice The admin appoints itself recorder and validator and lowers the
    /// quorum to one (what it would need to slash alone).
    function adminTakesOver() external step {
        if (!pool.hasRole(pool.RECORDER_ROLE(), admin)) _grant(pool.RECORDER_ROLE(), admin);
        if (!pool.hasRole(pool.VALIDATOR_ROLE(), admin)) _grant(pool.VALIDATOR_ROLE(), admin);
        _setQuorum(1);
    }

    /// @notice The admin, as recorder, commits a fresh epoch of a node whose
    /// one leaf is an honest signed submission, and votes to slash it.
    function adminSlashesHonestWork(uint256 nodeSeed) external step {
        if (!pool.hasRole(pool.RECORDER_ROLE(), admin) || !pool.hasRole(pool.VALIDATOR_ROLE(), admin)) return;
        uint256 i = nodeSeed % 2;
        uint64 e = nextEpoch++;
        bytes32 leaf = MerkleBuilder.leaf(pool.submissionDigest(_sub(i, e)));
        vm.prank(admin);
        pool.submitWork(e, nodes[i], 1, leaf);
        recs.push(Rec(e, i, e));
        if (pool.workOf(e, nodes[i]).penalty != _ghostPenalty()) ++wrongPenalties;
        _voteSlash(recs[recs.length - 1], admin);
    }

    function revokeValidator(uint256 seed) external step {
        address v = seed % 5 == 4 ? admin : validators[seed % 3];
        bytes32 role = pool.VALIDATOR_ROLE();
        if (seed % 2 == 0) {
            vm.prank(admin);
            pool.revokeRole(role, v);
        } else {
            vm.prank(v);
            pool.renounceRole(role, v);
        }
    }

    function setQuorum(uint256 q) external step {
        _setQuorum(bound(q, 0, 5));
    }

    function setInvalidationWindow(uint256 w) external step {
        vm.prank(admin);
        pool.setInvalidationWindow(bound(w, 0, 40 days));
    }

    function setSlashPenalty(uint256 p) external step {
        p = bound(p, 0, 300 ether);
        uint256 now_ = _ghostPenalty();
        vm.prank(admin);
        pool.setSlashPenalty(p);
        if (p <= now_) {
            (ghostPenalty, ghostPenaltyAt) = (p, 0);
        } else {
            (ghostPenalty, ghostPenaltyNext, ghostPenaltyAt) = (now_, p, block.timestamp + pool.SLASH_CHANGE_DELAY());
        }
    }

    function setRewardPerUnit(uint256 amount) external step {
        vm.prank(admin);
        pool.setRewardPerUnit(bound(amount, 0, 1e20));
    }

    function setUnbondingPeriod(uint256 p) external step {
        vm.prank(admin);
        manager.setUnbondingPeriod(bound(p, 0, 40 days));
    }

    function setMinStakePerNode(uint256 amount) external step {
        vm.prank(admin);
        manager.setMinStakePerNode(bound(amount, 0, 300 ether));
    }

    // ---- providers ----

    /// @notice The dodge: remove the node, unbond everything possible, withdraw
    /// what matured, and re-add the node with a fresh consent.
    function dodge(uint256 nodeSeed) external step {
        uint256 i = nodeSeed % 2;
        address p = providers[i];
        vm.startPrank(p);
        if (registry.providerOf(nodes[i]) == p) registry.removeNode(nodes[i]);
        uint256 free = manager.stakeOf(p);
        uint256 locked = manager.lockedOf(p);
        if (free > locked) manager.requestUnbond(free - locked);
        (, uint256 withdrawable) = manager.unbondingOf(p);
        if (withdrawable != 0) manager.withdraw();
        vm.stopPrank();
        if (registry.providerOf(nodes[i]) == address(0)) {
            uint256 deadline = block.timestamp + 1 hours;
            bytes32 digest = registry.consentDigest(p, nodes[i], registry.consentNonce(nodes[i]), deadline);
            vm.prank(p);
            registry.addNode(nodes[i], deadline, signDigest(nodePks[i], digest));
        }
        ++dodges;
    }

    function topUpAndRejoin(uint256 nodeSeed, uint256 amount) external step {
        uint256 i = nodeSeed % 2;
        address p = providers[i];
        amount = bound(amount, 1, 400 ether);
        _mintTo(p, amount);
        vm.startPrank(p);
        token.approve(address(manager), amount);
        manager.stake(amount);
        if (!pool.isJoined(nodes[i]) && registry.providerOf(nodes[i]) == p) pool.joinPool(nodes[i]);
        vm.stopPrank();
    }

    /// @notice Claims a record: a valid one past its window must be paid exactly its reward.
    function claim(uint256 recSeed, uint256 early) external step {
        if (recs.length == 0) return;
        (Rec memory r, IComputePool.WorkRecord memory w) = _record(recSeed);
        if (early % 4 != 0 && block.timestamp < w.unlocksAt) vm.warp(w.unlocksAt);
        bool claimable = !w.invalidated && !w.claimed && block.timestamp >= w.unlocksAt;
        uint64[] memory e = new uint64[](1);
        e[0] = r.epoch;
        uint256 before = token.balanceOf(w.provider);
        vm.prank(w.provider);
        try pool.claim(nodes[r.node], e) returns (uint256 paid) {
            if (!claimable || paid != w.reward || token.balanceOf(w.provider) - before != paid) ++badClaims;
            ghostPaid += paid;
        } catch {
            if (claimable) ++validClaimsRefused;
        }
    }

    function warp(uint256 secs) external step {
        vm.warp(block.timestamp + bound(secs, 0, 12 hours));
    }

    /// @notice Long waits, so that delayed changes come to apply within a run.
    function warpDays(uint256 d) external step {
        vm.warp(block.timestamp + bound(d, 1, 62) * 1 days);
    }

    function addedLaterCount() external view returns (uint256) {
        return addedLater.length;
    }

    function recCount() external view returns (uint256) {
        return recs.length;
    }

    function validator(uint256 k) external view returns (address) {
        return validators[k];
    }
}

contract PoolInvariantTest is ProtocolFixture {
    PoolHandler handler;

    function setUp() public {
        deployProtocol();
        fundPool(1e24);
        onboard(alice, NODE_PK);
        onboard(bob, NODE2_PK);
        stakeAs(alice, 300 ether);
        stakeAs(bob, 300 ether);
        address validator3 = address(0x7A13);
        handler = new PoolHandler(
            token,
            pool,
            manager,
            registry,
            admin,
            [NODE_PK, NODE2_PK],
            [alice, bob],
            [validator, validator2, validator3]
        );
        vm.startPrank(admin);
        pool.grantRole(pool.RECORDER_ROLE(), address(handler));
        pool.grantRole(pool.VALIDATOR_ROLE(), validator3);
        vm.stopPrank();
        targetContract(address(handler));
    }

    /// 1. Every record still in its window and not yet slashed has its penalty
    /// backed: together they never exceed the provider's active stake.
    function invariant_stakeBacksEverySlashableRecord() public view {
        for (uint256 j; j < 2; ++j) {
            address p = handler.providers(j);
            uint256 owed;
            for (uint256 k; k < handler.recCount(); ++k) {
                (uint64 epoch, uint256 i,) = handler.recs(k);
                IComputePool.WorkRecord memory w = pool.workOf(epoch, handler.nodes(i));
                if (w.provider == p && block.timestamp < w.unlocksAt && !w.slashed) owed += w.penalty;
            }
            vm.assertLe(owed, manager.stakeOf(p), "slashable penalties exceed the stake behind them");
            vm.assertLe(owed, manager.lockedOf(p), "a slashable record's penalty is not locked");
        }
        vm.assertEq(handler.shortSlashes(), 0, "a slash took less than the record's penalty");
    }

    /// 2. A signed submission is evidence for one penalty at most.
    function invariant_evidenceSlashesOnce() public view {
        vm.assertEq(handler.evidenceReused(), 0, "a signed submission slashed twice");
        vm.assertEq(token.balanceOf(treasury), handler.ghostSlashed(), "treasury holds every slashed token");
        for (uint256 k; k < 3; ++k) {
            vm.assertEq(token.balanceOf(handler.validator(k)), 0, "a validator gained tokens");
        }
    }

    /// 3. Invalidations and slashes happen only on a quorum of current validators.
    function invariant_onlyCurrentValidatorsCount() public view {
        vm.assertEq(handler.executionsWithoutQuorum(), 0, "executed without a quorum of current validators");
    }

    /// 4. Reserved rewards are exactly what unclaimed valid records are owed,
    /// the pool holds them, and every valid record past its window is paid.
    function invariant_paidWorkIsFinalAndValidWorkIsPaid() public view {
        uint256 owed;
        for (uint256 k; k < handler.recCount(); ++k) {
            (uint64 epoch, uint256 i,) = handler.recs(k);
            IComputePool.WorkRecord memory w = pool.workOf(epoch, handler.nodes(i));
            if (!w.invalidated && !w.claimed) owed += w.reward;
        }
        vm.assertEq(pool.reservedRewards(), owed, "reserved == unclaimed valid rewards");
        vm.assertEq(pool.totalFunded(), handler.ghostFunded() + 1e24, "funded");
        vm.assertEq(pool.totalPaid(), handler.ghostPaid(), "paid");
        vm.assertEq(
            pool.totalPaid() + pool.reservedRewards() + pool.availableRewards(),
            pool.totalFunded(),
            "paid+reserved+available"
        );
        vm.assertEq(token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool balance");
        vm.assertEq(handler.validClaimsRefused(), 0, "a valid record past its window could not be claimed");
        vm.assertEq(handler.badClaims(), 0, "a claim paid the wrong amount or too early");
    }

    /// 5. Parameters stay in their bounds whatever the admin tries.
    function invariant_parametersStayBounded() public view {
        uint256 q = pool.quorum();
        vm.assertGe(q, 1, "quorum >= 1");
        vm.assertLe(q, pool.validatorCount(), "quorum <= validators");
        uint256 holders;
        for (uint256 k; k < 3; ++k) {
            if (pool.hasRole(pool.VALIDATOR_ROLE(), handler.validator(k))) ++holders;
        }
        if (pool.hasRole(pool.VALIDATOR_ROLE(), admin)) ++holders;
        vm.assertEq(pool.validatorCount(), holders, "validator count");
        vm.assertGe(pool.invalidationWindow(), pool.MIN_INVALIDATION_WINDOW(), "window never zero");
        vm.assertLe(pool.invalidationWindow(), manager.unbondingPeriod(), "window <= unbonding");
        vm.assertLe(manager.unbondingPeriod(), manager.MAX_UNBONDING_PERIOD(), "unbonding bounded");
        vm.assertLe(pool.slashPenalty(), manager.minStakePerNode(), "penalty <= min stake");
        (uint256 pending,) = pool.pendingSlashPenalty();
        vm.assertLe(pending, manager.minStakePerNode(), "a waiting penalty <= min stake");
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "stake conserved");
    }

    /// 6. No operator profits from a slash: slashed stake reaches only the
    /// deployment's treasury, never an account given a role after deployment
    /// (the admin appointing itself among them); such a validator's slash vote
    /// counts only from SLASH_CHANGE_DELAY after its appointment, a lower quorum
    /// and a higher penalty apply only from that delay on.
    function invariant_noSlashReachesAnAccountAddedLater() public view {
        vm.assertEq(manager.treasury(), treasury, "the deployment's treasury");
        vm.assertEq(token.balanceOf(admin), 0, "the admin gained tokens");
        for (uint256 k; k < handler.addedLaterCount(); ++k) {
            vm.assertEq(token.balanceOf(handler.addedLater(k)), 0, "an account added later gained tokens");
        }
        vm.assertEq(handler.earlySlashVotes(), 0, "a slash vote counted before its validator's delay");
        vm.assertEq(handler.wrongPenalties(), 0, "work recorded under a penalty not yet due");
    }
}
