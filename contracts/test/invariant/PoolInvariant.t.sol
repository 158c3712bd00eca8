// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {ComputePool} from "../../src/ComputePool.sol";
import {IComputePool} from "../../src/interfaces/IComputePool.sol";
import {ProviderRegistry} from "../../src/ProviderRegistry.sol";
import {StakeManager} from "../../src/StakeManager.sol";
import {StakeToken} from "../../src/StakeToken.sol";
import {TestBase} from "../utils/TestBase.sol";
import {ProtocolFixture} from "../utils/Fixtures.sol";
import {MerkleBuilder, WorkParts} from "../utils/Merkle.sol";

/// @notice Plays every party of a run in random order: funders, the recorder
/// recording parts of up to three leaves (also naming a membership that is not
/// live, a node no one runs, and, colluding, a signed leaf it already used),
/// validators voting to invalidate and slash, an admin changing every
/// parameter and scheduling grants and revocations of validators (which anyone
/// applies once due), also one that appoints itself recorder and validator,
/// lowers the quorum and slashes honest signed work, and providers joining, leaving, trying to dodge their stake (remove
/// the node, unbond, withdraw, re-add it, top up, rejoin), claiming and
/// releasing. It keeps a ghost of what each party is owed, of each leaf's
/// settlement, and of when each change that eases slashing applies, and flags
/// every action whose outcome breaks a promise of the protocol.
contract PoolHandler is TestBase {
    StakeToken token;
    ComputePool public pool;
    StakeManager manager;
    ProviderRegistry registry;
    address admin;
    uint256[2] nodePks;
    address[2] public nodes;
    address[2] public providers;
    address[3] validators;
    /// @dev A node no one runs: its leaves name a membership that never existed.
    address public constant STRANGER = address(0x5742);

    /// @dev One recorded leaf: leaf `pos` of part `part` of `epoch`, with the
    /// part's terms (a part is never overwritten: see `overwrites`).
    struct Leaf {
        uint64 epoch;
        uint32 part;
        uint32 pos;
        uint64 recordedAt;
        uint64 unlocksAt;
        uint128 rewardPerUnit;
        IComputePool.WorkLeaf leaf;
    }

    Leaf[] leaves;
    mapping(bytes32 partKey => IComputePool.WorkLeaf[]) partLeaves;
    /// @dev What the ghost saw become of each leaf, in `leaves` order.
    IComputePool.Settlement[] public ghostSettled;
    mapping(uint64 epoch => uint32) nextPart;
    /// @dev The step of the one signed submission a commitment holds.
    mapping(bytes32 commitment => uint64) stepOf;
    mapping(uint256 node => uint64[]) stepsOf;
    /// @dev The steps of the node's signed submissions that were evidence for a slash.
    mapping(uint256 node => uint64[]) slashedSteps;
    uint64 stepNonce;
    uint256 lastTarget;
    /// @dev Epochs from here on are used by no record yet.
    uint64 nextEpoch = 1000;
    uint256 public ghostFunded;
    uint256 public ghostPaid;
    uint256 public ghostSlashed;

    /// @dev Action counter: a vote counts if cast after the validator's last grant.
    uint256 seq = 1;
    mapping(address validator => uint256) lastGrant;
    /// @dev The ghost's own account of when each validator's slash votes count
    /// (zero for those of the deployment), of the quorum and penalty now, and
    /// of a change of either waiting to apply.
    mapping(address validator => uint256) ghostVotesAt;
    uint256 ghostQuorum;
    uint256 ghostQuorumNext;
    uint256 ghostQuorumAt;
    uint256 ghostPenalty;
    uint256 ghostPenaltyNext;
    uint256 ghostPenaltyAt;
    /// @dev Accounts given a role after deployment; no slashed token may reach one.
    address[] public addedLater;
    mapping(address => bool) isAddedLater;
    mapping(bytes32 ballot => mapping(address validator => uint256)) votedAt;

    /// @dev A role change the admin scheduled, due from `due`.
    struct RoleChange {
        bytes32 role;
        address account;
        bool grant;
        uint256 due;
    }

    RoleChange[] roleChanges;
    mapping(bytes32 digest => uint256) slashesWith;

    uint256 public executionsWithoutQuorum;
    uint256 public evidenceReused;
    uint256 public votesOnSlashed;
    uint256 public shortSlashes;
    uint256 public overSlashes;
    uint256 public unbackedSlashes;
    uint256 public lateVotes;
    uint256 public validClaimsRefused;
    uint256 public badClaims;
    uint256 public badReleases;
    uint256 public settledChanged;
    uint256 public overwrites;
    uint256 public wrongRoots;
    uint256 public badJoins;
    uint256 public unbackedUnbonds;
    uint256 public wrongRefusals;
    uint256 public slashes;
    uint256 public dodges;
    uint256 public earlySlashVotes;
    uint256 public earlyRoleChanges;
    uint256 public wrongPenalties;
    uint256 public adminSlashes;

    constructor(
        StakeToken token_,
        ComputePool pool_,
        StakeManager manager_,
        ProviderRegistry registry_,
        address admin_,
        uint256[2] memory pks,
        address[2] memory ps,
        address[3] memory vs
    ) {
        (token, pool, manager, registry, admin) = (token_, pool_, manager_, registry_, admin_);
        nodePks = pks;
        nodes = [vm.addr(pks[0]), vm.addr(pks[1])];
        providers = ps;
        validators = vs;
        (ghostQuorum, ghostPenalty) = (pool_.quorum(), pool_.slashPenalty());
        // The test schedules these two roles right after deploying this handler, and applies them once due.
        uint256 due = block.timestamp + pool_.SLASH_CHANGE_DELAY();
        _noteGrant(address(this), false, due);
        _noteGrant(vs[2], true, due);
    }

    /// @dev Every action comes a second after the one before (a block apart):
    /// what happens within one second is left to the unit tests.
    modifier step() {
        ++seq;
        vm.warp(block.timestamp + 1);
        _;
    }

    /// @dev `account` was granted a role, scheduled to be due from `due`.
    function _noteGrant(address account, bool validatorRole, uint256 due) internal {
        if (!isAddedLater[account]) {
            isAddedLater[account] = true;
            addedLater.push(account);
        }
        if (validatorRole) {
            lastGrant[account] = seq;
            ghostVotesAt[account] = due;
        }
    }

    /// @dev The admin schedules granting (`grant`) or revoking `role` for `account`.
    function _schedule(bytes32 role, address account, bool grant) internal {
        vm.prank(admin);
        pool.scheduleRoleChange(role, account, grant);
        uint256 due = block.timestamp + pool.SLASH_CHANGE_DELAY();
        if (grant && !isAddedLater[account]) {
            isAddedLater[account] = true;
            addedLater.push(account);
        }
        for (uint256 k; k < roleChanges.length; ++k) {
            RoleChange storage c = roleChanges[k];
            if (c.role == role && c.account == account) {
                (c.grant, c.due) = (grant, due); // a new schedule replaces the one waiting
                return;
            }
        }
        roleChanges.push(RoleChange(role, account, grant, due));
    }

    function _grant(bytes32 role, address account) internal {
        _schedule(role, account, true);
    }

    /// @notice Anyone applies the scheduled role changes: each only once due.
    function applyRoleChanges() external step {
        bytes32 validatorRole = pool.VALIDATOR_ROLE();
        for (uint256 k; k < roleChanges.length;) {
            RoleChange memory c = roleChanges[k];
            bool held = pool.hasRole(c.role, c.account);
            try pool.applyRoleChange(c.role, c.account) {
                if (block.timestamp < c.due) ++earlyRoleChanges;
                if (c.grant && !held) _noteGrant(c.account, c.role == validatorRole, c.due);
                roleChanges[k] = roleChanges[roleChanges.length - 1];
                roleChanges.pop();
            } catch {
                ++k; // not yet due, or a revocation the quorum does not allow
            }
        }
    }

    function _ghostQuorum() internal view returns (uint256) {
        return ghostQuorumAt != 0 && block.timestamp >= ghostQuorumAt ? ghostQuorumNext : ghostQuorum;
    }

    function _ghostPenalty() internal view returns (uint256) {
        return ghostPenaltyAt != 0 && block.timestamp >= ghostPenaltyAt ? ghostPenaltyNext : ghostPenalty;
    }

    function _setQuorum(uint256 q) internal {
        uint256 now_ = _ghostQuorum();
        vm.prank(admin);
        pool.setQuorum(q);
        if (q >= now_) (ghostQuorum, ghostQuorumAt) = (q, 0);
        else (ghostQuorum, ghostQuorumNext, ghostQuorumAt) = (now_, q, block.timestamp + pool.SLASH_CHANGE_DELAY());
    }

    function _sub(uint256 i, uint64 s) internal view returns (IComputePool.Submission memory) {
        return IComputePool.Submission(pool.runId(), nodes[i], s, keccak256(abi.encode("rollout", i, s)));
    }

    function _mintTo(address to, uint256 amount) internal {
        vm.prank(admin);
        token.mint(to, amount);
    }

    // ---- the ghost's view of recorded leaves ----

    function _partKey(uint64 epoch, uint32 part) internal pure returns (bytes32) {
        return keccak256(abi.encode(epoch, part));
    }

    function leafCount() external view returns (uint256) {
        return leaves.length;
    }

    /// @notice Recorded leaf `k`, with the part it is in.
    function leafAt(uint256 k) public view returns (uint64 epoch, uint32 part, IComputePool.WorkLeaf memory leaf) {
        Leaf storage l = leaves[k];
        return (l.epoch, l.part, l.leaf);
    }

    /// @dev Leaf `k` with its proof, as anyone rebuilds it from the logs.
    function _ref(uint256 k) internal view returns (IComputePool.LeafRef memory) {
        Leaf storage l = leaves[k];
        IComputePool.WorkLeaf[] memory ls = partLeaves[_partKey(l.epoch, l.part)];
        return WorkParts.ref(l.epoch, l.part, ls, l.pos);
    }

    /// @dev Whether membership `m` was live at `recordedAt`.
    function _backs(IComputePool.Membership memory m, uint256 recordedAt) internal pure returns (bool) {
        return m.provider != address(0) && m.joinedAt <= recordedAt && (m.leftAt == 0 || m.leftAt > recordedAt);
    }

    /// @dev Notes what became of leaf `k`; a settled leaf never changes.
    function _noteSettlement(uint256 k) internal {
        (uint64 epoch, uint32 part, IComputePool.WorkLeaf memory leaf) = leafAt(k);
        IComputePool.Settlement now_ = pool.settlementOf(epoch, part, leaf.node);
        IComputePool.Settlement was = ghostSettled[k];
        if (was != IComputePool.Settlement.Open && now_ != was) ++settledChanged;
        ghostSettled[k] = now_;
    }

    /// @dev `n`'s leaf under its latest membership, committing one signed submission of step `s`.
    function _leafOf(uint256 i, uint128 units, uint64 s) internal returns (IComputePool.WorkLeaf memory) {
        (uint32 index,) = pool.membershipOf(nodes[i]);
        bytes32 commitment = MerkleBuilder.leaf(pool.submissionDigest(_sub(i, s)));
        stepOf[commitment] = s;
        stepsOf[i].push(s);
        return IComputePool.WorkLeaf(nodes[i], index, units, commitment);
    }

    /// @dev `by` records part `part` of `epoch`; the ghost keeps its leaves and checks its terms.
    function _recordAs(address by, uint64 epoch, uint32 part, IComputePool.WorkLeaf[] memory ls) internal {
        vm.prank(by);
        pool.recordWork(epoch, part, ls);
        IComputePool.PartRecord memory rec = pool.recordOf(epoch, part);
        if (rec.root != WorkParts.root(ls)) ++wrongRoots;
        bytes32 key = _partKey(epoch, part);
        for (uint256 pos; pos < ls.length; ++pos) {
            partLeaves[key].push(ls[pos]);
            leaves.push(Leaf(epoch, part, uint32(pos), rec.recordedAt, rec.unlocksAt, rec.rewardPerUnit, ls[pos]));
            ghostSettled.push(IComputePool.Settlement.Open);
        }
    }

    // ---- funders and the recorder ----

    function fund(uint256 amount) external step {
        amount = bound(amount, 1, 1e24);
        _mintTo(address(this), amount);
        token.approve(address(pool), amount);
        pool.fund(amount);
        ghostFunded += amount;
    }

    /// @notice Records the next one or two parts of an epoch, each of some of
    /// the two nodes and the stranger (see `_partLeaves`); a third of the time
    /// a node's commitment is a signed leaf it already had committed, perhaps
    /// under an earlier membership. Now and then it tries to record a part again.
    function recordWork(uint256 epochSeed, uint256 mask, uint256 units, uint256 reuse, uint256 stale) external step {
        uint64 epoch = uint64(bound(epochSeed, 0, 15));
        for (uint256 parts = 1 + units % 2; parts > 0; --parts) {
            uint32 part = nextPart[epoch]++;
            IComputePool.WorkLeaf[] memory ls = _partLeaves(mask, units, reuse, stale);
            _recordAs(address(this), epoch, part, ls);
            if (reuse % 4 == 1) {
                try pool.recordWork(epoch, part, ls) {
                    ++overwrites;
                } catch {}
            }
            (mask, units, reuse, stale) = (mask / 12, units >> 1, reuse / 4, stale / 7);
        }
    }

    /// @dev A part's leaves in ascending node order: of node 0, node 1 and the
    /// stranger as `mask` picks, a node only while it is joined (as an honest
    /// recorder would), unless `stale` makes the recorder name a membership that
    /// is not live: the latest one of a node out of the pool, or the one
    /// before or after it.
    function _partLeaves(uint256 mask, uint256 units, uint256 reuse, uint256 stale)
        internal
        returns (IComputePool.WorkLeaf[] memory ls)
    {
        bool mistaken = stale % 7 < 2;
        // node 0, node 1 or both; the stranger besides a quarter of the time
        mask = (mask % 3 + 1) | ((mask / 3) % 4 == 0 ? 4 : 0);
        for (uint256 i; i < 2; ++i) {
            if (!mistaken && !pool.isJoined(nodes[i])) mask &= ~(uint256(1) << i);
        }
        if (mask == 0) mask = 4;
        ls = new IComputePool.WorkLeaf[]((mask & 1) + (mask >> 1 & 1) + (mask >> 2));
        uint256 n;
        for (uint256 i; i < 2; ++i) {
            if (mask >> i & 1 == 0) continue;
            uint64 s = ++stepNonce;
            if (reuse % 3 == 0 && stepsOf[i].length != 0) s = stepsOf[i][(reuse / 3) % stepsOf[i].length];
            IComputePool.WorkLeaf memory leaf = _leafOf(i, uint128(bound(units >> (64 * i), 1, 1e3)), s);
            if (stale % 7 == 0) leaf.membership += 1; // one that does not exist (yet)
            else if (stale % 7 == 1 && leaf.membership != 0) leaf.membership -= 1; // an earlier one
            ls[n++] = leaf;
        }
        if (mask >> 2 == 1) ls[n] = IComputePool.WorkLeaf(STRANGER, 1, uint128(bound(units, 1, 1e3)), bytes32(0));
        WorkParts.sort(ls);
    }

    /// @notice The colluding recorder: one signed leaf committed in two fresh
    /// parts of a joined node's membership, then every current validator votes
    /// to slash with it in both.
    function colludeWithOneLeaf(uint256 nodeSeed) external step {
        uint256 i = nodeSeed % 2;
        if (!pool.isJoined(nodes[i])) return;
        uint64 e = nextEpoch;
        nextEpoch += 2;
        IComputePool.WorkLeaf[] memory ls = WorkParts.one(_leafOf(i, 1, ++stepNonce));
        _recordAs(address(this), e, 0, ls);
        _recordAs(address(this), e + 1, 0, ls);
        uint256 last = leaves.length - 1;
        for (uint256 k; k < 6; ++k) {
            address v = validators[k % 3];
            if (pool.hasRole(pool.VALIDATOR_ROLE(), v)) _voteSlash(last - 1 + k / 3, v);
        }
    }

    /// @notice The slashed provider comes back (topping up, re-adding and
    /// rejoining its node as needed) and the colluding recorder commits,
    /// under the new membership, a signed leaf that already was evidence for a
    /// slash; every current validator votes to slash with it again.
    function replayEvidence(uint256 nodeSeed) external step {
        uint256 i = nodeSeed % 2;
        uint256 used = slashedSteps[i].length;
        if (used == 0) return;
        address p = providers[i];
        _mintTo(p, 200 ether);
        vm.startPrank(p);
        token.approve(address(manager), 200 ether);
        manager.stake(200 ether);
        vm.stopPrank();
        if (registry.providerOf(nodes[i]) == address(0)) _readd(i);
        if (!pool.isJoined(nodes[i])) _join(i);
        if (!pool.isJoined(nodes[i])) return;
        IComputePool.WorkLeaf[] memory ls = WorkParts.one(_leafOf(i, 1, slashedSteps[i][nodeSeed / 2 % used]));
        _recordAs(address(this), nextEpoch++, 0, ls);
        for (uint256 k; k < 3; ++k) {
            if (pool.hasRole(pool.VALIDATOR_ROLE(), validators[k])) _voteSlash(leaves.length - 1, validators[k]);
        }
    }

    // ---- validators ----

    /// @dev Votes of validators (the admin among them) holding the role in the
    /// term they voted in, as the ghost saw them.
    function _liveVotes(bytes32 ballot) internal view returns (uint256 n) {
        for (uint256 k; k < 4; ++k) {
            address v = k < 3 ? validators[k] : admin;
            if (pool.hasRole(pool.VALIDATOR_ROLE(), v) && votedAt[ballot][v] > lastGrant[v]) ++n;
        }
    }

    /// @dev Half the votes go to the leaf voted on last, so that ballots gather
    /// votes from several validators, some of them revoked in between.
    function _target(uint256 leafSeed) internal returns (uint256 k) {
        k = leafSeed % 2 == 0 && lastTarget < leaves.length ? lastTarget : leafSeed / 2 % leaves.length;
        lastTarget = k;
    }

    function invalidate(uint256 leafSeed, uint256 validatorSeed) external step {
        if (leaves.length == 0) return;
        _voteInvalidate(_target(leafSeed), validators[validatorSeed % 3]);
    }

    /// @notice A validator votes to invalidate a leaf, its key is revoked (the
    /// quorum allowing), another votes on the same leaf, and the first is
    /// appointed again: the revoked vote must not count, nor come back.
    function voteAcrossARevocation(uint256 leafSeed, uint256 seed) external step {
        if (leaves.length == 0) return;
        bytes32 role = pool.VALIDATOR_ROLE();
        (address a, address b) = (validators[seed % 3], validators[(seed + 1) % 3]);
        if (!pool.hasRole(role, a) || !pool.hasRole(role, b)) return;
        if (_ghostQuorum() < 2) _setQuorum(2);
        uint256 k = _target(leafSeed);
        if (!_voteInvalidate(k, a)) return;
        vm.prank(a);
        try pool.renounceRole(role, a) {}
        catch {
            return;
        }
        ++seq;
        _voteInvalidate(k, b);
        _grant(role, a); // scheduled: applied by `applyRoleChanges` once due
        ++seq;
        _voteInvalidate(k, a);
    }

    /// @dev One invalidation vote by `v` on leaf `k`, and the ghost's verdict on what it executed.
    function _voteInvalidate(uint256 k, address v) internal returns (bool voted) {
        IComputePool.LeafRef memory r = _ref(k);
        bytes32 ballot = keccak256(abi.encode(r.epoch, r.part, r.leaf.node));
        vm.prank(v);
        try pool.invalidate(r) {
            voted = true;
        } catch {
            return false;
        }
        votedAt[ballot][v] = seq;
        if (block.timestamp >= leaves[k].unlocksAt) ++lateVotes;
        if (
            ghostSettled[k] == IComputePool.Settlement.Open
                && pool.settlementOf(r.epoch, r.part, r.leaf.node) == IComputePool.Settlement.Invalidated
        ) {
            if (_liveVotes(ballot) < _ghostQuorum()) ++executionsWithoutQuorum;
        }
        _noteSettlement(k);
    }

    function slash(uint256 leafSeed, uint256 validatorSeed) external step {
        if (leaves.length == 0) return;
        _voteSlash(_target(leafSeed), validators[validatorSeed % 3]);
    }

    /// @dev One slash vote by `v` against leaf `k` with its commitment's signed
    /// submission, and the ghost's verdict on what it executed.
    function _voteSlash(uint256 k, address v) internal {
        IComputePool.LeafRef memory r = _ref(k);
        if (r.leaf.node == STRANGER) return;
        uint256 i = r.leaf.node == nodes[0] ? 0 : 1;
        IComputePool.Submission memory sub = _sub(i, stepOf[r.leaf.commitment]);
        bytes32 digest = pool.submissionDigest(sub);
        bytes32 ballot = keccak256(abi.encode(r.leaf.node, r.leaf.membership, digest));
        IComputePool.Membership memory before = pool.membershipAt(r.leaf.node, r.leaf.membership);
        IComputePool.PartRecord memory rec = pool.recordOf(r.epoch, r.part);
        uint256 expected = pool.slashPenalty();
        if (before.penalty < expected) expected = before.penalty;
        uint256 treasuryBefore = token.balanceOf(manager.treasury());
        vm.prank(v);
        try pool.slash(r, sub, signDigest(nodePks[i], digest), new bytes32[](0)) {
            votedAt[ballot][v] = seq;
        } catch {
            return;
        }
        if (block.timestamp < ghostVotesAt[v]) ++earlySlashVotes;
        if (block.timestamp >= rec.unlocksAt) ++lateVotes;
        if (!_backs(before, rec.recordedAt)) ++unbackedSlashes;
        if (before.slashed) ++votesOnSlashed;
        _noteSettlement(k);
        if (before.slashed || !pool.membershipAt(r.leaf.node, r.leaf.membership).slashed) return;
        ++slashes;
        if (v == admin) ++adminSlashes;
        if (_liveVotes(ballot) < _ghostQuorum()) ++executionsWithoutQuorum;
        if (++slashesWith[digest] > 1) ++evidenceReused;
        slashedSteps[i].push(sub.step);
        uint256 taken = token.balanceOf(manager.treasury()) - treasuryBefore;
        if (taken > expected) ++overSlashes;
        else if (taken < expected) ++shortSlashes;
        ghostSlashed += taken;
        _claimForfeited(before.provider, r.leaf.node, r.leaf.membership);
    }

    /// @dev The provider of a membership just slashed claims what it recorded
    /// and has not been paid, past its window: forfeited, so refused.
    function _claimForfeited(address provider, address node, uint32 membership) internal {
        for (uint256 k; k < leaves.length; ++k) {
            Leaf storage l = leaves[k];
            if (l.leaf.node != node || l.leaf.membership != membership || block.timestamp < l.unlocksAt) continue;
            if (ghostSettled[k] != IComputePool.Settlement.Open) continue;
            IComputePool.LeafRef[] memory refs = WorkParts.list(_ref(k));
            vm.prank(provider);
            try pool.claim(refs) returns (uint256 paid) {
                ++badClaims;
                ghostPaid += paid;
            } catch {}
            _noteSettlement(k);
        }
    }

    // ---- the admin ----

    /// @notice One move of the admin's: appoint or revoke a validator (or one
    /// renounces), eject a node, or set a parameter of the pool or the stake
    /// manager, within its bounds or beyond them.
    function adminActs(uint256 which, uint256 value) external step {
        which %= 9;
        if (which == 0) {
            address v = validators[value % 3];
            if (!pool.hasRole(pool.VALIDATOR_ROLE(), v)) _grant(pool.VALIDATOR_ROLE(), v);
        } else if (which == 1) {
            _revokeValidator(value);
        } else if (which == 2) {
            vm.prank(admin);
            pool.eject(nodes[value % 2]);
        } else if (which == 3) {
            _setQuorum(bound(value, 0, 5));
        } else if (which == 4) {
            vm.prank(admin);
            pool.setInvalidationWindow(bound(value, 0, 40 days));
        } else if (which == 5) {
            _setSlashPenalty(bound(value, 0, 300 ether));
        } else if (which == 6) {
            vm.prank(admin);
            pool.setRewardPerUnit(bound(value, 0, 1e20));
        } else if (which == 7) {
            vm.prank(admin);
            manager.setUnbondingPeriod(bound(value, 0, 40 days));
        } else {
            vm.prank(admin);
            manager.setMinStakePerNode(bound(value, 0, 300 ether));
        }
    }

    /// @notice The admin appoints itself recorder and validator and lowers the
    /// quorum to one (what it would need to slash alone).
    function adminTakesOver() external step {
        if (!pool.hasRole(pool.RECORDER_ROLE(), admin)) _grant(pool.RECORDER_ROLE(), admin);
        if (!pool.hasRole(pool.VALIDATOR_ROLE(), admin)) _grant(pool.VALIDATOR_ROLE(), admin);
        _setQuorum(1);
    }

    /// @notice The admin, as recorder, records a fresh part holding a node's
    /// leaf whose one submission is honest and signed, and votes to slash it.
    function adminSlashesHonestWork(uint256 nodeSeed) external step {
        if (!pool.hasRole(pool.RECORDER_ROLE(), admin) || !pool.hasRole(pool.VALIDATOR_ROLE(), admin)) return;
        if (!pool.isJoined(nodes[nodeSeed % 2])) return;
        uint64 e = nextEpoch++;
        _recordAs(admin, e, 0, WorkParts.one(_leafOf(nodeSeed % 2, 1, ++stepNonce)));
        _voteSlash(leaves.length - 1, admin);
    }

    function _revokeValidator(uint256 seed) internal {
        address v = seed % 5 == 4 ? admin : validators[seed % 3];
        bytes32 role = pool.VALIDATOR_ROLE();
        if (seed % 2 == 0) {
            _schedule(role, v, false);
        } else {
            vm.prank(v);
            pool.renounceRole(role, v);
        }
    }

    function _setSlashPenalty(uint256 p) internal {
        uint256 now_ = _ghostPenalty();
        vm.prank(admin);
        pool.setSlashPenalty(p);
        if (p <= now_) {
            (ghostPenalty, ghostPenaltyAt) = (p, 0);
        } else {
            (ghostPenalty, ghostPenaltyNext, ghostPenaltyAt) = (now_, p, block.timestamp + pool.SLASH_CHANGE_DELAY());
        }
    }

    // ---- providers ----

    /// @notice The provider joins its node, under a new membership; if it is
    /// joined, it leaves and joins again (to shed its work, or its bond).
    function join(uint256 nodeSeed) external step {
        uint256 i = nodeSeed % 2;
        if (registry.providerOf(nodes[i]) != providers[i]) return;
        if (pool.isJoined(nodes[i])) {
            vm.prank(providers[i]);
            pool.leavePool(nodes[i]);
        }
        _join(i);
    }

    /// @dev A join, refused exactly when the provider's stake would not cover
    /// its nodes and its bonds.
    function _join(uint256 i) internal {
        (address p, address n) = (providers[i], nodes[i]);
        bool covered = manager.coversNodes(p, registry.nodesOf(p).length)
            && manager.stakeOf(p) >= manager.bondedOf(p) + pool.slashPenalty();
        vm.prank(p);
        try pool.joinPool(n) {
            if (!covered || manager.stakeOf(p) < manager.bondedOf(p)) ++badJoins;
            _checkJoinPenalty(n);
        } catch {
            if (covered) ++badJoins;
        }
    }

    /// @dev A membership bonds the penalty in force at its join, a higher one
    /// only from its delay on.
    function _checkJoinPenalty(address n) internal {
        (, IComputePool.Membership memory m) = pool.membershipOf(n);
        if (m.penalty != _ghostPenalty()) ++wrongPenalties;
    }

    function leave(uint256 nodeSeed, bool byNode) external step {
        uint256 i = nodeSeed % 2;
        vm.prank(byNode ? nodes[i] : providers[i]);
        pool.leavePool(nodes[i]);
    }

    /// @dev An unbond of `amount`: refused exactly when what stays active would
    /// not cover the provider's nodes or its bonds.
    function _unbond(address p, uint256 amount) internal {
        uint256 active = manager.stakeOf(p);
        uint256 required = manager.minStakePerNode() * registry.nodesOf(p).length;
        uint256 bonded = manager.bondedOf(p);
        if (bonded > required) required = bonded;
        vm.prank(p);
        try manager.requestUnbond(amount) {
            if (manager.stakeOf(p) < required) ++unbackedUnbonds;
        } catch {
            if (amount != 0 && amount <= active && active - amount >= required) ++wrongRefusals;
        }
    }

    function unbond(uint256 seed, uint256 amount) external step {
        address p = providers[seed % 2];
        uint256 active = manager.stakeOf(p);
        if (active == 0) return;
        _unbond(p, bound(amount, 1, active));
    }

    function withdraw(uint256 seed) external step {
        address p = providers[seed % 2];
        vm.prank(p);
        manager.withdraw();
    }

    /// @notice The dodge: remove the node from the registry (its membership
    /// stays), try to unbond everything, then what the bonds allow, withdraw
    /// what matured, and (half the time) re-add the node with a fresh consent.
    function dodge(uint256 nodeSeed) external step {
        uint256 i = nodeSeed % 2;
        address p = providers[i];
        if (registry.providerOf(nodes[i]) == p) {
            vm.prank(p);
            registry.removeNode(nodes[i]);
        }
        uint256 active = manager.stakeOf(p);
        if (active != 0) _unbond(p, active);
        active = manager.stakeOf(p);
        uint256 bonded = manager.bondedOf(p);
        if (active > bonded) _unbond(p, active - bonded);
        (, uint256 withdrawable) = manager.unbondingOf(p);
        if (withdrawable != 0) {
            vm.prank(p);
            manager.withdraw();
        }
        if (nodeSeed / 2 % 2 == 0) _readd(i);
        ++dodges;
    }

    /// @dev The provider adds its node back to the registry, with a fresh consent.
    function _readd(uint256 i) internal {
        uint256 deadline = block.timestamp + 1 hours;
        bytes32 digest = registry.consentDigest(providers[i], nodes[i], registry.consentNonce(nodes[i]), deadline);
        vm.prank(providers[i]);
        registry.addNode(nodes[i], deadline, signDigest(nodePks[i], digest));
    }

    /// @notice The provider re-adds its node if it had removed it, tops up its
    /// stake and rejoins.
    function topUpAndRejoin(uint256 nodeSeed, uint256 amount) external step {
        uint256 i = nodeSeed % 2;
        address p = providers[i];
        amount = bound(amount, 1, 200 ether);
        _mintTo(p, amount);
        vm.startPrank(p);
        token.approve(address(manager), amount);
        manager.stake(amount);
        vm.stopPrank();
        if (registry.providerOf(nodes[i]) == address(0)) _readd(i);
        if (!pool.isJoined(nodes[i])) _join(i);
    }

    /// @notice A provider claims every leaf the ghost deems payable to it
    /// (mostly after waiting for one leaf's window), a third of the time with
    /// one more leaf (a duplicate, another's, or one that cannot be paid): a
    /// list of payable leaves is paid exactly their rewards, any other refused whole.
    function claim(uint256 leafSeed, uint256 early, uint256 who) external step {
        if (leaves.length == 0) return;
        uint256 extra = leafSeed % leaves.length;
        uint256 unlocks = leaves[extra].unlocksAt;
        if (early % 4 != 0 && block.timestamp < unlocks) vm.warp(unlocks);
        address claimer = providers[who % 2];
        uint256[] memory ks = new uint256[](leaves.length + 1);
        uint256 n;
        uint256 expected;
        for (uint256 k; k < leaves.length; ++k) {
            (bool ok, uint256 reward) = _payableTo(claimer, k);
            if (!ok) continue;
            ks[n++] = k;
            expected += reward;
        }
        bool valid = who % 3 != 0;
        if (!valid) ks[n++] = _unpayableTo(claimer, extra);
        if (n == 0) return;
        IComputePool.LeafRef[] memory refs = new IComputePool.LeafRef[](n);
        for (uint256 i; i < n; ++i) {
            refs[i] = _ref(ks[i]);
        }
        uint256 before = token.balanceOf(claimer);
        vm.prank(claimer);
        try pool.claim(refs) returns (uint256 paid) {
            if (!valid || paid != expected || token.balanceOf(claimer) - before != paid) ++badClaims;
            ghostPaid += paid;
        } catch {
            if (valid) ++validClaimsRefused;
        }
        for (uint256 i; i < n; ++i) {
            _noteSettlement(ks[i]);
        }
    }

    /// @dev From leaf `k` on, a leaf open and past its window but not payable
    /// to `claimer`: preferably of a slashed membership of its own, else of
    /// one not live at the record, else another's; failing all, `k` itself
    /// (listed already, or not payable either).
    function _unpayableTo(address claimer, uint256 k) internal view returns (uint256) {
        (uint256 best, uint256 tier) = (k, 0);
        for (uint256 j; j < leaves.length && tier < 3; ++j) {
            uint256 c = (k + j) % leaves.length;
            if (ghostSettled[c] != IComputePool.Settlement.Open || block.timestamp < leaves[c].unlocksAt) continue;
            (bool ok,) = _payableTo(claimer, c);
            if (ok) continue;
            IComputePool.WorkLeaf storage l = leaves[c].leaf;
            IComputePool.Membership memory m = pool.membershipAt(l.node, l.membership);
            uint256 t = m.provider != claimer ? 1 : m.slashed ? 3 : 2;
            if (t > tier) (best, tier) = (c, t);
        }
        return best;
    }

    /// @dev Whether leaf `k` is payable to `claimer` now, and its reward.
    function _payableTo(address claimer, uint256 k) internal view returns (bool, uint256) {
        if (ghostSettled[k] != IComputePool.Settlement.Open) return (false, 0);
        Leaf storage l = leaves[k];
        if (block.timestamp < l.unlocksAt) return (false, 0);
        IComputePool.Membership memory m = pool.membershipAt(l.leaf.node, l.leaf.membership);
        bool ok = m.provider == claimer && _backs(m, l.recordedAt) && !m.slashed;
        return (ok, l.leaf.units * l.rewardPerUnit);
    }

    /// @notice Anyone releases a leaf: exactly those that can never be paid.
    function release(uint256 leafSeed) external step {
        if (leaves.length == 0) return;
        uint256 k = leafSeed % leaves.length;
        IComputePool.LeafRef memory r = _ref(k);
        IComputePool.Membership memory m = pool.membershipAt(r.leaf.node, r.leaf.membership);
        bool payable_ = _backs(m, leaves[k].recordedAt) && !m.slashed;
        bool releasable = ghostSettled[k] == IComputePool.Settlement.Open && !payable_;
        try pool.release(r) {
            if (!releasable) ++badReleases;
        } catch {
            if (releasable) ++badReleases;
        }
        _noteSettlement(k);
    }

    function warp(uint256 secs) external step {
        vm.warp(block.timestamp + bound(secs, 0, 12 hours));
    }

    /// @notice Long waits, so that delayed changes come to apply within a run.
    function warpDays(uint256 d) external step {
        vm.warp(block.timestamp + bound(d, 1, 62) * 1 days);
    }

    // ---- the ghost's accounts, for the invariants ----

    /// @notice The rewards of the leaves the pool holds unsettled, and how many
    /// leaves it holds settled otherwise than the ghost saw.
    function unsettledRewards() external view returns (uint256 owed, uint256 mismatches) {
        for (uint256 k; k < leaves.length; ++k) {
            Leaf storage l = leaves[k];
            IComputePool.Settlement s = pool.settlementOf(l.epoch, l.part, l.leaf.node);
            if (s != ghostSettled[k]) ++mismatches;
            if (s == IComputePool.Settlement.Open) owed += l.leaf.units * l.rewardPerUnit;
        }
    }

    /// @notice For each node, what its memberships with work that can still be
    /// slashed bonded at their joins, and what slashing each of them would take now.
    function slashableBonds() external view returns (uint256[2] memory bonded, uint256[2] memory due) {
        bool[][2] memory slashable;
        for (uint256 j; j < 2; ++j) {
            (uint32 last,) = pool.membershipOf(nodes[j]);
            slashable[j] = new bool[](last + 1);
        }
        for (uint256 k; k < leaves.length; ++k) {
            Leaf storage l = leaves[k];
            if (block.timestamp >= l.unlocksAt) continue;
            (address node, uint32 index) = (l.leaf.node, l.leaf.membership);
            if (node == STRANGER) continue;
            bool[] memory flags = slashable[node == nodes[0] ? 0 : 1];
            if (index == 0 || index >= flags.length || flags[index]) continue;
            IComputePool.Membership memory m = pool.membershipAt(node, index);
            flags[index] = !m.slashed && _backs(m, l.recordedAt);
        }
        uint256 penalty = pool.slashPenalty();
        for (uint256 j; j < 2; ++j) {
            for (uint256 idx = 1; idx < slashable[j].length; ++idx) {
                if (!slashable[j][idx]) continue;
                uint256 bond = pool.membershipAt(nodes[j], uint32(idx)).penalty;
                bonded[j] += bond;
                due[j] += bond < penalty ? bond : penalty;
            }
        }
    }

    function addedLaterCount() external view returns (uint256) {
        return addedLater.length;
    }

    function validator(uint256 k) external view returns (address) {
        return validators[k];
    }
}

contract PoolInvariantTest is ProtocolFixture {
    PoolHandler handler;

    function setUp() public {
        deployProtocol();
        fundPool(1e24);
        onboard(alice, NODE_PK);
        onboard(bob, NODE2_PK);
        stakeAs(alice, 20 ether); // little beyond the node's minimum: bonds bind
        stakeAs(bob, 20 ether);
        address validator3 = address(0x7A13);
        handler = new PoolHandler(
            token,
            pool,
            manager,
            registry,
            admin,
            [NODE_PK, NODE2_PK],
            [alice, bob],
            [validator, validator2, validator3]
        );
        (bytes32 recorderRole, bytes32 validatorRole) = (pool.RECORDER_ROLE(), pool.VALIDATOR_ROLE());
        scheduleRole(pool, recorderRole, address(handler), true);
        scheduleRole(pool, validatorRole, validator3, true);
        passDelay(pool);
        pool.applyRoleChange(recorderRole, address(handler));
        pool.applyRoleChange(validatorRole, validator3);
        targetContract(address(handler));
    }

    /// 1. Every membership with work that can still be slashed is bonded, and
    /// the stake behind the bonds covers the penalties of all of them. Joins
    /// and unbonds never leave the bonds uncovered, and a slash takes the
    /// membership's penalty (the current one if lower) in full.
    function invariant_stakeBacksEverySlashableRecord() public view {
        (uint256[2] memory bonded, uint256[2] memory due) = handler.slashableBonds();
        for (uint256 j; j < 2; ++j) {
            (address p, address n) = (handler.providers(j), handler.nodes(j));
            (uint256 joined, uint256 leaving, uint256 until) = pool.bondsOf(p);
            vm.assertLe(bonded[j], joined + (block.timestamp < until ? leaving : 0), "slashable work not bonded");
            (, IComputePool.Membership memory latest) = pool.membershipOf(n);
            vm.assertEq(joined, pool.isJoined(n) ? latest.penalty : 0, "joined memberships bond exactly");
            vm.assertLe(due[j], manager.stakeOf(p), "slashable penalties exceed the stake behind them");
        }
        vm.assertEq(handler.badJoins(), 0, "a join left the bonds uncovered, or one that covered them was refused");
        vm.assertEq(handler.unbackedUnbonds(), 0, "an unbond left a node or a bond uncovered");
        vm.assertEq(handler.wrongRefusals(), 0, "an unbond that kept everything covered was refused");
        vm.assertEq(handler.shortSlashes(), 0, "a slash took less than the membership's penalty");
        vm.assertEq(handler.overSlashes(), 0, "a slash took more than the membership's penalty");
    }

    /// 2. A signed submission is evidence for one penalty at most, a membership
    /// is slashed once, and only for work it backed.
    function invariant_evidenceSlashesOnce() public view {
        vm.assertEq(handler.evidenceReused(), 0, "a signed submission slashed twice");
        vm.assertEq(handler.votesOnSlashed(), 0, "a vote against a membership slashed already");
        vm.assertEq(handler.unbackedSlashes(), 0, "a slash vote on work its membership did not back");
        vm.assertEq(token.balanceOf(treasury), handler.ghostSlashed(), "treasury holds every slashed token");
        for (uint256 k; k < 3; ++k) {
            vm.assertEq(token.balanceOf(handler.validator(k)), 0, "a validator gained tokens");
        }
    }

    /// 3. Invalidations and slashes happen only on a quorum of current validators.
    function invariant_onlyCurrentValidatorsCount() public view {
        vm.assertEq(handler.executionsWithoutQuorum(), 0, "executed without a quorum of current validators");
    }

    /// 4. Reserved rewards are exactly what the unsettled leaves are owed, the
    /// pool holds them, a settled leaf never changes, no vote comes after the
    /// window, every payable leaf past its window is paid to its membership's
    /// provider and no other, and every unpayable one can be released.
    function invariant_paidWorkIsFinalAndValidWorkIsPaid() public view {
        (uint256 owed, uint256 mismatches) = handler.unsettledRewards();
        vm.assertEq(mismatches, 0, "a leaf settled behind the ghost's back");
        vm.assertEq(pool.reservedRewards(), owed, "reserved == rewards of unsettled leaves");
        vm.assertEq(pool.totalFunded(), handler.ghostFunded() + 1e24, "funded");
        vm.assertEq(pool.totalPaid(), handler.ghostPaid(), "paid");
        vm.assertEq(
            pool.totalPaid() + pool.reservedRewards() + pool.availableRewards(),
            pool.totalFunded(),
            "paid+reserved+available"
        );
        vm.assertEq(token.balanceOf(address(pool)), pool.reservedRewards() + pool.availableRewards(), "pool balance");
        vm.assertEq(handler.settledChanged(), 0, "a settled leaf changed");
        vm.assertEq(handler.lateVotes(), 0, "a vote counted after the window");
        vm.assertEq(handler.validClaimsRefused(), 0, "a payable leaf past its window could not be claimed");
        vm.assertEq(handler.badClaims(), 0, "a claim paid the wrong amount, too early or the wrong account");
        vm.assertEq(handler.badReleases(), 0, "a payable leaf was released, or an unpayable one could not be");
        vm.assertEq(handler.overwrites(), 0, "a recorded part was overwritten");
        vm.assertEq(handler.wrongRoots(), 0, "a part's root is not the tree of its leaves");
    }

    /// 5. Parameters stay in their bounds whatever the admin tries.
    function invariant_parametersStayBounded() public view {
        uint256 q = pool.quorum();
        vm.assertGe(q, 1, "quorum >= 1");
        vm.assertLe(q, pool.validatorCount(), "quorum <= validators");
        uint256 holders;
        for (uint256 k; k < 3; ++k) {
            if (pool.hasRole(pool.VALIDATOR_ROLE(), handler.validator(k))) ++holders;
        }
        if (pool.hasRole(pool.VALIDATOR_ROLE(), admin)) ++holders;
        vm.assertEq(pool.validatorCount(), holders, "validator count");
        vm.assertGe(pool.invalidationWindow(), pool.MIN_INVALIDATION_WINDOW(), "window never zero");
        vm.assertLe(pool.invalidationWindow(), manager.unbondingPeriod(), "window <= unbonding");
        (uint256 nextWindow,) = pool.pendingInvalidationWindow();
        vm.assertLe(nextWindow, manager.unbondingPeriod(), "a waiting window <= unbonding");
        vm.assertLe(manager.unbondingPeriod(), manager.MAX_UNBONDING_PERIOD(), "unbonding bounded");
        vm.assertLe(pool.slashPenalty(), manager.minStakePerNode(), "penalty <= min stake");
        (uint256 pending,) = pool.pendingSlashPenalty();
        vm.assertLe(pending, manager.minStakePerNode(), "a waiting penalty <= min stake");
        vm.assertEq(token.balanceOf(address(manager)), manager.totalStaked(), "stake conserved");
    }

    /// 6. No operator profits from a slash: slashed stake reaches only the
    /// deployment's treasury, never an account given a role after deployment
    /// (the admin appointing itself among them); such a recorder or validator
    /// holds its role only from SLASH_CHANGE_DELAY after the admin scheduled
    /// it, a lower quorum and a higher penalty apply only from that delay on.
    function invariant_noSlashReachesAnAccountAddedLater() public view {
        vm.assertEq(manager.treasury(), treasury, "the deployment's treasury");
        vm.assertEq(token.balanceOf(admin), 0, "the admin gained tokens");
        for (uint256 k; k < handler.addedLaterCount(); ++k) {
            vm.assertEq(token.balanceOf(handler.addedLater(k)), 0, "an account added later gained tokens");
        }
        vm.assertEq(handler.earlySlashVotes(), 0, "a slash vote counted before its validator's delay");
        vm.assertEq(handler.earlyRoleChanges(), 0, "a role change applied before its delay");
        vm.assertEq(handler.wrongPenalties(), 0, "a membership bonded a penalty not yet due");
    }
}
