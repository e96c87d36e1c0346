"""Issue 65, findings 2 and 16, on both backends: a password account's name is never handed to a new person once it
owned data (the name is tombstoned, as team names are), hostile spellings of a name are refused, a password is
checked against a list of common passwords as well as its length, and `set_password` changes a password without
removing the account, ending every browser login made with the old one."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from store import InvalidInput, PromptRecord, SessionLog
from store.deletion import delete_user_data
from store.threads import ChatThreads
from store.users import MAX_ACCOUNT_NAME, UnknownUser, UserError, Users
from tests.store.conftest import StoreTarget

PROMPT = PromptRecord(text="p", token_ids=(1,), prompt_sha="s")
PASSWORD = "alice's long password"


def _session(log: SessionLog, owner: str) -> str:
    sid = log.create_session(f"{owner}'s private question?", PROMPT, {}, "base", owner=owner, source="chat")
    log.finish(sid, "completed", report="r")
    return sid


def test_a_name_that_owned_data_is_never_given_to_a_new_account(store_target: StoreTarget) -> None:
    """Finding 2: `users remove alice` then `users add alice` (the only way to reset a password) made a new alice
    who saw the old alice's private history."""
    with store_target.open() as log:
        users = Users(log)
        users.add("alice", password=PASSWORD)
        _session(log, "alice")
        users.remove("alice")
        for name in ("alice", " alice "):
            with pytest.raises(UserError, match=r"owned data and has no account now.*users set-password alice"):
                users.add(name, password="a new long password")
        assert users.find("alice") is None
        # Data owned through a chat thread alone counts too, and so does a legacy mixed-case owner.
        users.add("bob", password="bob's long password")
        ChatThreads(log).add("thr_b", _session(log, "carol"))
        with log.transaction(write=True) as conn:
            conn.execute("UPDATE chat_threads SET owner = 'bob'")
            conn.execute("UPDATE sessions SET owner = 'Dave'")
        users.remove("bob")
        for name in ("bob", "dave"):
            with pytest.raises(UserError, match="owned data and has no account now"):
                users.add(name, password="a new long password")


def test_a_name_whose_data_was_deleted_stays_retired(store_target: StoreTarget) -> None:
    """`users delete-data` removes the account and its rows; the name still belonged to someone, whose bank items
    and copies may still be on their way out, so it is not handed to a new person either."""
    with store_target.open() as log:
        users = Users(log)
        users.add("erin", password="erin's long password")
        _session(log, "erin")
        delete_user_data(log, "erin", requested_by="local")
        assert users.find("erin") is None
        with pytest.raises(UserError, match="owned data and has no account now"):
            users.add("erin", password="erin's new password")


def test_a_name_that_owned_nothing_may_be_made_again_under_a_new_login_key(store_target: StoreTarget) -> None:
    """An account removed before it owned anything may be made again (a typo undone), but the new account's login
    key differs, so a browser signed in to the old one is not signed in to the new one."""
    with store_target.open() as log:
        users = Users(log)
        users.add("frank", password="frank's long password")
        signed = users.sign_in("frank", "frank's long password")
        assert signed is not None and signed[0].user_id == "frank" and users.login_key("frank") == signed[1]
        users.remove("frank")
        assert users.login_key("frank") is None
        users.add("frank", password="frank's long password")
        assert users.login_key("frank") not in (None, signed[1])


@pytest.mark.parametrize(("name", "why"), [
    ("Alice", "lower case"),
    ("ALICE", "lower case"),
    ("alice\u200b", "U+200B ZERO WIDTH SPACE"),
    ("\u200balice", "U+200B ZERO WIDTH SPACE"),
    ("ali\u00adce", "U+00AD SOFT HYPHEN"),
    ("\uff41\uff4c\uff49\uff43\uff45", "reads as 'alice'"),  # full-width letters, NFKC-folded to alice
    ("\u0430lice", "U+0430 CYRILLIC SMALL LETTER A"),  # a Cyrillic a that looks like a Latin one
    ("alice\u0301", "U+0301 COMBINING ACUTE ACCENT"),
    ("a" * (MAX_ACCOUNT_NAME + 1), f"at most {MAX_ACCOUNT_NAME} characters"),
    ("a" * 100_000, f"at most {MAX_ACCOUNT_NAME} characters"),
])
def test_hostile_spellings_of_a_name_are_refused_with_a_clear_error(store_target: StoreTarget, name: str,
                                                                   why: str) -> None:
    """Case variants, invisible and look-alike characters and very long names would make a second account that
    reads as the first one (or slip past its tombstone): each is refused, saying why, and nothing is written."""
    with store_target.open() as log:
        users = Users(log)
        users.add("alice", password=PASSWORD)
        with pytest.raises(InvalidInput, match=re.escape(why)) as refused:
            users.add(name, password="a different long password")
        assert name not in str(refused.value) or name.isascii()  # invisible characters are named, never echoed
        assert len(str(refused.value)) < 600
        assert [u.user_id for u in users.list()] == ["alice"]


def test_a_legacy_mixed_case_account_blocks_its_lower_case_twin(store_target: StoreTarget) -> None:
    """An account named `Alice` before names were lower case: `alice` would be a second account that reads as hers."""
    with store_target.open() as log:
        users = Users(log)
        users.add("alice", password=PASSWORD)
        with log.transaction(write=True) as conn:
            conn.execute("UPDATE users SET user_id = 'Alice'")
        with pytest.raises(UserError, match="'Alice' already exists"):
            users.add("alice", password="another long password")


@pytest.mark.parametrize("password", ["12345678", "password", "Password1", "QWERTYUIOP", "iloveyou", "1q2w3e4r",
                                      "  12345678  "])
def test_a_common_password_is_refused_for_a_named_account(store_target: StoreTarget, password: str) -> None:
    """Finding 16: the rule was length alone, so `12345678` was accepted (OWASP ASVS 2.1.7 asks for a check against
    commonly used passwords). The message says why, and never repeats the password."""
    with store_target.open() as log:
        users = Users(log)
        with pytest.raises(InvalidInput, match="commonly used passwords") as refused:
            users.add("alice", password=password)
        assert password.strip() not in str(refused.value) or password.strip() == "password"
        assert users.list() == []


def test_a_password_equal_to_the_name_is_refused(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        with pytest.raises(InvalidInput, match="the account's name"):
            Users(log).add("margaret", password="Margaret")


def test_the_common_password_list_ships_with_the_package() -> None:
    """Read through importlib.resources (as an installed wheel would): a few hundred lower-case entries."""
    text = resources.files("store").joinpath("common_passwords.txt").read_text(encoding="utf-8")
    entries = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert len(entries) >= 300 and len(set(entries)) == len(entries)
    assert all(e == e.lower() for e in entries) and "12345678" in entries


def test_set_password_keeps_the_account_and_ends_its_logins(store_target: StoreTarget) -> None:
    """The way to reset a password without removing the account: the new password works, the old one does not, and
    the login key changes (every browser session signed in with the old one ends at its next page load)."""
    with store_target.open() as log:
        users = Users(log)
        alice = users.add("alice", password=PASSWORD, role="admin")
        sid = _session(log, "alice")
        signed = users.sign_in("alice", PASSWORD)
        assert signed is not None
        assert users.set_password("alice", "alice's new password") == alice
        assert users.verify_password("alice", PASSWORD) is None
        assert users.verify_password("alice", "alice's new password") == alice
        assert users.login_key("alice") not in (None, signed[1])
        assert log.get(sid).owner == "alice"  # her history stays hers
        with pytest.raises(InvalidInput, match="commonly used passwords"):
            users.set_password("alice", "12345678")
        with pytest.raises(InvalidInput, match="at least 8"):
            users.set_password("alice", "short")
        assert users.verify_password("alice", "alice's new password") == alice  # a refused one changed nothing
        with pytest.raises(UnknownUser, match="no user 'nobody'"):
            users.set_password("nobody", "a long new password")
        users.ensure("shared:user", kind="local", role="user")
        with pytest.raises(UserError, match="not a password account"):
            users.set_password("shared:user", "a long new password")
