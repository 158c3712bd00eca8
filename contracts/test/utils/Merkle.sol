// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

import {IComputePool} from "../../src/interfaces/IComputePool.sol";

/// @notice The Merkle trees of the protocol, as swarmrl.chain.eip712.MerkleTree
/// builds them: sorted-pair keccak256 (OpenZeppelin MerkleProof), an odd node
/// at the end of a level moves up unpaired. Used for a node's commitment (over
/// its signed submissions) and for a part's root (over its work leaves).
library MerkleBuilder {
    function hashPair(bytes32 a, bytes32 b) internal pure returns (bytes32) {
        return a < b ? keccak256(abi.encodePacked(a, b)) : keccak256(abi.encodePacked(b, a));
    }

    /// @dev A commitment's leaf: the EIP-712 digest of one signed submission.
    function leaf(bytes32 digest) internal pure returns (bytes32) {
        return keccak256(abi.encode(digest));
    }

    function _up(bytes32[] memory below) private pure returns (bytes32[] memory above) {
        uint256 n = below.length;
        above = new bytes32[]((n + 1) / 2);
        for (uint256 i; i + 1 < n; i += 2) {
            above[i / 2] = hashPair(below[i], below[i + 1]);
        }
        if (n % 2 == 1) above[n / 2] = below[n - 1];
    }

    function root(bytes32[] memory leaves) internal pure returns (bytes32) {
        require(leaves.length > 0, "no leaves");
        bytes32[] memory level = leaves;
        while (level.length > 1) level = _up(level);
        return level[0];
    }

    function proof(bytes32[] memory leaves, uint256 index) internal pure returns (bytes32[] memory out) {
        bytes32[] memory buf = new bytes32[](64);
        uint256 len;
        bytes32[] memory level = leaves;
        while (level.length > 1) {
            uint256 sibling = index ^ 1;
            if (sibling < level.length) buf[len++] = level[sibling];
            index /= 2;
            level = _up(level);
        }
        out = new bytes32[](len);
        for (uint256 i; i < len; ++i) {
            out[i] = buf[i];
        }
    }
}

/// @notice A part of an epoch's work as the recorder builds it and as anyone
/// rebuilds it from the `WorkRecorded` logs: its leaves in ascending node
/// order, their hashes `keccak256(abi.encode(leaf))`, the root `recordWork`
/// stores and each leaf's proof against it.
library WorkParts {
    function leafHash(IComputePool.WorkLeaf memory l) internal pure returns (bytes32) {
        return keccak256(abi.encode(l.node, l.membership, l.units, l.commitment));
    }

    function hashes(IComputePool.WorkLeaf[] memory leaves) internal pure returns (bytes32[] memory h) {
        h = new bytes32[](leaves.length);
        for (uint256 i; i < leaves.length; ++i) {
            h[i] = leafHash(leaves[i]);
        }
    }

    function root(IComputePool.WorkLeaf[] memory leaves) internal pure returns (bytes32) {
        return MerkleBuilder.root(hashes(leaves));
    }

    function proof(IComputePool.WorkLeaf[] memory leaves, uint256 i) internal pure returns (bytes32[] memory) {
        return MerkleBuilder.proof(hashes(leaves), i);
    }

    /// @dev Leaf `i` of part `part` of `epoch` with its proof.
    function ref(uint64 epoch, uint32 part, IComputePool.WorkLeaf[] memory leaves, uint256 i)
        internal
        pure
        returns (IComputePool.LeafRef memory)
    {
        IComputePool.WorkLeaf memory l = leaves[i];
        // A copy: a test may alter the ref's leaf without altering the part.
        IComputePool.WorkLeaf memory copy = IComputePool.WorkLeaf(l.node, l.membership, l.units, l.commitment);
        return IComputePool.LeafRef({epoch: epoch, part: part, leaf: copy, proof: proof(leaves, i)});
    }

    /// @dev The leaf of `node` in `leaves`, with its proof; reverts if there is none.
    function refOf(uint64 epoch, uint32 part, IComputePool.WorkLeaf[] memory leaves, address node)
        internal
        pure
        returns (IComputePool.LeafRef memory)
    {
        return ref(epoch, part, leaves, indexOf(leaves, node));
    }

    function indexOf(IComputePool.WorkLeaf[] memory leaves, address node) internal pure returns (uint256) {
        for (uint256 i; i < leaves.length; ++i) {
            if (leaves[i].node == node) return i;
        }
        revert("node not in part");
    }

    /// @dev Sorts `leaves` in place into the ascending node order `recordWork` requires.
    function sort(IComputePool.WorkLeaf[] memory leaves) internal pure returns (IComputePool.WorkLeaf[] memory) {
        for (uint256 i = 1; i < leaves.length; ++i) {
            IComputePool.WorkLeaf memory l = leaves[i];
            uint256 j = i;
            while (j > 0 && leaves[j - 1].node > l.node) {
                leaves[j] = leaves[j - 1];
                --j;
            }
            leaves[j] = l;
        }
        return leaves;
    }

    function one(IComputePool.WorkLeaf memory l) internal pure returns (IComputePool.WorkLeaf[] memory leaves) {
        leaves = new IComputePool.WorkLeaf[](1);
        leaves[0] = l;
    }

    function two(IComputePool.WorkLeaf memory a, IComputePool.WorkLeaf memory b)
        internal
        pure
        returns (IComputePool.WorkLeaf[] memory leaves)
    {
        leaves = new IComputePool.WorkLeaf[](2);
        (leaves[0], leaves[1]) = (a, b);
        sort(leaves);
    }

    /// @dev `n` leaves of nodes no one runs (ascending addresses from `first`),
    /// of `units` each: their memberships never existed, so none is payable.
    function strangers(uint256 n, uint160 first, uint128 units)
        internal
        pure
        returns (IComputePool.WorkLeaf[] memory leaves)
    {
        leaves = new IComputePool.WorkLeaf[](n);
        for (uint256 i; i < n; ++i) {
            address node = address(first + uint160(i));
            leaves[i] = IComputePool.WorkLeaf(node, 1, units, keccak256(abi.encode(node)));
        }
    }

    /// @dev A claim's list of one leaf.
    function list(IComputePool.LeafRef memory r) internal pure returns (IComputePool.LeafRef[] memory refs) {
        refs = new IComputePool.LeafRef[](1);
        refs[0] = r;
    }
}
