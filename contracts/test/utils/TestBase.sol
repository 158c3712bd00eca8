// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @notice The subset of forge's cheatcodes our tests use. forge-std is not
/// installable offline (its npm builds fetch ds-test from git), so the tests
/// talk to the cheatcode address directly; assertions are forge's own
/// `vm.assert*` cheatcodes, which revert (and so fail the test) on mismatch.
interface Vm {
    function warp(uint256 timestamp) external;
    function roll(uint256 blockNumber) external;
    function chainId(uint256 id) external;
    function prank(address sender) external;
    function startPrank(address sender) external;
    function stopPrank() external;
    function expectRevert() external;
    function expectRevert(bytes4 selector) external;
    function expectRevert(bytes calldata revertData) external;
    function expectEmit() external;
    function expectEmit(address emitter) external;
    function addr(uint256 privateKey) external pure returns (address);
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function assume(bool condition) external pure;
    function label(address account, string calldata name) external;
    function assertTrue(bool condition, string calldata err) external pure;
    function assertFalse(bool condition, string calldata err) external pure;
    function assertEq(uint256 a, uint256 b, string calldata err) external pure;
    function assertEq(address a, address b, string calldata err) external pure;
    function assertEq(bytes32 a, bytes32 b, string calldata err) external pure;
    function assertEq(bool a, bool b, string calldata err) external pure;
    function assertLe(uint256 a, uint256 b, string calldata err) external pure;
    function assertGe(uint256 a, uint256 b, string calldata err) external pure;
    function assertLt(uint256 a, uint256 b, string calldata err) external pure;
    function assertGt(uint256 a, uint256 b, string calldata err) external pure;
}

/// @notice What every test contract inherits: the cheatcodes, signing helpers,
/// `bound` for fuzz inputs, and the selectors forge reads to aim invariant runs.
abstract contract TestBase {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    address[] private targets;

    /// @dev forge calls this to learn which contracts invariant runs call into.
    function targetContracts() public view returns (address[] memory) {
        return targets;
    }

    function targetContract(address target) internal {
        targets.push(target);
    }

    /// @dev Maps any fuzzed `x` into [lo, hi] without discarding runs.
    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        require(lo <= hi, "bound: lo > hi");
        if (x >= lo && x <= hi) return x;
        return lo + (x % (hi - lo + 1));
    }

    /// @dev A 65-byte signature (r, s, v) by `privateKey` over `digest`.
    function signDigest(uint256 privateKey, bytes32 digest) internal pure returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(privateKey, digest);
        return abi.encodePacked(r, s, v);
    }
}
