// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @title Settings whose changes wait a delay before they apply.
/// @notice A setting holds its value now, and at most one change waiting to
/// apply from a set time on. A waiting value applies by itself when its time
/// comes (reads see it from then on; no transaction is needed), so a change
/// can be neither hurried nor held back by anyone once it is scheduled. A new
/// change replaces the one still waiting. What the deployment sets (in the
/// constructor) applies at once: it is the terms everyone joins under.
///
/// The same record also holds a pending action (a code the inheriting contract
/// gives meaning to, such as granting a role) that someone must carry out once
/// it is due: `_scheduleAction` and `_takeDue`.
abstract contract DelayedSettings {
    /// @dev `value` now; `next` applies from `nextAt` (0: none waits).
    struct Delayed {
        uint256 value;
        uint256 next;
        uint256 nextAt;
    }

    /// @dev How long a delayed change waits.
    function _settingDelay() internal view virtual returns (uint256);

    /// @dev Whether this runs inside the constructor (no code is deployed yet).
    function _deploying() internal view returns (bool) {
        return address(this).code.length == 0;
    }

    /// @dev The setting's value now: its waiting value once that applies.
    function _valueOf(Delayed storage d) internal view returns (uint256) {
        uint256 nextAt = d.nextAt;
        return nextAt != 0 && block.timestamp >= nextAt ? d.next : d.value;
    }

    /// @dev The value waiting to apply and from when, or zeros if none waits.
    function _pendingOf(Delayed storage d) internal view returns (uint256 value, uint256 effectiveAt) {
        if (d.nextAt > block.timestamp) return (d.next, d.nextAt);
    }

    /// @dev Sets `d` to `value` at once if `atOnce` (or while deploying), else
    /// from `_settingDelay()` on, replacing a change still waiting. Returns the
    /// value before and when the new one applies.
    function _schedule(Delayed storage d, uint256 value, bool atOnce)
        internal
        returns (uint256 old, uint256 effectiveAt)
    {
        old = _valueOf(d);
        if (atOnce || _deploying()) {
            (d.value, d.next, d.nextAt) = (value, 0, 0);
            return (old, block.timestamp);
        }
        effectiveAt = block.timestamp + _settingDelay();
        (d.value, d.next, d.nextAt) = (old, value, effectiveAt);
    }

    /// @dev Schedules `action` (nonzero) to become due `_settingDelay()` from
    /// now, replacing one still waiting; returns when it is due.
    function _scheduleAction(Delayed storage d, uint256 action) internal returns (uint256 effectiveAt) {
        effectiveAt = block.timestamp + _settingDelay();
        (d.next, d.nextAt) = (action, effectiveAt);
    }

    /// @dev The action scheduled in `d` and when it is due (zeros if none).
    /// Once due it is cleared and returned as `action`; before, `action` is 0.
    function _takeDue(Delayed storage d) internal returns (uint256 action, uint256 effectiveAt) {
        effectiveAt = d.nextAt;
        if (effectiveAt == 0 || block.timestamp < effectiveAt) return (0, effectiveAt);
        action = d.next;
        (d.next, d.nextAt) = (0, 0);
    }
}
