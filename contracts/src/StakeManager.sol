// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

import {IComputePool} from "./interfaces/IComputePool.sol";
import {IPoolFactory} from "./interfaces/IPoolFactory.sol";
import {IProviderRegistry} from "./interfaces/IProviderRegistry.sol";
import {IStakeManager} from "./interfaces/IStakeManager.sol";

/// @title Provider stake: deposit, unbond, withdraw, bonds and slashing.
/// @notice See IStakeManager. Only registered providers stake. Unbonding moves
/// active stake into an entry released `unbondingPeriod` after the request;
/// every entry stays slashable until it is withdrawn. Slashing takes active
/// stake first, then unbonding entries newest first, and sends what it took to
/// the treasury, or burns it (ERC20Burnable.burn on the token) when the
/// treasury is the zero address; if the token cannot burn, the tokens go to
/// 0x...dEaD instead.
///
/// The only slashers are the pools this manager created (`createPool`, through
/// the factory fixed at construction), whose code slashes only on evidence and
/// a validator quorum. The treasury is fixed at construction: an admin that
/// could move it could send itself the stake of every later slash. Where
/// slashed stake goes is thus one of the terms a staker reads before it
/// stakes; fixed is simpler than a change delayed past every staker's exit,
/// and loses nothing the protocol needs, since a slash is a deterrent, not
/// income (zero burns it). The admin sets
/// parameters within bounds: a longer unbonding period applies only to requests
/// made once the current period has passed, so every staker can leave under the
/// terms it staked with.
contract StakeManager is IStakeManager, AccessControl, ReentrancyGuard {
    using SafeERC20 for IERC20;

    /// @notice At most this many unbonding entries per provider; a request
    /// beyond it is merged into the newest entry (which then releases at the
    /// later of the two times). Bounds the gas of `withdraw` and `slash`.
    uint256 public constant MAX_UNBONDING_ENTRIES = 32;
    /// @notice At most this many pools; bounds the gas of the parameter checks.
    uint256 public constant MAX_POOLS = 16;
    /// @notice The shortest unbonding period, and the shortest invalidation window.
    uint256 public constant MIN_UNBONDING_PERIOD = 1 minutes;
    /// @notice The longest unbonding period: stake is never frozen for longer.
    uint256 public constant MAX_UNBONDING_PERIOD = 30 days;

    /// @notice Where slashed tokens go if the token cannot burn them.
    address public constant BURN_ADDRESS = 0x000000000000000000000000000000000000dEaD;

    /// @inheritdoc IStakeManager
    IERC20 public immutable token;
    /// @inheritdoc IStakeManager
    IProviderRegistry public immutable registry;
    /// @notice Deploys this manager's pools.
    IPoolFactory public immutable poolFactory;

    /// @inheritdoc IStakeManager
    uint256 public minStakePerNode;
    /// @inheritdoc IStakeManager
    address public immutable treasury;
    /// @inheritdoc IStakeManager
    uint256 public totalStaked;

    uint256 private _unbondingPeriod;
    /// @dev A longer period waits here until `_pendingPeriodAt`.
    uint256 private _pendingPeriod;
    uint256 private _pendingPeriodAt;

    address[] private _pools;
    mapping(address pool => bool) private _isPool;

    mapping(address provider => uint256) private _active;
    mapping(address provider => uint256) private _unbondingTotal;
    /// @dev Oldest first; slashing consumes from the end.
    mapping(address provider => Unbonding[]) private _unbonding;
    modifier onlyPool() {
        if (!_isPool[msg.sender]) revert NotPool(msg.sender);
        _;
    }

    /// @param token_ The stake token (ERC20 with ERC-2612 permit; StakeToken).
    /// @param registry_ The provider registry.
    /// @param poolFactory_ The factory `createPool` deploys through (its code is what slashes).
    /// @param admin Receives DEFAULT_ADMIN_ROLE (pools and setters).
    /// @param minStakePerNode_ Active stake each registered node needs.
    /// @param unbondingPeriod_ Seconds between an unbond request and its withdrawal.
    /// @param treasury_ Receiver of slashed stake, for good; zero burns it.
    constructor(
        IERC20 token_,
        IProviderRegistry registry_,
        IPoolFactory poolFactory_,
        address admin,
        uint256 minStakePerNode_,
        uint256 unbondingPeriod_,
        address treasury_
    ) {
        _checkUnbondingPeriod(unbondingPeriod_);
        token = token_;
        registry = registry_;
        poolFactory = poolFactory_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        minStakePerNode = minStakePerNode_;
        _unbondingPeriod = unbondingPeriod_;
        treasury = treasury_;
        emit MinStakePerNodeChanged(0, minStakePerNode_);
        emit UnbondingPeriodChanged(0, unbondingPeriod_, block.timestamp);
    }

    // ---- providers ----

    /// @inheritdoc IStakeManager
    /// @dev Reverts NotProvider for unregistered callers, ZeroAmount for 0.
    function stake(uint256 amount) external nonReentrant {
        _stake(amount);
    }

    /// @inheritdoc IStakeManager
    /// @dev A permit that fails (e.g. already used by a front-runner) is
    /// ignored; the transfer then needs the allowance to be there anyway.
    function stakeWithPermit(uint256 amount, uint256 deadline, uint8 v, bytes32 r, bytes32 s) external nonReentrant {
        try IERC20Permit(address(token)).permit(msg.sender, address(this), amount, deadline, v, r, s) {} catch {}
        _stake(amount);
    }

    /// @inheritdoc IStakeManager
    /// @dev Reverts ZeroAmount, InsufficientStake if `amount` exceeds the
    /// active stake, StakeBacksNodes if what stays active would not cover
    /// `minStakePerNode` for each of the caller's registered nodes,
    /// StakeBacksWork if it would not cover what the pools bond (`bondedOf`).
    function requestUnbond(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        uint256 active = _active[msg.sender];
        if (amount > active) revert InsufficientStake(active, amount);
        uint256 remaining = active - amount;
        uint256 required = minStakePerNode * registry.nodeCountOf(msg.sender);
        if (remaining < required) revert StakeBacksNodes(remaining, required);
        uint256 bonded = bondedOf(msg.sender);
        if (remaining < bonded) revert StakeBacksWork(remaining, bonded);

        _active[msg.sender] = remaining;
        _unbondingTotal[msg.sender] += amount;
        uint256 releaseTime = block.timestamp + unbondingPeriod();
        Unbonding[] storage entries = _unbonding[msg.sender];
        uint256 n = entries.length;
        if (n < MAX_UNBONDING_ENTRIES) {
            entries.push(Unbonding(amount, releaseTime));
        } else {
            Unbonding storage last = entries[n - 1];
            last.amount += amount;
            if (releaseTime > last.releaseTime) last.releaseTime = releaseTime;
            releaseTime = last.releaseTime;
        }
        emit UnbondRequested(msg.sender, amount, releaseTime);
    }

    /// @inheritdoc IStakeManager
    /// @dev Reverts NothingToWithdraw if no entry has matured.
    function withdraw() external nonReentrant returns (uint256 amount) {
        Unbonding[] storage entries = _unbonding[msg.sender];
        uint256 n = entries.length;
        uint256 kept;
        for (uint256 i; i < n; ++i) {
            Unbonding memory e = entries[i];
            if (e.releaseTime <= block.timestamp) {
                amount += e.amount;
            } else {
                if (kept != i) entries[kept] = e;
                ++kept;
            }
        }
        if (amount == 0) revert NothingToWithdraw();
        for (uint256 i = n; i > kept; --i) {
            entries.pop();
        }
        _unbondingTotal[msg.sender] -= amount;
        totalStaked -= amount;
        emit Withdrawn(msg.sender, amount);
        token.safeTransfer(msg.sender, amount);
    }

    // ---- pools ----

    /// @inheritdoc IStakeManager
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts TooManyPools; the pool's own
    /// constructor checks `params` (see ComputePool).
    function createPool(
        bytes32 runId,
        address admin,
        IComputePool.PoolParams calldata params,
        address[] calldata recorders,
        address[] calldata validators
    ) external onlyRole(DEFAULT_ADMIN_ROLE) returns (address pool) {
        if (_pools.length >= MAX_POOLS) revert TooManyPools();
        pool = poolFactory.createPool(runId, admin, params, recorders, validators);
        _pools.push(pool);
        _isPool[pool] = true;
        emit PoolCreated(pool, runId, admin);
    }

    /// @inheritdoc IStakeManager
    /// @dev Only pools. Slashes min(amount, active + unbonding); never reverts
    /// for lack of stake. Emits Slashed only if something was taken.
    function slash(address provider, uint256 amount, bytes32 reason)
        external
        onlyPool
        nonReentrant
        returns (uint256 slashed)
    {
        uint256 active = _active[provider];
        slashed = amount < active ? amount : active;
        _active[provider] = active - slashed;

        uint256 left = amount - slashed;
        if (left != 0) {
            Unbonding[] storage entries = _unbonding[provider];
            uint256 fromUnbonding;
            while (left != 0 && entries.length != 0) {
                Unbonding storage last = entries[entries.length - 1];
                uint256 e = last.amount;
                if (e <= left) {
                    left -= e;
                    fromUnbonding += e;
                    entries.pop();
                } else {
                    last.amount = e - left;
                    fromUnbonding += left;
                    left = 0;
                }
            }
            _unbondingTotal[provider] -= fromUnbonding;
            slashed += fromUnbonding;
        }
        if (slashed == 0) return 0;

        totalStaked -= slashed;
        address to = treasury;
        emit Slashed(provider, slashed, reason, to, msg.sender);
        if (to != address(0)) {
            token.safeTransfer(to, slashed);
        } else {
            try ERC20Burnable(address(token)).burn(slashed) {}
            catch {
                token.safeTransfer(BURN_ADDRESS, slashed);
            }
        }
    }

    // ---- views ----

    /// @inheritdoc IStakeManager
    function stakeOf(address provider) external view returns (uint256 active) {
        return _active[provider];
    }

    /// @inheritdoc IStakeManager
    function unbondingOf(address provider) external view returns (uint256 total, uint256 withdrawable) {
        total = _unbondingTotal[provider];
        Unbonding[] storage entries = _unbonding[provider];
        uint256 n = entries.length;
        for (uint256 i; i < n; ++i) {
            if (entries[i].releaseTime <= block.timestamp) withdrawable += entries[i].amount;
        }
    }

    /// @notice The provider's unbonding entries, oldest first.
    function unbondingEntries(address provider) external view returns (Unbonding[] memory) {
        return _unbonding[provider];
    }

    /// @inheritdoc IStakeManager
    /// @dev At most MAX_POOLS calls, one per pool.
    function bondedOf(address provider) public view returns (uint256 bonded) {
        uint256 n = _pools.length;
        for (uint256 i; i < n; ++i) {
            bonded += IComputePool(_pools[i]).bondOf(provider);
        }
    }

    /// @inheritdoc IStakeManager
    function coversNodes(address provider, uint256 nodeCount) external view returns (bool) {
        return _active[provider] >= minStakePerNode * nodeCount;
    }

    /// @inheritdoc IStakeManager
    function unbondingPeriod() public view returns (uint256) {
        uint256 at = _pendingPeriodAt;
        return at != 0 && block.timestamp >= at ? _pendingPeriod : _unbondingPeriod;
    }

    /// @notice A longer unbonding period waiting to apply, and from when (zeros if none).
    function pendingUnbondingPeriod() external view returns (uint256 period, uint256 effectiveAt) {
        if (_pendingPeriodAt > block.timestamp) return (_pendingPeriod, _pendingPeriodAt);
    }

    /// @inheritdoc IStakeManager
    function isPool(address pool) external view returns (bool) {
        return _isPool[pool];
    }

    /// @inheritdoc IStakeManager
    function pools() external view returns (address[] memory) {
        return _pools;
    }

    // ---- admin ----

    /// @inheritdoc IStakeManager
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts MinStakeBelowPenalty below any
    /// pool's penalty, also one still waiting to apply. A higher minimum
    /// applies to later joins and unbond requests.
    function setMinStakePerNode(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        uint256 n = _pools.length;
        for (uint256 i; i < n; ++i) {
            IComputePool pool = IComputePool(_pools[i]);
            uint256 penalty = pool.slashPenalty();
            (uint256 pending,) = pool.pendingSlashPenalty();
            if (pending > penalty) penalty = pending;
            if (amount < penalty) revert MinStakeBelowPenalty(amount, penalty);
        }
        emit MinStakePerNodeChanged(minStakePerNode, amount);
        minStakePerNode = amount;
    }

    /// @inheritdoc IStakeManager
    /// @dev Only DEFAULT_ADMIN_ROLE. Reverts UnbondingPeriodOutOfRange. A
    /// shorter period applies at once; a longer one from when the current
    /// period has passed, so stakers can still leave on the old terms.
    function setUnbondingPeriod(uint256 period) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _checkUnbondingPeriod(period);
        uint256 current = unbondingPeriod();
        uint256 effectiveAt = period > current ? block.timestamp + current : block.timestamp;
        if (period > current) {
            _unbondingPeriod = current;
            (_pendingPeriod, _pendingPeriodAt) = (period, effectiveAt);
        } else {
            _unbondingPeriod = period;
            (_pendingPeriod, _pendingPeriodAt) = (0, 0);
        }
        emit UnbondingPeriodChanged(current, period, effectiveAt);
    }

    // ---- internals ----

    function _stake(uint256 amount) private {
        if (!registry.isProvider(msg.sender)) revert NotProvider(msg.sender);
        if (amount == 0) revert ZeroAmount();
        _active[msg.sender] += amount;
        totalStaked += amount;
        emit Staked(msg.sender, amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @dev Reverts unless `period` is within the bounds and covers every
    /// pool's window, also one still waiting to apply.
    function _checkUnbondingPeriod(uint256 period) private view {
        uint256 min = MIN_UNBONDING_PERIOD;
        uint256 n = _pools.length;
        for (uint256 i; i < n; ++i) {
            IComputePool pool = IComputePool(_pools[i]);
            uint256 window = pool.invalidationWindow();
            (uint256 pending,) = pool.pendingInvalidationWindow();
            if (pending > window) window = pending;
            if (window > min) min = window;
        }
        if (period < min || period > MAX_UNBONDING_PERIOD) {
            revert UnbondingPeriodOutOfRange(period, min, MAX_UNBONDING_PERIOD);
        }
    }
}
