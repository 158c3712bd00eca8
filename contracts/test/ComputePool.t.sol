// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";

import {ComputePool} from "../src/ComputePool.sol";
import {StakeManager} from "../src/StakeManager.sol";
import {IComputePool} from "../src/interfaces/IComputePool.sol";
import {IStakeManager} from "../src/interfaces/IStakeManager.sol";
import {MerkleBuilder, ProtocolFixture} from "./utils/Fixtures.sol";

contract ComputePoolTest is ProtocolFixture {
    uint64 constant EPOCH = 7;
    uint256 constant FUNDING = 1000 ether;

    function setUp() public {
        deployProtocol();
        fundPool(FUNDING);
        onboard(alice, NODE_PK);
    }

    function _submit(uint64 epoch, address n, uint128 units, bytes32 commitment) internal {
        vm.prank(recorder);
        pool.submitWork(epoch, n, units, commitment);
    }

    function _accounting() internal view {
        vm.assertEq(
            pool.totalPaid() + pool.reservedRewards() + pool.availableRewards(),
            pool.totalFunded(),
            "paid+reserved+available"
        );
        vm.assertEq(token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool balance");
    }

    /// @dev Records EPOCH for `node` with a 3-leaf commitment; returns the evidence for leaf `i`.
    function _recordWithEvidence(uint256 i)
        internal
        returns (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof)
    {
        (IComputePool.Submission[] memory subs, bytes32[] memory leaves, bytes32 root) = commitThree(node);
        _submit(EPOCH, node, 10, root);
        sub = subs[i];
        sig = signDigest(NODE_PK, pool.submissionDigest(sub));
        proof = MerkleBuilder.proof(leaves, i);
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
        emit IComputePool.NodeJoined(node2, alice);
        vm.prank(alice);
        pool.joinPool(node2);
        vm.assertTrue(pool.isJoined(node2), "joined");
        vm.assertEq(pool.joinedProviderOf(node2), alice, "provider");
    }

    function test_joinPool_notRegisteredReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NodeNotRegistered.selector, node2));
        vm.prank(alice);
        pool.joinPool(node2);
    }

    function test_joinPool_notProviderReverts() public {
        addNode(alice, NODE2_PK);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node2, bob));
        vm.prank(bob);
        pool.joinPool(node2);
    }

    function test_joinPool_alreadyJoinedReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyJoined.selector, node));
        vm.prank(alice);
        pool.joinPool(node);
    }

    function test_joinPool_replacesAMembershipItsFormerProviderGaveUp() public {
        vm.prank(alice);
        registry.removeNode(node);
        vm.assertTrue(pool.isJoined(node), "stale membership");
        register(bob);
        addNode(bob, NODE_PK);
        stakeAs(bob, MIN_STAKE);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeLeft(node);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeJoined(node, bob);
        vm.prank(bob);
        pool.joinPool(node);
        vm.assertEq(pool.joinedProviderOf(node), bob, "new provider");
    }

    function test_joinPool_stakeTooLowReverts() public {
        addNode(alice, NODE2_PK); // two nodes, stake for one
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        vm.prank(alice);
        pool.joinPool(node2);
    }

    function test_leavePool_byNode() public {
        vm.expectEmit(address(pool));
        emit IComputePool.NodeLeft(node);
        vm.prank(node);
        pool.leavePool(node);
        vm.assertFalse(pool.isJoined(node), "left");
    }

    function test_leavePool_byProvider() public {
        vm.prank(alice);
        pool.leavePool(node);
        vm.assertFalse(pool.isJoined(node), "left");
    }

    function test_leavePool_notJoinedReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotJoined.selector, node2));
        vm.prank(node2);
        pool.leavePool(node2);
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

    // ---- submitWork ----

    function test_submitWork() public {
        vm.expectEmit(address(pool));
        emit IComputePool.WorkSubmitted(EPOCH, node, 10, bytes32(uint256(1)), 10 ether, block.timestamp + WINDOW);
        vm.expectEmit(address(manager));
        emit IStakeManager.StakeLocked(alice, address(pool), PENALTY, block.timestamp + WINDOW);
        _submit(EPOCH, node, 10, bytes32(uint256(1)));
        IComputePool.WorkRecord memory rec = pool.workOf(EPOCH, node);
        vm.assertEq(rec.units, 10, "units");
        vm.assertEq(rec.recordedAt, block.timestamp, "recordedAt");
        vm.assertEq(rec.unlocksAt, block.timestamp + WINDOW, "unlocksAt");
        vm.assertEq(rec.provider, alice, "provider");
        vm.assertEq(rec.penalty, PENALTY, "penalty");
        vm.assertEq(manager.lockedOf(alice), PENALTY, "penalty locked");
        vm.assertEq(rec.commitment, bytes32(uint256(1)), "commitment");
        vm.assertEq(rec.reward, 10 ether, "reward");
        vm.assertFalse(rec.invalidated, "valid");
        vm.assertFalse(rec.claimed, "unclaimed");
        vm.assertEq(pool.reservedRewards(), 10 ether, "reserved");
        vm.assertEq(pool.availableRewards(), FUNDING - 10 ether, "available");
        vm.assertEq(pool.unlocksAt(EPOCH, node), block.timestamp + WINDOW, "unlocks");
        _accounting();
    }

    function test_submitWork_notRecorderReverts() public {
        bytes32 role = pool.RECORDER_ROLE();
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, validator, role)
        );
        vm.prank(validator);
        pool.submitWork(EPOCH, node, 1, 0);
    }

    function test_submitWork_zeroUnitsReverts() public {
        vm.expectRevert(IComputePool.ZeroAmount.selector);
        _submit(EPOCH, node, 0, 0);
    }

    function test_submitWork_notJoinedReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotJoined.selector, node2));
        _submit(EPOCH, node2, 1, 0);
    }

    function test_submitWork_nodeRemovedFromRegistryReverts() public {
        vm.prank(alice);
        registry.removeNode(node); // still joined here, but no longer backed by alice's stake
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NodeNotRegistered.selector, node));
        _submit(EPOCH, node, 1, 0);
    }

    function test_submitWork_twiceReverts() public {
        _submit(EPOCH, node, 1, 0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WorkAlreadyRecorded.selector, EPOCH, node));
        _submit(EPOCH, node, 2, 0);
        _submit(EPOCH + 1, node, 2, 0); // another epoch is fine
    }

    function test_submitWork_insufficientRewardsReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.InsufficientRewards.selector, FUNDING, 1001 ether));
        _submit(EPOCH, node, 1001, 0);
        _submit(EPOCH, node, 1000, 0); // exactly the budget
        vm.assertEq(pool.availableRewards(), 0, "all reserved");
    }

    // ---- invalidate ----

    function test_invalidate() public {
        _submit(EPOCH, node, 10, 0);
        vm.expectEmit(address(pool));
        emit IComputePool.InvalidationVoted(EPOCH, node, validator, 1);
        vm.expectEmit(address(pool));
        emit IComputePool.WorkInvalidated(EPOCH, node);
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
        vm.assertTrue(pool.workOf(EPOCH, node).invalidated, "invalidated");
        vm.assertEq(pool.availableRewards(), FUNDING, "released");
        vm.assertEq(pool.reservedRewards(), 0, "nothing reserved");
        _accounting();
    }

    function test_invalidate_notValidatorReverts() public {
        _submit(EPOCH, node, 10, 0);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, recorder, role)
        );
        vm.prank(recorder);
        pool.invalidate(EPOCH, node);
    }

    function test_invalidate_noWorkReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH, node));
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
    }

    function test_invalidate_twiceReverts() public {
        _submit(EPOCH, node, 10, 0);
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyInvalidated.selector, EPOCH, node));
        vm.prank(validator2);
        pool.invalidate(EPOCH, node);
    }

    function test_invalidate_afterWindowReverts() public {
        _submit(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, EPOCH, node));
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
    }

    function test_invalidate_lastSecondOfWindow() public {
        _submit(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW - 1);
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
        vm.assertTrue(pool.workOf(EPOCH, node).invalidated, "invalidated");
    }

    function test_invalidate_quorumTwoNeedsTwoValidators() public {
        vm.prank(admin);
        pool.setQuorum(2);
        _submit(EPOCH, node, 10, 0);
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
        vm.assertFalse(pool.workOf(EPOCH, node).invalidated, "one vote is not enough");
        vm.assertEq(pool.invalidationVotes(EPOCH, node), 1, "one vote");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyVoted.selector, validator));
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
        vm.prank(validator2);
        pool.invalidate(EPOCH, node);
        vm.assertTrue(pool.workOf(EPOCH, node).invalidated, "two distinct votes");
        _accounting();
    }

    // ---- slash ----

    function test_slash() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(1);
        bytes32 digest = pool.submissionDigest(sub);
        uint256 validatorBefore = token.balanceOf(validator);

        vm.expectEmit(address(pool));
        emit IComputePool.SlashVoted(EPOCH, node, digest, validator, 1);
        vm.expectEmit(address(pool));
        emit IComputePool.WorkInvalidated(EPOCH, node);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeEjected(node, validator);
        vm.expectEmit(address(manager));
        emit IStakeManager.Slashed(alice, PENALTY, digest, treasury, address(pool));
        vm.expectEmit(address(pool));
        emit IComputePool.NodeSlashed(EPOCH, node, alice, digest, PENALTY);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);

        vm.assertEq(token.balanceOf(treasury), PENALTY, "treasury receives");
        vm.assertEq(token.balanceOf(validator), validatorBefore, "validator does not profit");
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "stake cut");
        vm.assertFalse(pool.isJoined(node), "ejected");
        vm.assertTrue(pool.workOf(EPOCH, node).invalidated, "invalidated");
        vm.assertEq(pool.availableRewards(), FUNDING, "reward released");
        (uint256 votes, bool used) = pool.slashVotes(EPOCH, node, digest);
        vm.assertEq(votes, 1, "votes");
        vm.assertTrue(used, "used");
        _accounting();
    }

    /// Every leaf of the commitment is accepted as evidence (quorum 2 keeps each
    /// vote pending, so all three are checked without the epoch being slashed).
    function test_slash_eachLeafOfTheCommitmentIsEvidence() public {
        (IComputePool.Submission[] memory subs, bytes32[] memory leaves, bytes32 root) = commitThree(node);
        _submit(EPOCH, node, 10, root);
        vm.prank(admin);
        pool.setQuorum(2);
        for (uint256 i; i < 3; ++i) {
            bytes32 digest = pool.submissionDigest(subs[i]);
            vm.prank(validator);
            pool.slash(EPOCH, subs[i], signDigest(NODE_PK, digest), MerkleBuilder.proof(leaves, i));
            (uint256 votes, bool slashed) = pool.slashVotes(EPOCH, node, digest);
            vm.assertEq(votes, 1, "vote counted");
            vm.assertFalse(slashed, "below quorum");
        }
        vm.assertEq(token.balanceOf(treasury), 0, "nothing slashed yet");
    }

    function test_slash_notValidatorReverts() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        bytes32 role = pool.VALIDATOR_ROLE();
        vm.expectRevert(abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, bob, role));
        vm.prank(bob);
        pool.slash(EPOCH, sub, sig, proof);
    }

    function test_slash_noWorkReverts() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH + 1, node));
        vm.prank(validator);
        pool.slash(EPOCH + 1, sub, sig, proof);
    }

    function test_slash_wrongRunReverts() public {
        (IComputePool.Submission memory sub,, bytes32[] memory proof) = _recordWithEvidence(0);
        sub.runId = keccak256("other-run");
        bytes memory sig = signDigest(NODE_PK, pool.submissionDigest(sub));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WrongRun.selector, sub.runId));
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
    }

    function test_slash_signatureBySomeoneElseReverts() public {
        (IComputePool.Submission memory sub,, bytes32[] memory proof) = _recordWithEvidence(0);
        bytes memory sig = signDigest(OTHER_PK, pool.submissionDigest(sub));
        vm.expectRevert(IComputePool.BadSignature.selector);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
    }

    function test_slash_signatureForOtherChainReverts() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.chainId(block.chainid + 1);
        vm.expectRevert(IComputePool.BadSignature.selector);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
    }

    function test_slash_malformedSignatureReverts() public {
        (IComputePool.Submission memory sub,, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.expectRevert(IComputePool.BadSignature.selector);
        vm.prank(validator);
        pool.slash(EPOCH, sub, new bytes(64), proof);
    }

    function test_slash_validSignatureNotInCommitmentReverts() public {
        (,, bytes32[] memory proof) = _recordWithEvidence(0);
        // signed by the node, but never committed
        IComputePool.Submission memory other = submission(node, 99, keccak256("not committed"));
        bytes memory sig = signDigest(NODE_PK, pool.submissionDigest(other));
        vm.expectRevert(IComputePool.NotInCommitment.selector);
        vm.prank(validator);
        pool.slash(EPOCH, other, sig, proof);
    }

    function test_slash_wrongProofReverts() public {
        (IComputePool.Submission memory sub, bytes memory sig,) = _recordWithEvidence(0);
        (,, bytes32[] memory proofOfOther) = _proofFor(2);
        vm.expectRevert(IComputePool.NotInCommitment.selector);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proofOfOther);
    }

    function _proofFor(uint256 i) internal view returns (bytes32, bytes32, bytes32[] memory) {
        (, bytes32[] memory leaves, bytes32 root) = commitThree(node);
        return (root, leaves[i], MerkleBuilder.proof(leaves, i));
    }

    function test_slash_afterWindowReverts() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowClosed.selector, EPOCH, node));
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
    }

    function test_slash_evidenceUsedOnce() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, EPOCH, node));
        vm.prank(validator2);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "slashed once");
    }

    /// Every other submission of the same epoch is valid evidence too, but the
    /// epoch has had its one penalty.
    function test_slash_oncePerEpochWhateverTheEvidence() public {
        (IComputePool.Submission memory sub0, bytes memory sig0, bytes32[] memory proof0) = _recordWithEvidence(0);
        vm.prank(validator);
        pool.slash(EPOCH, sub0, sig0, proof0);
        (IComputePool.Submission[] memory subs, bytes32[] memory leaves,) = commitThree(node);
        bytes memory sig1 = signDigest(NODE_PK, pool.submissionDigest(subs[1]));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadySlashed.selector, EPOCH, node));
        vm.prank(validator2);
        pool.slash(EPOCH, subs[1], sig1, MerkleBuilder.proof(leaves, 1));
        (, bool slashed) = pool.slashVotes(EPOCH, node, pool.submissionDigest(subs[1]));
        vm.assertTrue(slashed, "epoch marked slashed");
        vm.assertEq(token.balanceOf(treasury), PENALTY, "one penalty per epoch");
    }

    function test_slash_quorumTwoNeedsTwoDistinctValidators() public {
        vm.prank(admin);
        pool.setQuorum(2);
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(token.balanceOf(treasury), 0, "one vote slashes nothing");
        vm.assertTrue(pool.isJoined(node), "still joined");
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyVoted.selector, validator));
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.prank(validator2);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "two votes slash");
        vm.assertEq(token.balanceOf(validator) + token.balanceOf(validator2), 0, "validators get nothing");
    }

    function test_slash_providerCannotDodgeByRemovingNode() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.stopPrank();
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "alice still slashed");
    }

    function test_slash_theLockedPenaltyCannotBeUnbonded() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, PENALTY));
        manager.requestUnbond(MIN_STAKE);
        manager.requestUnbond(MIN_STAKE - PENALTY);
        vm.stopPrank();
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(manager.stakeOf(alice), 0, "the penalty came from the locked stake");
        (uint256 unbonding,) = manager.unbondingOf(alice);
        vm.assertEq(unbonding, MIN_STAKE - PENALTY, "the free part leaves untouched");
        vm.assertEq(token.balanceOf(treasury), PENALTY, "treasury");
    }

    function test_slash_afterInvalidationDoesNotReleaseTwice() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.prank(validator2);
        pool.invalidate(EPOCH, node);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(pool.availableRewards(), FUNDING, "released once");
        _accounting();
    }

    /// A record is slashed by the penalty it was recorded with, whatever the admin sets later.
    function test_slash_takesThePenaltyOfTheRecord() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.prank(admin);
        pool.setSlashPenalty(MIN_STAKE);
        vm.expectEmit(address(pool));
        emit IComputePool.NodeSlashed(EPOCH, node, alice, pool.submissionDigest(sub), PENALTY);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "the recorded penalty");
    }

    function test_submitWork_needsFreeStakeForThePenalty() public {
        _submit(1, node, 1, 0);
        _submit(2, node, 1, 0); // 100 staked: two penalties of 50
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.FreeStakeTooLow.selector, 0, PENALTY));
        _submit(3, node, 1, 0);
        vm.warp(block.timestamp + WINDOW);
        _submit(3, node, 1, 0); // the first two windows ended
        vm.assertEq(manager.lockedOf(alice), PENALTY, "one live lock");
    }

    // ---- claim ----

    function _epochs(uint64 a) internal pure returns (uint64[] memory e) {
        e = new uint64[](1);
        e[0] = a;
    }

    function test_claim() public {
        _submit(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardClaimed(EPOCH, node, alice, 10 ether);
        vm.prank(alice);
        uint256 paid = pool.claim(node, _epochs(EPOCH));
        vm.assertEq(paid, 10 ether, "returned");
        vm.assertEq(token.balanceOf(alice), 10 ether, "paid");
        vm.assertTrue(pool.workOf(EPOCH, node).claimed, "claimed");
        vm.assertEq(pool.totalPaid(), 10 ether, "total paid");
        vm.assertEq(pool.reservedRewards(), 0, "reserved");
        _accounting();
    }

    function test_claim_severalEpochs() public {
        stakeAs(alice, PENALTY);
        _submit(1, node, 1, 0);
        _submit(2, node, 2, 0);
        _submit(3, node, 3, 0);
        vm.warp(block.timestamp + WINDOW);
        uint64[] memory e = new uint64[](3);
        (e[0], e[1], e[2]) = (1, 2, 3);
        vm.prank(alice);
        vm.assertEq(pool.claim(node, e), 6 ether, "sum");
        _accounting();
    }

    function test_claim_emptyListPaysNothing() public {
        vm.prank(alice);
        vm.assertEq(pool.claim(node, new uint64[](0)), 0, "nothing");
    }

    function test_claim_windowOpenReverts() public {
        _submit(EPOCH, node, 10, 0);
        uint256 unlocks = block.timestamp + WINDOW;
        vm.warp(unlocks - 1);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.WindowOpen.selector, EPOCH, node, unlocks));
        vm.prank(alice);
        pool.claim(node, _epochs(EPOCH));
    }

    function test_claim_twiceReverts() public {
        _submit(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.prank(alice);
        pool.claim(node, _epochs(EPOCH));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyClaimed.selector, EPOCH, node));
        vm.prank(alice);
        pool.claim(node, _epochs(EPOCH));
    }

    function test_claim_sameEpochTwiceInOneCallReverts() public {
        _submit(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        uint64[] memory e = new uint64[](2);
        (e[0], e[1]) = (EPOCH, EPOCH);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyClaimed.selector, EPOCH, node));
        vm.prank(alice);
        pool.claim(node, e);
    }

    function test_claim_invalidatedReverts() public {
        _submit(EPOCH, node, 10, 0);
        vm.prank(validator);
        pool.invalidate(EPOCH, node);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.AlreadyInvalidated.selector, EPOCH, node));
        vm.prank(alice);
        pool.claim(node, _epochs(EPOCH));
    }

    function test_claim_noWorkReverts() public {
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NoWork.selector, EPOCH, node));
        vm.prank(alice);
        pool.claim(node, _epochs(EPOCH));
    }

    function test_claim_notProviderReverts() public {
        _submit(EPOCH, node, 10, 0);
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, bob));
        vm.prank(bob);
        pool.claim(node, _epochs(EPOCH));
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, node));
        vm.prank(node);
        pool.claim(node, _epochs(EPOCH));
    }

    function test_claim_afterLeavingStillPaysJoinTimeProvider() public {
        _submit(EPOCH, node, 10, 0);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.stopPrank();
        register(bob);
        onboard(bob, NODE_PK); // the node moves to bob
        vm.warp(block.timestamp + WINDOW);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.NotNodeProvider.selector, node, bob));
        vm.prank(bob);
        pool.claim(node, _epochs(EPOCH));
        vm.prank(alice);
        vm.assertEq(pool.claim(node, _epochs(EPOCH)), 10 ether, "alice earned it");
    }

    function test_claim_afterEjectStillPays() public {
        _submit(EPOCH, node, 10, 0);
        vm.prank(admin);
        pool.eject(node);
        vm.warp(block.timestamp + WINDOW);
        vm.prank(alice);
        vm.assertEq(pool.claim(node, _epochs(EPOCH)), 10 ether, "earned before the ejection");
    }

    function test_rejoinAfterSlashNeedsTopUp() public {
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.expectRevert(abi.encodeWithSelector(IComputePool.StakeTooLow.selector, alice));
        vm.prank(alice);
        pool.joinPool(node);
        stakeAs(alice, PENALTY);
        vm.prank(alice);
        pool.joinPool(node);
        vm.assertTrue(pool.isJoined(node), "back in");
    }

    function test_slash_burnsWhenTreasuryIsZero() public {
        manager = new StakeManager(token, registry, factory, admin, MIN_STAKE, UNBONDING, address(0));
        pool = createPool(RUN, 1);
        fundPool(FUNDING);
        stakeAs(alice, MIN_STAKE);
        vm.prank(alice);
        pool.joinPool(node);
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(0);
        uint256 supply = token.totalSupply();
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        vm.assertEq(token.totalSupply(), supply - PENALTY, "burnt");
        vm.assertEq(token.balanceOf(validator), 0, "validator gets nothing");
    }

    // ---- admin ----

    function test_setters_emitOldAndNew() public {
        vm.startPrank(admin);
        vm.expectEmit(address(pool));
        emit IComputePool.QuorumChanged(1, 2, block.timestamp);
        pool.setQuorum(2);
        vm.expectEmit(address(pool));
        emit IComputePool.RewardPerUnitChanged(REWARD_PER_UNIT, 4);
        pool.setRewardPerUnit(4);
        vm.expectEmit(address(pool));
        emit IComputePool.SlashPenaltyChanged(PENALTY, 5, block.timestamp);
        pool.setSlashPenalty(5);
        vm.expectEmit(address(pool));
        emit IComputePool.InvalidationWindowChanged(WINDOW, 6 minutes);
        pool.setInvalidationWindow(6 minutes);
        vm.stopPrank();
        vm.assertEq(pool.quorum(), 2, "quorum");
        vm.assertEq(pool.rewardPerUnit(), 4, "reward");
        vm.assertEq(pool.slashPenalty(), 5, "penalty");
        vm.assertEq(pool.invalidationWindow(), 6 minutes, "window");
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
        emit IComputePool.ValidatorAppointed(newcomer, later);
        pool.grantRole(role, newcomer);
        vm.stopPrank();
        vm.assertEq(pool.quorum(), 2, "quorum waits");
        vm.assertEq(pool.slashPenalty(), PENALTY, "penalty waits");
        vm.assertEq(pool.slashVotesAt(newcomer), later, "newcomer waits");
        vm.warp(later);
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
        vm.stopPrank();
    }

    // ---- fuzz ----

    function testFuzz_rewardAccounting(uint128 units, uint256 perUnit, uint256 funding, bool invalid, uint256 wait)
        public
    {
        perUnit = bound(perUnit, 0, 1e24);
        units = uint128(bound(units, 1, 1e12));
        funding = bound(funding, 1, 1e36);
        wait = bound(wait, 0, 2 * WINDOW);
        vm.prank(admin);
        pool.setRewardPerUnit(perUnit);
        fundPool(funding);
        uint256 reward = uint256(units) * perUnit;
        uint256 available = pool.availableRewards();
        if (reward > available) {
            vm.expectRevert(abi.encodeWithSelector(IComputePool.InsufficientRewards.selector, available, reward));
            _submit(EPOCH, node, units, 0);
            _accounting();
            return;
        }
        _submit(EPOCH, node, units, 0);
        if (invalid) {
            vm.prank(validator);
            pool.invalidate(EPOCH, node);
        }
        vm.warp(block.timestamp + wait);
        if (!invalid && wait >= WINDOW) {
            vm.prank(alice);
            vm.assertEq(pool.claim(node, _epochs(EPOCH)), reward, "claimed reward");
            vm.assertEq(token.balanceOf(alice), reward, "paid");
        }
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
        (IComputePool.Submission memory sub, bytes memory sig, bytes32[] memory proof) = _recordWithEvidence(2);
        vm.prank(validator);
        pool.slash(EPOCH, sub, sig, proof);
        uint256 expected = penalty < staked ? penalty : staked;
        vm.assertEq(token.balanceOf(treasury), expected, "treasury");
        vm.assertEq(token.balanceOf(validator), 0, "validator");
        vm.assertEq(manager.stakeOf(alice), staked - expected, "stake");
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "conserved");
    }
}
