// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";

import {IProviderRegistry} from "./interfaces/IProviderRegistry.sol";
import {IStakeManager} from "./interfaces/IStakeManager.sol";

/// @title Provider stake: deposit, unbond, withdraw, and slashing.
/// @notice Only registered providers stake. Unbonding moves active stake into
/// an entry released `unbondingPeriod` after the request; every entry stays
/// slashable until it is withdrawn. Slashing takes active stake first, then
/// unbonding entries newest first, and sends what it took to the treasury, or
/// burns it (ERC20Burnable.burn on the token) when the treasury is the zero
/// address; if the token cannot burn, the tokens go to 0x...dEaD instead.
/// Deployers should keep `unbondingPeriod` >= every pool's invalidation window
/// so that stake cannot leave before the work it backs can be slashed.
contract StakeManager is IStakeManager, AccessControl, ReentrancyGuard {
    using SafeERC20 for IERC20;

    /// @inheritdoc IStakeManager
    bytes32 public constant SLASHER_ROLE = keccak256("SLASHER_ROLE");

    /// @notice At most this many unbonding entries per provider; a request
    /// beyond it is merged into the newest entry (which then releases at the
    /// later of the two times). Bounds the gas of `withdraw` and `slash`.
    uint256 public constant MAX_UNBONDING_ENTRIES = 32;

    /// @notice Where slashed tokens go if the token cannot burn them.
    address public constant BURN_ADDRESS = 0x000000000000000000000000000000000000dEaD;

    struct Unbonding {
        uint256 amount;
        uint256 releaseTime;
    }

    /// @notice The stake token.
    IERC20 public immutable token;
    /// @notice The registry that says who is a provider and how many nodes each runs.
    IProviderRegistry public immutable registry;

    /// @inheritdoc IStakeManager
    uint256 public minStakePerNode;
    /// @inheritdoc IStakeManager
    uint256 public unbondingPeriod;
    /// @inheritdoc IStakeManager
    address public treasury;
    /// @inheritdoc IStakeManager
    uint256 public totalStaked;

    mapping(address provider => uint256) private _active;
    mapping(address provider => uint256) private _unbondingTotal;
    /// @dev Oldest first; slashing consumes from the end.
    mapping(address provider => Unbonding[]) private _unbonding;

    /// @param token_ The stake token (ERC20 with ERC-2612 permit; StakeToken).
    /// @param registry_ The provider registry.
    /// @param admin Receives DEFAULT_ADMIN_ROLE (setters, granting SLASHER_ROLE).
    /// @param minStakePerNode_ Active stake each registered node needs.
    /// @param unbondingPeriod_ Seconds between an unbond request and its withdrawal.
    /// @param treasury_ Receiver of slashed stake; zero burns it.
    constructor(
        IERC20 token_,
        IProviderRegistry registry_,
        address admin,
        uint256 minStakePerNode_,
        uint256 unbondingPeriod_,
        address treasury_
    ) {
        token = token_;
        registry = registry_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        minStakePerNode = minStakePerNode_;
        unbondingPeriod = unbondingPeriod_;
        treasury = treasury_;
        emit MinStakePerNodeChanged(minStakePerNode_);
        emit UnbondingPeriodChanged(unbondingPeriod_);
        emit TreasuryChanged(treasury_);
    }

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
    /// `minStakePerNode` for each of the caller's registered nodes.
    function requestUnbond(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        uint256 active = _active[msg.sender];
        if (amount > active) revert InsufficientStake(active, amount);
        uint256 remaining = active - amount;
        uint256 required = minStakePerNode * registry.nodesOf(msg.sender).length;
        if (remaining < required) revert StakeBacksNodes(remaining, required);

        _active[msg.sender] = remaining;
        _unbondingTotal[msg.sender] += amount;
        uint256 releaseTime = block.timestamp + unbondingPeriod;
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

    /// @inheritdoc IStakeManager
    /// @dev Only SLASHER_ROLE. Slashes min(amount, active + unbonding); never
    /// reverts for lack of stake. Emits Slashed only if something was taken.
    function slash(address provider, uint256 amount, bytes32 reason)
        external
        onlyRole(SLASHER_ROLE)
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
        emit Slashed(provider, slashed, reason, to);
        if (to != address(0)) {
            token.safeTransfer(to, slashed);
        } else {
            try ERC20Burnable(address(token)).burn(slashed) {}
            catch {
                token.safeTransfer(BURN_ADDRESS, slashed);
            }
        }
    }

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
    function coversNodes(address provider, uint256 nodeCount) external view returns (bool) {
        return _active[provider] >= minStakePerNode * nodeCount;
    }

    /// @inheritdoc IStakeManager
    /// @dev Only DEFAULT_ADMIN_ROLE.
    function setMinStakePerNode(uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        minStakePerNode = amount;
        emit MinStakePerNodeChanged(amount);
    }

    /// @inheritdoc IStakeManager
    /// @dev Only DEFAULT_ADMIN_ROLE. Applies to later unbond requests only.
    function setUnbondingPeriod(uint256 period) external onlyRole(DEFAULT_ADMIN_ROLE) {
        unbondingPeriod = period;
        emit UnbondingPeriodChanged(period);
    }

    /// @inheritdoc IStakeManager
    /// @dev Only DEFAULT_ADMIN_ROLE. The zero address means: burn slashed stake.
    function setTreasury(address treasury_) external onlyRole(DEFAULT_ADMIN_ROLE) {
        treasury = treasury_;
        emit TreasuryChanged(treasury_);
    }

    function _stake(uint256 amount) private {
        if (!registry.isProvider(msg.sender)) revert NotProvider(msg.sender);
        if (amount == 0) revert ZeroAmount();
        _active[msg.sender] += amount;
        totalStaked += amount;
        emit Staked(msg.sender, amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }
}
