// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";

import {StakeToken} from "../src/StakeToken.sol";
import {TestBase} from "./utils/TestBase.sol";

contract StakeTokenTest is TestBase {
    StakeToken token;
    address admin = address(0xA11CE);
    uint256 constant OWNER_PK = 0x0D0E;
    bytes32 constant PERMIT_TYPEHASH =
        keccak256("Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)");

    function setUp() public {
        token = new StakeToken(admin);
    }

    function test_metadata() public view {
        vm.assertEq(keccak256(bytes(token.name())), keccak256("SwarmRL Stake"), "name");
        vm.assertEq(keccak256(bytes(token.symbol())), keccak256("SRL"), "symbol");
        vm.assertEq(token.decimals(), 18, "decimals");
        vm.assertTrue(token.hasRole(token.DEFAULT_ADMIN_ROLE(), admin), "admin role");
        vm.assertTrue(token.hasRole(token.MINTER_ROLE(), admin), "minter role");
        vm.assertEq(token.MINTER_ROLE(), keccak256("MINTER_ROLE"), "role id");
    }

    function test_mint_byMinter() public {
        vm.prank(admin);
        token.mint(address(0xB0B), 5 ether);
        vm.assertEq(token.balanceOf(address(0xB0B)), 5 ether, "balance");
        vm.assertEq(token.totalSupply(), 5 ether, "supply");
    }

    function test_mint_revertsForNonMinter() public {
        bytes32 role = token.MINTER_ROLE();
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, address(this), role)
        );
        token.mint(address(this), 1);
    }

    function test_grantedMinterCanMint() public {
        bytes32 role = token.MINTER_ROLE();
        vm.prank(admin);
        token.grantRole(role, address(this));
        token.mint(address(this), 7);
        vm.assertEq(token.balanceOf(address(this)), 7, "balance");
    }

    function test_burn() public {
        vm.prank(admin);
        token.mint(address(this), 10);
        token.burn(4);
        vm.assertEq(token.balanceOf(address(this)), 6, "balance");
        vm.assertEq(token.totalSupply(), 6, "supply");
    }

    function test_permit() public {
        address owner = vm.addr(OWNER_PK);
        address spender = address(0x5E);
        uint256 deadline = block.timestamp + 1;
        bytes32 structHash = keccak256(abi.encode(PERMIT_TYPEHASH, owner, spender, 9, token.nonces(owner), deadline));
        bytes32 digest = keccak256(abi.encodePacked("\x19\x01", token.DOMAIN_SEPARATOR(), structHash));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(OWNER_PK, digest);
        token.permit(owner, spender, 9, deadline, v, r, s);
        vm.assertEq(token.allowance(owner, spender), 9, "allowance");
        vm.assertEq(token.nonces(owner), 1, "nonce");
        // replay fails: the nonce moved on
        vm.expectRevert();
        token.permit(owner, spender, 9, deadline, v, r, s);
    }

    function testFuzz_mintAndTransfer(uint256 amount, uint256 sent) public {
        amount = bound(amount, 0, type(uint128).max);
        sent = bound(sent, 0, amount);
        vm.prank(admin);
        token.mint(address(this), amount);
        token.transfer(address(0xB0B), sent);
        vm.assertEq(token.balanceOf(address(this)) + token.balanceOf(address(0xB0B)), amount, "conserved");
    }
}
