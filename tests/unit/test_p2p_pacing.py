"""swarmrl.p2p.pacing: the shared rate cap, on trio's virtual clock (a sleep jumps the
clock at once), so every time below is exact and the tests take no real time. The
rates measured through real sockets are tests/integration/test_rate_caps.py's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from swarmrl.p2p.pacing import BURST_SECONDS, MIN_CHUNK, Pacer


def run(test: Callable[[], Awaitable[None]]) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def pacer(rate: float | None, **kwargs: object) -> Pacer:
    return Pacer(rate, clock=trio.current_time, **kwargs)


async def paced(p: Pacer, sizes: list[int], *, first: bool = False) -> float:
    """Paces `sizes` one after another; the virtual time it took."""
    start = trio.current_time()
    for n in sizes:
        await p.pace_trio(n, first=first)
    return trio.current_time() - start


def test_bytes_paced_average_the_rate():
    async def main() -> None:
        p = pacer(1000)
        assert await paced(p, [100] * 10) == pytest.approx(1.0)

    run(main)


def test_credit_saved_while_idle_is_capped():
    async def main() -> None:
        p = pacer(1000)
        await trio.sleep(60)  # a quiet minute buys BURST_SECONDS, not a minute's bytes
        assert await paced(p, [1000]) == pytest.approx(1.0 - BURST_SECONDS)

    run(main)


def test_users_together_keep_to_one_rate():
    async def main() -> None:
        p = pacer(1000)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(paced, p, [100] * 5)
        assert trio.current_time() - start == pytest.approx(2.0)

    run(main)


def test_the_first_lane_is_paid_before_bytes_asked_for_earlier():
    async def main() -> None:
        p = pacer(1000)
        done: dict[str, float] = {}

        async def serve() -> None:
            await p.pace_trio(1000)
            done["served"] = trio.current_time()

        async def submit() -> None:
            await trio.sleep(0.1)
            await p.pace_trio(500, first=True)
            done["submitted"] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(submit)
        # The submission waits only for what was paid by 0.1 s; the served bytes wait
        # for the submission's too.
        assert done["submitted"] == pytest.approx(0.5)
        assert done["served"] == pytest.approx(1.5)

    run(main)


def test_a_raised_rate_reaches_a_user_already_waiting():
    async def main() -> None:
        p = pacer(100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(paced, p, [1000])  # 10 s at 100 B/s
            await trio.sleep(1)
            p.rate = 1000
        # 100 B paid by 1 s, the other 900 at the new rate: 0.9 s, seen within a recheck.
        assert 1.9 <= trio.current_time() <= 1.9 + 0.25

    run(main)


def test_a_halted_pacer_moves_nothing_until_it_has_a_rate_again():
    async def main() -> None:
        p = pacer(0)
        assert p.halted
        async with trio.open_nursery() as nursery:
            nursery.start_soon(paced, p, [100])
            await trio.sleep(60)
            p.rate = None
        assert not p.halted
        assert 60 <= trio.current_time() <= 60 + 0.25

    run(main)


def test_without_a_cap_nothing_waits_and_every_byte_is_counted():
    async def main() -> None:
        counted: list[int] = []
        p = pacer(None, on_bytes=counted.append)
        assert await paced(p, [10**9, 10**9, 0, 5], first=True) == 0
        assert counted == [10**9, 10**9, 5]

    run(main)


def test_chunks_are_a_few_hundredths_of_a_second_of_the_rate():
    assert Pacer(None).chunk(10**9) == 10**9
    assert Pacer(100e6).chunk(10**9) == 4 * 1024 * 1024
    assert Pacer(10e6).chunk(10**9) == 500_000
    assert Pacer(1000).chunk(10**9) == MIN_CHUNK
    assert Pacer(10e6).chunk(1000) == 1000


@pytest.mark.parametrize("rate", [-1.0, float("nan")])
def test_a_rate_below_zero_is_refused(rate):
    with pytest.raises(ValueError, match="a rate is 0 or more bytes a second"):
        Pacer(rate)
    with pytest.raises(ValueError, match="a rate is 0 or more bytes a second"):
        Pacer().rate = rate
