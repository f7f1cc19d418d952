"""Members and tokens: adding, listing, revoking, authenticating, hashing."""

import hashlib

import pytest

from homeai.store import members
from homeai.store.models import Token


def test_add_member_returns_a_token_that_authenticates(session):
    member, token = members.add_member(session, name="alice", admin=True)
    assert token.startswith("hai_") and len(token) > 40
    assert member.role == "admin" and member.is_admin
    assert members.authenticate(session, token).id == member.id


def test_members_are_not_admins_by_default(session):
    member, _ = members.add_member(session, name="bob")
    assert member.role == "member" and not member.is_admin


def test_wrong_or_missing_token_fails(session):
    _, token = members.add_member(session, name="alice")
    assert members.authenticate(session, token + "x") is None
    assert members.authenticate(session, "hai_" + "A" * 43) is None
    assert members.authenticate(session, token[:-1]) is None
    assert members.authenticate(session, "") is None
    assert members.authenticate(session, None) is None


def test_authenticate_records_last_use(session):
    _, token = members.add_member(session, name="alice")
    row = session.query(Token).one()
    assert row.last_used_at is None
    members.authenticate(session, token)
    assert row.last_used_at is not None


def test_revoked_token_fails(session):
    _, token = members.add_member(session, name="alice")
    assert members.revoke(session, name="alice") == 1
    assert members.authenticate(session, token) is None


def test_revoke_one_token_by_prefix_keeps_the_others(session):
    _, first = members.add_member(session, name="alice")
    second = members.add_token(session, name="alice")
    assert members.revoke(session, prefix=first[:members.PREFIX_LEN]) == 1
    assert members.authenticate(session, first) is None
    assert members.authenticate(session, second).name == "alice"
    assert members.revoke(session, prefix=first[:members.PREFIX_LEN]) == 0


def test_revoke_by_name_counts_only_active_tokens(session):
    members.add_member(session, name="alice")
    members.add_token(session, name="alice")
    members.add_token(session, name="alice")
    members.add_member(session, name="bob")
    assert members.revoke(session, name="alice") == 3
    assert members.revoke(session, name="alice") == 0
    listed = {m.name: m.active_prefixes for m in members.list_members(session)}
    assert listed["alice"] == [] and len(listed["bob"]) == 1


def test_revoke_needs_a_target_and_known_names(session):
    members.add_member(session, name="alice")
    with pytest.raises(ValueError, match="name"):
        members.revoke(session)
    with pytest.raises(ValueError, match="no member named 'carol'"):
        members.revoke(session, name="carol")
    with pytest.raises(ValueError, match="no token with prefix"):
        members.revoke(session, prefix="hai_nothere")


def test_list_members_shows_active_prefixes(session):
    _, a1 = members.add_member(session, name="alice")
    a2 = members.add_token(session, name="alice")
    members.revoke(session, prefix=a1[:members.PREFIX_LEN])
    members.add_member(session, name="bob", admin=True)
    listed = members.list_members(session)
    assert [(m.name, m.role) for m in listed] == [("alice", "member"), ("bob", "admin")]
    assert listed[0].active_prefixes == [a2[:members.PREFIX_LEN]]
    assert len(listed[1].active_prefixes) == 1


def test_duplicate_and_unknown_names_raise(session):
    members.add_member(session, name="alice")
    with pytest.raises(ValueError, match="already exists"):
        members.add_member(session, name="alice")
    with pytest.raises(ValueError, match="already exists"):
        members.add_member(session, name="  alice ")
    with pytest.raises(ValueError, match="no member named"):
        members.add_token(session, name="carol")
    with pytest.raises(ValueError, match="no member named"):
        members.remove_member(session, name="carol")
    with pytest.raises(ValueError, match="empty"):
        members.add_member(session, name="   ")


def test_tokens_are_stored_only_as_hashes(new_session, db_path):
    with new_session() as s:
        _, token = members.add_member(s, name="alice-the-member")
        extra = members.add_token(s, name="alice-the-member")
        stored = {t.token_hash for t in s.query(Token)}
    assert stored == {hashlib.sha256(t.encode()).hexdigest() for t in (token, extra)}
    files = b"".join(p.read_bytes() for p in db_path.parent.glob("homeai.db*"))
    # The controls prove the bytes we search are where the rows went.
    assert b"alice-the-member" in files
    assert hashlib.sha256(token.encode()).hexdigest().encode() in files
    assert token.encode() not in files
    assert extra.encode() not in files
    assert token[members.PREFIX_LEN:].encode() not in files


def test_default_member_is_an_admin_made_once(session):
    first = members.ensure_default_member(session)
    second = members.ensure_default_member(session)
    assert first.id == second.id
    assert (first.name, first.role) == ("household", "admin")
    assert [m.name for m in members.list_members(session)] == ["household"]


# ---- the lanes a member may use ------------------------------------------------------------

DEFAULTS = ("chat", "summaries", "indexing", "embeddings")


def test_a_new_member_may_use_chat_and_the_background_lanes_not_voice(session):
    bob, token = members.add_member(session, name="bob")
    assert members.allowed_lanes(bob) == DEFAULTS == members.DEFAULT_LANES
    assert members.allowed_lanes(members.authenticate(session, token)) == DEFAULTS
    with pytest.raises(members.LaneNotAllowed) as refused:
        members.check_lane("bob", members.allowed_lanes(bob), "voice")
    assert "'voice'" in str(refused.value) and "chat, summaries, indexing, embeddings" in str(refused.value)
    members.check_lane("bob", members.allowed_lanes(bob), "chat")  # allowed: no error


def test_a_voice_default_lane_brings_voice_and_explicit_lanes_are_kept_in_order(session):
    ha, _ = members.add_member(session, name="ha", lane="voice")
    assert members.allowed_lanes(ha) == ("voice", *DEFAULTS)
    kid, _ = members.add_member(session, name="kid", lanes=[" embeddings", "chat", "chat"])
    assert members.allowed_lanes(kid) == ("chat", "embeddings")
    assert members.lanes_of(session, name="kid") == ("chat", "embeddings")


def test_admins_and_the_default_member_may_use_every_lane(session):
    admin, _ = members.add_member(session, name="root", admin=True)
    assert members.allowed_lanes(admin) == members.ALL_LANES == ("voice", "chat", "summaries", "indexing", "embeddings")
    assert members.allowed_lanes(members.ensure_default_member(session)) == members.ALL_LANES
    with pytest.raises(ValueError, match="admin"):
        members.add_member(session, name="root2", admin=True, lanes=["chat"])
    with pytest.raises(ValueError, match="admin"):
        members.set_lanes(session, name="root", lanes=["chat"])


def test_lanes_can_be_changed_and_bad_ones_are_refused(session):
    members.add_member(session, name="bob")
    assert members.set_lanes(session, name="bob", lanes=["voice", "chat"]) == ("voice", "chat")
    assert members.lanes_of(session, name="bob") == ("voice", "chat")
    with pytest.raises(ValueError, match="unknown lane 'nowhere'"):
        members.set_lanes(session, name="bob", lanes=["chat", "nowhere"])
    with pytest.raises(ValueError, match="at least one lane"):
        members.set_lanes(session, name="bob", lanes=[])
    with pytest.raises(ValueError, match="no member named"):
        members.set_lanes(session, name="carol", lanes=["chat"])
    assert members.lanes_of(session, name="bob") == ("voice", "chat")  # nothing changed by the refusals


def test_a_default_lane_must_be_one_the_member_may_use(session):
    with pytest.raises(members.LaneNotAllowed, match="may not use lane 'voice'"):
        members.add_member(session, name="ha", lane="voice", lanes=["chat"])
    assert [m.name for m in members.list_members(session)] == []  # refused whole
    members.add_member(session, name="bob")
    with pytest.raises(members.LaneNotAllowed, match="allowed: chat, summaries, indexing, embeddings"):
        members.set_default_lane(session, name="bob", lane="voice")
    members.set_lanes(session, name="bob", lanes=["chat", "voice"])
    members.set_default_lane(session, name="bob", lane="voice")
    with pytest.raises(ValueError, match="default lane 'voice' would not be allowed"):
        members.set_lanes(session, name="bob", lanes=["chat"])
    members.set_default_lane(session, name="bob", lane=None)
    assert members.set_lanes(session, name="bob", lanes=["chat"]) == ("chat",)


def test_lanes_are_stored_per_member(new_session):
    with new_session() as s:
        members.add_member(s, name="ha", lane="voice")
        members.add_member(s, name="bob", lanes=["chat"])
    with new_session() as s:  # read back from the database, not the session's objects
        listed = {m.name: members.allowed_lanes(m) for m in members.list_members(s)}
    assert listed == {"bob": ("chat",), "ha": ("voice", *DEFAULTS)}


def test_a_member_name_cannot_be_a_proxys_user():
    """`owui/alice` is how a proxy's user is shared (fair share, the prompt cache): a member so named
    would be taken for that user, and reuse all of alice's cached cells."""
    with pytest.raises(ValueError, match="must not contain '/'"):
        members._valid_name("owui/alice")
