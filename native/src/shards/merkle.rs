//! The Merkle tree over shard hashes.
//!
//! leaf = BLAKE3(0x00 || shard hash), node = BLAKE3(0x01 || left || right).
//! Each level pairs nodes left to right; an odd last node is promoted to the
//! next level unchanged, not duplicated (duplication would let two different
//! shard lists share a root). The root of a single shard is its leaf. The tags
//! keep a leaf from ever being read as a node. This is the shape of RFC 6962's
//! tree (left subtree = the largest power of two below the leaf count).

use super::{Hash, ShardError};

fn tagged(tag: u8, parts: &[&Hash]) -> Hash {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&[tag]);
    for part in parts {
        hasher.update(*part);
    }
    *hasher.finalize().as_bytes()
}

fn leaf(shard_hash: &Hash) -> Hash {
    tagged(0x00, &[shard_hash])
}

fn node(left: &Hash, right: &Hash) -> Hash {
    tagged(0x01, &[left, right])
}

fn leaves(shard_hashes: &[Hash]) -> Result<Vec<Hash>, ShardError> {
    if shard_hashes.is_empty() {
        return Err(ShardError::NoShards);
    }
    Ok(shard_hashes.iter().map(leaf).collect())
}

fn parents(level: &[Hash]) -> Vec<Hash> {
    level.chunks(2).map(|pair| if let [l, r] = pair { node(l, r) } else { pair[0] }).collect()
}

pub fn merkle_root(shard_hashes: &[Hash]) -> Result<Hash, ShardError> {
    let mut level = leaves(shard_hashes)?;
    while level.len() > 1 {
        level = parents(&level);
    }
    Ok(level[0])
}

/// The sibling hashes on the path from shard `index`'s leaf to the root,
/// bottom up. Levels where the path node is promoted contribute nothing.
pub fn inclusion_proof(shard_hashes: &[Hash], index: u64) -> Result<Vec<Hash>, ShardError> {
    let count = shard_hashes.len() as u64;
    if index >= count {
        return Err(ShardError::Index { index, count });
    }
    let mut level = leaves(shard_hashes)?;
    let mut i = index as usize;
    let mut proof = Vec::new();
    while level.len() > 1 {
        if let Some(sibling) = level.get(i ^ 1) {
            proof.push(*sibling);
        }
        level = parents(&level);
        i /= 2;
    }
    Ok(proof)
}

/// Checks that `shard_hash` is shard `index` of `count` under `root`. The
/// count fixes where nodes are promoted, so it is part of what is checked.
pub fn verify_inclusion(
    root: &Hash,
    count: u64,
    index: u64,
    shard_hash: &Hash,
    proof: &[Hash],
) -> Result<(), ShardError> {
    if index >= count {
        return Err(ShardError::Index { index, count });
    }
    let mut siblings = proof.iter();
    let (mut h, mut i, mut width) = (leaf(shard_hash), index, count);
    while width > 1 {
        if i ^ 1 < width {
            let sibling = siblings.next().ok_or(ShardError::Proof)?;
            h = if i % 2 == 0 { node(&h, sibling) } else { node(sibling, &h) };
        }
        i /= 2;
        width = width.div_ceil(2);
    }
    if siblings.next().is_some() || h != *root {
        return Err(ShardError::Proof);
    }
    Ok(())
}
