// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title Ballots of validators whose votes count only in the term they were cast in.
/// @notice A ballot is any bytes32 key; each voter votes on it once per term.
/// A voter's term starts anew whenever it is appointed (`_newTerm`), so a vote
/// counts only while its voter is a voter (`_isVoter`) in the term it voted in:
/// losing the role voids its pending votes, also if it is appointed again later.
/// Counting walks the ballot's voters, who are at most the validators that ever voted on it.
abstract contract ValidatorBallots {
    /// @dev Bumped on every appointment, so a vote names the term it was cast in.
    mapping(address voter => uint256) private _term;
    mapping(bytes32 ballot => address[]) private _voters;
    mapping(bytes32 ballot => mapping(address voter => uint256 term)) private _votedIn;

    /// @dev Whether `account` may vote now.
    function _isVoter(address account) internal view virtual returns (bool);

    /// @dev Starts a new term for `voter`: its earlier votes no longer count.
    function _newTerm(address voter) internal {
        ++_term[voter];
    }

    /// @dev Casts `voter`'s vote on `ballot`. Returns false, casting nothing, if
    /// it voted there in its current term already; and the votes that count now.
    function _cast(bytes32 ballot, address voter) internal returns (bool cast, uint256 votes) {
        uint256 term = _term[voter];
        uint256 votedIn = _votedIn[ballot][voter];
        if (votedIn != term) {
            if (votedIn == 0) _voters[ballot].push(voter);
            _votedIn[ballot][voter] = term;
            cast = true;
        }
        votes = _tally(ballot);
    }

    /// @dev The votes on `ballot` whose voter is a voter still, in the term it voted in.
    function _tally(bytes32 ballot) internal view returns (uint256 votes) {
        address[] storage voters = _voters[ballot];
        uint256 n = voters.length;
        for (uint256 i; i < n; ++i) {
            address v = voters[i];
            if (_isVoter(v) && _votedIn[ballot][v] == _term[v]) ++votes;
        }
    }
}
