// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {TestBase} from "./TestBase.sol";
import {StakeToken} from "../../src/StakeToken.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {StakeManager} from "../../src/StakeManager.sol";
import {ComputePool} from "../../src/ComputePool.sol";
import {PoolFactory} from "../../src/PoolFactory.sol";
import {IComputePool} from "../../src/interfaces/IComputePool.sol";
import {IPoolFactory} from "../../src/interfaces/IPoolFactory.sol";
import {IProviderRegistry} from "../../src/interfaces/IProviderRegistry.sol";
import {IStakeManager} from "../../src/interfaces/IStakeManager.sol";
import {MerkleBuilder, WorkParts} from "./Merkle.sol";

/// @notice Cheatcodes TestBase does not declare (exact forge signatures).
interface VmExtra {
    function expectRevert(bytes4 selector, address reverter) external;
    function getBlockTimestamp() external view returns (uint256);
}

/// @dev Hands back a fixed address as the new pool, so that a test contract
/// can stand in for a pool: answer `bondOf` and call slash directly.
contract StandInFactory is IPoolFactory {
    address immutable standIn;

    constructor(address standIn_) {
        standIn = standIn_;
    }

    function createPool(bytes32, address, IComputePool.PoolParams calldata, address[] calldata, address[] calldata)
        external
        view
        returns (address)
    {
        return standIn;
    }
}

/// @notice Deploys the whole protocol with small numbers and offers helpers
/// to register providers and nodes, stake, join, record parts and sign submissions.
abstract contract ProtocolFixture is TestBase {
    VmExtra internal constant vmx = VmExtra(address(uint160(uint256(keccak256("hevm cheat code")))));

    uint256 internal constant MIN_STAKE = 100 ether;
    uint256 internal constant UNBONDING = 7 days;
    uint256 internal constant WINDOW = 24 hours;
    uint256 internal constant REWARD_PER_UNIT = 1 ether;
    uint256 internal constant PENALTY = 50 ether;
    bytes32 internal constant RUN = keccak256("test-run");

    address internal admin = address(0xA11CE);
    address internal treasury = address(0x7EA5);
    address internal recorder = address(0x12EC);
    address internal validator = address(0x7A11);
    address internal validator2 = address(0x7A12);
    address internal alice = address(0xA1);
    address internal bob = address(0xB0B);

    uint256 internal constant NODE_PK = 0xA11;
    uint256 internal constant NODE2_PK = 0xB22;
    uint256 internal constant OTHER_PK = 0xC33;
    address internal node;
    address internal node2;

    StakeToken internal token;
    ProviderRegistry internal registry;
    PoolFactory internal factory;
    StakeManager internal manager;
    ComputePool internal pool;

    function deployProtocol() internal {
        node = vm.addr(NODE_PK);
        node2 = vm.addr(NODE2_PK);
        vm.warp(1_000_000);
        token = new StakeToken(admin);
        registry = new ProviderRegistry();
        factory = new PoolFactory();
        manager = new StakeManager(token, registry, factory, admin, MIN_STAKE, UNBONDING, treasury);
        pool = createPool(RUN, 1);
    }

    function params(uint256 quorum) internal pure returns (IComputePool.PoolParams memory) {
        return IComputePool.PoolParams({
            invalidationWindow: WINDOW, rewardPerUnit: REWARD_PER_UNIT, slashPenalty: PENALTY, quorum: quorum
        });
    }

    /// @dev A pool of `manager` with the fixture's recorder and both validators.
    function createPool(bytes32 runId, uint256 quorum) internal returns (ComputePool) {
        address[] memory recorders = new address[](1);
        recorders[0] = recorder;
        address[] memory validators = new address[](2);
        (validators[0], validators[1]) = (validator, validator2);
        vm.prank(admin);
        return ComputePool(manager.createPool(runId, admin, params(quorum), recorders, validators));
    }

    /// @dev Warps past `p`'s delay: every change scheduled before applies (or is due).
    function passDelay(ComputePool p) internal {
        vm.warp(block.timestamp + p.SLASH_CHANGE_DELAY());
    }

    /// @dev The admin schedules granting (`grant`) or revoking `role` for `account` on `p`.
    function scheduleRole(ComputePool p, bytes32 role, address account, bool grant) internal {
        vm.prank(admin);
        p.scheduleRoleChange(role, account, grant);
    }

    /// @dev The admin schedules a role change on `p`, which is applied once the delay has passed.
    function changeRoleAfterDelay(ComputePool p, bytes32 role, address account, bool grant) internal {
        scheduleRole(p, role, account, grant);
        passDelay(p);
        p.applyRoleChange(role, account);
    }

    function mint(address to, uint256 amount) internal {
        vm.prank(admin);
        token.mint(to, amount);
    }

    function consentSig(uint256 nodePk, address provider, uint256 deadline) internal view returns (bytes memory) {
        address n = vm.addr(nodePk);
        return signDigest(nodePk, registry.consentDigest(provider, n, registry.consentNonce(n), deadline));
    }

    function register(address provider) internal {
        vm.prank(provider);
        registry.registerProvider();
    }

    function addNode(address provider, uint256 nodePk) internal {
        bytes memory sig = consentSig(nodePk, provider, block.timestamp + 1 hours);
        vm.prank(provider);
        registry.addNode(vm.addr(nodePk), block.timestamp + 1 hours, sig);
    }

    function stakeAs(address provider, uint256 amount) internal {
        mint(provider, amount);
        vm.startPrank(provider);
        token.approve(address(manager), amount);
        manager.stake(amount);
        vm.stopPrank();
    }

    /// @dev Registers `provider`, adds the node, stakes MIN_STAKE and joins the pool.
    function onboard(address provider, uint256 nodePk) internal {
        if (!registry.isProvider(provider)) register(provider);
        addNode(provider, nodePk);
        stakeAs(provider, MIN_STAKE);
        vm.prank(provider);
        pool.joinPool(vm.addr(nodePk));
    }

    function fundPool(uint256 amount) internal {
        mint(admin, amount);
        vm.startPrank(admin);
        token.approve(address(pool), amount);
        pool.fund(amount);
        vm.stopPrank();
    }

    function submission(address n, uint64 step, bytes32 rollout)
        internal
        pure
        returns (IComputePool.Submission memory)
    {
        return IComputePool.Submission({runId: RUN, node: n, step: step, rolloutDigest: rollout});
    }

    /// @dev Three submissions by `n` (steps 1..3) and the commitment over them.
    function commitThree(address n)
        internal
        view
        returns (IComputePool.Submission[] memory subs, bytes32[] memory leaves, bytes32 root)
    {
        subs = new IComputePool.Submission[](3);
        leaves = new bytes32[](3);
        for (uint256 i; i < 3; ++i) {
            subs[i] = submission(n, uint64(i + 1), keccak256(abi.encode("rollout", i)));
            leaves[i] = MerkleBuilder.leaf(pool.submissionDigest(subs[i]));
        }
        root = MerkleBuilder.root(leaves);
    }

    // ---- recorded work ----

    /// @dev `n`'s leaf in pool `p` under the node's latest membership.
    function leafIn(ComputePool p, address n, uint128 units, bytes32 commitment)
        internal
        view
        returns (IComputePool.WorkLeaf memory)
    {
        (uint32 index,) = p.membershipOf(n);
        return IComputePool.WorkLeaf({node: n, membership: index, units: units, commitment: commitment});
    }

    function leafOf(address n, uint128 units, bytes32 commitment) internal view returns (IComputePool.WorkLeaf memory) {
        return leafIn(pool, n, units, commitment);
    }

    /// @dev The recorder records part `part` of `epoch` (leaves in ascending node order).
    function recordPart(uint64 epoch, uint32 part, IComputePool.WorkLeaf[] memory leaves) internal {
        vm.prank(recorder);
        pool.recordWork(epoch, part, leaves);
    }

    /// @dev `by` records part 0 of `epoch` in `p`, with `n`'s one leaf; returns it with its proof.
    function recordOneIn(ComputePool p, address by, uint64 epoch, address n, uint128 units, bytes32 commitment)
        internal
        returns (IComputePool.LeafRef memory)
    {
        IComputePool.WorkLeaf[] memory leaves = WorkParts.one(leafIn(p, n, units, commitment));
        vm.prank(by);
        p.recordWork(epoch, 0, leaves);
        return WorkParts.ref(epoch, 0, leaves, 0);
    }

    function recordOne(uint64 epoch, address n, uint128 units, bytes32 commitment)
        internal
        returns (IComputePool.LeafRef memory)
    {
        return recordOneIn(pool, recorder, epoch, n, units, commitment);
    }

    /// @dev `provider` claims the one leaf `r`.
    function claimAs(address provider, IComputePool.LeafRef memory r) internal returns (uint256) {
        IComputePool.LeafRef[] memory refs = WorkParts.list(r);
        vm.prank(provider);
        return pool.claim(refs);
    }

    function settlementOf(IComputePool.LeafRef memory r) internal view returns (uint256) {
        return uint256(pool.settlementOf(r.epoch, r.part, r.leaf.node));
    }

    /// @dev A submission of `n` (key `pk`) signed in `p`'s domain, whose lone leaf is a whole commitment.
    function signedLeaf(ComputePool p, uint256 pk, uint64 step)
        internal
        view
        returns (IComputePool.Submission memory sub, bytes memory sig, bytes32 root)
    {
        sub = submission(vm.addr(pk), step, keccak256(abi.encode("rollout", step)));
        bytes32 digest = p.submissionDigest(sub);
        sig = signDigest(pk, digest);
        root = MerkleBuilder.leaf(digest);
    }

    /// @notice A leaf and the evidence against it: a submission its node signed,
    /// the signature and the submission's proof against the leaf's commitment.
    struct Evidence {
        IComputePool.LeafRef ref;
        IComputePool.Submission sub;
        bytes sig;
        bytes32[] proof;
    }

    /// @dev `by` records in `p` part 0 of `epoch` with the 10-unit leaf of the node
    /// of key `pk`, whose commitment is one signed submission (step `step`).
    function recordSignedIn(ComputePool p, address by, uint64 epoch, uint256 pk, uint64 step)
        internal
        returns (Evidence memory e)
    {
        bytes32 root;
        (e.sub, e.sig, root) = signedLeaf(p, pk, step);
        e.ref = recordOneIn(p, by, epoch, vm.addr(pk), 10, root);
        e.proof = new bytes32[](0);
    }

    function recordSigned(uint64 epoch, uint256 pk, uint64 step) internal returns (Evidence memory) {
        return recordSignedIn(pool, recorder, epoch, pk, step);
    }

    /// @dev Node `n` takes itself out of the pool.
    function leaveAsNode(address n) internal {
        vm.prank(n);
        pool.leavePool(n);
    }

    /// @dev `provider` joins its node `n` to the pool.
    function joinAs(address provider, address n) internal {
        vm.prank(provider);
        pool.joinPool(n);
    }

    /// @dev Validator `v`'s slash vote in `p` with evidence `e`.
    function slashWith(ComputePool p, address v, Evidence memory e) internal {
        vm.prank(v);
        p.slash(e.ref, e.sub, e.sig, e.proof);
    }

    function invalidateAs(address v, IComputePool.LeafRef memory r) internal {
        vm.prank(v);
        pool.invalidate(r);
    }
}
