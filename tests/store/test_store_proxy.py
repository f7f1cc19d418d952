"""Trusted proxy members (issue 27): the stored flag, set at add or later, and the upgrade that
makes every member there already not one."""

import pytest
import sqlalchemy as sa

from homeai.store import members
from homeai.store.db import make_engine, make_sessionmaker, migrate
from tests.store.test_store_migrations import old_member


def test_a_member_is_no_proxy_unless_added_as_one(session):
    plain, _ = members.add_member(session, name="alice")
    owui, token = members.add_member(session, name="owui", proxy=True)
    assert not members.is_proxy(plain) and members.is_proxy(owui)
    assert members.lanes_of(session, name="owui") == members.DEFAULT_LANES  # a proxy's lanes are a member's
    assert members.is_proxy(members.authenticate(session, token))


def test_the_flag_is_set_and_cleared_and_kept(new_session):
    with new_session() as s:
        members.add_member(s, name="owui")
        members.add_member(s, name="root", admin=True)  # an admin has no settings row until one is needed
        members.set_proxy(s, name="owui", proxy=True)
        members.set_proxy(s, name="root", proxy=True)
    with new_session() as s:
        listed = {m.name: members.is_proxy(m) for m in members.list_members(s)}
        assert listed == {"owui": True, "root": True}
        assert members.lanes_of(s, name="root") == members.ALL_LANES
        members.set_proxy(s, name="owui", proxy=False)
    with new_session() as s:
        assert not members.is_proxy(next(m for m in members.list_members(s) if m.name == "owui"))
        with pytest.raises(ValueError, match="no member named 'nobody'"):
            members.set_proxy(s, name="nobody", proxy=True)


def test_members_there_before_0006_are_not_proxies(db_url):
    migrate(db_url, revision="0005")
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s:
        ids = [old_member(s, name)[0].id for name in ("ha", "bob")]
    settings = sa.table("member_settings", sa.column("member_id"), sa.column("lanes"))
    with engine.begin() as c:
        c.execute(settings.insert(), [{"member_id": i, "lanes": "chat"} for i in ids])

    migrate(db_url)

    with make_sessionmaker(engine)() as s:
        assert [(m.name, members.is_proxy(m), members.allowed_lanes(m)) for m in members.list_members(s)] == [
            ("bob", False, ("chat",)), ("ha", False, ("chat",))]
        members.set_proxy(s, name="bob", proxy=True)
        assert members.is_proxy(next(m for m in members.list_members(s) if m.name == "bob"))
    engine.dispose()
