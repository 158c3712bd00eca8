// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";

/// @title The SwarmRL stake and reward token ("SwarmRL Stake", "SRL", 18 decimals).
/// @notice Holders of MINTER_ROLE can mint, which is meant for local and test
/// networks (a faucet). Anyone can burn their own tokens (ERC20Burnable); the
/// stake manager burns slashed stake that way when it has no treasury.
/// ERC-2612 permits are signed in the domain (name "SwarmRL Stake", version "1").
contract StakeToken is ERC20, ERC20Burnable, ERC20Permit, AccessControl {
    /// @notice Role allowed to mint.
    bytes32 public constant MINTER_ROLE = keccak256("MINTER_ROLE");

    /// @param admin Receives DEFAULT_ADMIN_ROLE and MINTER_ROLE.
    constructor(address admin) ERC20("SwarmRL Stake", "SRL") ERC20Permit("SwarmRL Stake") {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(MINTER_ROLE, admin);
    }

    /// @notice Mints `amount` tokens to `to`; only MINTER_ROLE.
    /// @param to The receiver.
    /// @param amount The amount in wei (18 decimals).
    function mint(address to, uint256 amount) external onlyRole(MINTER_ROLE) {
        _mint(to, amount);
    }
}
