// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {StakeManager} from "../../src/StakeManager.sol";
import {StakeToken} from "../../src/StakeToken.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {IComputePool} from "../../src/interfaces/IComputePool.sol";
import {TestBase} from "../utils/TestBase.sol";
import {ProtocolFixture, StandInFactory} from "../utils/Fixtures.sol";

/// @notice Drives the stake manager with random stakes, unbonds, withdrawals,
/// bonds, slashes and time, standing in as its one pool. Records every unbond
/// request, and flags any withdrawal that pays more than the requests already
/// past their unbonding period, and any unbond that uncovers nodes or bonds.
contract StakeHandler is TestBase {
    /// @dev What the manager would read from its pool on a parameter change.
    uint256 public slashPenalty;
    uint256 public invalidationWindow = 1 hours;
    /// @dev What this pool bonds of each provider's active stake (IComputePool.bondOf).
    mapping(address provider => uint256) public bondOf;

    StakeToken token;
    StakeManager public manager;
    ProviderRegistry registry;
    address minter;
    address[] public providers;

    struct Request {
        uint256 amount;
        uint256 releaseTime;
    }

    mapping(address => Request[]) public requests;
    mapping(address => uint256) public withdrawn;
    uint256 public earlyWithdrawals;
    uint256 public wrongWithdrawals;
    uint256 public slashedTotal;
    uint256 public unbackedUnbonds;
    uint256 public wrongRefusals;
    uint256 public okWithdrawals;
    uint256 public calls;

    constructor(StakeToken token_, ProviderRegistry registry_, address minter_, address treasury, address[] memory ps) {
        token = token_;
        registry = registry_;
        minter = minter_;
        providers = ps;
        manager = new StakeManager(
            token_, registry_, new StandInFactory(address(this)), address(this), 100 ether, 7 days, treasury
        );
        IComputePool.PoolParams memory none;
        manager.createPool(bytes32(0), address(this), none, new address[](0), new address[](0));
    }

    function providerCount() external view returns (uint256) {
        return providers.length;
    }

    function _pick(uint256 seed) internal view returns (address) {
        return providers[seed % providers.length];
    }

    function stake(uint256 seed, uint256 amount) external {
        address p = _pick(seed);
        amount = bound(amount, 1, 1e27);
        vm.prank(minter);
        token.mint(p, amount);
        vm.startPrank(p);
        token.approve(address(manager), amount);
        manager.stake(amount);
        vm.stopPrank();
        ++calls;
    }

    function requestUnbond(uint256 seed, uint256 amount) external {
        address p = _pick(seed);
        uint256 active = manager.stakeOf(p);
        if (active == 0) return;
        uint256 required = manager.minStakePerNode() * registry.nodesOf(p).length;
        uint256 bonded = bondOf[p];
        if (bonded > required) required = bonded;
        amount = bound(amount, 1, active);
        vm.prank(p);
        try manager.requestUnbond(amount) {
            if (manager.stakeOf(p) < required) ++unbackedUnbonds;
            requests[p].push(Request(amount, block.timestamp + manager.unbondingPeriod()));
        } catch {
            if (active - amount >= required) ++wrongRefusals;
        }
        ++calls;
    }

    function withdraw(uint256 seed) external {
        address p = _pick(seed);
        (, uint256 withdrawable) = manager.unbondingOf(p);
        uint256 before = token.balanceOf(p);
        vm.prank(p);
        try manager.withdraw() returns (uint256 amount) {
            if (token.balanceOf(p) - before != amount || amount != withdrawable) ++wrongWithdrawals;
            withdrawn[p] += amount;
            ++okWithdrawals;
            if (withdrawn[p] > maturedRequested(p)) ++earlyWithdrawals;
        } catch {
            if (withdrawable != 0) ++wrongWithdrawals;
        }
        ++calls;
    }

    /// @notice The pool bonds some of the active stake (or more than there is, as
    /// after a slash), or releases it as its windows close.
    function bond(uint256 seed, uint256 amount) external {
        address p = _pick(seed);
        bondOf[p] = bound(amount, 0, manager.stakeOf(p) + 1 ether);
        ++calls;
    }

    function slash(uint256 seed, uint256 amount) external {
        address p = _pick(seed);
        amount = bound(amount, 0, 2e27);
        slashedTotal += manager.slash(p, amount, bytes32("fuzz"));
        ++calls;
    }

    function warp(uint256 secs) external {
        vm.warp(block.timestamp + bound(secs, 0, 3 days));
        ++calls;
    }

    /// @notice Jumps to within a day either side of the release of one of `p`'s entries.
    function warpNearRelease(uint256 seed, uint256 offset) external {
        StakeManager.Unbonding[] memory entries = manager.unbondingEntries(_pick(seed));
        if (entries.length == 0) return;
        uint256 target = entries[offset % entries.length].releaseTime + bound(offset, 0, 2 days) - 1 days;
        if (target > block.timestamp) vm.warp(target);
        ++calls;
    }

    /// @notice What `p` asked to unbond and whose release time has passed.
    function maturedRequested(address p) public view returns (uint256 sum) {
        Request[] storage rs = requests[p];
        for (uint256 i; i < rs.length; ++i) {
            if (rs[i].releaseTime <= block.timestamp) sum += rs[i].amount;
        }
    }
}

contract StakeInvariantTest is ProtocolFixture {
    StakeHandler handler;

    function setUp() public {
        deployProtocol();
        address[] memory ps = new address[](3);
        (ps[0], ps[1], ps[2]) = (alice, bob, address(0xCA401));
        for (uint256 i; i < 3; ++i) {
            register(ps[i]);
        }
        addNode(alice, NODE_PK); // alice's stake must keep backing one node
        handler = new StakeHandler(token, registry, admin, treasury, ps);
        manager = handler.manager();
        targetContract(address(handler));
    }

    /// (a) the manager holds exactly the stake it accounts for.
    function invariant_stakeConservation() public view {
        uint256 sum;
        for (uint256 i; i < handler.providerCount(); ++i) {
            address p = handler.providers(i);
            (uint256 unbonding,) = manager.unbondingOf(p);
            StakeManager.Unbonding[] memory entries = manager.unbondingEntries(p);
            uint256 entrySum;
            for (uint256 j; j < entries.length; ++j) {
                entrySum += entries[j].amount;
            }
            vm.assertEq(entrySum, unbonding, "entries add up to the unbonding total");
            sum += manager.stakeOf(p) + unbonding;
        }
        vm.assertEq(sum, manager.totalStaked(), "sum of stakes == totalStaked");
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "balance == totalStaked");
        vm.assertEq(token.balanceOf(treasury), handler.slashedTotal(), "slashed stake went to the treasury");
    }

    /// (b) nothing is withdrawn before its unbonding period ends.
    function invariant_noEarlyWithdrawal() public view {
        vm.assertEq(handler.earlyWithdrawals(), 0, "withdrawal before the unbonding period ended");
        vm.assertEq(handler.wrongWithdrawals(), 0, "withdraw paid other than what had matured");
        for (uint256 i; i < handler.providerCount(); ++i) {
            address p = handler.providers(i);
            vm.assertLe(handler.withdrawn(p), handler.maturedRequested(p), "withdrawn <= matured requests");
        }
    }

    /// An unbond never leaves a provider's nodes or bonds unbacked, and is refused only then.
    function invariant_unbondKeepsNodesAndWorkBacked() public view {
        vm.assertEq(handler.unbackedUnbonds(), 0, "an unbond left a node or a bond unbacked");
        vm.assertEq(handler.wrongRefusals(), 0, "an unbond that kept everything backed was refused");
    }

    /// The manager's bond is exactly what its pool bonds: it keeps no copy that could go stale.
    function invariant_bondedIsWhatThePoolsBond() public view {
        for (uint256 i; i < handler.providerCount(); ++i) {
            address p = handler.providers(i);
            vm.assertEq(manager.bondedOf(p), handler.bondOf(p), "bondedOf == the pool's bondOf");
        }
    }
}
