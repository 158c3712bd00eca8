// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";

import {IComputePool} from "../src/interfaces/IComputePool.sol";
import {IStakeManager} from "../src/interfaces/IStakeManager.sol";
import {ProtocolFixture} from "./utils/Fixtures.sol";
import {WorkParts} from "./utils/Merkle.sol";

/// @dev forge's cheatcode that marks an account's storage cold (as in a fresh transaction).
interface VmCool {
    function cool(address target) external;
}

/// @notice One test per finding of the outside audit; each failed against the
/// code before its fix. They use only what that code had too (new errors by
/// their signatures), so they still run against it.
contract AuditFindingsTest is ProtocolFixture {
    /// @dev forge prints these (ds-test's log event) with -vv.
    event log_named_uint(string key, uint256 val);

    uint256 constant FUNDING = 1000 ether;
    address carol = address(0xCA201);

    function setUp() public {
        deployProtocol();
        fundPool(FUNDING);
        onboard(alice, NODE_PK);
    }

    // ---- 1. a leave in the second of a record, after it ----

    /// @dev Records 10 units of `node`'s work and, in the same second, ends its
    /// membership the way `how` says: 0 the admin ejects it, 1 the node leaves,
    /// 2 its new provider (bob) joins it.
    function _recordThenLeaveInTheSameSecond(uint256 how) internal returns (IComputePool.LeafRef memory r) {
        r = recordOne(1, node, 10, 0);
        if (how == 0) {
            vm.prank(admin);
            pool.eject(node);
        } else if (how == 1) {
            leaveAsNode(node);
        } else {
            vm.prank(alice);
            registry.removeNode(node);
            register(bob);
            addNode(bob, NODE_PK);
            stakeAs(bob, MIN_STAKE);
            joinAs(bob, node);
        }
    }

    /// Work recorded before the leave, in the same second, stays claimable by
    /// the provider whose penalty it bonded, and the bond ends with its window.
    function _checkWorkRecordedBeforeTheLeaveIsPaid(uint256 how) internal {
        uint256 end = block.timestamp + WINDOW;
        IComputePool.LeafRef memory r = _recordThenLeaveInTheSameSecond(how);
        vm.assertFalse(pool.isJoined(node) && pool.joinedProviderOf(node) == alice, "alice's membership ended");
        vm.assertEq(pool.bondOf(alice), PENALTY, "its penalty bonded for the work");
        vm.warp(end);
        vm.assertEq(pool.bondOf(alice), 0, "until its window closed");
        vm.assertEq(claimAs(alice, r), 10 ether, "the work recorded before the leave is paid");
        vm.assertEq(token.balanceOf(alice), 10 ether, "to alice");
    }

    function test_audit1_workRecordedBeforeAnEjectInItsSecondIsPaid() public {
        _checkWorkRecordedBeforeTheLeaveIsPaid(0);
    }

    function test_audit1_workRecordedBeforeALeaveInItsSecondIsPaid() public {
        _checkWorkRecordedBeforeTheLeaveIsPaid(1);
    }

    function test_audit1_workRecordedBeforeARejoinInItsSecondIsPaid() public {
        _checkWorkRecordedBeforeTheLeaveIsPaid(2);
    }

    /// A part recorded after the leave, in a second that had a record before
    /// it, is backed too: the leave bonded its window, which ends with that
    /// second's other parts. It is paid, and slashable until then.
    function test_audit1_aPartAfterTheLeaveInASecondWithAnEarlierRecordIsBonded() public {
        recordOne(1, node, 10, 0);
        leaveAsNode(node);
        Evidence memory e = recordSigned(2, NODE_PK, 1);
        (,, uint256 until) = pool.bondsOf(alice);
        vm.assertEq(until, pool.recordOf(2, 0).unlocksAt, "bonded through the later part's window");
        vm.warp(block.timestamp + 1);
        slashWith(pool, validator, e);
        vm.assertEq(token.balanceOf(treasury), PENALTY, "slashed for it with the bonded penalty");
    }

    // ---- 2. a membership slashed after it left ----

    /// A membership slashed after it left stops bonding at once: the provider
    /// paid its penalty, and the rest of its stake is free to unbond.
    function test_audit2_aMembershipSlashedAfterItLeftBondsNothing() public {
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        vm.warp(block.timestamp + 1);
        vm.startPrank(alice);
        pool.leavePool(node);
        registry.removeNode(node);
        vm.stopPrank();
        vm.assertEq(pool.bondOf(alice), PENALTY, "bonded while its work is slashable");
        vm.warp(block.timestamp + 1);
        slashWith(pool, validator, e);
        vm.assertEq(manager.stakeOf(alice), MIN_STAKE - PENALTY, "the penalty was paid");
        (uint256 joined, uint256 leaving,) = pool.bondsOf(alice);
        vm.assertEq(joined + leaving, 0, "a slashed membership bonds nothing");
        vm.assertEq(pool.bondOf(alice), 0, "nothing bonded");
        vm.prank(alice);
        manager.requestUnbond(MIN_STAKE - PENALTY); // reverted StakeBacksWork before the fix
        vm.assertEq(manager.stakeOf(alice), 0, "all of the rest unbonding");
    }

    /// The fix takes out the slashed membership's penalty only: another
    /// membership that left with a window open stays bonded.
    function test_audit2_otherLeavingMembershipsStayBonded() public {
        addNode(alice, NODE2_PK);
        stakeAs(alice, MIN_STAKE);
        joinAs(alice, node2);
        Evidence memory e = recordSigned(1, NODE_PK, 1);
        recordOne(2, node2, 10, 0);
        vm.warp(block.timestamp + 1);
        leaveAsNode(node);
        leaveAsNode(node2);
        vm.startPrank(alice);
        registry.removeNode(node);
        registry.removeNode(node2);
        vm.stopPrank();
        vm.assertEq(pool.bondOf(alice), 2 * PENALTY, "both bonded");
        slashWith(pool, validator, e);
        vm.assertEq(pool.bondOf(alice), PENALTY, "node2's membership still bonded");
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, PENALTY - 1, PENALTY));
        vm.prank(alice);
        manager.requestUnbond(MIN_STAKE + 1); // 150 is left, 50 of it bonded
    }

    // ---- 3. gas of joinPool and requestUnbond ----

    /// @dev Registers `provider` with `count` nodes (keys from `firstPk`), stakes
    /// for them and one extra node, and returns the node to join.
    function _providerWithNodes(address provider, uint256 count, uint256 firstPk) internal returns (address) {
        register(provider);
        for (uint256 i; i < count; ++i) {
            addNode(provider, firstPk + i);
        }
        stakeAs(provider, MIN_STAKE * count + MIN_STAKE);
        return vm.addr(firstPk);
    }

    /// @dev Makes the protocol's storage cold again, as at the start of a transaction.
    function _cool() internal {
        VmCool(address(vm)).cool(address(registry));
        VmCool(address(vm)).cool(address(manager));
        VmCool(address(vm)).cool(address(pool));
        VmCool(address(vm)).cool(address(token));
    }

    function _gasOfJoin(address provider, address n) internal returns (uint256 used) {
        _cool();
        vm.prank(provider);
        used = gasleft();
        pool.joinPool(n);
        used -= gasleft();
    }

    function _gasOfUnbond(address provider) internal returns (uint256 used) {
        _cool();
        vm.prank(provider);
        used = gasleft();
        manager.requestUnbond(1 ether);
        used -= gasleft();
    }

    /// joinPool and requestUnbond cost the same whether the provider runs one
    /// node or a thousand (the registry counts nodes instead of listing them).
    function test_audit3_joinAndUnbondGasDoNotGrowWithTheProvidersNodes() public {
        address small = _providerWithNodes(bob, 1, 0x10000);
        address large = _providerWithNodes(carol, 1000, 0x20000);
        uint256 joinSmall = _gasOfJoin(bob, small);
        uint256 joinLarge = _gasOfJoin(carol, large);
        uint256 unbondSmall = _gasOfUnbond(bob);
        uint256 unbondLarge = _gasOfUnbond(carol);
        emit log_named_uint("joinPool gas, 1 node", joinSmall);
        emit log_named_uint("joinPool gas, 1000 nodes", joinLarge);
        emit log_named_uint("requestUnbond gas, 1 node", unbondSmall);
        emit log_named_uint("requestUnbond gas, 1000 nodes", unbondLarge);
        vm.assertLe(joinLarge, joinSmall + 100, "joinPool grows with the provider's nodes");
        vm.assertLe(unbondLarge, unbondSmall + 100, "requestUnbond grows with the provider's nodes");
    }

    // ---- 4. the admin takes the budget ----

    /// The admin tries at once what would let it take the budget: make itself
    /// recorder, revoke the validators, shorten the window and raise the
    /// reward. None of it applies now; it cannot record, the deployment's
    /// validators still invalidate, and the recorded terms stay the old ones.
    function test_audit4_theAdminCannotMoveThePayAtOnce() public {
        bytes32 recorderRole = pool.RECORDER_ROLE();
        bytes32 validatorRole = pool.VALIDATOR_ROLE();
        bytes4 delayed = bytes4(keccak256("RoleChangeDelayed(bytes32)"));
        vm.startPrank(admin);
        vm.expectRevert(abi.encodeWithSelector(delayed, recorderRole));
        pool.grantRole(recorderRole, admin);
        vm.expectRevert(abi.encodeWithSelector(delayed, validatorRole));
        pool.revokeRole(validatorRole, validator2);
        vm.expectRevert(abi.encodeWithSelector(delayed, recorderRole));
        pool.revokeRole(recorderRole, recorder);
        pool.setQuorum(2);
        pool.setInvalidationWindow(1 minutes);
        pool.setRewardPerUnit(FUNDING);
        vm.stopPrank();
        vm.assertEq(pool.invalidationWindow(), WINDOW, "the window waits");
        vm.assertEq(pool.rewardPerUnit(), REWARD_PER_UNIT, "the reward waits");

        IComputePool.WorkLeaf[] memory grab = WorkParts.one(leafOf(node, 1, 0));
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, admin, recorderRole)
        );
        vm.prank(admin);
        pool.recordWork(1, 0, grab);

        // the recorder's next part keeps the old terms, and both validators still count
        IComputePool.LeafRef memory r = recordOne(1, node, 10, 0);
        vm.assertEq(pool.recordOf(1, 0).unlocksAt, block.timestamp + WINDOW, "old window");
        vm.assertEq(pool.recordOf(1, 0).rewardPerUnit, REWARD_PER_UNIT, "old reward");
        vm.warp(block.timestamp + 1 hours);
        invalidateAs(validator, r);
        invalidateAs(validator2, r);
        vm.assertEq(settlementOf(r), uint256(IComputePool.Settlement.Invalidated), "the validators still judge");
        vm.assertEq(token.balanceOf(admin), 0, "the admin took nothing");
    }
}
