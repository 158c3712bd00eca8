// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";
import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

import {StakeManager} from "../src/StakeManager.sol";
import {IComputePool} from "../src/interfaces/IComputePool.sol";
import {IStakeManager} from "../src/interfaces/IStakeManager.sol";
import {ProtocolFixture, StandInFactory} from "./utils/Fixtures.sol";

/// @dev A token without burn, to check the 0xdEaD fallback.
contract PlainToken is ERC20 {
    constructor() ERC20("Plain", "PLN") {}

    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}

/// @notice The stake manager alone; this test contract is its one pool.
contract StakeManagerTest is ProtocolFixture {
    /// @dev What the manager reads from its pools when its parameters change.
    uint256 public slashPenalty = PENALTY;
    uint256 public invalidationWindow = WINDOW;
    /// @dev What this pool bonds of each provider's active stake (IComputePool.bondOf).
    mapping(address provider => uint256) public bondOf;
    /// @dev A higher penalty waiting to apply (0: none).
    uint256 pendingPenalty;
    /// @dev A window waiting to apply (0: none).
    uint256 pendingWindow;
    bytes32 constant REASON = keccak256("reason");
    uint256 constant OWNER_PK = 0x0D0E;
    bytes32 constant PERMIT_TYPEHASH =
        keccak256("Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)");

    function setUp() public {
        deployProtocol();
        manager = _managerWithThisAsPool(token, treasury);
        register(alice);
    }

    function _managerWithThisAsPool(ERC20 token_, address treasury_) internal returns (StakeManager m) {
        StandInFactory standIn = new StandInFactory(address(this));
        m = new StakeManager(token_, registry, standIn, admin, MIN_STAKE, UNBONDING, treasury_);
        vm.prank(admin);
        m.createPool(RUN, admin, params(1), new address[](0), new address[](0));
    }

    function pendingSlashPenalty() external view returns (uint256, uint256) {
        return (pendingPenalty, pendingPenalty == 0 ? 0 : block.timestamp + 1);
    }

    function pendingInvalidationWindow() external view returns (uint256, uint256) {
        return (pendingWindow, pendingWindow == 0 ? 0 : block.timestamp + 1);
    }

    function _unbond(address provider, uint256 amount) internal {
        vm.prank(provider);
        manager.requestUnbond(amount);
    }

    function _checkConservation() internal view {
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "balance == totalStaked");
    }

    // ---- constructor and views ----

    function test_constructor() public view {
        vm.assertEq(address(manager.token()), address(token), "token");
        vm.assertEq(address(manager.registry()), address(registry), "registry");
        vm.assertEq(manager.minStakePerNode(), MIN_STAKE, "min");
        vm.assertEq(manager.unbondingPeriod(), UNBONDING, "period");
        vm.assertEq(manager.treasury(), treasury, "treasury");
        vm.assertTrue(manager.hasRole(manager.DEFAULT_ADMIN_ROLE(), admin), "admin");
        vm.assertTrue(manager.isPool(address(this)), "the pool");
        vm.assertEq(manager.pools().length, 1, "one pool");
        vm.assertEq(manager.totalStaked(), 0, "nothing staked");
    }

    // ---- stake ----

    function test_stake() public {
        mint(alice, 300 ether);
        vm.startPrank(alice);
        token.approve(address(manager), 300 ether);
        vm.expectEmit(address(manager));
        emit IStakeManager.Staked(alice, 120 ether);
        manager.stake(120 ether);
        manager.stake(30 ether);
        vm.stopPrank();
        vm.assertEq(manager.stakeOf(alice), 150 ether, "active");
        vm.assertEq(manager.totalStaked(), 150 ether, "total");
        vm.assertEq(token.balanceOf(alice), 150 ether, "left with alice");
        _checkConservation();
    }

    function test_stake_notProviderReverts() public {
        mint(bob, 1 ether);
        vm.prank(bob);
        token.approve(address(manager), 1 ether);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotProvider.selector, bob));
        vm.prank(bob);
        manager.stake(1 ether);
    }

    function test_stake_zeroReverts() public {
        vm.expectRevert(IStakeManager.ZeroAmount.selector);
        vm.prank(alice);
        manager.stake(0);
    }

    function test_stake_withoutApprovalReverts() public {
        mint(alice, 1 ether);
        vm.expectRevert();
        vm.prank(alice);
        manager.stake(1 ether);
    }

    function _permit(uint256 pk, uint256 value, uint256 deadline) internal view returns (uint8, bytes32, bytes32) {
        address owner = vm.addr(pk);
        bytes32 structHash =
            keccak256(abi.encode(PERMIT_TYPEHASH, owner, address(manager), value, token.nonces(owner), deadline));
        return vm.sign(pk, keccak256(abi.encodePacked("\x19\x01", token.DOMAIN_SEPARATOR(), structHash)));
    }

    function test_stakeWithPermit() public {
        address owner = vm.addr(OWNER_PK);
        register(owner);
        mint(owner, 10 ether);
        (uint8 v, bytes32 r, bytes32 s) = _permit(OWNER_PK, 10 ether, block.timestamp);
        vm.prank(owner);
        manager.stakeWithPermit(10 ether, block.timestamp, v, r, s);
        vm.assertEq(manager.stakeOf(owner), 10 ether, "staked");
        _checkConservation();
    }

    function test_stakeWithPermit_frontRunPermitStillStakes() public {
        address owner = vm.addr(OWNER_PK);
        register(owner);
        mint(owner, 10 ether);
        (uint8 v, bytes32 r, bytes32 s) = _permit(OWNER_PK, 10 ether, block.timestamp);
        token.permit(owner, address(manager), 10 ether, block.timestamp, v, r, s); // someone else used it
        vm.prank(owner);
        manager.stakeWithPermit(10 ether, block.timestamp, v, r, s);
        vm.assertEq(manager.stakeOf(owner), 10 ether, "staked");
    }

    function test_stakeWithPermit_badPermitReverts() public {
        address owner = vm.addr(OWNER_PK);
        register(owner);
        mint(owner, 10 ether);
        (uint8 v, bytes32 r, bytes32 s) = _permit(OTHER_PK, 10 ether, block.timestamp);
        vm.expectRevert();
        vm.prank(owner);
        manager.stakeWithPermit(10 ether, block.timestamp, v, r, s);
    }

    function test_stakeWithPermit_notProviderReverts() public {
        address owner = vm.addr(OWNER_PK);
        mint(owner, 10 ether);
        (uint8 v, bytes32 r, bytes32 s) = _permit(OWNER_PK, 10 ether, block.timestamp);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotProvider.selector, owner));
        vm.prank(owner);
        manager.stakeWithPermit(10 ether, block.timestamp, v, r, s);
    }

    // ---- unbond and withdraw ----

    function test_requestUnbond() public {
        stakeAs(alice, 100 ether);
        vm.expectEmit(address(manager));
        emit IStakeManager.UnbondRequested(alice, 40 ether, block.timestamp + UNBONDING);
        _unbond(alice, 40 ether);
        vm.assertEq(manager.stakeOf(alice), 60 ether, "active");
        (uint256 total, uint256 withdrawable) = manager.unbondingOf(alice);
        vm.assertEq(total, 40 ether, "unbonding");
        vm.assertEq(withdrawable, 0, "not yet");
        vm.assertEq(manager.totalStaked(), 100 ether, "still staked");
        _checkConservation();
    }

    function test_requestUnbond_zeroReverts() public {
        vm.expectRevert(IStakeManager.ZeroAmount.selector);
        _unbond(alice, 0);
    }

    function test_requestUnbond_moreThanActiveReverts() public {
        stakeAs(alice, 10 ether);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.InsufficientStake.selector, 10 ether, 11 ether));
        _unbond(alice, 11 ether);
    }

    function test_requestUnbond_stakeBacksNodesReverts() public {
        addNode(alice, NODE_PK);
        addNode(alice, NODE2_PK);
        stakeAs(alice, 250 ether);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksNodes.selector, 199 ether, 200 ether));
        _unbond(alice, 51 ether);
        _unbond(alice, 50 ether); // exactly covers two nodes
        vm.assertEq(manager.stakeOf(alice), 200 ether, "active");
        // removing a node frees its stake
        vm.prank(alice);
        registry.removeNode(node2);
        _unbond(alice, 100 ether);
        vm.assertEq(manager.stakeOf(alice), 100 ether, "active");
    }

    function test_withdraw_afterPeriod() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 40 ether);
        vm.warp(block.timestamp + UNBONDING);
        (, uint256 withdrawable) = manager.unbondingOf(alice);
        vm.assertEq(withdrawable, 40 ether, "withdrawable");
        vm.expectEmit(address(manager));
        emit IStakeManager.Withdrawn(alice, 40 ether);
        vm.prank(alice);
        uint256 got = manager.withdraw();
        vm.assertEq(got, 40 ether, "returned");
        vm.assertEq(token.balanceOf(alice), 40 ether, "paid");
        vm.assertEq(manager.totalStaked(), 60 ether, "total");
        (uint256 total,) = manager.unbondingOf(alice);
        vm.assertEq(total, 0, "no unbonding left");
        vm.assertEq(manager.unbondingEntries(alice).length, 0, "entries gone");
        _checkConservation();
    }

    function test_withdraw_beforePeriodReverts() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 40 ether);
        vm.warp(block.timestamp + UNBONDING - 1);
        vm.expectRevert(IStakeManager.NothingToWithdraw.selector);
        vm.prank(alice);
        manager.withdraw();
    }

    function test_withdraw_nothingReverts() public {
        vm.expectRevert(IStakeManager.NothingToWithdraw.selector);
        vm.prank(alice);
        manager.withdraw();
    }

    function test_withdraw_paysOnlyMaturedEntries() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 10 ether);
        vm.warp(block.timestamp + 1 days);
        _unbond(alice, 20 ether);
        vm.warp(block.timestamp + UNBONDING - 1 days);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), 10 ether, "first only");
        StakeManager.Unbonding[] memory entries = manager.unbondingEntries(alice);
        vm.assertEq(entries.length, 1, "one left");
        vm.assertEq(entries[0].amount, 20 ether, "second kept");
        vm.warp(block.timestamp + 1 days);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), 20 ether, "second");
        _checkConservation();
    }

    function test_withdraw_shortenedPeriodOutOfOrder() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 10 ether); // releases at +7d
        vm.prank(admin);
        manager.setUnbondingPeriod(1 days);
        _unbond(alice, 20 ether); // releases at +1d
        vm.warp(block.timestamp + 1 days);
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), 20 ether, "newer, earlier entry");
        StakeManager.Unbonding[] memory entries = manager.unbondingEntries(alice);
        vm.assertEq(entries.length, 1, "older kept");
        vm.assertEq(entries[0].amount, 10 ether, "older amount");
    }

    function test_requestUnbond_mergesBeyondMaxEntries() public {
        uint256 max = manager.MAX_UNBONDING_ENTRIES();
        stakeAs(alice, 100 ether);
        for (uint256 i; i < max; ++i) {
            _unbond(alice, 1 ether);
            vm.warp(block.timestamp + 1);
        }
        _unbond(alice, 2 ether);
        StakeManager.Unbonding[] memory entries = manager.unbondingEntries(alice);
        vm.assertEq(entries.length, max, "capped");
        vm.assertEq(entries[max - 1].amount, 3 ether, "merged into the newest");
        vm.assertEq(entries[max - 1].releaseTime, block.timestamp + UNBONDING, "later release");
        (uint256 total,) = manager.unbondingOf(alice);
        vm.assertEq(total, max * 1 ether + 2 ether, "total");
    }

    // ---- slash ----

    function test_slash_activeToTreasury() public {
        stakeAs(alice, 100 ether);
        vm.expectEmit(address(manager));
        emit IStakeManager.Slashed(alice, 30 ether, REASON, treasury, address(this));
        uint256 slashed = manager.slash(alice, 30 ether, REASON);
        vm.assertEq(slashed, 30 ether, "slashed");
        vm.assertEq(manager.stakeOf(alice), 70 ether, "active");
        vm.assertEq(token.balanceOf(treasury), 30 ether, "treasury");
        vm.assertEq(token.balanceOf(address(this)), 0, "the pool gets nothing");
        _checkConservation();
    }

    function test_slash_unbondingNewestFirst() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 30 ether);
        vm.warp(block.timestamp + 1);
        _unbond(alice, 20 ether);
        // active 50, entries [30 (older), 20 (newer)]
        uint256 slashed = manager.slash(alice, 75 ether, REASON);
        vm.assertEq(slashed, 75 ether, "slashed");
        vm.assertEq(manager.stakeOf(alice), 0, "active gone");
        StakeManager.Unbonding[] memory entries = manager.unbondingEntries(alice);
        vm.assertEq(entries.length, 1, "newest consumed");
        vm.assertEq(entries[0].amount, 25 ether, "oldest reduced by the rest");
        (uint256 total,) = manager.unbondingOf(alice);
        vm.assertEq(total, 25 ether, "total");
        _checkConservation();
    }

    function test_slash_moreThanStakeTakesAll() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 30 ether);
        uint256 slashed = manager.slash(alice, 1000 ether, REASON);
        vm.assertEq(slashed, 100 ether, "everything");
        vm.assertEq(manager.totalStaked(), 0, "nothing left");
        vm.assertEq(token.balanceOf(treasury), 100 ether, "treasury");
        vm.prank(alice);
        vm.expectRevert(IStakeManager.NothingToWithdraw.selector);
        manager.withdraw();
    }

    function test_slash_nothingReturnsZero() public {
        vm.assertEq(manager.slash(bob, 10 ether, REASON), 0, "nothing");
        vm.assertEq(manager.slash(alice, 0, REASON), 0, "zero amount");
    }

    function test_slash_notPoolReverts() public {
        stakeAs(alice, 100 ether);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotPool.selector, admin));
        vm.prank(admin);
        manager.slash(alice, 1, REASON);
    }

    function test_slash_adminCannotMakeItselfASlasher() public {
        stakeAs(alice, 100 ether);
        bytes32 adminRole = manager.DEFAULT_ADMIN_ROLE();
        vm.startPrank(admin);
        // the admin role is the only role there is; holding it does not slash
        manager.grantRole(adminRole, bob);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.NotPool.selector, admin));
        manager.slash(alice, 1, REASON);
        vm.stopPrank();
        vm.assertEq(manager.stakeOf(alice), 100 ether, "untouched");
    }

    function test_slash_burnsWithoutTreasury() public {
        manager = _managerWithThisAsPool(token, address(0));
        stakeAs(alice, 100 ether);
        uint256 supply = token.totalSupply();
        vm.expectEmit(address(manager));
        emit IStakeManager.Slashed(alice, 40 ether, REASON, address(0), address(this));
        manager.slash(alice, 40 ether, REASON);
        vm.assertEq(token.totalSupply(), supply - 40 ether, "burnt");
        _checkConservation();
    }

    function test_slash_deadAddressWhenTokenCannotBurn() public {
        PlainToken plain = new PlainToken();
        StakeManager m = _managerWithThisAsPool(plain, address(0));
        plain.mint(alice, 10 ether);
        vm.startPrank(alice);
        plain.approve(address(m), 10 ether);
        m.stake(10 ether);
        vm.stopPrank();
        m.slash(alice, 4 ether, REASON);
        vm.assertEq(plain.balanceOf(m.BURN_ADDRESS()), 4 ether, "sent to dead");
        vm.assertEq(plain.balanceOf(address(m)), m.totalStaked(), "conserved");
    }

    function test_slash_reachesMaturedButUnwithdrawnEntries() public {
        stakeAs(alice, 100 ether);
        _unbond(alice, 100 ether);
        vm.warp(block.timestamp + UNBONDING + 1);
        vm.assertEq(manager.slash(alice, 30 ether, REASON), 30 ether, "held stake is slashable");
        vm.prank(alice);
        vm.assertEq(manager.withdraw(), 70 ether, "the rest");
        _checkConservation();
    }

    // ---- coversNodes ----

    function test_coversNodes() public {
        stakeAs(alice, 250 ether);
        vm.assertTrue(manager.coversNodes(alice, 0), "zero nodes");
        vm.assertTrue(manager.coversNodes(alice, 2), "two");
        vm.assertFalse(manager.coversNodes(alice, 3), "three");
        vm.assertTrue(manager.coversNodes(bob, 0), "nobody with no nodes");
        vm.assertFalse(manager.coversNodes(bob, 1), "nobody with a node");
    }

    // ---- bonds ----

    function test_bondedOf_asksThePools() public {
        vm.assertEq(manager.bondedOf(alice), 0, "nothing bonded");
        bondOf[alice] = 60 ether;
        vm.assertEq(manager.bondedOf(alice), 60 ether, "the pool's bond");
        vm.assertEq(manager.bondedOf(bob), 0, "per provider");
    }

    /// Every pool the manager created counts (here the same stand-in, listed twice).
    function test_bondedOf_sumsEveryPool() public {
        bondOf[alice] = 30 ether;
        vm.prank(admin);
        manager.createPool(RUN, admin, params(1), new address[](0), new address[](0));
        vm.assertEq(manager.bondedOf(alice), 60 ether, "one bond per pool");
    }

    function test_bond_blocksUnbondingBelowIt() public {
        stakeAs(alice, 100 ether);
        bondOf[alice] = 60 ether;
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 30 ether, 60 ether));
        _unbond(alice, 70 ether);
        _unbond(alice, 40 ether); // the unbonded part may go
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 59 ether, 60 ether));
        _unbond(alice, 1 ether);
        bondOf[alice] = 0; // the pool's windows closed
        _unbond(alice, 60 ether);
        vm.assertEq(manager.stakeOf(alice), 0, "all unbonding");
        _checkConservation();
    }

    /// Nodes and bonds are separate requirements; the larger one binds.
    function test_bond_andNodesAreBothCovered() public {
        addNode(alice, NODE_PK);
        stakeAs(alice, 200 ether);
        bondOf[alice] = 150 ether;
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksNodes.selector, 99 ether, 100 ether));
        _unbond(alice, 101 ether);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 140 ether, 150 ether));
        _unbond(alice, 60 ether);
        _unbond(alice, 50 ether);
        bondOf[alice] = 10 ether;
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksNodes.selector, 90 ether, 100 ether));
        _unbond(alice, 60 ether);
        _unbond(alice, 50 ether);
        vm.assertEq(manager.stakeOf(alice), 100 ether, "one node's stake left");
    }

    /// A bond never stops a slash, and lasts as long as the pool says,
    /// whatever the slash took.
    function test_bond_doesNotShieldFromSlashes() public {
        stakeAs(alice, 100 ether);
        bondOf[alice] = 50 ether;
        vm.assertEq(manager.slash(alice, 80 ether, REASON), 80 ether, "bonded stake is slashable");
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.StakeBacksWork.selector, 0, 50 ether));
        _unbond(alice, 20 ether);
        bondOf[alice] = 0;
        _unbond(alice, 20 ether);
        _checkConservation();
    }

    function testFuzz_bond_unbondKeepsItCovered(uint256 staked, uint256 bond, uint256 amount) public {
        staked = bound(staked, 1, 1e30);
        bond = bound(bond, 0, 2e30);
        amount = bound(amount, 1, staked);
        stakeAs(alice, staked);
        bondOf[alice] = bond;
        vm.prank(alice);
        try manager.requestUnbond(amount) {
            vm.assertGe(manager.stakeOf(alice), bond, "unbonded into the bond");
        } catch {
            vm.assertLt(staked - amount, bond, "refused an unbond that kept the bond");
        }
    }

    // ---- pools ----

    function test_createPool_onlyAdmin() public {
        bytes memory err = abi.encodeWithSelector(
            IAccessControl.AccessControlUnauthorizedAccount.selector, alice, manager.DEFAULT_ADMIN_ROLE()
        );
        vm.expectRevert(err);
        vm.prank(alice);
        manager.createPool(RUN, alice, params(1), new address[](0), new address[](0));
    }

    function test_createPool_atMostMaxPools() public {
        vm.startPrank(admin);
        for (uint256 i = 1; i < manager.MAX_POOLS(); ++i) {
            manager.createPool(RUN, admin, params(1), new address[](0), new address[](0));
        }
        vm.expectRevert(IStakeManager.TooManyPools.selector);
        manager.createPool(RUN, admin, params(1), new address[](0), new address[](0));
        vm.stopPrank();
    }

    // ---- admin ----

    function test_setters_emitOldAndNew() public {
        vm.startPrank(admin);
        vm.expectEmit(address(manager));
        emit IStakeManager.MinStakePerNodeChanged(MIN_STAKE, 500 ether);
        manager.setMinStakePerNode(500 ether);
        vm.expectEmit(address(manager));
        emit IStakeManager.UnbondingPeriodChanged(UNBONDING, 2 days, block.timestamp);
        manager.setUnbondingPeriod(2 days);
        vm.stopPrank();
        vm.assertEq(manager.minStakePerNode(), 500 ether, "min");
        vm.assertEq(manager.unbondingPeriod(), 2 days, "period");
    }

    function test_setMinStakePerNode_neverBelowAPoolsPenalty() public {
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.MinStakeBelowPenalty.selector, PENALTY - 1, PENALTY));
        vm.prank(admin);
        manager.setMinStakePerNode(PENALTY - 1);
        vm.prank(admin);
        manager.setMinStakePerNode(PENALTY);
    }

    /// A higher penalty waiting to apply bounds the minimum stake already, so
    /// that it never applies above the stake a node needs.
    function test_setMinStakePerNode_neverBelowAPendingPenalty() public {
        pendingPenalty = PENALTY + 10 ether;
        vm.expectRevert(
            abi.encodeWithSelector(IStakeManager.MinStakeBelowPenalty.selector, PENALTY + 9 ether, PENALTY + 10 ether)
        );
        vm.prank(admin);
        manager.setMinStakePerNode(PENALTY + 9 ether);
        vm.prank(admin);
        manager.setMinStakePerNode(PENALTY + 10 ether);
    }

    function test_setUnbondingPeriod_bounds() public {
        uint256 max = manager.MAX_UNBONDING_PERIOD();
        vm.startPrank(admin);
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.UnbondingPeriodOutOfRange.selector, 0, WINDOW, max));
        manager.setUnbondingPeriod(0);
        // never shorter than a pool's invalidation window
        vm.expectRevert(
            abi.encodeWithSelector(IStakeManager.UnbondingPeriodOutOfRange.selector, WINDOW - 1, WINDOW, max)
        );
        manager.setUnbondingPeriod(WINDOW - 1);
        manager.setUnbondingPeriod(WINDOW);
        // nor than a window still waiting to apply
        pendingWindow = WINDOW + 1 hours;
        vm.expectRevert(
            abi.encodeWithSelector(IStakeManager.UnbondingPeriodOutOfRange.selector, WINDOW, WINDOW + 1 hours, max)
        );
        manager.setUnbondingPeriod(WINDOW);
        pendingWindow = 0;
        // never years
        vm.expectRevert(abi.encodeWithSelector(IStakeManager.UnbondingPeriodOutOfRange.selector, 365 days, WINDOW, max));
        manager.setUnbondingPeriod(365 days);
        vm.stopPrank();
        vm.expectRevert(
            abi.encodeWithSelector(
                IStakeManager.UnbondingPeriodOutOfRange.selector, 0, manager.MIN_UNBONDING_PERIOD(), max
            )
        );
        new StakeManager(token, registry, factory, admin, MIN_STAKE, 0, treasury);
    }

    function test_setUnbondingPeriod_longerAppliesOnlyAfterTheCurrentPeriod() public {
        stakeAs(alice, 100 ether);
        vm.expectEmit(address(manager));
        emit IStakeManager.UnbondingPeriodChanged(UNBONDING, 30 days, block.timestamp + UNBONDING);
        vm.prank(admin);
        manager.setUnbondingPeriod(30 days);
        (uint256 pending, uint256 at) = manager.pendingUnbondingPeriod();
        vm.assertEq(pending, 30 days, "pending");
        vm.assertEq(at, block.timestamp + UNBONDING, "from");
        vm.assertEq(manager.unbondingPeriod(), UNBONDING, "not yet");

        // a staker who wants out leaves on the terms it staked with
        vm.warp(block.timestamp + UNBONDING - 1);
        _unbond(alice, 10 ether);
        vm.assertEq(manager.unbondingEntries(alice)[0].releaseTime, block.timestamp + UNBONDING, "old terms");
        vm.warp(block.timestamp + 1);
        vm.assertEq(manager.unbondingPeriod(), 30 days, "now");
        _unbond(alice, 10 ether);
        vm.assertEq(manager.unbondingEntries(alice)[1].releaseTime, block.timestamp + 30 days, "new terms");
        (pending, at) = manager.pendingUnbondingPeriod();
        vm.assertEq(at, 0, "nothing pending");
    }

    function test_setUnbondingPeriod_shorterCancelsAPendingLongerOne() public {
        vm.startPrank(admin);
        manager.setUnbondingPeriod(30 days);
        manager.setUnbondingPeriod(2 days);
        vm.stopPrank();
        vm.assertEq(manager.unbondingPeriod(), 2 days, "at once");
        vm.warp(block.timestamp + UNBONDING);
        vm.assertEq(manager.unbondingPeriod(), 2 days, "the longer one never came");
    }

    function test_setters_notAdminReverts() public {
        bytes memory err = abi.encodeWithSelector(
            IAccessControl.AccessControlUnauthorizedAccount.selector, alice, manager.DEFAULT_ADMIN_ROLE()
        );
        vm.startPrank(alice);
        vm.expectRevert(err);
        manager.setMinStakePerNode(1);
        vm.expectRevert(err);
        manager.setUnbondingPeriod(1 days);
        vm.stopPrank();
    }

    // ---- fuzz ----

    function testFuzz_stakeUnbondWithdraw(uint256 amount, uint256 unbond, uint256 wait) public {
        amount = bound(amount, 1, 1e30);
        unbond = bound(unbond, 1, amount);
        wait = bound(wait, 0, 2 * UNBONDING);
        stakeAs(alice, amount);
        _unbond(alice, unbond);
        uint256 requestedAt = block.timestamp;
        vm.warp(block.timestamp + wait);
        if (block.timestamp < requestedAt + UNBONDING) {
            vm.expectRevert(IStakeManager.NothingToWithdraw.selector);
            vm.prank(alice);
            manager.withdraw();
            vm.assertEq(token.balanceOf(alice), 0, "nothing paid early");
        } else {
            vm.prank(alice);
            vm.assertEq(manager.withdraw(), unbond, "withdrawn");
            vm.assertEq(token.balanceOf(alice), unbond, "paid");
        }
        vm.assertEq(manager.stakeOf(alice), amount - unbond, "active");
        _checkConservation();
    }

    function testFuzz_slash(uint256 amount, uint256 unbond1, uint256 unbond2, uint256 penalty) public {
        amount = bound(amount, 2, 1e30);
        unbond1 = bound(unbond1, 1, amount / 2);
        unbond2 = bound(unbond2, 1, amount - unbond1);
        penalty = bound(penalty, 0, 2e30);
        stakeAs(alice, amount);
        _unbond(alice, unbond1);
        vm.warp(block.timestamp + 1);
        _unbond(alice, unbond2);
        uint256 active = amount - unbond1 - unbond2;

        uint256 slashed = manager.slash(alice, penalty, REASON);

        uint256 expected = penalty < amount ? penalty : amount;
        vm.assertEq(slashed, expected, "slashed min(penalty, stake)");
        vm.assertEq(token.balanceOf(treasury), expected, "treasury got it");
        vm.assertEq(manager.stakeOf(alice), penalty >= active ? 0 : active - penalty, "active first");
        (uint256 total,) = manager.unbondingOf(alice);
        vm.assertEq(manager.stakeOf(alice) + total, amount - expected, "rest intact");
        // newest first: the older entry is touched only once the newer is gone
        uint256 fromUnbonding = expected > active ? expected - active : 0;
        StakeManager.Unbonding[] memory entries = manager.unbondingEntries(alice);
        if (fromUnbonding < unbond2) {
            vm.assertEq(entries[0].amount, unbond1, "older untouched");
        }
        _checkConservation();
    }
}
