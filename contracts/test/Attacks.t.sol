// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";

import {ComputePool} from "../src/ComputePool.sol";
import {IComputePool} from "../src/interfaces/IComputePool.sol";
import {IStakeManager} from "../src/interfaces/IStakeManager.sol";
import {MerkleBuilder, ProtocolFixture} from "./utils/Fixtures.sol";

/// @notice Each attack an outside review found, tried as the attacker would:
/// a provider dodging its stake, a recorder and quorum colluding, a revoked
/// validator's key, an admin reopening paid epochs or freezing stake, an admin
/// making itself treasury, recorder and validator to profit from a slash. Each
/// test fails if the attack works.
contract AttacksTest is ProtocolFixture {
    uint256 constant FUNDING = 1000 ether;
    address validator3 = address(0x7A13);

    function setUp() public {
        deployProtocol();
        fundPool(FUNDING);
        onboard(alice, NODE_PK);
    }

    function _submit(uint64 epoch, address n, bytes32 commitment) internal {
        vm.prank(recorder);
        pool.submitWork(epoch, n, 10, commitment);
    }

    function _one(uint64 epoch) internal pure returns (uint64[] memory e) {
        e = new uint64[](1);
        e[0] = epoch;
    }

    /// @dev Node's signed submission whose lone leaf is a whole commitment.
    function _loneEvidence(uint64 step)
        internal
        view
        returns (IComputePool.Submission memory sub, bytes memory sig, bytes32 root)
    {
        return _loneEvidenceIn(pool, step);
    }

    /// @dev The same in pool `p`'s domain.
    function _loneEvidenceIn(ComputePool p, uint64 step)
        internal
        view
        returns (IComputePool.Submission memory sub, bytes memory sig, bytes32 root)
    {
        sub = submission(node, step, keccak256(abi.encode("rollout", step)));
        bytes32 digest = p.submissionDigest(sub);
        sig = signDigest(NODE_PK, digest);
        root = MerkleBuilder.leaf(digest);
    }

    // ---- 1. stake backs work for as long as the work is slashable ----

    /// Remove the node, unbond and withdraw everything, re-add the node with a
    /// fresh consent, keep working: the stake behind recorded work cannot be
    /// unbonded while that work is slashable, the slash takes the full penalty,
    /// and no new work is recorded on stake that left.
    function test_1_providerCannotWithdrawTheStakeBehindItsWork() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);

        vm.startPrank(alice);
        registry.removeNode(node);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, PENALTY));
        manager.requestUnbond(MIN_STAKE);
        manager.requestUnbond(MIN_STAKE - PENALTY); // only what no work needs
        vm.stopPrank();
        addNode(alice, NODE_PK); // a fresh consent; the pool still lists the node
        vm.assertTrue(pool.isJoined(node), "membership stayed");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        _submit(2, node, root);

        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), PENALTY, "the whole penalty");
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), MIN_STAKE - PENALTY, "only the free part left");
    }

    /// A provider with several nodes needs free stake for every record's penalty.
    function test_1_eachRecordInItsWindowHasItsOwnPenaltyBacked() public {
        register(bob);
        addNode(bob, NODE2_PK);
        stakeAs(bob, MIN_STAKE + PENALTY);
        vm.prank(bob);
        pool.joinPool(node2);
        _submit(1, node2, bytes32(0));
        _submit(2, node2, bytes32(0));
        _submit(3, node2, bytes32(0));
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.FreeStakeTooLow.selector, 0, PENALTY));
        _submit(4, node2, bytes32(0));
        vm.assertEq(manager.lockedOf(bob), 3 * PENALTY, "three penalties locked");
    }

    /// Lengthening the window after work was recorded cannot outlast the lock:
    /// the record keeps its own window, and its lock ends exactly with it.
    function test_1_lengtheningTheWindowDoesNotStretchOldRecords() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        uint256 end = block.timestamp + WINDOW;
        vm.prank(admin);
        pool.setInvalidationWindow(UNBONDING);
        vm.assertEq(pool.unlocksAt(1, node), end, "old record keeps its window");
        vm.warp(end);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, node));
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(manager.lockedOf(alice), 0, "stake free exactly when the work is final");

        _submit(2, node, root);
        vm.assertEq(pool.unlocksAt(2, node), block.timestamp + UNBONDING, "new record, new window");
        vm.warp(block.timestamp + UNBONDING - 1);
        vm.assertEq(manager.lockedOf(alice), PENALTY, "locked for its whole window");
    }

    // ---- 2. one signed submission is evidence for at most one penalty ----

    /// A recorder puts the same signed leaf into two epochs' commitments; a
    /// quorum slashes with it once, and not again in the other epoch.
    function test_2_theSameSignedLeafInTwoEpochsSlashesOnce() public {
        stakeAs(alice, MIN_STAKE);
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        _submit(2, node, root);
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        bytes32 digest = pool.submissionDigest(sub);
        vm.assertTrue(pool.evidenceUsed(digest), "used");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.EvidenceUsed.selector, digest));
        vm.prank(validator);
        pool.slash(2, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), PENALTY, "one penalty");
        vm.assertEq(manager.stakeOf(alice), 2 * MIN_STAKE - PENALTY, "the rest stays");
    }

    // ---- 3. only current validators count ----

    function test_3_aRevokedValidatorsInvalidationVoteDies() public {
        vm.startPrank(admin);
        pool.grantRole(pool.VALIDATOR_ROLE(), validator3);
        pool.setQuorum(2);
        vm.stopPrank();
        _submit(1, node, bytes32(0));
        vm.prank(validator);
        pool.invalidate(1, node);
        vm.assertEq(pool.invalidationVotes(1, node), 1, "one vote");

        bytes32 role = pool.VALIDATOR_ROLE();
        vm.prank(admin);
        pool.revokeRole(role, validator); // the key was compromised
        vm.assertEq(pool.invalidationVotes(1, node), 0, "its vote died with its role");
        vm.prank(validator2);
        pool.invalidate(1, node);
        vm.assertFalse(pool.workOf(1, node).invalidated, "one live vote is no quorum");

        // granted again, the old key is a new term: its old vote stays dead, a new one counts
        vm.prank(admin);
        pool.grantRole(role, validator);
        vm.assertEq(pool.invalidationVotes(1, node), 1, "old term's vote not revived");
        vm.prank(validator);
        pool.invalidate(1, node);
        vm.assertTrue(pool.workOf(1, node).invalidated, "two live votes");
    }

    function test_3_aRenouncedValidatorsSlashVoteDies() public {
        vm.startPrank(admin);
        pool.grantRole(pool.VALIDATOR_ROLE(), validator3);
        pool.setQuorum(2);
        vm.stopPrank();
        vm.warp(block.timestamp + pool.SLASH_CHANGE_DELAY()); // validator3's slash votes count
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        bytes32 digest = pool.submissionDigest(sub);
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));

        bytes32 role = pool.VALIDATOR_ROLE();
        vm.prank(validator);
        pool.renounceRole(role, validator);
        (uint256 votes,) = pool.slashVotes(1, node, digest);
        vm.assertEq(votes, 0, "renounced: its vote died");
        vm.prank(validator2);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), 0, "no quorum of current validators");
        vm.prank(validator3);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), PENALTY, "two current validators");
    }

    function test_3_revokedValidatorCannotVote() public {
        _submit(1, node, bytes32(0));
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.prank(admin);
        pool.revokeRole(role, validator);
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, validator, role)
        );
        vm.prank(validator);
        pool.invalidate(1, node);
    }

    // ---- 4. paid work is final ----

    /// After a claim, raising the window reopens nothing: no invalidation, no
    /// slash, no second release of the reward, and later claims are still paid.
    function test_4_raisingTheWindowDoesNotReopenClaimedEpochs() public {
        stakeAs(alice, MIN_STAKE);
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        vm.warp(block.timestamp + WINDOW);
        vm.prank(alice);
        pool.claim(node, _one(1));
        uint256 available = pool.availableRewards();

        vm.prank(admin);
        pool.setInvalidationWindow(UNBONDING);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, node));
        vm.prank(validator);
        pool.invalidate(1, node);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, node));
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(pool.availableRewards(), available, "no reward released twice");
        vm.assertEq(manager.stakeOf(alice), 2 * MIN_STAKE, "no stake taken");

        // a later valid record is still paid in full
        _submit(2, node, root);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(alice);
        vm.assertEq(pool.claim(node, _one(2)), 10 ether, "paid");
        vm.assertEq(
            token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool holds its debts"
        );
    }

    // ---- 5. admin power is bounded and cannot take stake ----

    /// The stake manager's admin holds the only role there is on it; with it,
    /// it can neither slash nor make itself a slasher.
    function test_5_theAdminCannotSlash() public {
        vm.startPrank(admin);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotPool.selector, admin));
        manager.slash(alice, MIN_STAKE, bytes32(0));
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotPool.selector, admin));
        manager.lock(alice, MIN_STAKE, block.timestamp + 1);
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
        vm.expectRevert(abi.encodeWithSelector(IComputePool.BadQuorum.selector, 2, 1));
        pool.revokeRole(role, validator);
        vm.stopPrank();
    }

    /// The longest unbonding period applies only to requests made after the
    /// current period: a provider who disagrees leaves on the old terms.
    function test_5_aLongerUnbondingPeriodWaitsForStakersToLeave() public {
        vm.prank(alice);
        registry.removeNode(node);
        uint256 longest = manager.MAX_UNBONDING_PERIOD();
        vm.prank(admin);
        manager.setUnbondingPeriod(longest);
        vm.prank(alice);
        manager.requestUnbond(MIN_STAKE);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), MIN_STAKE, "out on the old terms");
    }

    /// A penalty raised after work was recorded applies to later work only.
    function test_5_aHigherPenaltyAppliesToNewRecordsOnly() public {
        stakeAs(alice, MIN_STAKE);
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), PENALTY, "the penalty of the record");
    }

    // ---- 6. no operator profits from a slash ----

    /// @dev The admin appoints itself recorder and validator of `p` and lowers
    /// its quorum to one: everything a slash of its own would need.
    function _adminTakesOver(ComputePool p) internal {
        vm.startPrank(admin);
        p.grantRole(p.RECORDER_ROLE(), admin);
        p.grantRole(p.VALIDATOR_ROLE(), admin);
        p.setQuorum(1);
        vm.stopPrank();
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

    /// The second half: the admin appoints itself recorder and validator,
    /// lowers the quorum to one, records an epoch whose commitment holds one of
    /// the node's honest signed submissions and votes to slash it. Neither its
    /// vote nor the lower quorum counts before SLASH_CHANGE_DELAY.
    function test_6_anAdminAppointedValidatorCannotSlashBeforeTheDelay() public {
        ComputePool p = _poolOfQuorumTwo();
        uint256 t0 = block.timestamp;
        uint256 delay = p.SLASH_CHANGE_DELAY();
        _adminTakesOver(p);
        vm.assertEq(p.quorum(), 2, "the lower quorum waits");
        (uint256 q, uint256 qAt) = p.pendingQuorum();
        vm.assertEq(q, 1, "pending quorum");
        vm.assertEq(qAt, t0 + delay, "from");
        vm.assertEq(p.slashVotesAt(admin), t0 + delay, "the admin's votes wait");
        vm.assertEq(p.slashVotesAt(validator), t0, "the deployment's count at once");

        IComputePool.Submission memory sub = submission(node, 1, keccak256("an honest rollout"));
        bytes32 digest = p.submissionDigest(sub);
        bytes memory sig = signDigest(NODE_PK, digest);
        vm.prank(admin);
        p.submitWork(1, node, 1, MerkleBuilder.leaf(digest)); // recording alone slashes nothing
        vm.expectRevert(abi.encodeWithSelector(IComputePool.SlashVoteTooEarly.selector, admin, t0 + delay));
        vm.prank(admin);
        p.slash(1, sub, sig, new bytes32[](0));

        // one honest deployment validator misled into voting is still no quorum
        vm.prank(validator);
        p.slash(1, sub, sig, new bytes32[](0));
        vm.assertFalse(p.workOf(1, node).slashed, "two votes needed until the delay has passed");
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
        vm.prank(bob);
        pool.joinPool(node2);

        uint256 t0 = block.timestamp;
        uint256 delay = pool.SLASH_CHANGE_DELAY();
        _adminTakesOver(pool);
        IComputePool.Submission memory sub = submission(node, 1, keccak256("an honest rollout"));
        bytes32 digest = pool.submissionDigest(sub);
        vm.warp(t0 + 1 days - 1);
        vm.prank(admin);
        pool.submitWork(1, node, 1, MerkleBuilder.leaf(digest));

        // alice leaves a day after the change: the node, the pool, the free stake now ...
        vm.warp(t0 + 1 days);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        manager.requestUnbond(MIN_STAKE - PENALTY);
        // ... and the penalty that backs the admin's record once its window has closed
        vm.warp(pool.unlocksAt(1, node));
        manager.requestUnbond(PENALTY);
        vm.warp(block.timestamp + longest);
        vm.assertEq(manager.withdraw(), MIN_STAKE, "all of it");
        vm.stopPrank();
        vm.assertLe(block.timestamp, t0 + delay, "out before the change applies");

        vm.warp(t0 + delay);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, node));
        vm.prank(admin);
        pool.slash(1, sub, signDigest(NODE_PK, digest), new bytes32[](0));

        // bob stayed: now the admin's validator can slash him, to the treasury's gain, not its own
        IComputePool.Submission memory bobs = submission(node2, 1, keccak256("bob's rollout"));
        bytes32 bobsDigest = pool.submissionDigest(bobs);
        vm.startPrank(admin);
        pool.submitWork(2, node2, 1, MerkleBuilder.leaf(bobsDigest));
        pool.slash(2, bobs, signDigest(NODE2_PK, bobsDigest), new bytes32[](0));
        vm.stopPrank();
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
        vm.startPrank(admin);
        pool.setInvalidationWindow(1 minutes);
        manager.setUnbondingPeriod(1 minutes);
        vm.stopPrank();
        vm.assertEq(manager.unbondingPeriod(), 1 minutes, "shorter at once");
        uint256 t0 = block.timestamp;
        _adminTakesOver(pool);
        vm.assertEq(pool.slashVotesAt(admin), t0 + delay, "the same delay");

        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        vm.warp(t0 + delay - 30 seconds);
        vm.prank(admin);
        pool.submitWork(1, node, 1, root);
        vm.warp(t0 + delay - 1);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.SlashVoteTooEarly.selector, admin, t0 + delay));
        vm.prank(admin);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.warp(t0 + delay);
        vm.prank(admin);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertTrue(pool.workOf(1, node).slashed, "from the delay on, as announced");
        vm.assertEq(token.balanceOf(admin), 0, "to the treasury, not the admin");
    }

    /// Revoking a validator and appointing it again starts its delay again.
    function test_6_aReappointedValidatorWaitsAgain() public {
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.startPrank(admin);
        pool.revokeRole(role, validator);
        pool.grantRole(role, validator);
        vm.stopPrank();
        uint256 at = block.timestamp + pool.SLASH_CHANGE_DELAY();
        vm.assertEq(pool.slashVotesAt(validator), at, "a new term, a new delay");
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.SlashVoteTooEarly.selector, validator, at));
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.prank(validator); // invalidating takes no stake and counts at once
        pool.invalidate(1, node);
        vm.assertTrue(pool.workOf(1, node).invalidated, "invalidated");
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE, "no stake taken");
    }

    /// A higher penalty applies only to work recorded from the delay on; a
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
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        vm.warp(t0 + delay - 1);
        _submit(1, node, root);
        vm.assertEq(pool.workOf(1, node).penalty, PENALTY, "recorded under the old penalty");
        vm.warp(t0 + delay);
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), PENALTY, "the old penalty");
        vm.prank(alice);
        pool.joinPool(node); // back after the slash ejected it
        _submit(2, node, bytes32(0));
        vm.assertEq(pool.workOf(2, node).penalty, MIN_STAKE, "the new one from the delay on");

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
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidenceIn(p, 1);
        vm.warp(t0 + delay - 1 hours);
        vm.prank(recorder);
        p.submitWork(1, node, 1, root);
        vm.warp(t0 + delay - 1);
        vm.prank(validator);
        p.slash(1, sub, sig, new bytes32[](0));
        vm.assertFalse(p.workOf(1, node).slashed, "one vote of two");
        vm.warp(t0 + delay);
        vm.assertEq(p.quorum(), 1, "now one");
        (uint256 votes,) = p.slashVotes(1, node, p.submissionDigest(sub));
        vm.assertEq(votes, 1, "the vote cast before still counts");
        vm.prank(validator2);
        p.slash(1, sub, sig, new bytes32[](0));
        vm.assertTrue(p.workOf(1, node).slashed, "slashed");

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

    /// Whatever the admin sets first (window, unbonding period, quorum, penalty)
    /// and whenever it records, a validator it appoints cannot slash before
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
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        vm.prank(admin);
        pool.submitWork(1, node, 1, root);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.SlashVoteTooEarly.selector, admin, t0 + delay));
        vm.prank(admin);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE, "untouched");
    }

    // ---- fuzz: the same attacks with any numbers ----

    /// Whatever it unbonds and whenever, a provider keeps the penalty of its
    /// slashable work; the slash within the window always takes it in full.
    function testFuzz_1_unbondingNeverUncoversWork(uint256 extra, uint256 amount, uint256 wait) public {
        extra = bound(extra, 0, 1e24);
        if (extra != 0) stakeAs(alice, extra);
        wait = bound(wait, 0, WINDOW - 1);
        (IComputePool.Submission memory sub, bytes memory sig, bytes32 root) = _loneEvidence(1);
        _submit(1, node, root);
        vm.prank(alice);
        registry.removeNode(node);
        vm.warp(block.timestamp + wait);
        uint256 active = manager.stakeOf(alice);
        amount = bound(amount, 1, active);
        vm.prank(alice);
        try manager.requestUnbond(amount) {
            vm.assertGe(active - amount, PENALTY, "unbonded into the penalty");
        } catch {
            vm.assertLt(active - amount, PENALTY, "refused an unbond that kept the penalty");
        }
        vm.prank(validator);
        pool.slash(1, sub, sig, new bytes32[](0));
        vm.assertEq(token.balanceOf(treasury), PENALTY, "full penalty");
    }

    /// Any window the admin sets after a claim leaves the claimed epoch closed.
    function testFuzz_4_noWindowReopensAClaim(uint256 window, uint256 wait) public {
        window = bound(window, 60, UNBONDING);
        _submit(1, node, bytes32(0));
        vm.warp(block.timestamp + WINDOW + bound(wait, 0, UNBONDING));
        vm.prank(alice);
        pool.claim(node, _one(1));
        vm.prank(admin);
        pool.setInvalidationWindow(window);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, 1, node));
        vm.prank(validator);
        pool.invalidate(1, node);
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved again");
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
