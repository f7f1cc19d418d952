"""KV accounting with shared cells: counted once, against the lender, and handed to borrowers
when the lender lets them go; never less than what llama.cpp holds."""

from homeai.sched.kv import KVManager


def physical(holdings: dict[int, range]) -> int:
    """Cells llama.cpp holds: each position of each lineage once (one lineage here: all share 0..)."""
    return len(set().union(*holdings.values())) if holdings else 0


def test_a_borrowed_prefix_is_counted_once():
    kv = KVManager(1000, 4)
    a = kv.admit(300)
    b = kv.admit(350, borrow=(a, 300))
    assert kv.num_used_cells == 350 and kv.length(b) == 350  # 300 + the 50 b computes itself


def test_the_borrower_is_counted_for_cells_its_lender_lets_go():
    kv = KVManager(1000, 4)
    a = kv.admit(300)
    b = kv.admit(350, borrow=(a, 300))
    kv.cache(a, 300)
    assert kv.num_used_cells + kv.num_cached_cells == 350
    kv.trim(a, 100)  # the entry keeps 100: b now alone holds 100..300
    assert kv.num_used_cells + kv.num_cached_cells == 350 and kv.borrowed[b] == (a, 100)
    kv.evict(a)
    assert kv.num_used_cells == 350 and kv.num_cached_cells == 0 and b not in kv.borrowed
    kv.release(b)
    assert kv.num_used_cells == 0 and len(kv.free_seq_ids) == 4


def test_a_borrower_leaving_leaves_its_lender_counted():
    kv = KVManager(1000, 4)
    a = kv.admit(300)
    b = kv.admit(320, borrow=(a, 300))
    c = kv.admit(400, borrow=(b, 310))  # through b: 300 of a's and 10 of b's own
    assert kv.num_used_cells == 300 + 20 + 90
    kv.release(b)  # c alone holds b's 10 now, and borrows a's 300 from a itself
    assert kv.num_used_cells == 300 + 100 and kv.borrowed[c] == (a, 300)
    assert kv.num_used_cells >= physical({a: range(300), c: range(400)})
    kv.release(a)
    kv.release(c)
    assert kv.num_used_cells == 0


def test_growing_a_borrower_counts_only_its_own_cells():
    kv = KVManager(400, 4)
    a = kv.admit(300)
    b = kv.admit(300, borrow=(a, 299))
    assert kv.ensure(b, 390) and kv.num_used_cells == 300 + 91
    assert not kv.ensure(b, 420)  # 21 more than the 9 free
