// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";

import {ComputePool} from "../src/ComputePool.sol";
import {IComputePool} from "../src/interfaces/IComputePool.sol";
import {IStakeManager} from "../src/interfaces/IStakeManager.sol";
import {ProtocolFixture} from "./utils/Fixtures.sol";
import {WorkParts} from "./utils/Merkle.sol";

/// @notice Each attack an outside review found, tried as the attacker would:
/// a provider dodging its stake (leaving, unbonding, rejoining), a cheater
/// leaving before its work is recorded, a recorder and quorum colluding, a
/// revoked validator's key, an admin reopening paid work or freezing stake,
/// an admin making itself treasury, recorder and validator to profit from a
/// slash. Each test fails if the attack works.
contract AttacksTest is ProtocolFixture {
    uint256 constant FUNDING = 1000 ether;
    address validator3 = address(0x7A13);

    function setUp() public {
        deployProtocol();
        fundPool(FUNDING);
        onboard(alice, NODE_PK);
    }

    function _slash(address v, Evidence memory e) internal {
        slashWith(pool, v, e);
    }

    function _slashed(ComputePool p, address n, uint32 membership) internal view returns (bool) {
        return p.membershipAt(n, membership).slashed;
    }

    // ---- 1. stake backs work for as long as the work is slashable ----

    /// Remove the node, unbond and withdraw everything, re-add the node with a
    /// fresh consent, keep working: the stake its membership bonds cannot be
    /// unbonded while joined, the slash takes the full penalty, the stake that
    /// left backs no new membership, and the slashed membership earns nothing more.
    function test_1_providerCannotWithdrawTheStakeBehindItsWork() public {
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        vm.warp(block.timestamp + 1);
        vm.startPrank(alice);
        registry.removeNode(node);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, PENALTY));
        manager.requestUnbond(MIN_STAKE);
        manager.requestUnbond(MIN_STAKE - PENALTY); // only what no membership bonds
        vm.stopPrank();
        addNode(alice, NODE_PK); // a fresh consent; the pool still lists the node
        vm.assertTrue(pool.isJoined(node), "membership stayed");
        addNode(alice, NODE2_PK);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        joinAs(alice, node2); // no new membership on stake that left

        IComputePool.LeafRef memory later = recordOne(2, node, 10, 0); // still bonded: backed
        vm.warp(block.timestamp + 1);
        _slash(validator, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "the whole penalty");
        vm.warp(block.timestamp + 1);
        IComputePool.LeafRef memory afterSlash = recordOne(3, node, 10, 0); // names the ended membership
        vm.warp(block.timestamp + UNBONDING);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        claimAs(alice, later);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        claimAs(alice, afterSlash); // any leaf of a slashed membership
        pool.release(later);
        pool.release(afterSlash);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), MIN_STAKE - PENALTY, "only the unbonded part left");
        vm.assertEq(token.balanceOf(address(pool)), pool.availableRewards(), "no reward owed to alice");
    }

    /// Every membership bonds its own penalty: leaving and rejoining while
    /// earlier work is slashable needs stake for all of them, and each of them
    /// can then be slashed in full.
    function test_1_eachMembershipHasItsOwnPenaltyBacked() public {
        register(bob);
        addNode(bob, NODE2_PK);
        stakeAs(bob, MIN_STAKE + PENALTY);
        Evidence[] memory es = new Evidence[](3);
        for (uint256 i; i < 3; ++i) {
            joinAs(bob, node2);
            es[i] = recordSigned(uint64(i + 1), NODE2_PK, uint64(i + 1));
            vm.assertEq(es[i].ref.leaf.membership, i + 1, "membership");
            vm.warp(block.timestamp + 1);
            leaveAsNode(node2);
        }
        vm.assertEq(pool.bondOf(bob), 3 * PENALTY, "three penalties bonded");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, bob));
        joinAs(bob, node2); // a fourth needs 200
        vm.expectRevert(
            abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, MIN_STAKE + PENALTY - 1, 150 ether)
        );
        vm.prank(bob);
        manager.requestUnbond(1);
        for (uint256 i; i < 3; ++i) {
            _slash(validator, es[i]);
        }
        vm.assertEq(token.balanceOf(treasury), 3 * PENALTY, "each slashed in full");
        vm.assertEq(manager.stakeOf(bob), 0, "all of it");
    }

    /// Lengthening the window after work was recorded cannot outlast the bond:
    /// the record keeps its own window, and a leave's bond ends exactly with it.
    function test_1_lengtheningTheWindowDoesNotStretchOldRecords() public {
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        uint256 end = block.timestamp + WINDOW;
        vm.prank(admin);
        pool.setInvalidationWindow(UNBONDING);
        vm.assertEq(pool.recordOf(1, 0).unlocksAt, end, "old record keeps its window");
        vm.warp(block.timestamp + 1 hours);
        leaveAsNode(node);
        (,, uint256 until) = pool.bondsOf(alice);
        vm.assertEq(until, end, "bonded until the old window ends");
        vm.warp(end);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, 0));
        _slash(validator, e);
        vm.assertEq(pool.bondOf(alice), 0, "stake free exactly when the work is final");

        passDelay(pool); // the longer window applies
        joinAs(alice, node);
        recordOne(2, node, 10, 0);
        vm.assertEq(pool.recordOf(2, 0).unlocksAt, block.timestamp + UNBONDING, "new record, new window");
        vm.warp(block.timestamp + 1);
        leaveAsNode(node);
        vm.warp(block.timestamp + UNBONDING - 2);
        vm.assertEq(pool.bondOf(alice), PENALTY, "bonded for its whole window");
        vm.warp(block.timestamp + 1);
        vm.assertEq(pool.bondOf(alice), 0, "and not longer");
    }

    /// A cheater leaves right before the part holding its bad work is recorded
    /// (the recorder names the membership it worked under): it is neither paid
    /// nor slashed, the part's other nodes are paid, and its reward returns to the budget.
    function test_1_aCheaterWhoLeavesBeforeItsPartIsRecordedGetsNothing() public {
        onboard(bob, NODE2_PK);
        Evidence memory e;
        bytes32 root;
        (e.sub, e.sig, root) = signedLeaf(pool, NODE_PK, 1);
        IComputePool.WorkLeaf[] memory leaves = WorkParts.two(leafOf(node, 10, root), leafOf(node2, 10, 0));
        leaveAsNode(node);
        vm.warp(block.timestamp + 1);
        recordPart(1, 0, leaves);
        e.ref = WorkParts.refOf(1, 0, leaves, node);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 1));
        _slash(validator, e);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotBacked.selector, node, 1));
        claimAs(alice, e.ref);
        vm.assertEq(claimAs(bob, WorkParts.refOf(1, 0, leaves, node2)), 10 ether, "the honest node is paid");
        vm.prank(bob);
        pool.release(e.ref);
        vm.assertEq(token.balanceOf(alice), 0, "the cheater got nothing");
        vm.assertEq(pool.availableRewards(), FUNDING - 10 ether, "its reward is back in the budget");
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved");
    }

    /// Memberships are versioned: leaving and rejoining does not shed the work
    /// recorded under the earlier membership, whose slash still lands.
    function test_1_rejoiningDoesNotEscapeASlash() public {
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        vm.warp(block.timestamp + 1);
        leaveAsNode(node);
        joinAs(alice, node); // membership 2; both bonded
        vm.assertEq(pool.bondOf(alice), 2 * PENALTY, "the old membership stays bonded");
        IComputePool.LeafRef memory fresh = recordOne(2, node, 5, 0);
        vm.warp(block.timestamp + 1);
        _slash(validator, e);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "slashed");
        vm.assertTrue(_slashed(pool, node, 1), "the old membership");
        vm.assertFalse(_slashed(pool, node, 2), "not the new one");
        vm.assertTrue(pool.isJoined(node), "which goes on");
        // the leaf cannot be passed off as the new membership's either
        e.ref.leaf.membership = 2;
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotInRecord.selector, 1, 0, node));
        _slash(validator2, e);
        vm.warp(block.timestamp + WINDOW);
        vm.assertEq(claimAs(alice, fresh), 5 ether, "the new membership's work is paid");
    }

    /// Whatever it unbonds and whenever, and whether its node left or not, a
    /// provider keeps the penalty of its slashable work; the slash within the
    /// window always takes it in full.
    function testFuzz_1_unbondingNeverUncoversWork(uint256 extra, uint256 amount, uint256 wait, bool leave) public {
        extra = bound(extra, 0, 1e24);
        if (extra != 0) stakeAs(alice, extra);
        wait = bound(wait, 1, WINDOW - 1);
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        vm.warp(block.timestamp + wait);
        if (leave) leaveAsNode(node);
        vm.prank(alice);
        registry.removeNode(node);
        uint256 active = manager.stakeOf(alice);
        amount = bound(amount, 1, active);
        vm.prank(alice);
        try manager.requestUnbond(amount) {
            vm.assertGe(active - amount, PENALTY, "unbonded into the penalty");
        } catch {
            vm.assertLt(active - amount, PENALTY, "refused an unbond that kept the penalty");
        }
        _slash(validator, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "full penalty");
    }

    /// Whenever the node leaves, the penalty stays bonded exactly until the
    /// window of the work recorded before the leave has closed.
    function testFuzz_1_aLeaveIsBondedUntilTheWindowCloses(uint256 before, uint256 afterwards) public {
        uint256 t0 = block.timestamp;
        recordOne(1, node, 10, 0);
        vm.warp(t0 + bound(before, 1, 2 * WINDOW));
        leaveAsNode(node);
        vm.warp(block.timestamp + bound(afterwards, 0, 2 * WINDOW));
        vm.prank(alice);
        registry.removeNode(node);
        vm.prank(alice);
        try manager.requestUnbond(MIN_STAKE) {
            vm.assertGe(block.timestamp, t0 + WINDOW, "unbonded while the work was slashable");
        } catch {
            vm.assertLt(block.timestamp, t0 + WINDOW, "refused after the window closed");
        }
    }

    // ---- 2. one signed submission is evidence for at most one penalty ----

    /// A recorder puts the same signed leaf into the commitments of two
    /// memberships of the node; a quorum slashes with it once, and not again
    /// against the other membership.
    function test_2_theSameSignedLeafInTwoMembershipsSlashesOnce() public {
        stakeAs(alice, MIN_STAKE);
        Evidence memory first = recordSigned(1, NODE_PK, 1);
        vm.warp(block.timestamp + 1);
        leaveAsNode(node);
        joinAs(alice, node);
        Evidence memory second = recordSigned(2, NODE_PK, 1);
        vm.assertEq(second.ref.leaf.membership, 2, "the next membership");
        vm.warp(block.timestamp + 1);
        _slash(validator, first);
        bytes32 digest = pool.submissionDigest(first.sub);
        vm.assertTrue(pool.evidenceUsed(digest), "used");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.EvidenceUsed.selector, digest));
        _slash(validator, second);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "one penalty");
        vm.assertEq(manager.stakeOf(alice), 2 * MIN_STAKE - PENALTY, "the rest stays");
    }

    /// The same signed leaf in two parts of one membership: one penalty, since a
    /// membership bonds one.
    function test_2_oneMembershipIsSlashedOnce() public {
        stakeAs(alice, MIN_STAKE);
        Evidence memory first = recordSigned(1, NODE_PK, 1);
        Evidence memory second = recordSigned(2, NODE_PK, 1);
        vm.warp(block.timestamp + 1);
        _slash(validator, first);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, node, 1));
        _slash(validator, second);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "one penalty");
    }

    // ---- 3. only current validators count ----

    function test_3_aRevokedValidatorsInvalidationVoteDies() public {
        bytes32 role = pool.VALIDATOR_ROLE();
        changeRoleAfterDelay(pool, role, validator3, true);
        vm.prank(admin);
        pool.setQuorum(2);
        scheduleRole(pool, role, validator, false); // the key was compromised
        (, uint256 due) = pool.pendingRoleChange(role, validator);
        vm.warp(due - 1 hours);
        IComputePool.LeafRef memory r = recordOne(1, node, 10, 0);
        invalidateAs(validator, r);
        vm.assertEq(pool.invalidationVotes(1, 0, node), 1, "one vote");

        vm.warp(due);
        pool.applyRoleChange(role, validator);
        vm.assertEq(pool.invalidationVotes(1, 0, node), 0, "its vote died with its role");
        invalidateAs(validator2, r);
        vm.assertEq(settlementOf(r), uint256(IComputePool.Settlement.Open), "one live vote is no quorum");
        invalidateAs(validator3, r);
        vm.assertEq(settlementOf(r), uint256(IComputePool.Settlement.Invalidated), "two live votes");

        // granted again, the old key is a new term: its old vote stays dead, a new one counts
        IComputePool.LeafRef memory later = recordOne(2, node, 10, 0);
        invalidateAs(validator2, later);
        changeRoleAfterDelay(pool, role, validator, true);
        vm.assertEq(pool.invalidationVotes(1, 0, node), 2, "validator2's and validator3's: the old term's not revived");
        vm.assertEq(pool.invalidationVotes(2, 0, node), 1, "validator2's vote on the later record");
    }

    function test_3_aRenouncedValidatorsSlashVoteDies() public {
        changeRoleAfterDelay(pool, pool.VALIDATOR_ROLE(), validator3, true); // its votes count from here
        vm.prank(admin);
        pool.setQuorum(2);
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        bytes32 digest = pool.submissionDigest(e.sub);
        _slash(validator, e);

        bytes32 role = pool.VALIDATOR_ROLE();
        vm.prank(validator);
        pool.renounceRole(role, validator);
        (uint256 votes,) = pool.slashVotes(node, 1, digest);
        vm.assertEq(votes, 0, "renounced: its vote died");
        _slash(validator2, e);
        vm.assertEq(token.balanceOf(treasury), 0, "no quorum of current validators");
        _slash(validator3, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "two current validators");
    }

    function test_3_revokedValidatorCannotVote() public {
        bytes32 role = pool.VALIDATOR_ROLE();
        changeRoleAfterDelay(pool, role, validator, false);
        IComputePool.LeafRef memory r = recordOne(1, node, 10, 0);
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, validator, role)
        );
        invalidateAs(validator, r);
    }

    // ---- 4. paid work is final ----

    /// After a claim, raising the window reopens nothing: no invalidation, no
    /// slash, no second claim or release of the reward, and later claims are still paid.
    function test_4_raisingTheWindowDoesNotReopenClaimedWork() public {
        stakeAs(alice, MIN_STAKE);
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        vm.warp(block.timestamp + WINDOW);
        claimAs(alice, e.ref);
        uint256 available = pool.availableRewards();

        vm.prank(admin);
        pool.setInvalidationWindow(UNBONDING);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, 0));
        invalidateAs(validator, e.ref);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, 0));
        _slash(validator, e);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, 1, 0, node));
        claimAs(alice, e.ref);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySettled.selector, 1, 0, node));
        pool.release(e.ref);
        vm.assertEq(pool.availableRewards(), available, "no reward released twice");
        vm.assertEq(manager.stakeOf(alice), 2 * MIN_STAKE, "no stake taken");

        // a later valid record is still paid in full
        IComputePool.LeafRef memory r = recordOne(2, node, 10, e.ref.leaf.commitment);
        vm.warp(block.timestamp + UNBONDING);
        vm.assertEq(claimAs(alice, r), 10 ether, "paid");
        vm.assertEq(
            token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool holds its debts"
        );
    }

    /// Any window the admin sets after a claim leaves the claimed work closed.
    function testFuzz_4_noWindowReopensAClaim(uint256 window, uint256 wait) public {
        window = bound(window, 60, UNBONDING);
        IComputePool.LeafRef memory r = recordOne(1, node, 10, 0);
        vm.warp(block.timestamp + WINDOW + bound(wait, 0, UNBONDING));
        claimAs(alice, r);
        vm.prank(admin);
        pool.setInvalidationWindow(window);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, 0));
        invalidateAs(validator, r);
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved again");
        vm.assertEq(settlementOf(r), uint256(IComputePool.Settlement.Claimed), "claimed");
    }

    // ---- 5. admin power is bounded and cannot take stake ----

    /// The stake manager's admin holds the only role there is on it; with it,
    /// it can neither slash, nor make itself a slasher, nor bond stake.
    function test_5_theAdminCannotSlash() public {
        vm.startPrank(admin);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotPool.selector, admin));
        manager.slash(alice, MIN_STAKE, bytes32(0));
        (bool locked,) =
            address(manager).call(abi.encodeWithSignature("lock(address,uint256,uint256)", alice, MIN_STAKE, 1));
        vm.assertFalse(locked, "no lock to freeze stake with: only the pools' bonds hold it");
        vm.stopPrank();
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE, "untouched");
        vm.assertEq(token.balanceOf(admin), 0, "nothing gained");
    }

    /// No parameter freezes stake or earned rewards for years, or makes votes unreachable.
    function test_5_theAdminCannotFreezeStakeOrRewards() public {
        uint256 max = manager.MAX_UNBONDING_PERIOD();
        vm.startPrank(admin);
        vm.expectRevert(
            abi.encodeWithSelector(IStakeManager.UnbondingPeriodOutOfRange.selector, 10 * 365 days, WINDOW, max)
        );
        manager.setUnbondingPeriod(10 * 365 days);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOutOfRange.selector, 10 * 365 days, 60, UNBONDING));
        pool.setInvalidationWindow(10 * 365 days);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOutOfRange.selector, 0, 60, UNBONDING));
        pool.setInvalidationWindow(0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 3, 2));
        pool.setQuorum(3);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.PenaltyTooHigh.selector, MIN_STAKE + 1, MIN_STAKE));
        pool.setSlashPenalty(MIN_STAKE + 1);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.MinStakeBelowPenalty.selector, 0, PENALTY));
        manager.setMinStakePerNode(0);
        // the quorum cannot be left above the validators by revoking them
        pool.setQuorum(2);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IComputePool.RoleChangeDelayed.selector, role));
        pool.revokeRole(role, validator);
        vm.stopPrank();
        changeRoleAfterDelay(pool, role, validator2, true); // holds it already: nothing changes
        scheduleRole(pool, role, validator, false);
        passDelay(pool);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 2, 1));
        pool.applyRoleChange(role, validator);
    }

    /// The longest unbonding period applies only to requests made after the
    /// current period: a provider who disagrees leaves on the old terms.
    function test_5_aLongerUnbondingPeriodWaitsForStakersToLeave() public {
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.stopPrank();
        uint256 longest = manager.MAX_UNBONDING_PERIOD();
        vm.prank(admin);
        manager.setUnbondingPeriod(longest);
        vm.prank(alice);
        manager.requestUnbond(MIN_STAKE);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), MIN_STAKE, "out on the old terms");
    }

    /// A penalty raised after a node joined applies to later joins only: what
    /// a provider bonded is what it can lose.
    function test_5_aHigherPenaltyAppliesToNewMembershipsOnly() public {
        stakeAs(alice, MIN_STAKE);
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY());
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        _slash(validator, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "the penalty of the membership");
    }

    // ---- 6. no operator profits from a slash ----

    /// @dev The admin schedules its appointment as recorder and validator of
    /// `p` and lowers its quorum to one: everything a slash of its own would need.
    function _adminTakesOver(ComputePool p) internal {
        vm.startPrank(admin);
        p.scheduleRoleChange(p.RECORDER_ROLE(), admin, true);
        p.scheduleRoleChange(p.VALIDATOR_ROLE(), admin, true);
        p.setQuorum(1);
        vm.stopPrank();
    }

    /// @dev The admin's appointments on `p`, once due, applied.
    function _adminTakesOffice(ComputePool p) internal {
        p.applyRoleChange(p.RECORDER_ROLE(), admin);
        p.applyRoleChange(p.VALIDATOR_ROLE(), admin);
    }

    /// @dev A second pool of the run whose deployment asked two validators per
    /// vote; alice's node joins it.
    function _poolOfQuorumTwo() internal returns (ComputePool p) {
        p = createPool(RUN, 2);
        vm.prank(alice);
        p.joinPool(node);
        mint(admin, FUNDING);
        vm.startPrank(admin);
        token.approve(address(p), FUNDING);
        p.fund(FUNDING);
        vm.stopPrank();
    }

    /// The first half of the hole: the stake manager's admin cannot point the
    /// treasury at itself; there is no setter, and the treasury stays the one
    /// of the deployment.
    function test_6_theAdminCannotMoveTheTreasury() public {
        vm.prank(admin);
        (bool moved,) = address(manager).call(abi.encodeWithSignature("setTreasury(address)", admin));
        vm.assertFalse(moved, "no setter");
        vm.assertEq(manager.treasury(), treasury, "the deployment's treasury");
    }

    /// The second half: the admin appoints itself recorder and validator and
    /// lowers the quorum to one, to record a part whose leaf commits one of the
    /// node's honest signed submissions and vote to slash it. Neither its roles
    /// nor the lower quorum count before SLASH_CHANGE_DELAY.
    function test_6_anAdminAppointedValidatorCannotSlashBeforeTheDelay() public {
        ComputePool p = _poolOfQuorumTwo();
        uint256 t0 = block.timestamp;
        uint256 delay = p.SLASH_CHANGE_DELAY();
        _adminTakesOver(p);
        vm.assertEq(p.quorum(), 2, "the lower quorum waits");
        (uint256 q, uint256 qAt) = p.pendingQuorum();
        vm.assertEq(q, 1, "pending quorum");
        vm.assertEq(qAt, t0 + delay, "from");
        (bool grant, uint256 due) = p.pendingRoleChange(p.VALIDATOR_ROLE(), admin);
        vm.assertTrue(grant && due == t0 + delay, "the admin's appointment waits");
        vm.assertEq(p.slashVotesAt(validator), t0, "the deployment's count at once");

        vm.warp(t0 + delay - 1);
        bytes32 role = p.RECORDER_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IComputePool.RoleChangeNotDue.selector, role, admin, t0 + delay));
        p.applyRoleChange(role, admin);
        IComputePool.WorkLeaf[] memory leaves = WorkParts.one(leafOf(node, 10, 0));
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, admin, role));
        vm.prank(admin);
        p.recordWork(1, 0, leaves);

        // one honest deployment validator misled into voting on the honest recorder's part is still no quorum
        Evidence memory e = recordSignedIn(p, recorder, 1, NODE_PK, 1);
        slashWith(p, validator, e);
        vm.assertFalse(_slashed(p, node, 1), "two votes needed until the delay has passed");
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE, "stake untouched");
        vm.assertEq(token.balanceOf(admin), 0, "nothing gained");
    }

    /// After the delay the admin's validator may slash, but only the stake of
    /// providers who stayed, and what it takes goes to the deployment's
    /// treasury. The worst case for the staker who leaves: the window and the
    /// unbonding period at their longest, the admin recording one of its
    /// honest submissions at the last moment before it leaves a day late.
    function test_6_afterTheDelayStakersHadTimeToLeave() public {
        uint256 longest = manager.MAX_UNBONDING_PERIOD();
        vm.prank(admin);
        manager.setUnbondingPeriod(longest);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(admin);
        pool.setInvalidationWindow(longest);
        register(bob);
        addNode(bob, NODE2_PK);
        stakeAs(bob, MIN_STAKE);
        joinAs(bob, node2);

        passDelay(pool); // the longest window applies
        uint256 t0 = block.timestamp;
        uint256 delay = pool.SLASH_CHANGE_DELAY();
        _adminTakesOver(pool);
        vm.warp(t0 + 1 days - 1);
        Evidence memory e = recordSignedIn(pool, recorder, 1, NODE_PK, 1); // the recorder's last part before alice leaves

        // alice leaves a day after the change: the node, the pool, the free stake now ...
        vm.warp(t0 + 1 days);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        manager.requestUnbond(MIN_STAKE - PENALTY);
        // ... and the penalty bonded for the admin's record once its window has closed
        vm.warp(pool.recordOf(1, 0).unlocksAt);
        manager.requestUnbond(PENALTY);
        vm.warp(block.timestamp + longest);
        vm.assertEq(manager.withdraw(), MIN_STAKE, "all of it");
        vm.stopPrank();
        vm.assertLe(block.timestamp, t0 + delay, "out before the change applies");

        vm.warp(t0 + delay);
        _adminTakesOffice(pool);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, 0));
        slashWith(pool, admin, e);

        // bob stayed: now the admin's validator can slash him, to the treasury's gain, not its own
        Evidence memory bobs = recordSignedIn(pool, admin, 2, NODE2_PK, 1);
        slashWith(pool, admin, bobs);
        vm.assertEq(manager.stakeOf(bob), MIN_STAKE - PENALTY, "bob, who stayed, was slashed");
        vm.assertEq(token.balanceOf(treasury), PENALTY, "to the deployment's treasury");
        vm.assertEq(token.balanceOf(admin), 0, "the admin gained nothing");
        vm.assertEq(token.balanceOf(alice), MIN_STAKE, "alice kept everything");
    }

    /// The delay is a constant beyond the longest window plus the longest
    /// unbonding period: shortening both first changes nothing.
    function test_6_shorteningTheUnbondingPeriodDoesNotShortenTheDelay() public {
        uint256 delay = pool.SLASH_CHANGE_DELAY();
        vm.assertGt(delay, 2 * manager.MAX_UNBONDING_PERIOD(), "longest window + longest unbonding");
        vm.prank(admin);
        pool.setInvalidationWindow(1 minutes);
        passDelay(pool);
        vm.prank(admin);
        manager.setUnbondingPeriod(1 minutes);
        vm.assertEq(manager.unbondingPeriod(), 1 minutes, "shorter at once");
        uint256 t0 = block.timestamp;
        _adminTakesOver(pool);
        (, uint256 due) = pool.pendingRoleChange(pool.VALIDATOR_ROLE(), admin);
        vm.assertEq(due, t0 + delay, "the same delay");

        vm.warp(t0 + delay - 30 seconds);
        Evidence memory e = recordSignedIn(pool, recorder, 1, NODE_PK, 1);
        vm.warp(t0 + delay - 1);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IComputePool.RoleChangeNotDue.selector, role, admin, t0 + delay));
        pool.applyRoleChange(role, admin);
        vm.warp(t0 + delay);
        _adminTakesOffice(pool);
        slashWith(pool, admin, e);
        vm.assertTrue(_slashed(pool, node, 1), "from the delay on, as announced");
        vm.assertEq(token.balanceOf(admin), 0, "to the treasury, not the admin");
    }

    /// Revoking a validator and appointing it again waits the delay again; until
    /// then it can neither slash nor invalidate.
    function test_6_aReappointedValidatorWaitsAgain() public {
        bytes32 role = pool.VALIDATOR_ROLE();
        changeRoleAfterDelay(pool, role, validator, false);
        scheduleRole(pool, role, validator, true);
        uint256 at = block.timestamp + pool.SLASH_CHANGE_DELAY();
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, validator, role)
        );
        _slash(validator, e);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.RoleChangeNotDue.selector, role, validator, at));
        pool.applyRoleChange(role, validator);
        vm.warp(at);
        pool.applyRoleChange(role, validator);
        vm.assertEq(pool.slashVotesAt(validator), at, "a new term from its appointment");
        Evidence memory later = recordSigned(2, NODE_PK, 2);
        _slash(validator, later);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "its slash counts once appointed");
    }

    /// A higher penalty applies only to memberships joined from the delay on; a
    /// lower one at once, cancelling the higher one.
    function test_6_aHigherPenaltyWaitsForStakersToLeave() public {
        stakeAs(alice, MIN_STAKE);
        uint256 t0 = block.timestamp;
        uint256 delay = pool.SLASH_CHANGE_DELAY();
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.assertEq(pool.slashPenalty(), PENALTY, "not yet");
        (uint256 pending, uint256 at) = pool.pendingSlashPenalty();
        vm.assertEq(pending, MIN_STAKE, "pending");
        vm.assertEq(at, t0 + delay, "from");
        vm.warp(t0 + delay - 1);
        addNode(alice, NODE2_PK);
        joinAs(alice, node2);
        vm.assertEq(pool.membershipAt(node2, 1).penalty, PENALTY, "joined under the old penalty");
        vm.assertEq(pool.bondOf(alice), 2 * PENALTY, "bonded under the old penalty");
        vm.warp(t0 + delay);
        vm.assertEq(pool.bondOf(alice), 2 * PENALTY, "and stays so");
        Evidence memory e = recordSigned(1, NODE2_PK, 1);
        _slash(validator, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "the old penalty");
        stakeAs(alice, PENALTY); // two nodes need 200
        joinAs(alice, node2); // back after the slash ended its membership
        vm.assertEq(pool.membershipAt(node2, 2).penalty, MIN_STAKE, "the new one from the delay on");
        vm.assertEq(pool.bondOf(alice), PENALTY + MIN_STAKE, "bonded");

        vm.startPrank(admin);
        pool.setSlashPenalty(MIN_STAKE); // raising to the same value changes nothing
        pool.setSlashPenalty(PENALTY + 1 ether);
        pool.setSlashPenalty(MIN_STAKE);
        pool.setSlashPenalty(PENALTY);
        vm.stopPrank();
        vm.assertEq(pool.slashPenalty(), PENALTY, "lower at once");
        (, at) = pool.pendingSlashPenalty();
        vm.assertEq(at, 0, "the higher one was cancelled");
        vm.warp(block.timestamp + delay);
        vm.assertEq(pool.slashPenalty(), PENALTY, "and never came");
    }

    /// A lower quorum counts only from the delay on; a higher one at once,
    /// cancelling the lower one.
    function test_6_aLowerQuorumWaitsForStakersToLeave() public {
        ComputePool p = _poolOfQuorumTwo();
        uint256 t0 = block.timestamp;
        uint256 delay = p.SLASH_CHANGE_DELAY();
        vm.prank(admin);
        p.setQuorum(1);
        vm.warp(t0 + delay - 1 hours);
        Evidence memory e = recordSignedIn(p, recorder, 1, NODE_PK, 1);
        vm.warp(t0 + delay - 1);
        slashWith(p, validator, e);
        vm.assertFalse(_slashed(p, node, 1), "one vote of two");
        vm.warp(t0 + delay);
        vm.assertEq(p.quorum(), 1, "now one");
        (uint256 votes,) = p.slashVotes(node, 1, p.submissionDigest(e.sub));
        vm.assertEq(votes, 1, "the vote cast before still counts");
        slashWith(p, validator2, e);
        vm.assertTrue(_slashed(p, node, 1), "slashed");

        vm.startPrank(admin);
        p.setQuorum(2); // higher: at once
        vm.assertEq(p.quorum(), 2, "higher at once");
        p.setQuorum(1);
        p.setQuorum(2);
        vm.stopPrank();
        (, uint256 at) = p.pendingQuorum();
        vm.assertEq(at, 0, "the lower one was cancelled");
        vm.warp(block.timestamp + delay);
        vm.assertEq(p.quorum(), 2, "and never came");
    }

    /// Whatever the admin sets first (window, unbonding period, quorum, penalty),
    /// a recorder and validator it appoints can neither record nor slash before
    /// SLASH_CHANGE_DELAY has passed.
    function testFuzz_6_noAdminMoveLetsANewValidatorSlashEarly(
        uint256 window,
        uint256 period,
        uint256 penalty,
        uint256 wait
    ) public {
        vm.startPrank(admin);
        try pool.setInvalidationWindow(bound(window, 0, 40 days)) {} catch {}
        try manager.setUnbondingPeriod(bound(period, 0, 40 days)) {} catch {}
        try pool.setSlashPenalty(bound(penalty, 0, MIN_STAKE)) {} catch {}
        vm.stopPrank();
        uint256 t0 = block.timestamp;
        uint256 delay = pool.SLASH_CHANGE_DELAY();
        _adminTakesOver(pool);
        wait = bound(wait, 0, delay - 1);
        vm.warp(t0 + wait);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IComputePool.RoleChangeNotDue.selector, role, admin, t0 + delay));
        pool.applyRoleChange(role, admin);
        Evidence memory e = recordSignedIn(pool, recorder, 1, NODE_PK, 1);
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, admin, role));
        slashWith(pool, admin, e);
        vm.assertFalse(pool.hasRole(pool.RECORDER_ROLE(), admin), "not a recorder");
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE, "untouched");
    }

    /// Whatever numbers the admin tries, a setter either refuses them or they
    /// land inside the documented bounds.
    function testFuzz_5_adminParametersStayBounded(uint256 period, uint256 window, uint256 penalty, uint256 q) public {
        vm.startPrank(admin);
        try manager.setUnbondingPeriod(period) {} catch {}
        try pool.setInvalidationWindow(window) {} catch {}
        try pool.setSlashPenalty(penalty) {} catch {}
        try pool.setQuorum(q) {} catch {}
        vm.stopPrank();
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY()); // whatever waited applies
        uint256 u = manager.unbondingPeriod();
        vm.assertLe(u, manager.MAX_UNBONDING_PERIOD(), "unbonding <= 30 days");
        vm.assertGe(u, pool.invalidationWindow(), "unbonding >= window");
        vm.assertGe(pool.invalidationWindow(), pool.MIN_INVALIDATION_WINDOW(), "window >= 1 minute");
        vm.assertLe(pool.slashPenalty(), manager.minStakePerNode(), "penalty <= min stake");
        vm.assertGe(pool.quorum(), 1, "quorum >= 1");
        vm.assertLe(pool.quorum(), pool.validatorCount(), "quorum <= validators");
    }

    // ---- also: a node revokes a consent it has not used ----

    function test_aNodeRevokesAnUnusedConsent() public {
        register(bob);
        uint256 deadline = block.timestamp + 1 hours;
        bytes memory consent = consentSig(NODE2_PK, bob, deadline);
        vm.prank(node2);
        registry.revokeConsent();
        vm.expectRevert();
        vm.prank(bob);
        registry.addNode(node2, deadline, consent);
        vm.assertEq(registry.providerOf(node2), address(0), "not added");
    }
}
