// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ComputePool} from "../../src/ComputePool.sol";
import {IComputePool} from "../../src/interfaces/IComputePool.sol";
import {StakeToken} from "../../src/StakeToken.sol";
import {StakeManager} from "../../src/StakeManager.sol";
import {TestBase} from "../utils/TestBase.sol";
import {ProtocolFixture} from "../utils/Fixtures.sol";

/// @notice Drives a pool with random funding, work records, invalidations,
/// claims, slashes (with real signed evidence), rejoins, reward-rate changes
/// and time, keeping a ghost of what is owed. The handler is also the
/// validator, so its token balance shows whether a validator ever profits.
contract PoolHandler is TestBase {
    StakeToken token;
    ComputePool pool;
    StakeManager manager;
    uint256[2] nodePks;
    address minter;
    address poolAdmin;
    address[2] nodes;
    address[2] providers;

    uint64[] public epochs;
    /// @dev Every recorded (epoch, node index), so actions aim at existing work.
    uint64[] recEpochs;
    uint256[] recNodes;
    mapping(uint64 => bool) seenEpoch;
    uint256 public ghostFunded;
    uint256 public ghostPaid;
    uint256 public badClaims;
    uint256 public ghostSlashed;
    uint256 public slashes;

    constructor(
        StakeToken token_,
        ComputePool pool_,
        StakeManager manager_,
        address admin_,
        uint256[2] memory pks,
        address[2] memory ps
    ) {
        token = token_;
        pool = pool_;
        manager = manager_;
        minter = admin_;
        poolAdmin = admin_;
        nodePks = pks;
        nodes = [vm.addr(pks[0]), vm.addr(pks[1])];
        providers = ps;
    }

    /// @dev The one submission committed for (epoch, node i): its commitment is the lone leaf.
    function _sub(uint64 epoch, uint256 i) internal view returns (IComputePool.Submission memory) {
        return IComputePool.Submission(pool.runId(), nodes[i], epoch, keccak256(abi.encode(epoch, i)));
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
        uint64 epoch = uint64(bound(epochSeed, 0, 7));
        address n = nodes[nodeSeed % 2];
        units = bound(units, 1, 1e3);
        bytes32 leaf = keccak256(abi.encode(pool.submissionDigest(_sub(epoch, nodeSeed % 2))));
        pool.submitWork(epoch, n, uint128(units), leaf);
        recEpochs.push(epoch);
        recNodes.push(nodeSeed % 2);
        if (!seenEpoch[epoch]) {
            seenEpoch[epoch] = true;
            epochs.push(epoch);
        }
    }

    /// @dev Half the time an existing record, otherwise anything (to hit the reverts too).
    function _target(uint256 epochSeed, uint256 nodeSeed) internal view returns (uint64, uint256) {
        if (recEpochs.length != 0 && epochSeed % 2 == 0) {
            uint256 k = (epochSeed / 2) % recEpochs.length;
            return (recEpochs[k], recNodes[k]);
        }
        return (uint64(bound(epochSeed, 0, 7)), nodeSeed % 2);
    }

    function invalidate(uint256 epochSeed, uint256 nodeSeed) external {
        (uint64 epoch, uint256 i) = _target(epochSeed, nodeSeed);
        pool.invalidate(epoch, nodes[i]);
    }

    function claim(uint256 epochSeed, uint256 nodeSeed) external {
        (uint64 epoch, uint256 i) = _target(epochSeed, nodeSeed);
        IComputePool.WorkRecord memory rec = pool.workOf(epoch, nodes[i]);
        uint64[] memory e = new uint64[](1);
        e[0] = epoch;
        // mostly claim once the window has passed; sometimes try early
        uint256 unlocks = uint256(rec.recordedAt) + pool.invalidationWindow();
        if (nodeSeed % 4 != 0 && rec.units != 0 && block.timestamp < unlocks) vm.warp(unlocks);
        uint256 before = token.balanceOf(providers[i]);
        vm.prank(providers[i]);
        uint256 paid = pool.claim(nodes[i], e);
        if (paid != rec.reward || token.balanceOf(providers[i]) - before != paid) ++badClaims;
        if (block.timestamp < uint256(rec.recordedAt) + pool.invalidationWindow() || rec.invalidated) ++badClaims;
        ghostPaid += paid;
    }

    function slash(uint256 epochSeed, uint256 nodeSeed) external {
        (uint64 epoch, uint256 i) = _target(epochSeed, nodeSeed);
        IComputePool.Submission memory sub = _sub(epoch, i);
        bytes memory sig = signDigest(nodePks[i], pool.submissionDigest(sub));
        uint256 before = token.balanceOf(manager.treasury());
        pool.slash(epoch, sub, sig, new bytes32[](0));
        ghostSlashed += token.balanceOf(manager.treasury()) - before;
        ++slashes;
    }

    /// @dev Tops the provider's stake up to cover its nodes and joins the node again.
    function rejoin(uint256 nodeSeed) external {
        uint256 i = nodeSeed % 2;
        if (pool.isJoined(nodes[i])) return;
        address p = providers[i];
        uint256 active = manager.stakeOf(p);
        uint256 need = manager.minStakePerNode();
        if (active < need) {
            vm.prank(minter);
            token.mint(p, need - active);
            vm.startPrank(p);
            token.approve(address(manager), need - active);
            manager.stake(need - active);
            vm.stopPrank();
        }
        vm.prank(p);
        pool.joinPool(nodes[i]);
    }

    function setRewardPerUnit(uint256 amount) external {
        vm.prank(poolAdmin);
        pool.setRewardPerUnit(bound(amount, 0, 1e20));
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
        handler = new PoolHandler(token, pool, manager, admin, [NODE_PK, NODE2_PK], [alice, bob]);
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
        vm.assertEq(
            pool.totalPaid() + pool.reservedRewards() + pool.availableRewards(), funded, "paid+reserved+available"
        );
        vm.assertLe(pool.totalPaid(), funded, "paid <= funded");
        vm.assertEq(token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool balance");
        vm.assertEq(handler.badClaims(), 0, "a claim paid the wrong amount or too early");
    }

    /// Slashed stake reaches the treasury only; the validator never gains a token.
    function invariant_slashesGoToTreasury() public view {
        vm.assertEq(token.balanceOf(treasury), handler.ghostSlashed(), "treasury holds every slashed token");
        vm.assertEq(token.balanceOf(address(handler)), 0, "validator balance unchanged");
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "stake conserved");
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
