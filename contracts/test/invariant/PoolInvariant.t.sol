// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ComputePool} from "../../src/ComputePool.sol";
import {IComputePool} from "../../src/interfaces/IComputePool.sol";
import {StakeToken} from "../../src/StakeToken.sol";
import {TestBase} from "../utils/TestBase.sol";
import {ProtocolFixture} from "../utils/Fixtures.sol";

/// @notice Drives a pool with random funding, work records, invalidations,
/// claims, reward-rate changes and time, keeping a ghost of what is owed.
contract PoolHandler is TestBase {
    StakeToken token;
    ComputePool pool;
    address minter;
    address poolAdmin;
    address[2] nodes;
    address[2] providers;

    uint64[] public epochs;
    mapping(uint64 => bool) seenEpoch;
    uint256 public ghostFunded;
    uint256 public ghostPaid;
    uint256 public badClaims;

    constructor(StakeToken token_, ComputePool pool_, address minter_, address admin_, address[2] memory ns, address[2] memory ps) {
        token = token_;
        pool = pool_;
        minter = minter_;
        poolAdmin = admin_;
        nodes = ns;
        providers = ps;
    }

    function fund(uint256 amount) external {
        amount = bound(amount, 1, 1e27);
        vm.prank(minter);
        token.mint(address(this), amount);
        token.approve(address(pool), amount);
        pool.fund(amount);
        ghostFunded += amount;
    }

    function submitWork(uint256 epochSeed, uint256 nodeSeed, uint256 units) external {
        uint64 epoch = uint64(bound(epochSeed, 0, 15));
        address n = nodes[nodeSeed % 2];
        units = bound(units, 1, 1e6);
        pool.submitWork(epoch, n, uint128(units), bytes32(0));
        if (!seenEpoch[epoch]) {
            seenEpoch[epoch] = true;
            epochs.push(epoch);
        }
    }

    function invalidate(uint256 epochSeed, uint256 nodeSeed) external {
        pool.invalidate(uint64(bound(epochSeed, 0, 15)), nodes[nodeSeed % 2]);
    }

    function claim(uint256 epochSeed, uint256 nodeSeed) external {
        uint256 i = nodeSeed % 2;
        uint64 epoch = uint64(bound(epochSeed, 0, 15));
        IComputePool.WorkRecord memory rec = pool.workOf(epoch, nodes[i]);
        uint64[] memory e = new uint64[](1);
        e[0] = epoch;
        uint256 before = token.balanceOf(providers[i]);
        vm.prank(providers[i]);
        uint256 paid = pool.claim(nodes[i], e);
        if (paid != rec.reward || token.balanceOf(providers[i]) - before != paid) ++badClaims;
        if (block.timestamp < uint256(rec.recordedAt) + pool.invalidationWindow() || rec.invalidated) ++badClaims;
        ghostPaid += paid;
    }

    function setRewardPerUnit(uint256 amount) external {
        vm.prank(poolAdmin);
        pool.setRewardPerUnit(bound(amount, 0, 1e21));
    }

    function warp(uint256 secs) external {
        vm.warp(block.timestamp + bound(secs, 0, 2 days));
    }

    function epochCount() external view returns (uint256) {
        return epochs.length;
    }

    function node(uint256 i) external view returns (address) {
        return nodes[i];
    }
}

contract PoolInvariantTest is ProtocolFixture {
    PoolHandler handler;

    function setUp() public {
        deployProtocol();
        onboard(alice, NODE_PK);
        onboard(bob, NODE2_PK);
        handler = new PoolHandler(token, pool, admin, admin, [node, node2], [alice, bob]);
        vm.startPrank(admin);
        pool.grantRole(pool.RECORDER_ROLE(), address(handler));
        pool.grantRole(pool.VALIDATOR_ROLE(), address(handler));
        vm.stopPrank();
        targetContract(address(handler));
    }

    /// (c) every funded token is paid, reserved or available; never more paid than funded.
    function invariant_rewardAccounting() public view {
        uint256 funded = pool.totalFunded();
        vm.assertEq(funded, handler.ghostFunded(), "funded");
        vm.assertEq(pool.totalPaid(), handler.ghostPaid(), "paid");
        vm.assertEq(pool.totalPaid() + pool.reservedRewards() + pool.availableRewards(), funded, "paid+reserved+available");
        vm.assertLe(pool.totalPaid(), funded, "paid <= funded");
        vm.assertEq(token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool balance");
        vm.assertEq(handler.badClaims(), 0, "a claim paid the wrong amount or too early");
    }

    /// Reserved rewards are exactly those of records neither invalidated nor claimed.
    function invariant_reservedMatchesRecords() public view {
        uint256 owed;
        for (uint256 i; i < handler.epochCount(); ++i) {
            uint64 epoch = handler.epochs(i);
            for (uint256 j; j < 2; ++j) {
                IComputePool.WorkRecord memory rec = pool.workOf(epoch, handler.node(j));
                if (rec.units != 0 && !rec.invalidated && !rec.claimed) owed += rec.reward;
            }
        }
        vm.assertEq(owed, pool.reservedRewards(), "reserved == unclaimed valid rewards");
    }
}
