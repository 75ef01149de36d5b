"""Replaying dead letters (``activedb.ingest.replay_dead_letters``) below the command: what it refuses."""

from __future__ import annotations

import dataclasses
import types

import pytest

import activedb
from activedb import Coupling, deadletters
from activedb.ingest import Ingestion, feed, replay_dead_letters
from activedb.ingest.errors import IngestError
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_database, app_state, new_app_database

APP = types.SimpleNamespace(mapping=app_counters.MAPPING, known_types=None, prefetch=None)


@pytest.mark.parametrize("letter_id", [None, "7", -1], ids=["none", "a-text", "negative"])
def test_a_letter_without_an_id_is_refused_before_any_letter_is_replayed(make_database_url, letter_id):
    """A letter is replayed as the batch numbered by its id: one without a whole-number id (a dict that lost its
    ``id``) failed with Batch's "a batch number is an integer from 0", which names no letter, after the letters
    before it had been replayed — their outcomes lost with the error.  Now an IngestError names the letter and what
    to give, and no letter is replayed."""
    database = new_app_database(make_database_url, "replay_no_id")
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        with database.transaction() as tx:
            deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0, [deadletters.Letter("why", row)])
        [stored] = deadletters.select(database)
        before = app_state(database)
        lost = dataclasses.asdict(stored) | {"id": letter_id}
        with pytest.raises(IngestError, match=r"dead letter 'why' of .* has no id .* as read from activedb_dead_letters"):
            replay_dead_letters(database, APP, [stored, lost])
        assert app_state(database) == before
        [outcome] = replay_dead_letters(database, APP, [stored])
        assert outcome.outcome == "applied" and app_state(database) != before
    finally:
        database.close()


def test_one_letter_where_the_letters_belong_is_refused_saying_what_to_give(make_database_url):
    """``replay_dead_letters`` takes a collection of letters: one letter's row (a dict) was iterated, each of its
    column names failing LetterRecord with a bare AttributeError ('str' object has no attribute 'get'), and one
    LetterRecord failed with a TypeError (not iterable)."""
    database = new_app_database(make_database_url, "replay_one")
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        with database.transaction() as tx:
            deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0, [deadletters.Letter("why", row)])
        [stored] = deadletters.select(database)
        for one in (stored, dataclasses.asdict(stored)):
            with pytest.raises(IngestError, match=r"letters is one .*, not a collection of letters: .*\[letter\]"):
                replay_dead_letters(database, APP, one)
    finally:
        database.close()


def test_a_letter_that_no_longer_exists_is_reported_not_found_and_nothing_is_applied(make_database_url):
    """Replaying a letter that is not in the table (purged since it was read, or a mistyped id) applies nothing, as
    before, but says so: its outcome is ``not found`` — it was ``already replayed``, which sent the user looking for a
    replay that never happened.  The letters after it are still replayed."""
    database = new_app_database(make_database_url, "replay_missing")
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        with database.transaction() as tx:
            deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0,
                               [deadletters.Letter("why", row), deadletters.Letter("why", row | {"seq": 2})])
        purged, kept = deadletters.select(database)
        assert deadletters.purge(database, deadletters.LetterFilter(ids=(purged.id,))) == 1
        mistyped = dataclasses.replace(kept, id=kept.id + 1000)
        before = app_state(database)
        outcomes = replay_dead_letters(database, APP, [purged, mistyped, kept])
        assert [outcome.outcome for outcome in outcomes] == ["not found", "not found", "applied"]
        assert [outcome.outcome for outcome in replay_dead_letters(database, APP, [kept])] == ["already replayed"]
        assert app_state(database) != before
    finally:
        database.close()


def test_arrow_letters_without_a_column_the_mapping_names_are_refused_before_any_letter_is_replayed(make_database_url):
    """A letter Spark delivered is a one-row Arrow table with the stream's columns: replayed with a mapping naming a
    column it lacks (the application's MAPPING changed since), every such letter was 'rejected again' — marked
    replayed, and a new dead letter of the same row written under replay:NAME.  Now ``check_columns`` refuses it,
    naming the letter, before any letter is replayed."""
    pa = pytest.importorskip("pyarrow")
    database = new_app_database(make_database_url, "replay_columns")
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        renamed = pa.Table.from_pylist([{"type": "add", "worker": "k", "ts": BASE_TIME, "amount": 1, "seq": 2}])
        with database.transaction() as tx:
            deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0,
                               [deadletters.Letter("why", row), deadletters.Letter("why", renamed)])
        stored = deadletters.select(database)
        before = app_state(database)
        with pytest.raises(IngestError, match=rf"dead letter {stored[1].id} of 'badges@.*': the stream has no column "
                                              rf"'key' named by the mapping .* no letter was replayed"):
            replay_dead_letters(database, APP, stored)
        assert app_state(database) == before
        assert [letter.replayed_at for letter in deadletters.select(database)] == [None, None]
    finally:
        database.close()


def test_letters_of_a_source_named_with_an_at_are_refused_before_any_letter_is_replayed(make_database_url):
    """A source with runs may be named with '@' (``feed(source="orders@eu", run=…)``): its replay's ledger id,
    ``replay:orders@eu``, reads as run ``eu`` of ``replay:orders``, which LedgerId refuses.  Replaying its letters
    failed inside ``feed`` with "pass LedgerId.parse('replay:orders@eu')" after the letters before it had been
    replayed — their outcomes lost with the error.  Now an IngestError names the letters and the source before any
    letter is replayed."""
    database = new_app_database(make_database_url, "replay_at")
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        with database.transaction() as tx:
            deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0, [deadletters.Letter("why", row)])
            deadletters.insert(tx, "orders@eu@00000000-0000-0000-0000-00000000000a", 0,
                               [deadletters.Letter("why", row | {"seq": 2})])
        plain, named_with_at = deadletters.select(database)
        before = app_state(database)
        with pytest.raises(IngestError, match=rf"dead letter {named_with_at.id} of the source 'orders@eu' cannot be "
                                              rf"replayed: .*replay:orders@eu.* no letter was replayed"):
            replay_dead_letters(database, APP, [plain, named_with_at])
        assert app_state(database) == before
        assert [letter.replayed_at for letter in deadletters.select(database)] == [None, None]
    finally:
        database.close()


def test_letters_of_a_source_whose_replay_name_is_too_long_are_refused_before_any_letter_is_replayed(make_database_url):
    """A source may be named with up to 2048 bytes; its replay's source, ``replay:NAME``, is seven more, which the
    Ingestion refuses.  Replaying its letters raised "Ingestion(source='replay:…') is a source name of 2055 bytes …
    give a shorter name (nothing was applied)" after the letters before it had been replayed — applied, marked, their
    outcomes lost with the error, which named an argument the caller never gave.  Now an IngestError names the
    letter, its source and what to do before any letter is replayed; a source whose replay's name fits replays."""
    database = new_app_database(make_database_url, "replay_long")
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        fits = "f" * (2048 - len("replay:"))
        with database.transaction() as tx:
            deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0, [deadletters.Letter("why", row)])
            deadletters.insert(tx, "s" * 2048, 0, [deadletters.Letter("why", row | {"seq": 2})])
            deadletters.insert(tx, fits, 0, [deadletters.Letter("why", row | {"seq": 3})])
        plain, too_long, fitting = deadletters.select(database)
        before = app_state(database)
        with pytest.raises(IngestError, match=rf"dead letter {too_long.id} of the source 'ssss.*' cannot be replayed: "
                                              rf"its replay's source, replay:NAME, is a source name of 2055 bytes .*at "
                                              rf"most 2048 bytes.* no letter was replayed"):
            replay_dead_letters(database, APP, [plain, too_long])
        assert app_state(database) == before
        assert [letter.replayed_at for letter in deadletters.select(database)] == [None, None, None]
        [outcome] = replay_dead_letters(database, APP, [fitting])
        assert outcome.outcome == "applied"
    finally:
        database.close()


def test_replaying_letters_when_no_rule_listens_to_a_stream_is_refused_and_marks_nothing(make_database_url):
    """The rule path accepts any event type when no enabled rule listens to a stream (its accepted types are then
    "any").  Replaying a letter after its rule was removed from an application that has no other stream rule (or the
    only one disabled) reported it "applied" and marked it replayed — no rule ran on its row, which ``dead-letters
    list`` then no longer showed: the row was lost with its letter's reason.  Now the replay is refused before any
    letter is replayed, saying to declare or enable the rules first; with the rules declared, the letter applies."""
    url = make_database_url("replay_no_rules", migrations=(app_counters.MIGRATIONS,))
    app_database(url).close()      # the tables
    database = activedb.connect(url)
    try:
        database.rule(on=database.modified("counters"), coupling=Coupling.DEFERRED, name="watch")(lambda tx, e: None)
        row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
        with database.transaction() as tx:
            deadletters.insert(tx, "badges", 0, [deadletters.Letter("rejected by rule 'apply_add': …", row)])
        [letter] = deadletters.select(database)
        with pytest.raises(IngestError, match=r"no enabled rule listens to a stream event type.*declare the "
                                              r"application's rules.*no letter was replayed"):
            replay_dead_letters(database, APP, [letter])
        assert [letter.replayed_at for letter in deadletters.select(database)] == [None]
        app_counters.register(database)
        [outcome] = replay_dead_letters(database, APP, [letter])
        assert outcome.outcome == "applied" and app_state(database)["counters"] != []
    finally:
        database.close()


@pytest.mark.parametrize("prefix", ["replay:", "capture:"])
def test_a_feed_under_a_source_name_replay_or_capture_owns_is_refused_and_the_letter_still_replays(make_database_url,
                                                                                                 prefix):
    """``replay:NAME`` and ``capture:NAME`` are the sources of a dead letter's replay (batch number: the letter's id)
    and of a capture consumer.  ``feed(source="replay:badges")`` was taken: its batch 0 filled the ledger slot of the
    replay of letter 0, which then reported "already replayed" for ever, its row never applied.  Now a feed or an
    Ingestion under such a name is refused, naming the prefix and why, and the letter replays."""
    database = new_app_database(make_database_url, f"replay_reserved_{prefix[:-1]}")
    row = {"type": "add", "key": "reserved", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
    try:
        with pytest.raises(IngestError, match=rf"feed\(source='{prefix}badges'\) begins with '{prefix}', which is "
                                              r"reserved for .*nothing was applied"):
            feed(database, [[row]], source=f"{prefix}badges", mapping=app_counters.MAPPING)
        with pytest.raises(IngestError, match=rf"Ingestion\(source='{prefix}badges'\) begins with '{prefix}', "
                                              r"which is reserved"):
            Ingestion(database, app_counters.MAPPING, source=f"{prefix}badges")
        with database.transaction() as tx:
            deadletters.insert(tx, "badges", 0, [deadletters.Letter("why", row)])
        [stored] = deadletters.select(database)
        [outcome] = replay_dead_letters(database, APP, [stored])
        assert (outcome.query_id, outcome.outcome) == ("replay:badges", "applied")
    finally:
        database.close()


def _three_letters(database) -> list:
    row = {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": 1}
    with database.transaction() as tx:
        deadletters.insert(tx, "badges@00000000-0000-0000-0000-00000000000a", 0,
                           [deadletters.Letter("why", row | {"seq": seq}) for seq in (1, 2, 3)])
    return deadletters.select(database)


def test_progress_is_told_of_each_letter_and_what_it_raises_stops_the_replay_there(make_database_url):
    """A replay runs a transaction per letter — thousands take a while — and said nothing until it ended: now
    ``progress(outcome, done, total)`` is called after each letter's transaction (a bar's update); what it raises (a
    Ctrl-C in it) stops the replay there, the letters replayed so far staying replayed, the rest replayed later."""
    database = new_app_database(make_database_url, "replay_progress")
    try:
        stored = _three_letters(database)
        told: list[tuple[int, str, int, int]] = []

        def stops_after_the_first(outcome, done, total) -> None:
            told.append((outcome.letter_id, outcome.outcome, done, total))
            if done == 1:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            replay_dead_letters(database, APP, stored, progress=stops_after_the_first)
        assert told == [(stored[0].id, "applied", 1, 3)]
        again = replay_dead_letters(database, APP, stored, progress=lambda *told_now: told.append(told_now))
        assert [outcome.outcome for outcome in again] == ["already replayed", "applied", "applied"]
        assert [(done, total) for _, done, total in told[1:]] == [(1, 3), (2, 3), (3, 3)]
    finally:
        database.close()


def test_the_command_draws_a_bar_on_a_terminal_and_prints_only_its_line_otherwise(make_database_url):
    """``activedb dead-letters replay`` on a terminal: a progress bar on stderr (removed at the end), the summary on
    stdout; elsewhere (a pipe, a CI log) the summary alone."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests._terminal import run_on_terminal

    url = make_database_url("replay_bar", migrations=(app_counters.MIGRATIONS,))
    database = app_database(url)
    try:
        first, second, third = (letter.id for letter in _three_letters(database))
    finally:
        database.close()
    app = str(Path(app_counters.__file__).resolve())
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "dead-letters", "replay", app]
    environment = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    code, out, drawn = run_on_terminal([*command, "--id", str(first), "--id", str(second)], environment)
    assert code == 0, (out, drawn[-2000:])
    assert "replayed 2 dead letter(s) as replay:badges: 2 applied" in out, out
    assert b"dead-letters replay" in drawn and b"letters replayed" in drawn, drawn[-2000:]
    piped = subprocess.run([*command, "--id", str(third)], capture_output=True, text=True, timeout=120, env=environment)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout.strip() == "replayed 1 dead letter(s) as replay:badges: 1 applied", piped.stdout
