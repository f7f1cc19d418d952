"""The remote lanes' admission gate, without HTTP: bounded queue, concurrency, fair order, cancellation.

Run: .venv/bin/python -m pytest tests/ops/test_gate.py
"""

from __future__ import annotations

import asyncio

import pytest

from homeai.remote.gate import FairGate, GateClosed
from homeai.sched.scheduler import QueueFull


def run(coro):
    return asyncio.run(coro)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_concurrency_then_queue_then_queue_full():
    async def main():
        gate = FairGate("summaries", concurrency=2, max_queue=2)
        tickets = [await gate.acquire("ann"), await gate.acquire("ann")]
        waiters = [asyncio.create_task(gate.acquire("bob")) for _ in range(2)]
        await settle()
        assert (gate.num_running, gate.num_waiting) == (2, 2)
        with pytest.raises(QueueFull, match="'summaries' queue is full"):
            await gate.acquire("cid")
        assert gate.snapshot() == {"queued": 2, "running": 2, "concurrency": 2, "rejected": 1}
        for t in tickets:
            t.release()
            t.release()  # twice is once
        await asyncio.gather(*waiters)
        assert (gate.num_running, gate.num_waiting) == (2, 0)

    run(main())


def test_the_freed_slot_goes_to_the_member_with_the_fewest_virtual_tokens():
    async def main():
        gate = FairGate("chat", concurrency=1, max_queue=16)
        first = await gate.acquire("ann", num_prompt_estimate=10)
        order = []

        async def ask(member: str, tokens: int):
            ticket = await gate.acquire(member, num_prompt_estimate=tokens)
            order.append(member)
            ticket.settle(num_prompt=tokens, num_output=50)
            ticket.release()

        tasks = [asyncio.create_task(ask("ann", 100)) for _ in range(3)]
        await settle()
        tasks.append(asyncio.create_task(ask("bob", 100)))  # arrives last, has used nothing
        await settle()
        first.settle(num_prompt=10, num_output=200)  # ann's first answer was long
        first.release()
        await asyncio.gather(*tasks)
        assert order[0] == "bob" and order.count("ann") == 3
        assert gate.fair.counter(("chat", "ann")) > gate.fair.counter(("chat", "bob"))

    run(main())


def test_a_waiter_that_leaves_frees_its_place_and_close_refuses_the_rest():
    async def main():
        gate = FairGate("chat", concurrency=1, max_queue=1)
        held = await gate.acquire("ann")
        leaving = asyncio.create_task(gate.acquire("bob"))
        await settle()
        leaving.cancel()
        await settle()
        assert gate.num_waiting == 0
        staying = asyncio.create_task(gate.acquire("bob"))
        await settle()
        gate.close()
        with pytest.raises(GateClosed):
            await staying
        with pytest.raises(GateClosed):
            await gate.acquire("cid")
        held.release()
        assert gate.num_running == 0

    run(main())


def test_a_slot_granted_as_its_waiter_is_cancelled_is_handed_on():
    async def main():
        gate = FairGate("chat", concurrency=1, max_queue=4)
        held = await gate.acquire("ann")
        unlucky = asyncio.create_task(gate.acquire("bob"))
        next_one = asyncio.create_task(gate.acquire("cid"))
        await settle()
        held.release()  # grants bob's future...
        unlucky.cancel()  # ...as bob leaves: the slot must go on to cid
        await settle()
        ticket = await asyncio.wait_for(next_one, 5)
        assert ticket.member == "cid" and gate.num_running == 1

    run(main())
