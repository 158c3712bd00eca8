// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";

import {ComputePool} from "../src/ComputePool.sol";
import {StakeManager} from "../src/StakeManager.sol";
import {IComputePool} from "../src/interfaces/IComputePool.sol";
import {IStakeManager} from "../src/interfaces/IStakeManager.sol";
import {ProtocolFixture} from "./utils/Fixtures.sol";
import {MerkleBuilder, WorkParts} from "./utils/Merkle.sol";

contract ComputePoolTest is ProtocolFixture {
    uint64 constant EPOCH = 7;
    uint256 constant FUNDING = 1000 ether;
    uint256 constant OPEN = uint256(IComputePool.Settlement.Open);
    uint256 constant CLAIMED = uint256(IComputePool.Settlement.Claimed);
    uint256 constant INVALIDATED = uint256(IComputePool.Settlement.Invalidated);
    uint256 constant RELEASED = uint256(IComputePool.Settlement.Released);

    function setUp() public {
        deployProtocol();
        fundPool(FUNDING);
        onboard(alice, NODE_PK);
    }

    function _accounting() internal view {
        vm.assertEq(
            pool.totalPaid() + pool.reservedRewards() + pool.availableRewards(),
            pool.totalFunded(),
            "paid+reserved+available"
        );
        vm.assertEq(token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool balance");
    }

    /// @dev Records part 0 of `epoch` for `node` (10 units) with a 3-leaf
    /// commitment; returns the evidence of submission `i`.
    function _recordWithEvidenceIn(uint64 epoch, uint256 i) internal returns (Evidence memory e) {
        (IComputePool.Submission[] memory subs, bytes32[] memory leaves, bytes32 root) = commitThree(node);
        e.ref = recordOne(epoch, node, 10, root);
        e.sub = subs[i];
        e.sig = signDigest(NODE_PK, pool.submissionDigest(e.sub));
        e.proof = MerkleBuilder.proof(leaves, i);
    }

    function _recordWithEvidence(uint256 i) internal returns (Evidence memory) {
        return _recordWithEvidenceIn(EPOCH, i);
    }

    function _slash(address v, Evidence memory e) internal {
        slashWith(pool, v, e);
    }

    function _unbond(address provider, uint256 amount) internal {
        vm.prank(provider);
        manager.requestUnbond(amount);
    }

    function _membership(address n, uint32 index) internal view returns (IComputePool.Membership memory) {
        return pool.membershipAt(n, index);
    }

    // ---- constructor ----

    function test_constructor() public view {
        vm.assertEq(pool.runId(), RUN, "run");
        vm.assertEq(address(pool.token()), address(token), "token");
        vm.assertEq(address(pool.registry()), address(registry), "registry");
        vm.assertEq(address(pool.stakeManager()), address(manager), "manager");
        vm.assertEq(pool.invalidationWindow(), WINDOW, "window");
        vm.assertEq(pool.rewardPerUnit(), REWARD_PER_UNIT, "reward");
        vm.assertEq(pool.slashPenalty(), PENALTY, "penalty");
        vm.assertEq(pool.quorum(), 1, "quorum");
        vm.assertEq(pool.validatorCount(), 2, "validators");
        vm.assertEq(pool.MAX_LEAVES(), 1024, "max leaves");
        vm.assertEq(pool.latestUnlock(), 0, "nothing recorded");
        vm.assertTrue(pool.hasRole(pool.RECORDER_ROLE(), recorder), "recorder");
        vm.assertTrue(pool.hasRole(pool.VALIDATOR_ROLE(), validator2), "validator");
        vm.assertTrue(manager.isPool(address(pool)), "trusted by its manager");
        vm.assertTrue(pool.hasRole(pool.DEFAULT_ADMIN_ROLE(), admin), "admin");
        vm.assertEq(pool.RECORDER_ROLE(), keccak256("RECORDER_ROLE"), "recorder id");
        vm.assertEq(pool.VALIDATOR_ROLE(), keccak256("VALIDATOR_ROLE"), "validator id");
    }

    function test_createPool_checksItsParameters() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 0, 2));
        createPool(RUN, 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 3, 2));
        createPool(RUN, 3);
        IComputePool.PoolParams memory p = params(1);
        p.invalidationWindow = UNBONDING + 1;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOutOfRange.selector, UNBONDING + 1, 60, UNBONDING));
        vm.prank(admin);
        manager.createPool(RUN, admin, p, new address[](0), new address[](0));
        p = params(0);
        p.slashPenalty = MIN_STAKE + 1;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.PenaltyTooHigh.selector, MIN_STAKE + 1, MIN_STAKE));
        vm.prank(admin);
        manager.createPool(RUN, admin, p, new address[](0), new address[](0));
    }

    /// Anyone may deploy a stake manager over the same token and factory, but
    /// the pools it creates are trusted by no other manager.
    function test_aPoolOfAnotherManagerCannotSlash() public {
        StakeManager evil = new StakeManager(token, registry, factory, bob, MIN_STAKE, UNBONDING, bob);
        address[] memory validators = new address[](1);
        validators[0] = bob;
        vm.prank(bob);
        address rogue = evil.createPool(RUN, bob, params(1), validators, validators);
        vm.assertTrue(evil.isPool(rogue), "its own manager's");
        vm.assertFalse(manager.isPool(rogue), "not ours");
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotPool.selector, rogue));
        vm.prank(rogue);
        manager.slash(alice, 1, bytes32(0));
        vm.assertEq(manager.bondedOf(alice), PENALTY, "its bonds count for nothing here either");
    }

    function test_submissionDigest_matchesEip712() public view {
        bytes32 typehash = keccak256("Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)");
        vm.assertEq(pool.SUBMISSION_TYPEHASH(), typehash, "typehash");
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("SwarmRL ComputePool"),
                keccak256("1"),
                block.chainid,
                address(pool)
            )
        );
        vm.assertEq(pool.domainSeparator(), domain, "domain");
        IComputePool.Submission memory sub = submission(node, 42, bytes32(uint256(0xd1)));
        bytes32 structHash = keccak256(abi.encode(typehash, RUN, node, uint64(42), bytes32(uint256(0xd1))));
        vm.assertEq(pool.submissionDigest(sub), keccak256(abi.encodePacked("\x19\x01", domain, structHash)), "digest");
    }

    // ---- membership ----

    function test_joinPool() public {
        addNode(alice, NODE2_PK);
        stakeAs(alice, MIN_STAKE);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeJoined(node2, alice, 1);
        joinAs(alice, node2);
        vm.assertTrue(pool.isJoined(node2), "joined");
        vm.assertEq(pool.joinedProviderOf(node2), alice, "provider");
        (uint32 index, IComputePool.Membership memory m) = pool.membershipOf(node2);
        vm.assertEq(index, 1, "its first membership");
        vm.assertEq(m.provider, alice, "membership provider");
        vm.assertEq(m.joinedAt, block.timestamp, "joinedAt");
        vm.assertEq(m.leftAt, 0, "live");
        vm.assertFalse(m.slashed, "not slashed");
        vm.assertEq(m.penalty, PENALTY, "the penalty in force at the join");
        vm.assertEq(pool.bondOf(alice), 2 * PENALTY, "each joined membership bonds the penalty");
        vm.assertEq(manager.bondedOf(alice), 2 * PENALTY, "the manager reads the pool's bond");
    }

    function test_membershipOf_neverJoined() public view {
        (uint32 index, IComputePool.Membership memory m) = pool.membershipOf(node2);
        vm.assertEq(index, 0, "none");
        vm.assertEq(m.provider, address(0), "empty");
        vm.assertFalse(pool.isJoined(node2), "not joined");
        vm.assertEq(pool.joinedProviderOf(node2), address(0), "no provider");
    }

    function test_joinPool_notRegisteredReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NodeNotRegistered.selector, node2));
        joinAs(alice, node2);
    }

    function test_joinPool_notProviderReverts() public {
        addNode(alice, NODE2_PK);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node2, bob));
        joinAs(bob, node2);
    }

    function test_joinPool_alreadyJoinedReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyJoined.selector, node));
        joinAs(alice, node);
    }

    /// Each join is a new membership; the earlier one keeps its times.
    function test_joinPool_eachJoinIsANewMembership() public {
        uint256 t0 = block.timestamp;
        vm.warp(t0 + 10);
        leaveAsNode(node);
        vm.warp(t0 + 20);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeJoined(node, alice, 2);
        joinAs(alice, node);
        (uint32 index,) = pool.membershipOf(node);
        vm.assertEq(index, 2, "second membership");
        vm.assertEq(_membership(node, 1).joinedAt, t0, "first joined");
        vm.assertEq(_membership(node, 1).leftAt, t0 + 10, "first left");
        vm.assertEq(_membership(node, 2).joinedAt, t0 + 20, "second joined");
        vm.assertEq(_membership(node, 2).leftAt, 0, "second live");
    }

    /// A node its provider removed from the registry, still in the pool: its new
    /// provider replaces the stale membership, and the former provider's bond
    /// lasts as after any leave.
    function test_joinPool_replacesAMembershipItsFormerProviderGaveUp() public {
        recordOne(EPOCH, node, 10, 0);
        uint256 end = block.timestamp + WINDOW;
        vm.prank(alice);
        registry.removeNode(node);
        vm.assertTrue(pool.isJoined(node), "stale membership");
        register(bob);
        addNode(bob, NODE_PK);
        stakeAs(bob, MIN_STAKE);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeLeft(node);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeJoined(node, bob, 2);
        joinAs(bob, node);
        vm.assertEq(pool.joinedProviderOf(node), bob, "new provider");
        // ended after the second's record, which it backs: leftAt is the next second
        vm.assertEq(_membership(node, 1).leftAt, block.timestamp + 1, "the stale one ended");
        vm.assertEq(_membership(node, 1).provider, alice, "and stays alice's");
        (uint256 joined, uint256 leaving, uint256 until) = pool.bondsOf(alice);
        vm.assertEq(joined, 0, "alice: none joined");
        vm.assertEq(leaving, PENALTY, "alice: one leaving membership");
        vm.assertEq(until, end, "until its work's window closes");
        vm.assertEq(pool.bondOf(bob), PENALTY, "bob's new membership");
    }

    function test_joinPool_stakeTooLowReverts() public {
        addNode(alice, NODE2_PK); // two nodes, stake for one
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        joinAs(alice, node2);
    }

    /// The stake must also cover every bonded membership: rejoining while work of
    /// earlier memberships is open bonds one penalty more each time.
    function test_joinPool_stakeMustCoverTheBonds() public {
        recordOne(EPOCH, node, 10, 0);
        leaveAsNode(node);
        joinAs(alice, node); // 2 penalties: exactly MIN_STAKE
        vm.assertEq(pool.bondOf(alice), 2 * PENALTY, "joined and leaving");
        leaveAsNode(node);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        joinAs(alice, node); // a third would need 150
        stakeAs(alice, PENALTY);
        joinAs(alice, node);
        vm.assertEq(pool.bondOf(alice), 3 * PENALTY, "three bonded");
        vm.assertEq(manager.bondedOf(alice), manager.stakeOf(alice), "exactly covered");
    }

    function test_leavePool_byNode() public {
        vm.expectEmit(address(pool));
        emit IComputePool.NodeLeft(node);
        leaveAsNode(node);
        vm.assertFalse(pool.isJoined(node), "left");
        vm.assertEq(_membership(node, 1).leftAt, block.timestamp, "leftAt");
    }

    function test_leavePool_byProvider() public {
        vm.prank(alice);
        pool.leavePool(node);
        vm.assertFalse(pool.isJoined(node), "left");
    }

    function test_leavePool_notJoinedReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotJoined.selector, node2));
        leaveAsNode(node2);
        leaveAsNode(node);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotJoined.selector, node));
        leaveAsNode(node);
    }

    function test_leavePool_strangerReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, bob));
        vm.prank(bob);
        pool.leavePool(node);
    }

    function test_eject() public {
        vm.expectEmit(address(pool));
        emit IComputePool.NodeEjected(node, admin);
        vm.prank(admin);
        pool.eject(node);
        vm.assertFalse(pool.isJoined(node), "ejected");
        vm.assertEq(pool.bondOf(alice), 0, "no work open: nothing bonded");
    }

    function test_eject_notJoinedReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotJoined.selector, node2));
        vm.prank(admin);
        pool.eject(node2);
    }

    function test_eject_notAdminReverts() public {
        bytes32 role = pool.DEFAULT_ADMIN_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, alice, role));
        vm.prank(alice);
        pool.eject(node);
    }

    // ---- bonds ----

    /// While joined, the penalty cannot be unbonded, even once the node left the registry.
    function test_bond_aJoinedMembershipBondsThePenalty() public {
        (uint256 joined, uint256 leaving, uint256 until) = pool.bondsOf(alice);
        vm.assertEq(joined, PENALTY, "joined");
        vm.assertEq(leaving + until, 0, "none leaving");
        vm.assertEq(pool.bondOf(alice), PENALTY, "bond");
        stakeAs(alice, MIN_STAKE);
        vm.prank(alice);
        registry.removeNode(node); // the registry asks for nothing now; the pool's bond still does
        vm.assertTrue(pool.isJoined(node), "still joined");
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, PENALTY - 1, PENALTY));
        _unbond(alice, 2 * MIN_STAKE - PENALTY + 1);
        _unbond(alice, 2 * MIN_STAKE - PENALTY);
        vm.assertEq(manager.stakeOf(alice), PENALTY, "the penalty stays");
        // work recorded for the stale membership is backed by that bond: slashable ...
        Evidence memory e = recordSigned(EPOCH, NODE_PK, 1);
        _slash(validator, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "in full");
    }

    /// After a leave the bond lasts until the windows of the work recorded
    /// before it have closed, and not a second longer.
    function test_bond_afterLeavingLastsUntilTheWindowOfEarlierWorkCloses() public {
        recordOne(EPOCH, node, 10, 0);
        uint256 end = block.timestamp + WINDOW;
        vm.warp(block.timestamp + 1 hours);
        leaveAsNode(node);
        vm.prank(alice);
        registry.removeNode(node);
        (uint256 joined, uint256 leaving, uint256 until) = pool.bondsOf(alice);
        vm.assertEq(joined, 0, "not joined");
        vm.assertEq(leaving, PENALTY, "leaving");
        vm.assertEq(until, end, "until the window closes");
        vm.assertEq(pool.bondOf(alice), PENALTY, "bonded");
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, PENALTY));
        _unbond(alice, MIN_STAKE);
        vm.warp(end - 1);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, PENALTY));
        _unbond(alice, MIN_STAKE);
        vm.warp(end);
        vm.assertEq(pool.bondOf(alice), 0, "the window closed");
        _unbond(alice, MIN_STAKE);
        vm.warp(end + UNBONDING);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), MIN_STAKE, "all of it");
    }

    function test_bond_leavingWithNoWindowOpenBondsNothing() public {
        recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        leaveAsNode(node);
        vm.assertEq(pool.bondOf(alice), 0, "nothing slashable left");
        vm.prank(alice);
        registry.removeNode(node);
        _unbond(alice, MIN_STAKE);
    }

    /// Work recorded after the leave (of other nodes) does not prolong the bond.
    function test_bond_workRecordedAfterTheLeaveDoesNotProlongIt() public {
        recordOne(EPOCH, node, 10, 0);
        uint256 end = block.timestamp + WINDOW;
        vm.warp(block.timestamp + 1 hours);
        leaveAsNode(node);
        vm.warp(block.timestamp + 1 hours);
        recordPart(EPOCH + 1, 0, WorkParts.strangers(1, 0x1000, 1));
        vm.assertGt(pool.latestUnlock(), end, "a later window");
        (,, uint256 until) = pool.bondsOf(alice);
        vm.assertEq(until, end, "alice's bond keeps its end");
        vm.warp(end);
        vm.assertEq(pool.bondOf(alice), 0, "free");
    }

    /// A membership bonds the penalty in force at its join, whatever the admin
    /// sets later; a later join bonds the penalty then.
    function test_bond_isThePenaltyAtTheJoin() public {
        vm.prank(admin);
        pool.setSlashPenalty(10 ether);
        vm.assertEq(pool.bondOf(alice), PENALTY, "a lower penalty leaves the bond");
        addNode(alice, NODE2_PK);
        stakeAs(alice, MIN_STAKE);
        joinAs(alice, node2);
        vm.assertEq(_membership(node2, 1).penalty, 10 ether, "the new penalty");
        vm.assertEq(pool.bondOf(alice), PENALTY + 10 ether, "each its own");
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY());
        vm.assertEq(pool.slashPenalty(), MIN_STAKE, "a higher penalty applies");
        vm.assertEq(pool.bondOf(alice), PENALTY + 10 ether, "but not to memberships joined before");
        leaveAsNode(node2);
        joinAs(alice, node2);
        vm.assertEq(pool.bondOf(alice), PENALTY + MIN_STAKE, "a new join bonds it");
    }

    /// A join after a higher penalty applied must cover it.
    function test_bond_aRejoinAfterAHigherPenaltyMustCoverIt() public {
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY());
        recordOne(EPOCH, node, 1, 0);
        vm.warp(block.timestamp + 1);
        leaveAsNode(node); // PENALTY stays bonded while the part's window is open
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        joinAs(alice, node); // PENALTY + MIN_STAKE > MIN_STAKE
        stakeAs(alice, PENALTY);
        joinAs(alice, node);
        vm.assertEq(manager.bondedOf(alice), PENALTY + MIN_STAKE, "both bonded");
    }

    function test_bond_aSlashedMembershipBondsNothing() public {
        _slash(validator, _recordWithEvidence(0));
        (uint256 joined, uint256 leaving,) = pool.bondsOf(alice);
        vm.assertEq(joined + leaving, 0, "nothing bonded");
        vm.assertEq(pool.bondOf(alice), 0, "bond");
        vm.prank(alice);
        registry.removeNode(node);
        _unbond(alice, MIN_STAKE - PENALTY);
    }

    /// The manager sums the bonds of all its pools, and a join must cover them all.
    function test_bond_sumsOverThePools() public {
        ComputePool second = createPool(keccak256("run-2"), 1);
        ComputePool third = createPool(keccak256("run-3"), 1);
        vm.prank(alice);
        second.joinPool(node);
        vm.assertEq(manager.bondedOf(alice), 2 * PENALTY, "two pools");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        vm.prank(alice);
        third.joinPool(node);
        stakeAs(alice, PENALTY);
        vm.prank(alice);
        third.joinPool(node);
        vm.assertEq(manager.bondedOf(alice), 3 * PENALTY, "three pools");
    }

    // ---- fund ----

    function test_fund() public {
        mint(bob, 5 ether);
        vm.startPrank(bob);
        token.approve(address(pool), 5 ether);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardsFunded(bob, 5 ether);
        pool.fund(5 ether);
        vm.stopPrank();
        vm.assertEq(pool.availableRewards(), FUNDING + 5 ether, "available");
        vm.assertEq(pool.totalFunded(), FUNDING + 5 ether, "funded");
        _accounting();
    }

    function test_fund_zeroReverts() public {
        vm.expectRevert(IComputePool.ZeroAmount.selector);
        pool.fund(0);
    }

    function test_fund_withoutApprovalReverts() public {
        mint(bob, 5 ether);
        vm.expectRevert();
        vm.prank(bob);
        pool.fund(5 ether);
    }

    // ---- recordWork ----

    function test_recordWork() public {
        onboard(bob, NODE2_PK);
        IComputePool.WorkLeaf[] memory leaves =
            WorkParts.two(leafOf(node, 10, bytes32(uint256(1))), leafOf(node2, 5, bytes32(uint256(2))));
        bytes32 root = WorkParts.root(leaves);
        uint256 unlocks = block.timestamp + WINDOW;
        for (uint256 i; i < 2; ++i) {
            vm.expectEmit(address(pool));
            emit IComputePool.WorkRecorded(EPOCH, leaves[i].node, 3, 1, leaves[i].units, leaves[i].commitment);
        }
        vm.expectEmit(address(pool));
        emit IComputePool.PartRecorded(EPOCH, 3, root, 2, 15, 15 ether, unlocks);
        recordPart(EPOCH, 3, leaves);
        IComputePool.PartRecord memory rec = pool.recordOf(EPOCH, 3);
        vm.assertEq(rec.root, root, "root");
        vm.assertEq(rec.units, 15, "units");
        vm.assertEq(rec.nodes, 2, "nodes");
        vm.assertEq(rec.recordedAt, block.timestamp, "recordedAt");
        vm.assertEq(rec.unlocksAt, unlocks, "unlocksAt");
        vm.assertEq(rec.rewardPerUnit, REWARD_PER_UNIT, "reward per unit");
        vm.assertEq(pool.rootOf(leaves), root, "rootOf");
        vm.assertEq(pool.latestUnlock(), unlocks, "latest unlock");
        vm.assertEq(uint256(pool.settlementOf(EPOCH, 3, node)), OPEN, "open");
        vm.assertEq(pool.reservedRewards(), 15 ether, "reserved");
        vm.assertEq(pool.availableRewards(), FUNDING - 15 ether, "available");
        vm.assertEq(pool.recordOf(EPOCH, 2).recordedAt, 0, "other parts untouched");
        _accounting();
    }

    function test_recordWork_notRecorderReverts() public {
        bytes32 role = pool.RECORDER_ROLE();
        IComputePool.WorkLeaf[] memory leaves = WorkParts.one(leafOf(node, 1, 0));
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, validator, role)
        );
        vm.prank(validator);
        pool.recordWork(EPOCH, 0, leaves);
    }

    function test_recordWork_emptyOrTooManyLeavesReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadLeaves.selector, 0));
        recordPart(EPOCH, 0, new IComputePool.WorkLeaf[](0));
        vm.prank(admin);
        pool.setRewardPerUnit(1);
        passDelay(pool);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadLeaves.selector, 1025));
        recordPart(EPOCH, 0, WorkParts.strangers(1025, 0x1000, 1));
        IComputePool.WorkLeaf[] memory most = WorkParts.strangers(1024, 0x1000, 1);
        recordPart(EPOCH, 0, most); // MAX_LEAVES in one transaction
        vm.assertEq(pool.recordOf(EPOCH, 0).root, WorkParts.root(most), "root of 1024");
        vm.assertEq(pool.recordOf(EPOCH, 0).nodes, 1024, "nodes");
    }

    /// Strictly ascending nodes: one leaf per node and one canonical order.
    function test_recordWork_nodesMustAscend() public {
        IComputePool.WorkLeaf[] memory leaves = WorkParts.strangers(3, 0x1000, 1);
        (leaves[1], leaves[2]) = (leaves[2], leaves[1]);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadLeaves.selector, 2));
        recordPart(EPOCH, 0, leaves);
        leaves[2] = leaves[1]; // the same node twice
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadLeaves.selector, 2));
        recordPart(EPOCH, 0, leaves);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadLeaves.selector, 0));
        recordPart(EPOCH, 0, WorkParts.strangers(2, 0, 1)); // the zero address
        leaves = WorkParts.strangers(3, 0x1000, 1);
        (leaves[0], leaves[2]) = (leaves[2], leaves[0]);
        recordPart(EPOCH, 0, WorkParts.sort(leaves)); // sorted, the same leaves are fine
    }

    function test_recordWork_zeroUnitsReverts() public {
        onboard(bob, NODE2_PK);
        IComputePool.WorkLeaf[] memory leaves = WorkParts.two(leafOf(node, 1, 0), leafOf(node2, 0, 0));
        vm.expectRevert(IComputePool.ZeroAmount.selector);
        recordPart(EPOCH, 0, leaves);
    }

    function test_recordWork_partTwiceReverts() public {
        IComputePool.WorkLeaf[] memory first = WorkParts.one(leafOf(node, 1, 0));
        IComputePool.WorkLeaf[] memory second = WorkParts.one(leafOf(node, 2, 0));
        recordPart(EPOCH, 0, first);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.PartAlreadyRecorded.selector, EPOCH, 0));
        recordPart(EPOCH, 0, first);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.PartAlreadyRecorded.selector, EPOCH, 0));
        recordPart(EPOCH, 0, second); // other leaves do not overwrite it either
        recordPart(EPOCH, 1, second); // another part is fine
        recordPart(EPOCH + 1, 0, second); // and another epoch
        vm.assertEq(pool.recordOf(EPOCH, 0).units, 1, "first record kept");
    }

    function test_recordWork_insufficientRewardsReverts() public {
        IComputePool.WorkLeaf[] memory tooMuch = WorkParts.one(leafOf(node, 1001, 0));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.InsufficientRewards.selector, FUNDING, 1001 ether));
        recordPart(EPOCH, 0, tooMuch);
        onboard(bob, NODE2_PK);
        recordPart(EPOCH, 0, WorkParts.two(leafOf(node, 600, 0), leafOf(node2, 400, 0))); // exactly the budget
        vm.assertEq(pool.availableRewards(), 0, "all reserved");
        IComputePool.WorkLeaf[] memory more = WorkParts.one(leafOf(node, 1, 0));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.InsufficientRewards.selector, 0, 1 ether));
        recordPart(EPOCH + 1, 0, more);
        _accounting();
    }

    /// rootOf computes the root recordWork stores, which the tests' tree (the
    /// same as swarmrl's) rebuilds, for every size up to 9 (odd ones included),
    /// and every leaf's proof against it is accepted.
    function test_rootOf_matchesTheRecordedRootForOneToNineLeaves() public {
        vm.prank(admin);
        pool.setRewardPerUnit(1);
        passDelay(pool);
        for (uint256 n = 1; n <= 9; ++n) {
            IComputePool.WorkLeaf[] memory leaves = WorkParts.strangers(n, uint160(0x1000 + 16 * n), uint128(n));
            bytes32 root = pool.rootOf(leaves);
            vm.assertEq(root, WorkParts.root(leaves), "rootOf builds the tests' tree");
            recordPart(EPOCH, uint32(n), leaves);
            vm.assertEq(pool.recordOf(EPOCH, uint32(n)).root, root, "recordWork stores rootOf");
            for (uint256 i; i < n; ++i) {
                pool.release(WorkParts.ref(EPOCH, uint32(n), leaves, i)); // proven; no membership backs it
            }
        }
        vm.assertEq(pool.reservedRewards(), 0, "every leaf proven and released");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadLeaves.selector, 0));
        pool.rootOf(new IComputePool.WorkLeaf[](0));
        _accounting();
    }

    function testFuzz_rootOf_everyLeafProvesItselfOnly(uint256 n, uint256 i) public {
        n = bound(n, 1, 64);
        i = bound(i, 0, n - 1);
        vm.prank(admin);
        pool.setRewardPerUnit(1);
        passDelay(pool);
        IComputePool.WorkLeaf[] memory leaves = WorkParts.strangers(n, 0x1000, 3);
        recordPart(EPOCH, 0, leaves);
        vm.assertEq(pool.rootOf(leaves), pool.recordOf(EPOCH, 0).root, "rootOf");
        IComputePool.LeafRef memory r = WorkParts.ref(EPOCH, 0, leaves, i);
        if (n > 1) {
            IComputePool.LeafRef memory other = WorkParts.ref(EPOCH, 0, leaves, (i + 1) % n);
            r.proof = other.proof; // another leaf's proof
            vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, leaves[i].node));
            pool.release(r);
            r = WorkParts.ref(EPOCH, 0, leaves, i);
        }
        r.leaf.units = 4; // a leaf that was not recorded
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, leaves[i].node));
        pool.release(r);
        pool.release(WorkParts.ref(EPOCH, 0, leaves, i));
        vm.assertEq(pool.reservedRewards(), 3 * (n - 1), "one leaf released");
    }

    // ---- backing: a leaf counts only if its membership was live when recorded ----

    /// The recorder may name any membership; a leaf recorded after its
    /// membership left is neither paid nor slashable, and anyone returns its
    /// reward to the budget.
    function test_leafRecordedAfterTheLeaveIsNeitherPaidNorSlashable() public {
        leaveAsNode(node);
        vm.warp(block.timestamp + 1);
        Evidence memory e = recordSigned(EPOCH, NODE_PK, 1);
        vm.assertEq(e.ref.leaf.membership, 1, "names the membership that left");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 1));
        _slash(validator, e);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 1));
        claimAs(alice, e.ref);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardReleased(EPOCH, node, 0, 10 ether);
        vm.prank(bob);
        pool.release(e.ref);
        vm.assertEq(settlementOf(e.ref), RELEASED, "released");
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved");
        vm.assertEq(pool.availableRewards(), FUNDING, "back in the budget");
        _accounting();
    }

    /// A membership backs parts recorded from the second it joined up to the
    /// second it left (in a block, a leave and a record have no order the
    /// chain's clock could tell), and none after.
    function test_backing_boundaries() public {
        addNode(alice, NODE2_PK);
        stakeAs(alice, MIN_STAKE);
        joinAs(alice, node2);
        IComputePool.LeafRef memory joinedNow = recordOne(EPOCH, node2, 1, 0);
        vm.warp(block.timestamp + 1);
        leaveAsNode(node2);
        IComputePool.LeafRef memory leftNow = recordOne(EPOCH + 1, node2, 1, 0);
        vm.warp(block.timestamp + 1);
        IComputePool.LeafRef memory leftBefore = recordOne(EPOCH + 2, node2, 1, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.assertEq(claimAs(alice, joinedNow), 1 ether, "recorded in the second it joined");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node2, 1));
        claimAs(alice, leftNow); // a leave in the record's second counts as before it
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node2, 1));
        claimAs(alice, leftBefore);
    }

    /// The attack a leave in the record's second would open if it counted as after
    /// the record: the leave bonded nothing (no window was open), so the leaf's slash
    /// would take active stake first, the backing of the provider's other node, while
    /// the stake unbonded meanwhile leaves. The leaf is neither slashable nor paid.
    function test_backing_aLeafRecordedInTheSecondOfTheLeaveIsNeitherSlashedNorPaid() public {
        addNode(alice, NODE2_PK);
        stakeAs(alice, MIN_STAKE);
        joinAs(alice, node2);
        vm.warp(block.timestamp + 1);
        leaveAsNode(node);
        vm.assertEq(pool.bondOf(alice), PENALTY, "node2's alone: no window open at the leave");
        Evidence memory e = recordSigned(EPOCH, NODE_PK, 1);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 1));
        _slash(validator, e);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 1));
        claimAs(alice, e.ref);
        uint256 available = pool.availableRewards();
        pool.release(e.ref);
        vm.assertEq(pool.availableRewards(), available + 10 * REWARD_PER_UNIT, "given back");
        vm.assertEq(manager.stakeOf(alice), 2 * MIN_STAKE, "nothing taken");
    }

    function test_membershipsOf() public {
        onboard(bob, NODE2_PK);
        leaveAsNode(node2);
        address[] memory ns = new address[](3);
        (ns[0], ns[1], ns[2]) = (node, node2, address(0x1000));
        (uint32[] memory indexes, IComputePool.Membership[] memory ms) = pool.membershipsOf(ns);
        vm.assertEq(indexes.length, 3, "one per node");
        vm.assertEq(indexes[0], 1, "node's");
        vm.assertEq(ms[0].provider, alice, "alice's");
        vm.assertEq(ms[0].leftAt, 0, "live");
        vm.assertEq(indexes[1], 1, "node2's");
        vm.assertEq(ms[1].leftAt, block.timestamp, "left");
        vm.assertEq(indexes[2], 0, "never joined");
        vm.assertEq(ms[2].provider, address(0), "empty");
    }

    /// A leaf naming a membership that does not exist (yet), or none, is never backed.
    function test_leafOfAnotherMembershipIsNotBacked() public {
        IComputePool.WorkLeaf memory next = leafOf(node, 1, 0);
        next.membership = 2;
        IComputePool.WorkLeaf memory none = leafOf(node, 2, 0);
        none.membership = 0;
        recordPart(EPOCH, 0, WorkParts.one(next));
        recordPart(EPOCH, 1, WorkParts.one(none));
        vm.warp(block.timestamp + 1);
        leaveAsNode(node);
        joinAs(alice, node); // membership 2, joined after the record
        vm.warp(block.timestamp + WINDOW);
        IComputePool.LeafRef memory r = WorkParts.ref(EPOCH, 0, WorkParts.one(next), 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 2));
        claimAs(alice, r);
        pool.release(r);
        r = WorkParts.ref(EPOCH, 1, WorkParts.one(none), 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 0));
        claimAs(alice, r);
        pool.release(r);
        vm.assertEq(pool.reservedRewards(), 0, "both released");
    }

    // ---- release ----

    function test_release_payableLeafReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StillPayable.selector, node, 1));
        pool.release(r);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StillPayable.selector, node, 1));
        pool.release(r);
        leaveAsNode(node); // leaving later does not unback it
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StillPayable.selector, node, 1));
        pool.release(r);
    }

    function test_release_settledLeafReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        IComputePool.LeafRef memory s = recordOne(EPOCH + 1, node, 10, 0);
        invalidateAs(validator, s);
        vm.warp(block.timestamp + WINDOW);
        claimAs(alice, r);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH, 0, node));
        pool.release(r);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH + 1, 0, node));
        pool.release(s);
        IComputePool.LeafRef memory u = _recordStranger(EPOCH + 2);
        pool.release(u);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH + 2, 0, u.leaf.node));
        pool.release(u);
        _accounting();
    }

    function _recordStranger(uint64 epoch) internal returns (IComputePool.LeafRef memory) {
        IComputePool.WorkLeaf[] memory leaves = WorkParts.strangers(1, 0x1000, 1);
        recordPart(epoch, 0, leaves);
        return WorkParts.ref(epoch, 0, leaves, 0);
    }

    function test_release_noWorkOrNotInRecordReverts() public {
        IComputePool.LeafRef memory r = _recordStranger(EPOCH);
        r.part = 1;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH, 1));
        pool.release(r);
        r.part = 0;
        r.leaf.units = 2;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, r.leaf.node));
        pool.release(r);
    }

    // ---- invalidate ----

    function test_invalidate() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.expectEmit(address(pool));
        emit IComputePool.InvalidationVoted(EPOCH, node, validator, 1);
        vm.expectEmit(address(pool));
        emit IComputePool.WorkInvalidated(EPOCH, node, 0);
        invalidateAs(validator, r);
        vm.assertEq(settlementOf(r), INVALIDATED, "invalidated");
        vm.assertEq(pool.availableRewards(), FUNDING, "released");
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved");
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE, "no stake taken");
        _accounting();
    }

    /// One leaf of a part is dropped; the others stay payable.
    function test_invalidate_oneLeafOfAPart() public {
        onboard(bob, NODE2_PK);
        IComputePool.WorkLeaf[] memory leaves = WorkParts.two(leafOf(node, 10, 0), leafOf(node2, 5, 0));
        recordPart(EPOCH, 0, leaves);
        invalidateAs(validator, WorkParts.refOf(EPOCH, 0, leaves, node));
        vm.warp(block.timestamp + WINDOW);
        vm.assertEq(claimAs(bob, WorkParts.refOf(EPOCH, 0, leaves, node2)), 5 ether, "bob paid");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH, 0, node));
        claimAs(alice, WorkParts.refOf(EPOCH, 0, leaves, node));
        _accounting();
    }

    function test_invalidate_notValidatorReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, recorder, role)
        );
        invalidateAs(recorder, r);
    }

    function test_invalidate_noWorkReverts() public {
        IComputePool.LeafRef memory r = WorkParts.ref(EPOCH, 0, WorkParts.one(leafOf(node, 10, 0)), 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH, 0));
        invalidateAs(validator, r);
    }

    function test_invalidate_notInRecordReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        r.leaf.units = 11;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, node));
        invalidateAs(validator, r);
        r.leaf.units = 10;
        r.proof = new bytes32[](1);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, node));
        invalidateAs(validator, r);
    }

    function test_invalidate_twiceReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        invalidateAs(validator, r);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH, 0, node));
        invalidateAs(validator2, r);
    }

    function test_invalidate_afterWindowReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, EPOCH, 0));
        invalidateAs(validator, r);
    }

    function test_invalidate_lastSecondOfWindow() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW - 1);
        invalidateAs(validator, r);
        vm.assertEq(settlementOf(r), INVALIDATED, "invalidated");
    }

    function test_invalidate_quorumTwoNeedsTwoValidators() public {
        vm.prank(admin);
        pool.setQuorum(2);
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        invalidateAs(validator, r);
        vm.assertEq(settlementOf(r), OPEN, "one vote is not enough");
        vm.assertEq(pool.invalidationVotes(EPOCH, 0, node), 1, "one vote");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyVoted.selector, validator));
        invalidateAs(validator, r);
        invalidateAs(validator2, r);
        vm.assertEq(settlementOf(r), INVALIDATED, "two distinct votes");
        _accounting();
    }

    // ---- slash ----

    function test_slash() public {
        Evidence memory e = _recordWithEvidence(1);
        bytes32 digest = pool.submissionDigest(e.sub);
        uint256 validatorBefore = token.balanceOf(validator);

        vm.expectEmit(address(pool));
        emit IComputePool.SlashVoted(EPOCH, node, digest, validator, 1);
        vm.expectEmit(address(pool));
        emit IComputePool.WorkInvalidated(EPOCH, node, 0);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeEjected(node, validator);
        vm.expectEmit(address(manager));
        emit IStakeManager.Slashed(alice, PENALTY, digest, treasury, address(pool));
        vm.expectEmit(address(pool));
        emit IComputePool.NodeSlashed(EPOCH, node, alice, digest, PENALTY);
        _slash(validator, e);

        vm.assertEq(token.balanceOf(treasury), PENALTY, "treasury receives");
        vm.assertEq(token.balanceOf(validator), validatorBefore, "validator does not profit");
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "stake cut");
        vm.assertFalse(pool.isJoined(node), "ejected");
        IComputePool.Membership memory m = _membership(node, 1);
        vm.assertTrue(m.slashed, "membership slashed");
        vm.assertEq(m.leftAt, block.timestamp + 1, "and ended (after the part of its second)");
        vm.assertEq(settlementOf(e.ref), INVALIDATED, "invalidated");
        vm.assertEq(pool.availableRewards(), FUNDING, "reward released");
        (uint256 votes, bool slashed) = pool.slashVotes(node, 1, digest);
        vm.assertEq(votes, 1, "votes");
        vm.assertTrue(slashed, "slashed");
        vm.assertTrue(pool.evidenceUsed(digest), "evidence used");
        _accounting();
    }

    /// Every leaf of the commitment is accepted as evidence (quorum 2 keeps each
    /// vote pending, so all three are checked without the membership being slashed).
    function test_slash_eachLeafOfTheCommitmentIsEvidence() public {
        vm.prank(admin);
        pool.setQuorum(2);
        for (uint256 i; i < 3; ++i) {
            Evidence memory e = _recordWithEvidenceIn(EPOCH + uint64(i), i);
            bytes32 digest = pool.submissionDigest(e.sub);
            _slash(validator, e);
            (uint256 votes, bool slashed) = pool.slashVotes(node, 1, digest);
            vm.assertEq(votes, 1, "vote counted");
            vm.assertFalse(slashed, "below quorum");
        }
        vm.assertEq(token.balanceOf(treasury), 0, "nothing slashed yet");
    }

    function test_slash_notValidatorReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, bob, role));
        _slash(bob, e);
    }

    function test_slash_noWorkReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        e.ref.part = 1;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH, 1));
        _slash(validator, e);
    }

    function test_slash_leafNotInRecordReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        e.ref.leaf.membership = 2; // a later membership of the node: not what was recorded
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, node));
        _slash(validator, e);
    }

    function test_slash_wrongRunReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        e.sub.runId = keccak256("other-run");
        e.sig = signDigest(NODE_PK, pool.submissionDigest(e.sub));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WrongRun.selector, e.sub.runId));
        _slash(validator, e);
    }

    function test_slash_signatureBySomeoneElseReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        e.sig = signDigest(OTHER_PK, pool.submissionDigest(e.sub));
        vm.expectRevert(IComputePool.BadSignature.selector);
        _slash(validator, e);
    }

    function test_slash_signatureForOtherChainReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        vm.chainId(block.chainid + 1);
        vm.expectRevert(IComputePool.BadSignature.selector);
        _slash(validator, e);
    }

    function test_slash_malformedSignatureReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        e.sig = new bytes(64);
        vm.expectRevert(IComputePool.BadSignature.selector);
        _slash(validator, e);
    }

    function test_slash_submissionOfAnotherNodeReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        e.sub.node = node2;
        e.sig = signDigest(NODE2_PK, pool.submissionDigest(e.sub));
        vm.expectRevert(IComputePool.NotInCommitment.selector);
        _slash(validator, e);
    }

    function test_slash_validSignatureNotInCommitmentReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        // signed by the node, but never committed
        e.sub = submission(node, 99, keccak256("not committed"));
        e.sig = signDigest(NODE_PK, pool.submissionDigest(e.sub));
        vm.expectRevert(IComputePool.NotInCommitment.selector);
        _slash(validator, e);
    }

    function test_slash_wrongProofReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        (, bytes32[] memory leaves,) = commitThree(node);
        e.proof = MerkleBuilder.proof(leaves, 2);
        vm.expectRevert(IComputePool.NotInCommitment.selector);
        _slash(validator, e);
    }

    function test_slash_afterWindowReverts() public {
        Evidence memory e = _recordWithEvidence(0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, EPOCH, 0));
        _slash(validator, e);
    }

    /// A signed submission is evidence once: not again against the same
    /// membership, nor against the node's next one whose commitment the
    /// recorder filled with the same submission.
    function test_slash_evidenceUsedOnce() public {
        Evidence memory e = _recordWithEvidence(0);
        bytes32 digest = pool.submissionDigest(e.sub);
        vm.warp(block.timestamp + 1);
        _slash(validator, e);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        _slash(validator2, e);

        stakeAs(alice, PENALTY);
        joinAs(alice, node); // membership 2
        Evidence memory again = _recordWithEvidenceIn(EPOCH + 1, 0);
        vm.assertEq(again.ref.leaf.membership, 2, "the next membership");
        vm.assertEq(pool.submissionDigest(again.sub), digest, "the same signed submission");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.EvidenceUsed.selector, digest));
        _slash(validator, again);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "slashed once");
    }

    /// Every other submission of the membership is valid evidence too, in this
    /// part or another, but the membership has had its one penalty.
    function test_slash_oncePerMembershipWhateverTheEvidence() public {
        Evidence memory first = _recordWithEvidence(0);
        Evidence memory other = _recordWithEvidenceIn(EPOCH + 1, 1);
        vm.warp(block.timestamp + 1);
        _slash(validator, first);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        _slash(validator2, other);
        other.ref = first.ref;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        _slash(validator2, other);
        (, bool slashed) = pool.slashVotes(node, 1, pool.submissionDigest(other.sub));
        vm.assertTrue(slashed, "membership marked slashed");
        vm.assertEq(token.balanceOf(treasury), PENALTY, "one penalty per membership");
    }

    function test_slash_quorumTwoNeedsTwoDistinctValidators() public {
        vm.prank(admin);
        pool.setQuorum(2);
        Evidence memory e = _recordWithEvidence(0);
        _slash(validator, e);
        vm.assertEq(token.balanceOf(treasury), 0, "one vote slashes nothing");
        vm.assertTrue(pool.isJoined(node), "still joined");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyVoted.selector, validator));
        _slash(validator, e);
        _slash(validator2, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "two votes slash");
        vm.assertEq(token.balanceOf(validator) + token.balanceOf(validator2), 0, "validators get nothing");
    }

    function test_slash_providerCannotDodgeByRemovingNode() public {
        Evidence memory e = _recordWithEvidence(0);
        vm.warp(block.timestamp + 1);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.stopPrank();
        _slash(validator, e);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "alice still slashed");
    }

    function test_slash_theBondedPenaltyCannotBeUnbonded() public {
        Evidence memory e = _recordWithEvidence(0);
        vm.warp(block.timestamp + 1);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, PENALTY));
        manager.requestUnbond(MIN_STAKE);
        manager.requestUnbond(MIN_STAKE - PENALTY);
        vm.stopPrank();
        _slash(validator, e);
        vm.assertEq(manager.stakeOf(alice), 0, "the penalty came from the bonded stake");
        (uint256 unbonding,) = manager.unbondingOf(alice);
        vm.assertEq(unbonding, MIN_STAKE - PENALTY, "the free part leaves untouched");
        vm.assertEq(token.balanceOf(treasury), PENALTY, "treasury");
    }

    function test_slash_afterInvalidationDoesNotReleaseTwice() public {
        Evidence memory e = _recordWithEvidence(0);
        invalidateAs(validator2, e.ref);
        _slash(validator, e);
        vm.assertEq(pool.availableRewards(), FUNDING, "released once");
        vm.assertEq(settlementOf(e.ref), INVALIDATED, "invalidated");
        _accounting();
    }

    /// A membership is slashed by the penalty it joined under, whatever the admin raises later ...
    function test_slash_takesThePenaltyOfTheMembership() public {
        Evidence memory e = _recordWithEvidence(0);
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY());
        vm.assertEq(pool.slashPenalty(), MIN_STAKE, "the higher penalty applies");
        e = _recordWithEvidenceIn(EPOCH + 1, 0); // work recorded under it, by the membership of before
        vm.expectEmit(address(pool));
        emit IComputePool.NodeSlashed(EPOCH + 1, node, alice, pool.submissionDigest(e.sub), PENALTY);
        _slash(validator, e);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "the membership's penalty");
    }

    /// ... and by the current one if the admin lowered it since.
    function test_slash_takesTheCurrentPenaltyIfLower() public {
        Evidence memory e = _recordWithEvidence(0);
        vm.prank(admin);
        pool.setSlashPenalty(10 ether);
        _slash(validator, e);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - 10 ether, "the lower penalty");
    }

    /// A slashed membership forfeits every reward it has not been paid; paid ones stay paid.
    function test_slash_forfeitsTheUnpaidRewardsOfTheMembership() public {
        IComputePool.LeafRef memory paid = recordOne(1, node, 1, 0);
        IComputePool.LeafRef memory unpaid = recordOne(2, node, 2, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.assertEq(claimAs(alice, paid), 1 ether, "paid");
        Evidence memory e = _recordWithEvidence(0);
        _slash(validator, e);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        claimAs(alice, unpaid);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardReleased(2, node, 0, 2 ether);
        pool.release(unpaid);
        vm.assertEq(token.balanceOf(alice), 1 ether, "what was paid stays paid");
        vm.assertEq(pool.totalPaid(), 1 ether, "total paid");
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved");
        vm.assertEq(pool.availableRewards(), FUNDING - 1 ether, "the rest back in the budget");
        _accounting();
    }

    function test_rejoinAfterSlashNeedsTopUp() public {
        _slash(validator, _recordWithEvidence(0));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        joinAs(alice, node);
        stakeAs(alice, PENALTY);
        joinAs(alice, node);
        vm.assertTrue(pool.isJoined(node), "back in");
        (uint32 index, IComputePool.Membership memory m) = pool.membershipOf(node);
        vm.assertEq(index, 2, "a new membership");
        vm.assertFalse(m.slashed, "not slashed");
        IComputePool.LeafRef memory r = recordOne(EPOCH + 1, node, 3, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.assertEq(claimAs(alice, r), 3 ether, "its work is paid");
    }

    function test_slash_burnsWhenTreasuryIsZero() public {
        manager = new StakeManager(token, registry, factory, admin, MIN_STAKE, UNBONDING, address(0));
        pool = createPool(RUN, 1);
        fundPool(FUNDING);
        stakeAs(alice, MIN_STAKE);
        joinAs(alice, node);
        Evidence memory e = _recordWithEvidence(0);
        uint256 supply = token.totalSupply();
        _slash(validator, e);
        vm.assertEq(token.totalSupply(), supply - PENALTY, "burnt");
        vm.assertEq(token.balanceOf(validator), 0, "validator gets nothing");
    }

    // ---- claim ----

    function test_claim() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardClaimed(EPOCH, node, alice, 10 ether);
        uint256 paid = claimAs(alice, r);
        vm.assertEq(paid, 10 ether, "returned");
        vm.assertEq(token.balanceOf(alice), 10 ether, "paid");
        vm.assertEq(settlementOf(r), CLAIMED, "claimed");
        vm.assertEq(pool.totalPaid(), 10 ether, "total paid");
        vm.assertEq(pool.reservedRewards(), 0, "reserved");
        _accounting();
    }

    function test_claim_severalLeaves() public {
        onboard(bob, NODE2_PK);
        IComputePool.LeafRef[] memory refs = new IComputePool.LeafRef[](3);
        refs[0] = recordOne(1, node, 1, 0);
        IComputePool.WorkLeaf[] memory leaves = WorkParts.two(leafOf(node, 2, 0), leafOf(node2, 7, 0));
        recordPart(2, 5, leaves);
        refs[1] = WorkParts.refOf(2, 5, leaves, node);
        refs[2] = recordOne(3, node, 3, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.prank(alice);
        vm.assertEq(pool.claim(refs), 6 ether, "sum");
        vm.assertEq(token.balanceOf(alice), 6 ether, "one transfer");
        vm.assertEq(pool.reservedRewards(), 7 ether, "bob's still reserved");
        _accounting();
    }

    function test_claim_emptyListPaysNothing() public {
        vm.prank(alice);
        vm.assertEq(pool.claim(new IComputePool.LeafRef[](0)), 0, "nothing");
    }

    function test_claim_windowOpenReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        uint256 unlocks = block.timestamp + WINDOW;
        vm.warp(unlocks - 1);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOpen.selector, EPOCH, 0, unlocks));
        claimAs(alice, r);
    }

    function test_claim_twiceReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        claimAs(alice, r);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH, 0, node));
        claimAs(alice, r);
    }

    function test_claim_sameLeafTwiceInOneCallReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        IComputePool.LeafRef[] memory refs = new IComputePool.LeafRef[](2);
        (refs[0], refs[1]) = (r, r);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH, 0, node));
        vm.prank(alice);
        pool.claim(refs);
    }

    function test_claim_invalidatedReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        invalidateAs(validator, r);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, EPOCH, 0, node));
        claimAs(alice, r);
    }

    function test_claim_noWorkReverts() public {
        IComputePool.LeafRef memory r = WorkParts.ref(EPOCH, 0, WorkParts.one(leafOf(node, 10, 0)), 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH, 0));
        claimAs(alice, r);
    }

    function test_claim_notInRecordReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        r.leaf.units = 1000; // more than was recorded
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, EPOCH, 0, node));
        claimAs(alice, r);
    }

    function test_claim_notProviderReverts() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, bob));
        claimAs(bob, r);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, node));
        claimAs(node, r);
    }

    function test_claim_afterLeavingStillPaysJoinTimeProvider() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + 1);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.stopPrank();
        register(bob);
        onboard(bob, NODE_PK); // the node moves to bob
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, bob));
        claimAs(bob, r);
        vm.assertEq(claimAs(alice, r), 10 ether, "alice earned it");
    }

    function test_claim_afterEjectStillPays() public {
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + 1);
        vm.prank(admin);
        pool.eject(node);
        vm.warp(block.timestamp + WINDOW);
        vm.assertEq(claimAs(alice, r), 10 ether, "earned before the ejection");
    }

    // ---- admin ----

    function test_setters_emitOldAndNew() public {
        uint256 later = block.timestamp + pool.SLASH_CHANGE_DELAY();
        vm.startPrank(admin);
        vm.expectEmit(address(pool));
        emit IComputePool.QuorumChanged(1, 2, block.timestamp);
        pool.setQuorum(2);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardPerUnitChanged(REWARD_PER_UNIT, 4, later);
        pool.setRewardPerUnit(4);
        vm.expectEmit(address(pool));
        emit IComputePool.SlashPenaltyChanged(PENALTY, 5, block.timestamp);
        pool.setSlashPenalty(5);
        vm.expectEmit(address(pool));
        emit IComputePool.InvalidationWindowChanged(WINDOW, 6 minutes, later);
        pool.setInvalidationWindow(6 minutes);
        vm.stopPrank();
        vm.assertEq(pool.rewardPerUnit(), REWARD_PER_UNIT, "reward waits");
        vm.assertEq(pool.invalidationWindow(), WINDOW, "window waits");
        (uint256 r, uint256 rAt) = pool.pendingRewardPerUnit();
        (uint256 w, uint256 wAt) = pool.pendingInvalidationWindow();
        vm.assertEq(r, 4, "pending reward");
        vm.assertEq(w, 6 minutes, "pending window");
        vm.assertEq(rAt, later, "reward from");
        vm.assertEq(wAt, later, "window from");
        vm.warp(later);
        vm.assertEq(pool.quorum(), 2, "quorum");
        vm.assertEq(pool.rewardPerUnit(), 4, "reward");
        vm.assertEq(pool.slashPenalty(), 5, "penalty");
        vm.assertEq(pool.invalidationWindow(), 6 minutes, "window");
    }

    /// A part keeps the terms it was recorded under, a membership those it joined under.
    function test_setters_applyToLaterPartsOnly() public {
        vm.startPrank(admin);
        pool.setRewardPerUnit(3 ether);
        pool.setInvalidationWindow(1 hours);
        vm.stopPrank();
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY() - 1);
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, 10, 0); // the last second of the old terms
        uint256 end = block.timestamp + WINDOW;
        vm.prank(admin);
        pool.setSlashPenalty(5 ether);
        vm.warp(block.timestamp + 1);
        IComputePool.PartRecord memory rec = pool.recordOf(EPOCH, 0);
        vm.assertEq(rec.rewardPerUnit, REWARD_PER_UNIT, "reward kept");
        vm.assertEq(_membership(node, 1).penalty, PENALTY, "the membership's penalty kept");
        vm.assertEq(rec.unlocksAt, end, "window kept");
        IComputePool.LeafRef memory later = recordOne(EPOCH + 1, node, 10, 0);
        rec = pool.recordOf(EPOCH + 1, 0);
        vm.assertEq(rec.rewardPerUnit, 3 ether, "new reward");

        vm.assertEq(rec.unlocksAt, block.timestamp + 1 hours, "new window");
        vm.assertEq(pool.latestUnlock(), end, "the latest end stays the older part's");
        vm.warp(end);
        vm.assertEq(claimAs(alice, r), 10 ether, "old reward");
        vm.assertEq(claimAs(alice, later), 30 ether, "new reward");
        _accounting();
    }

    /// What lets a new party slash, or slash more, is announced with the time it applies.
    function test_setters_announceWhenTheChangesThatEaseSlashingApply() public {
        uint256 later = block.timestamp + pool.SLASH_CHANGE_DELAY();
        address newcomer = address(0x7A13);
        vm.startPrank(admin);
        pool.setQuorum(2);
        vm.expectEmit(address(pool));
        emit IComputePool.QuorumChanged(2, 1, later);
        pool.setQuorum(1);
        vm.expectEmit(address(pool));
        emit IComputePool.SlashPenaltyChanged(PENALTY, MIN_STAKE, later);
        pool.setSlashPenalty(MIN_STAKE);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectEmit(address(pool));
        emit IComputePool.RoleChangeScheduled(role, newcomer, true, later);
        pool.scheduleRoleChange(role, newcomer, true);
        vm.stopPrank();
        vm.assertEq(pool.quorum(), 2, "quorum waits");
        vm.assertEq(pool.slashPenalty(), PENALTY, "penalty waits");
        vm.assertFalse(pool.hasRole(role, newcomer), "newcomer waits");
        vm.warp(later);
        vm.expectEmit(address(pool));
        emit IComputePool.ValidatorAppointed(newcomer, later);
        pool.applyRoleChange(role, newcomer);
        vm.assertEq(pool.slashVotesAt(newcomer), later, "newcomer votes from its appointment");
        vm.assertEq(pool.quorum(), 1, "quorum applies");
        vm.assertEq(pool.slashPenalty(), MIN_STAKE, "penalty applies");
        (uint256 q, uint256 qAt) = pool.pendingQuorum();
        (uint256 p, uint256 pAt) = pool.pendingSlashPenalty();
        vm.assertEq(q + qAt + p + pAt, 0, "nothing waits any more");
    }

    /// The validators a pool is created with vote at once: providers join under them.
    function test_createPool_itsValidatorsSlashAtOnce() public {
        vm.expectEmit();
        emit IComputePool.ValidatorAppointed(validator, block.timestamp);
        ComputePool p = createPool(RUN, 1);
        vm.assertEq(p.slashVotesAt(validator), block.timestamp, "first");
        vm.assertEq(p.slashVotesAt(validator2), block.timestamp, "second");
    }

    function test_setters_bounds() public {
        vm.startPrank(admin);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 0, 2));
        pool.setQuorum(0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 3, 2));
        pool.setQuorum(3);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOutOfRange.selector, 0, 60, UNBONDING));
        pool.setInvalidationWindow(0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOutOfRange.selector, 59, 60, UNBONDING));
        pool.setInvalidationWindow(59);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOutOfRange.selector, UNBONDING + 1, 60, UNBONDING));
        pool.setInvalidationWindow(UNBONDING + 1);
        pool.setInvalidationWindow(UNBONDING);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.PenaltyTooHigh.selector, MIN_STAKE + 1, MIN_STAKE));
        pool.setSlashPenalty(MIN_STAKE + 1);
        pool.setSlashPenalty(MIN_STAKE);
        vm.stopPrank();
    }

    function test_setters_notAdminReverts() public {
        bytes memory err = abi.encodeWithSelector(
            IAccessControl.AccessControlUnauthorizedAccount.selector, validator, pool.DEFAULT_ADMIN_ROLE()
        );
        vm.startPrank(validator);
        vm.expectRevert(err);
        pool.setQuorum(1);
        vm.expectRevert(err);
        pool.setRewardPerUnit(1);
        vm.expectRevert(err);
        pool.setSlashPenalty(1);
        vm.expectRevert(err);
        pool.setInvalidationWindow(1 hours);
        bytes32 role = pool.RECORDER_ROLE();
        vm.expectRevert(err);
        pool.scheduleRoleChange(role, validator, true);
        vm.stopPrank();
    }

    // ---- fuzz ----

    function testFuzz_rewardAccounting(uint128 units, uint256 perUnit, uint256 funding, uint256 fate, uint256 wait)
        public
    {
        perUnit = bound(perUnit, 0, 1e24);
        units = uint128(bound(units, 1, 1e12));
        funding = bound(funding, 1, 1e36);
        wait = bound(wait, 0, 2 * WINDOW);
        fate = fate % 3; // 0: valid, 1: invalidated, 2: its membership left before it was recorded
        vm.prank(admin);
        pool.setRewardPerUnit(perUnit);
        passDelay(pool);
        fundPool(funding);
        uint256 reward = uint256(units) * perUnit;
        uint256 available = pool.availableRewards();
        if (fate == 2) {
            leaveAsNode(node);
            vm.warp(block.timestamp + 1);
        }
        if (reward > available) {
            IComputePool.WorkLeaf[] memory leaves = WorkParts.one(leafOf(node, units, 0));
            vm.expectRevert(abi.encodeWithSelector(IComputePool.InsufficientRewards.selector, available, reward));
            recordPart(EPOCH, 0, leaves);
            _accounting();
            return;
        }
        IComputePool.LeafRef memory r = recordOne(EPOCH, node, units, 0);
        vm.assertEq(pool.reservedRewards(), reward, "reserved");
        if (fate == 1) invalidateAs(validator, r);
        vm.warp(block.timestamp + wait);
        if (fate == 0 && wait >= WINDOW) {
            vm.assertEq(claimAs(alice, r), reward, "claimed reward");
            vm.assertEq(token.balanceOf(alice), reward, "paid");
        }
        if (fate == 2) pool.release(r);
        vm.assertEq(pool.reservedRewards(), fate == 0 && wait < WINDOW ? reward : 0, "reserved == unsettled");
        vm.assertLe(pool.totalPaid(), pool.totalFunded(), "paid <= funded");
        _accounting();
    }

    function testFuzz_slashPenalty(uint256 penalty, uint256 extraStake) public {
        penalty = bound(penalty, 0, MIN_STAKE);
        extraStake = bound(extraStake, 0, 1e30);
        if (extraStake > 0) stakeAs(alice, extraStake);
        uint256 staked = MIN_STAKE + extraStake;
        vm.prank(admin);
        pool.setSlashPenalty(penalty);
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY()); // a higher penalty waits
        vm.assertEq(pool.slashPenalty(), penalty, "applies");
        leaveAsNode(node);
        joinAs(alice, node); // a membership under the new penalty
        vm.assertEq(pool.bondOf(alice), penalty, "bonded");
        _slash(validator, _recordWithEvidence(2));
        uint256 expected = penalty < staked ? penalty : staked;
        vm.assertEq(token.balanceOf(treasury), expected, "treasury");
        vm.assertEq(token.balanceOf(validator), 0, "validator");
        vm.assertEq(manager.stakeOf(alice), staked - expected, "stake");
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "conserved");
    }
}
